package canon

import (
	"context"
	"math/rand/v2"
	"sort"
	"testing"

	"github.com/mokopt/mokopt/graph"
	"github.com/mokopt/mokopt/graph/eval"
	pb "github.com/mokopt/mokopt/graph/onnxpb"
	"google.golang.org/protobuf/proto"
)

// ruleCase is one row of a rule's table test: a small model, the op census
// wanted after canonicalization (keys as graph.OpKey, 0 for absent), and
// the truth the canonical model must compute: ref when set (for ops the
// reference evaluator lacks), else the original model evaluated.
type ruleCase struct {
	name    string
	opset   int64
	nodes   []*pb.NodeProto
	inputs  map[string]*eval.Tensor // graph inputs, declared with their type and shape
	inits   map[string]*eval.Tensor
	outputs []string
	funcs   []*pb.FunctionProto
	extra   []*pb.OperatorSetIdProto
	want    map[string]int
	ref     func(in map[string]*eval.Tensor) map[string]*eval.Tensor
	// noChange: the rule must not apply.
	noChange bool
	// tokens: the inputs' first dimension is declared symbolic ("N").
	tokens bool
}

func node(op string, in, out []string, attrs ...*pb.AttributeProto) *pb.NodeProto {
	return graph.NewNode(op, "", out[0]+"_node", in, out, attrs...)
}

func msNode(op string, in, out []string, attrs ...*pb.AttributeProto) *pb.NodeProto {
	return graph.NewNode(op, msDomain, out[0]+"_node", in, out, attrs...)
}

func vi(name string, dt pb.TensorProto_DataType, shape []int) *pb.ValueInfoProto {
	dims := make([]*pb.TensorShapeProto_Dimension, len(shape))
	for i, d := range shape {
		dims[i] = &pb.TensorShapeProto_Dimension{Value: &pb.TensorShapeProto_Dimension_DimValue{DimValue: int64(d)}}
	}
	return &pb.ValueInfoProto{Name: proto.String(name), Type: &pb.TypeProto{Value: &pb.TypeProto_TensorType{
		TensorType: &pb.TypeProto_Tensor{ElemType: proto.Int32(int32(dt)), Shape: &pb.TensorShapeProto{Dim: dims}}}}}
}

// randF32 returns a float32 tensor of shape with values in [-2, 2).
func randF32(r *rand.Rand, shape ...int) *eval.Tensor {
	n := 1
	for _, d := range shape {
		n *= d
	}
	v := make([]float32, n)
	for i := range v {
		v[i] = r.Float32()*4 - 2
	}
	return eval.NewFloat32(shape, v)
}

func (c *ruleCase) model(t *testing.T) *graph.Model {
	t.Helper()
	opset := c.opset
	if opset == 0 {
		opset = 17
	}
	g := &pb.GraphProto{Name: proto.String("case")}
	for _, n := range c.nodes {
		g.Node = append(g.Node, proto.Clone(n).(*pb.NodeProto))
	}
	for _, name := range sortedKeys(c.inputs) {
		in := vi(name, c.inputs[name].DType, c.inputs[name].Shape)
		if d := in.GetType().GetTensorType().GetShape().GetDim(); c.tokens && len(d) > 0 {
			d[0].Value = &pb.TensorShapeProto_Dimension_DimParam{DimParam: "N"}
		}
		g.Input = append(g.Input, in)
	}
	for _, name := range sortedKeys(c.inits) {
		tp, err := eval.ToProto(c.inits[name], name)
		if err != nil {
			t.Fatal(err)
		}
		g.Initializer = append(g.Initializer, tp)
	}
	for _, o := range c.outputs {
		g.Output = append(g.Output, &pb.ValueInfoProto{Name: proto.String(o)})
	}
	mp := &pb.ModelProto{IrVersion: proto.Int64(10), Graph: g, Functions: c.funcs,
		OpsetImport: append([]*pb.OperatorSetIdProto{{Domain: proto.String(""), Version: proto.Int64(opset)}}, c.extra...)}
	return &graph.Model{Proto: mp}
}

func sortedKeys[V any](m map[string]V) []string {
	var out []string
	for k := range m {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}

// runRuleCases canonicalizes each case with rules and checks the census,
// that the original model is untouched, and the numbers.
func runRuleCases(t *testing.T, rules []Rule, cases []ruleCase) {
	t.Helper()
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			m := c.model(t)
			before, _ := proto.Marshal(m.Proto)
			wc, res, err := Canonicalize(context.Background(), m, Options{Rules: rules})
			if err != nil {
				t.Fatal(err)
			}
			after, _ := proto.Marshal(m.Proto)
			if string(before) != string(after) {
				t.Fatal("Canonicalize edited the original model")
			}
			if c.noChange {
				if len(res.Applied) != 0 {
					t.Fatalf("rule applied (%s), want no change", res.Summary())
				}
				return
			}
			if len(res.Applied) == 0 {
				t.Fatal("no rule applied")
			}
			if errs := wc.Graph().Validate(); len(errs) > 0 {
				t.Fatalf("canonical graph invalid: %v", errs)
			}
			census := map[string]int{}
			for _, n := range wc.Proto.Graph.Node {
				census[graph.OpKey(n)]++
			}
			for op, n := range c.want {
				if census[op] != n {
					t.Errorf("%d %s nodes after, want %d (census %v)", census[op], op, n, census)
				}
			}
			var want map[string]*eval.Tensor
			if c.ref != nil {
				want = c.ref(c.inputs)
			} else {
				want, err = eval.Run(context.Background(), m, c.inputs, eval.Options{})
				if err != nil {
					t.Fatalf("original: %v", err)
				}
			}
			got, err := eval.Run(context.Background(), wc, c.inputs, eval.Options{})
			if err != nil {
				t.Fatalf("canonical: %v", err)
			}
			for _, o := range c.outputs {
				if got[o] == nil || want[o] == nil {
					t.Fatalf("output %s missing", o)
				}
				d, err := eval.Compare(got[o], want[o], 1e-5, 1e-6)
				if err != nil {
					t.Fatalf("output %s: %v", o, err)
				}
				if !d.OK() {
					t.Errorf("output %s differs: %+v", o, d)
				}
			}
		})
	}
}

// mapF32 applies f elementwise to a float32 tensor.
func mapF32(x *eval.Tensor, f func(float64) float64) *eval.Tensor {
	out := make([]float32, len(x.F32))
	for i, v := range x.F32 {
		out[i] = float32(f(float64(v)))
	}
	return eval.NewFloat32(x.Shape, out)
}

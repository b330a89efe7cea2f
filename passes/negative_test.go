package passes

import (
	"path/filepath"
	"strings"
	"testing"

	"github.com/mokopt/mokopt/graph"
	pb "github.com/mokopt/mokopt/graph/onnxpb"
	"github.com/mokopt/mokopt/moe"
	"google.golang.org/protobuf/proto"
)

func tinyModel(nodes []*pb.NodeProto, inits []*pb.TensorProto, in, out string) *graph.Model {
	vi := func(n string) *pb.ValueInfoProto {
		return &pb.ValueInfoProto{Name: proto.String(n), Type: &pb.TypeProto{Value: &pb.TypeProto_TensorType{TensorType: &pb.TypeProto_Tensor{
			ElemType: proto.Int32(int32(pb.TensorProto_FLOAT)),
			Shape:    &pb.TensorShapeProto{Dim: []*pb.TensorShapeProto_Dimension{{Value: &pb.TensorShapeProto_Dimension_DimValue{DimValue: 4}}, {Value: &pb.TensorShapeProto_Dimension_DimValue{DimValue: 8}}}}}}}}
	}
	mp := &pb.ModelProto{IrVersion: proto.Int64(10), OpsetImport: []*pb.OperatorSetIdProto{{Domain: proto.String(""), Version: proto.Int64(18)}},
		Graph: &pb.GraphProto{Name: proto.String("g"), Node: nodes, Initializer: inits, Input: []*pb.ValueInfoProto{vi(in)}, Output: []*pb.ValueInfoProto{vi(out)}}}
	return &graph.Model{Proto: mp, Dir: "."}
}

func TestNegativeNothingFused(t *testing.T) {
	w := func(name string, r, c int64) *pb.TensorProto {
		return moe.Float32Tensor(name, []int64{r, c}, make([]float32, r*c))
	}
	cases := []struct {
		name     string
		m        *graph.Model
		nearMiss string // substring of the expected near-miss reason; "" for none
	}{
		{"dense MLP, no router", tinyModel([]*pb.NodeProto{
			graph.NewNode("MatMul", "", "up", []string{"x", "w1"}, []string{"h"}),
			graph.NewNode("Sigmoid", "", "s", []string{"h"}, []string{"hs"}),
			graph.NewNode("Mul", "", "silu", []string{"h", "hs"}, []string{"a"}),
			graph.NewNode("MatMul", "", "down", []string{"a", "w2"}, []string{"y"}),
		}, []*pb.TensorProto{w("w1", 8, 16), w("w2", 16, 8)}, "x", "y"), ""},
		{"TopK on the input, not a router", tinyModel([]*pb.NodeProto{
			graph.NewNode("TopK", "", "tk", []string{"x", "k"}, []string{"v", "i"}),
			graph.NewNode("MatMul", "", "mm", []string{"v", "w1"}, []string{"y"}),
		}, []*pb.TensorProto{moe.Int64Tensor("k", []int64{1}, []int64{2}), w("w1", 2, 8)}, "x", "y"), ""},
		{"classifier head TopK", tinyModel([]*pb.NodeProto{
			graph.NewNode("Gemm", "", "head", []string{"x", "wh"}, []string{"logits"}, graph.IntAttr("transB", 1)),
			graph.NewNode("Softmax", "", "sm", []string{"logits"}, []string{"p"}),
			graph.NewNode("TopK", "", "tk", []string{"p", "k"}, []string{"y", "i"}),
		}, []*pb.TensorProto{w("wh", 8, 8), moe.Int64Tensor("k", []int64{1}, []int64{2})}, "x", "y"), "no single value combines"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			d, err := Detect(tc.m)
			if err != nil {
				t.Fatal(err)
			}
			if len(d.Blocks) != 0 {
				t.Fatalf("fused %d blocks", len(d.Blocks))
			}
			if tc.nearMiss == "" && len(d.NearMiss) != 0 {
				t.Fatalf("unexpected near-miss %+v", d.NearMiss)
			}
			if tc.nearMiss != "" && (len(d.NearMiss) != 1 || !strings.Contains(d.NearMiss[0].Reason, tc.nearMiss)) {
				t.Fatalf("near-misses %+v, want one containing %q", d.NearMiss, tc.nearMiss)
			}
		})
	}
}

// TestMissingExpertNamed cuts expert 5's branch out of a per-expert
// unrolled export and expects a refusal that names expert 5.
func TestMissingExpertNamed(t *testing.T) {
	f := filepath.Join(fixtureDir, "hf4_mixtral_block_dynamo.onnx")
	m, err := graph.Load(f)
	if err != nil {
		t.Fatal(err)
	}
	g := m.Graph()
	// The ScatterND chain adds one expert per step; find the step whose
	// update comes from the branch selected by the constant 5 and bypass it.
	c, err := newCtx(m, g)
	if err != nil {
		t.Fatal(err)
	}
	cut := false
	for _, n := range g.NodesByOp("ScatterND") {
		for nd := range c.backward(n.Input[2], nil) {
			if nd.GetOpType() == "Gather" {
				if e, ok := c.scalarInt(nd.Input[1]); ok && e == 5 {
					n.OpType, n.Input, n.Attribute = proto.String("Identity"), n.Input[:1], nil
					cut = true
				}
			}
		}
		if cut {
			break
		}
	}
	if !cut {
		t.Fatal("could not find expert 5's branch")
	}
	_, err = Rewrite(m, Options{})
	if err == nil || !strings.Contains(err.Error(), "expert(s) 5 missing") {
		t.Fatalf("want a refusal naming expert 5, got %v", err)
	}
}

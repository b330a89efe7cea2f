package passes

import (
	"context"
	"encoding/json"
	"math"
	"path/filepath"
	"strings"
	"testing"

	"github.com/mokopt/mokopt/graph"
	"github.com/mokopt/mokopt/graph/eval"
	pb "github.com/mokopt/mokopt/graph/onnxpb"
	"github.com/mokopt/mokopt/models"
	"google.golang.org/protobuf/proto"
)

// canonicalClasses are the manifest classes the canonicalization stage
// makes fusable: model-local functions, unoptimized dynamo output, ONNX
// Runtime offline-optimized models (blocks and whole models), whole raw
// dynamo models, and opsets below 13; float16 conversions that keep
// float32 I/O (casts inside the block); and exports whose weights are graph
// inputs too (keep_initializers_as_inputs); and blocks chained directly,
// one reading the previous one's output.
var canonicalClasses = map[string]bool{"functions": true, "dynamo_raw": true, "ort_opt": true, "full_ort": true, "full_raw": true, "low_opset": true,
	"fp16": true, "init_inputs": true, "chain": true}

// TestProducersCanonical checks that every export of the canonical classes
// that the manifest expects to fuse does: each block fuses with the
// expected experts and top-k, no TopK is left, the output model is valid,
// and every golden set of ONNX Runtime's is reproduced both through the
// reference kernel and through the fused node's function body.
func TestProducersCanonical(t *testing.T) {
	n := 0
	for _, c := range manifestCases(t) {
		if !canonicalClasses[c.Class] || c.Expected.Verdict != "fuse" {
			continue
		}
		n++
		t.Run(c.Name, func(t *testing.T) {
			m, err := graph.Load(filepath.Join(refusalDir, c.Name+".onnx"))
			if err != nil {
				t.Fatal(err)
			}
			defer m.Close()
			rep, err := Rewrite(m, Options{Check: true})
			if err != nil {
				t.Fatal(err)
			}
			blocks := max(c.Expected.Blocks, 1)
			if len(rep.Fused) != blocks {
				t.Fatalf("fused %d blocks, want %d", len(rep.Fused), blocks)
			}
			var e int
			if json.Unmarshal(c.Expected.E, &e) == nil {
				for _, fb := range rep.Fused {
					if fb.Block.Spec.NumExperts != e || (c.Expected.K > 0 && fb.Block.Spec.TopK != c.Expected.K) {
						t.Errorf("fused E=%d k=%d, want E=%d k=%d", fb.Block.Spec.NumExperts, fb.Block.Spec.TopK, e, c.Expected.K)
					}
					if (fb.Block.Spec.SharedInter > 0) != c.Expected.Shared {
						t.Errorf("shared expert %d, want %v", fb.Block.Spec.SharedInter, c.Expected.Shared)
					}
				}
			}
			for _, n := range m.Proto.Graph.Node {
				if n.GetOpType() == "TopK" {
					t.Fatalf("TopK %q left after fusion", n.GetName())
				}
			}
			if errs := m.Graph().Validate(); len(errs) > 0 {
				t.Fatalf("output model invalid: %v", errs)
			}
			if err := m.Check(); err != nil {
				t.Fatalf("output model fails the checker: %v", err)
			}
			for _, in := range m.Proto.Graph.Input {
				if v := in.GetName(); m.Graph().Initializer(v) != nil && len(m.Graph().Consumers(v)) == 0 {
					t.Errorf("graph input %q is a weight no node reads any more", v)
				}
			}
			if m.Opset("") < 13 {
				t.Fatalf("output opset %d", m.Opset(""))
			}
			// Contrib ops outside the blocks stay in the output; the
			// reference evaluator runs their canonical decomposition.
			em := Evaluable(context.Background(), m)
			sets, _ := filepath.Glob(filepath.Join(refusalDir, c.Name+"_data", "test_data_set_*"))
			if len(sets) == 0 || (c.Sets > 0 && len(sets) != c.Sets) {
				t.Fatalf("%d golden sets, manifest says %d", len(sets), c.Sets)
			}
			for _, dir := range sets {
				ds, err := eval.ReadDataSet(dir)
				if err != nil {
					t.Fatal(err)
				}
				feeds, err := eval.Feeds(m, ds.Inputs, ds.InputNames)
				if err != nil {
					t.Fatal(err)
				}
				for _, body := range []bool{false, true} {
					out, err := eval.Run(context.Background(), em, feeds, eval.Options{PreferFunctions: body})
					if err != nil {
						t.Fatal(err)
					}
					for i, o := range m.Proto.Graph.Output {
						rtol, atol := 1e-4, 1e-5
						if c.Class == "fp16" {
							// the export computes in float16 behind float32
							// I/O; the fused node in float32: they agree to
							// float16's precision
							rtol, atol = 1e-2, 1e-2*maxAbs(ds.Outputs[i])
						}
						d, err := eval.Compare(out[o.GetName()], ds.Outputs[i], rtol, atol)
						if err != nil {
							t.Fatal(err)
						}
						if !d.OK() {
							t.Errorf("%s, function body %v: output %s differs from ONNX Runtime's golden output: %+v", filepath.Base(dir), body, o.GetName(), d)
						}
					}
				}
			}
		})
	}
	if n == 0 {
		t.Fatal("no export of the canonical classes in the manifest")
	}
}

// TestCanonicalNoFuseUntouched checks that a model canonicalization changes
// (a contrib op, a model-local function, an identity) but that has no MoE
// block is left byte-identical by Rewrite.
func TestCanonicalNoFuseUntouched(t *testing.T) {
	fn := &pb.FunctionProto{Name: proto.String("act"), Domain: proto.String("local"), Input: []string{"a"}, Output: []string{"o"},
		Node:        []*pb.NodeProto{graph.NewNode("Relu", "", "r", []string{"a"}, []string{"o"})},
		OpsetImport: []*pb.OperatorSetIdProto{{Domain: proto.String(""), Version: proto.Int64(17)}}}
	g := &pb.GraphProto{Name: proto.String("g"),
		Node: []*pb.NodeProto{
			graph.NewNode("QuickGelu", "com.microsoft", "q", []string{"x"}, []string{"q"}, graph.FloatAttr("alpha", 1)),
			graph.NewNode("Identity", "", "i", []string{"q"}, []string{"i"}),
			graph.NewNode("act", "local", "call", []string{"i"}, []string{"y"}),
		},
		Input:  []*pb.ValueInfoProto{{Name: proto.String("x"), Type: &pb.TypeProto{Value: &pb.TypeProto_TensorType{TensorType: &pb.TypeProto_Tensor{ElemType: proto.Int32(int32(pb.TensorProto_FLOAT))}}}}},
		Output: []*pb.ValueInfoProto{{Name: proto.String("y")}}}
	for _, opset := range []int64{17, 11} {
		mp := &pb.ModelProto{IrVersion: proto.Int64(8), Graph: proto.Clone(g).(*pb.GraphProto), Functions: []*pb.FunctionProto{proto.Clone(fn).(*pb.FunctionProto)},
			OpsetImport: []*pb.OperatorSetIdProto{{Domain: proto.String(""), Version: proto.Int64(opset)}, {Domain: proto.String("com.microsoft"), Version: proto.Int64(1)}, {Domain: proto.String("local"), Version: proto.Int64(1)}}}
		mp.Functions[0].OpsetImport[0].Version = proto.Int64(opset)
		m := &graph.Model{Proto: mp}
		before, _ := proto.Marshal(mp)
		rep, err := Rewrite(m, Options{Check: true})
		if err != nil {
			t.Fatal(err)
		}
		after, _ := proto.Marshal(m.Proto)
		if len(rep.Fused) != 0 || string(before) != string(after) {
			t.Fatalf("opset %d: a model without MoE was edited (fused %d)", opset, len(rep.Fused))
		}
		if !strings.Contains(string(after), "QuickGelu") {
			t.Fatal("contrib op lost")
		}
	}
}

// TestSpliceBoundaryInsideFunction wraps a whole one-layer model (the MoE
// block and the residual Add after it) into a model-local function: the
// block's output exists only inside the function, so the splice must copy
// the inlined rest of the call (the Add) into the output. The rewritten
// model must be valid, no longer call the function, and compute what the
// original computes.
func TestSpliceBoundaryInsideFunction(t *testing.T) {
	for _, shape := range []string{"batched", "unrolled"} {
		t.Run(shape, func(t *testing.T) {
			cfg := models.Config{Shape: shape, Layers: 1, Experts: 4, TopK: 2, Hidden: 8, Inter: 8, Router: "softmax", Normalize: true, Tokens: 6, Seed: 3}
			m, err := models.Build(cfg)
			if err != nil {
				t.Fatal(err)
			}
			gp := m.Proto.Graph
			f := &pb.FunctionProto{Name: proto.String("Layer"), Domain: proto.String("local"), Node: gp.Node,
				OpsetImport: append([]*pb.OperatorSetIdProto(nil), m.Proto.OpsetImport...)}
			call := &pb.NodeProto{OpType: proto.String("Layer"), Domain: proto.String("local"), Name: proto.String("layer0")}
			for _, in := range gp.Input {
				f.Input = append(f.Input, in.GetName())
				call.Input = append(call.Input, in.GetName())
			}
			for _, ti := range gp.Initializer {
				f.Input = append(f.Input, ti.GetName())
				call.Input = append(call.Input, ti.GetName())
			}
			for _, o := range gp.Output {
				f.Output = append(f.Output, o.GetName())
				call.Output = append(call.Output, o.GetName())
			}
			gp.Node = []*pb.NodeProto{call}
			gp.ValueInfo = nil
			m.Proto.Functions = append(m.Proto.Functions, f)
			m.SetOpset("local", 1)
			orig := &graph.Model{Proto: proto.Clone(m.Proto).(*pb.ModelProto)}

			rep, err := Rewrite(m, Options{Check: true})
			if err != nil {
				t.Fatal(err)
			}
			if len(rep.Fused) != 1 {
				t.Fatalf("fused %d blocks, want 1", len(rep.Fused))
			}
			if errs := m.Graph().Validate(); len(errs) > 0 {
				t.Fatalf("output invalid: %v", errs)
			}
			for _, n := range m.Proto.Graph.Node {
				if n.GetDomain() == "local" {
					t.Fatal("the function call is still in the output")
				}
			}
			for _, fn := range m.Proto.Functions {
				if fn.GetDomain() == "local" {
					t.Fatal("the function no node calls is still in the output")
				}
			}
			x := make([]float32, 6*8)
			for i := range x {
				x[i] = float32((i*37)%23)/11 - 1
			}
			feeds := map[string]*eval.Tensor{gp.Input[0].GetName(): eval.NewFloat32([]int{6, 8}, x)}
			want, err := eval.Run(context.Background(), orig, feeds, eval.Options{})
			if err != nil {
				t.Fatal(err)
			}
			for _, body := range []bool{false, true} {
				got, err := eval.Run(context.Background(), m, feeds, eval.Options{PreferFunctions: body})
				if err != nil {
					t.Fatal(err)
				}
				o := gp.Output[0].GetName()
				d, err := eval.Compare(got[o], want[o], 1e-4, 1e-5)
				if err != nil || !d.OK() {
					t.Fatalf("function body %v: rewritten differs from the original: %+v %v", body, d, err)
				}
			}
		})
	}
}

// TestCanonicalRewriteDeterministic rewrites each export of the canonical
// classes twice: the two outputs must be byte-identical.
func TestCanonicalRewriteDeterministic(t *testing.T) {
	files, _ := filepath.Glob(filepath.Join(refusalDir, "*.onnx"))
	n := 0
	for _, f := range files {
		base := filepath.Base(f)
		if !strings.HasPrefix(base, "functions_") && !strings.HasPrefix(base, "dynamo_raw_") && !strings.HasPrefix(base, "ort_extended_") && !strings.HasPrefix(base, "opset1") {
			continue
		}
		n++
		var outs [2][]byte
		for i := range outs {
			m, err := graph.Load(f)
			if err != nil {
				t.Fatal(err)
			}
			if _, err := Rewrite(m, Options{}); err != nil {
				t.Fatalf("%s: %v", base, err)
			}
			if outs[i], err = (proto.MarshalOptions{Deterministic: true}).Marshal(m.Proto); err != nil {
				t.Fatal(err)
			}
			m.Close()
		}
		if string(outs[0]) != string(outs[1]) {
			t.Errorf("%s: two rewrites differ", base)
		}
	}
	if n == 0 {
		t.Skip("no export of the canonical classes")
	}
}

// maxAbs returns the largest magnitude of t's elements.
func maxAbs(t *eval.Tensor) float64 {
	m := 0.0
	for j := 0; j < t.Len(); j++ {
		m = max(m, math.Abs(t.Float64At(j)))
	}
	return m
}

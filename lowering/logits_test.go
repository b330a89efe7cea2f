package lowering

import (
	"testing"

	"github.com/mokopt/mokopt/graph"
	"github.com/mokopt/mokopt/graph/eval"
	pb "github.com/mokopt/mokopt/graph/onnxpb"
	"github.com/mokopt/mokopt/moe"
	"google.golang.org/protobuf/proto"
)

// withLogits gives m's one fused node its optional router_logits output,
// a graph output, with the function body of that overload.
func withLogits(t *testing.T, m *graph.Model, s *moe.Spec) *graph.Model {
	t.Helper()
	s.RouterLogits = true
	n := m.Proto.Graph.Node[0]
	n.Output = append(n.Output, "router_logits")
	n.Overload = proto.String(s.Overload())
	f, err := moe.Function(s, 18)
	if err != nil {
		t.Fatal(err)
	}
	m.Proto.Functions = []*pb.FunctionProto{f}
	m.Proto.Graph.Output = append(m.Proto.Graph.Output, &pb.ValueInfoProto{Name: proto.String("router_logits")})
	return cloneModel(t, m)
}

// TestRouterLogitsOutput: a fused node with the router_logits output gives
// moe.RouterLogits through its reference kernel and its function body, and
// keeps giving them lowered to ONNX Runtime's MoE (a Gemm beside the op)
// and to the MoK kernel (the router's standard ops beside the kernel
// node), in float32 within 1e-5; the block output is unchanged.
func TestRouterLogitsOutput(t *testing.T) {
	for _, tc := range []struct {
		name string
		cfg  blockCfg
	}{
		{"softmax norm, shared", blockCfg{E: 8, K: 2, H: 256, I: 256, Is: 256, Norm: true, Seed: 11}},
		{"router bias, topk then softmax", blockCfg{E: 16, K: 4, H: 256, I: 256, RBias: true, Order: moe.TopKThenActivation, Seed: 12}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			m, s, w := buildFused(t, tc.cfg)
			m = withLogits(t, m, s)
			const T = testTokens
			x := randInput(T, s.Hidden, tc.cfg.Seed+3)
			ref, err := moe.RouterLogits(s, w, x, T)
			if err != nil {
				t.Fatal(err)
			}
			same := func(what string, got *eval.Tensor) {
				t.Helper()
				if got == nil {
					t.Fatalf("%s: no router_logits output", what)
				}
				d, err := eval.Compare(got, eval.NewFloat32([]int{T, s.NumExperts}, ref), 1e-5, 1e-5)
				if err != nil || !d.OK() {
					t.Fatalf("%s: router_logits differ from moe.RouterLogits: %+v %v", what, d, err)
				}
			}
			out, y := run(t, m, x, T, s.Hidden, eval.Options{})
			same("reference kernel", out["router_logits"])
			body, _ := run(t, m, x, T, s.Hidden, eval.Options{PreferFunctions: true})
			same("function body", body["router_logits"])

			o := cloneModel(t, m)
			if _, err := LowerORT(o, ORTOptions{}); err != nil {
				t.Fatal(err)
			}
			low, yo := run(t, o, x, T, s.Hidden, eval.Options{})
			same("lowered to ONNX Runtime's MoE", low["router_logits"])
			if d, _ := eval.Compare(eval.NewFloat32([]int{T, s.Hidden}, yo), eval.NewFloat32([]int{T, s.Hidden}, y), 1e-4, 1e-5); !d.OK() {
				t.Fatalf("lowered to ONNX Runtime: block output differs: %+v", d)
			}

			rep, path := lowerAndSave(t, m, defaultOpts(), t.TempDir(), "mok")
			if !rep.Blocks[0].Lowered {
				t.Fatalf("not lowered to MoK: %s", rep.Blocks[0].Reason)
			}
			mok, _ := run(t, loadForEval(t, path), x, T, s.Hidden, eval.Options{})
			same("lowered to the MoK kernel", mok["router_logits"])
		})
	}
}

package verify_test

import (
	"context"
	"strings"
	"testing"

	"github.com/mokopt/mokopt/graph"
	"github.com/mokopt/mokopt/graph/eval"
	pb "github.com/mokopt/mokopt/graph/onnxpb"
	"github.com/mokopt/mokopt/internal/fixtures"
	"github.com/mokopt/mokopt/internal/verify"
	"github.com/mokopt/mokopt/moe"
	"github.com/mokopt/mokopt/passes"
	"google.golang.org/protobuf/proto"
)

// brokenFixture is a Mixtral block (E=8, k=2, softmax -> top-k -> renormalise):
// with 64 random tokens every expert is routed to, so a change to any one
// expert shows in the output.
var brokenFixture = fixtures.Path("fixtures", "mixtral_block_dynamo_batched_mm.onnx")

// rewritten loads the fixture twice: the original and its fused rewrite.
func rewritten(t *testing.T) (orig, fused *graph.Model) {
	t.Helper()
	orig, err := graph.Load(brokenFixture)
	if err != nil {
		t.Fatal(err)
	}
	fused, err = graph.Load(brokenFixture)
	if err != nil {
		t.Fatal(err)
	}
	rep, err := passes.Rewrite(fused, passes.Options{Check: true})
	if err != nil {
		t.Fatal(err)
	}
	if len(rep.Fused) != 1 {
		t.Fatalf("fused %d blocks, want 1", len(rep.Fused))
	}
	fused.Path = "fused.onnx"
	return orig, fused
}

// fusedNode returns the model's only ai.mok::MoE node.
func fusedNode(t *testing.T, m *graph.Model) *pb.NodeProto {
	t.Helper()
	for _, n := range m.Proto.Graph.Node {
		if n.GetDomain() == moe.Domain && n.GetOpType() == moe.OpType {
			return n
		}
	}
	t.Fatal("no fused node")
	return nil
}

// editWeight decodes the initializer feeding input pos of the fused node,
// lets edit change it, and stores it back inline.
func editWeight(t *testing.T, m *graph.Model, pos int, edit func(w *eval.Tensor)) {
	t.Helper()
	n := fusedNode(t, m)
	name := n.Input[pos]
	for i, ini := range m.Proto.Graph.Initializer {
		if ini.GetName() != name {
			continue
		}
		w, err := eval.FromProto(ini, m.TensorBytes)
		if err != nil {
			t.Fatal(err)
		}
		edit(w)
		p, err := eval.ToProto(w, name)
		if err != nil {
			t.Fatal(err)
		}
		m.Proto.Graph.Initializer[i] = p
		return
	}
	t.Fatalf("input %d (%q) of the fused node is not an initializer", pos, name)
}

// swapExperts exchanges experts a and b of a stacked [E, ...] weight.
func swapExperts(w *eval.Tensor, a, b int) {
	per := w.Len() / w.Shape[0]
	for j := 0; j < per; j++ {
		w.F32[a*per+j], w.F32[b*per+j] = w.F32[b*per+j], w.F32[a*per+j]
	}
}

// TestVerifyCatchesBrokenRewrites checks that verify passes the true rewrite
// and fails each deliberately broken one, naming the block's output.
func TestVerifyCatchesBrokenRewrites(t *testing.T) {
	orig, good := rewritten(t)
	opt := verify.Options{Tokens: []int{1, 7, 64}, Seed: 3, RTol: verify.DefaultRTol, ATol: verify.DefaultATol}
	r, err := verify.Compare(context.Background(), good, orig, opt)
	if err != nil {
		t.Fatal(err)
	}
	if !r.Pass {
		t.Fatalf("the true rewrite fails verify:\n%s", r.Summary())
	}
	outName := orig.Proto.Graph.Output[0].GetName()
	cases := []struct {
		name   string
		break_ func(t *testing.T, m *graph.Model)
	}{
		{"perturb one expert weight by 1e-2", func(t *testing.T, m *graph.Model) {
			editWeight(t, m, moe.InGate, func(w *eval.Tensor) {
				per := w.Len() / w.Shape[0]
				w.F32[5*per+17] += 1e-2 // expert 5, one element
			})
		}},
		{"swap two experts", func(t *testing.T, m *graph.Model) {
			for _, pos := range []int{moe.InGate, moe.InUp, moe.InDown} {
				editWeight(t, m, pos, func(w *eval.Tensor) { swapExperts(w, 2, 6) })
			}
		}},
		{"drop the renormalisation", func(t *testing.T, m *graph.Model) {
			n := fusedNode(t, m)
			found := false
			for _, a := range n.Attribute {
				if a.GetName() == "normalize_topk" {
					if a.GetI() != 1 {
						t.Fatalf("fixture is not renormalised: normalize_topk=%d", a.GetI())
					}
					a.I = proto.Int64(0)
					found = true
				}
			}
			if !found {
				t.Fatal("no normalize_topk attribute")
			}
			// Keep the node self-consistent: its overload and function
			// body follow the changed attribute, as a buggy rewrite would.
			s, err := moe.SpecFromNode(n, moe.InitializerDims(m.Graph(), n))
			if err != nil {
				t.Fatal(err)
			}
			n.Overload = proto.String(s.Overload())
			f, err := moe.Function(s, m.Opset(""))
			if err != nil {
				t.Fatal(err)
			}
			m.Proto.Functions = append(m.Proto.Functions, f)
		}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			broken := &graph.Model{Proto: proto.Clone(good.Proto).(*pb.ModelProto), Path: "broken.onnx", Dir: good.Dir}
			tc.break_(t, broken)
			for _, body := range []bool{false, true} {
				o := opt
				o.Eval.PreferFunctions = body
				r, err := verify.Compare(context.Background(), broken, orig, o)
				if err != nil {
					t.Fatal(err)
				}
				if r.Pass {
					t.Fatalf("function body %v: broken rewrite passes verify:\n%s", body, r.Summary())
				}
				failed := 0
				for _, c := range r.Cases {
					if !c.Pass {
						failed++
						if !strings.Contains(c.Message, `"`+outName+`"`) || c.Outputs[0].Pass || c.Outputs[0].NameA != outName {
							t.Errorf("case %s does not name output %q: %q", c.Name, outName, c.Message)
						}
					}
				}
				if failed == 0 {
					t.Errorf("report fails with no failing case:\n%s", r.Summary())
				}
				if s := r.Summary(); !strings.Contains(s, outName) {
					t.Errorf("summary does not name %q: %s", outName, s)
				}
			}
		})
	}
}

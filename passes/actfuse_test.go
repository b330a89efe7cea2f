package passes

import (
	"context"
	"fmt"
	"math"
	"strings"
	"testing"

	"github.com/mokopt/mokopt/graph"
	"github.com/mokopt/mokopt/graph/eval"
	pb "github.com/mokopt/mokopt/graph/onnxpb"
	"github.com/mokopt/mokopt/models"
	"github.com/mokopt/mokopt/moe"
	"google.golang.org/protobuf/proto"
)

// respelledBlock builds one synthetic MoE block of the given shape whose
// expert activation is written as sp.
func respelledBlock(t testing.TB, shape string, sp models.Spelling, seed int64) *graph.Model {
	t.Helper()
	m, err := models.Build(models.Config{Shape: shape, Layers: 1, Experts: 4, TopK: 2, Hidden: 16, Inter: 8, Normalize: true, Tokens: 6, Seed: seed})
	if err != nil {
		t.Fatal(err)
	}
	if err := models.Respell(m, sp, 8); err != nil {
		t.Fatal(err)
	}
	return m
}

// actShapes are the shapes a case is fused in: gated activations also in
// the batched shape's fused gate_up Split.
func actShapes(gated bool) []string {
	if gated {
		return []string{models.ShapeDense, models.ShapeUnrolled, models.ShapeBatched}
	}
	return []string{models.ShapeDense, models.ShapeUnrolled}
}

// maxRelDiff is max |a−b| / (1 + max |a|).
func maxRelDiff(a, b []float32) float64 {
	d, s := 0.0, 0.0
	for i := range a {
		d = max(d, math.Abs(float64(a[i])-float64(b[i])))
		s = max(s, math.Abs(float64(a[i])))
	}
	return d / (1 + s)
}

// runOut evaluates m on feeds and returns its only output.
func runOut(t testing.TB, m *graph.Model, feeds map[string]*eval.Tensor, preferFunctions bool) []float32 {
	t.Helper()
	res, err := eval.Run(context.Background(), Evaluable(context.Background(), m), feeds, eval.Options{Kernels: evalKernels(), PreferFunctions: preferFunctions})
	if err != nil {
		t.Fatal(err)
	}
	o := res[m.Proto.Graph.Output[0].GetName()]
	if o == nil || o.F32 == nil {
		t.Fatalf("no float output %q", m.Proto.Graph.Output[0].GetName())
	}
	return o.F32
}

// checkActSpec fails the test unless s reads cs's activation with its
// parameters (Alpha 1 where the case leaves it 0).
func checkActSpec(t *testing.T, s *moe.Spec, cs models.ActCase) {
	t.Helper()
	p := cs.Params
	if p.Alpha == 0 {
		p.Alpha = 1
	}
	if s.Activation != cs.Act || s.ActParams() != p {
		t.Fatalf("fused as %s %+v, want %s %+v", s.Activation, s.ActParams(), cs.Act, p)
	}
}

// TestFuseActivations: a block with every activation of the table, in each
// spelling and shape, fuses (numerical check on) into one ai.mok::MoE node
// with that activation and its parameters, and the fused model, run by
// the reference semantics (moe.Forward) and by its function body,
// reproduces the original graph run in the interpreter.
func TestFuseActivations(t *testing.T) {
	for _, cs := range models.ActivationCases {
		def := moe.LookupActivation(cs.Act)
		for _, shape := range actShapes(def.Gated) {
			for si, sp := range cs.Spellings {
				if shape != models.ShapeDense && si > 1 {
					continue // every spelling in one shape, two in the others
				}
				t.Run(fmt.Sprintf("%s/%s/%s", cs.Act, shape, sp.Name), func(t *testing.T) {
					m := respelledBlock(t, shape, sp, int64(si+3))
					feeds, err := RandomFeeds(m, 7, 6)
					if err != nil {
						t.Fatal(err)
					}
					want := runOut(t, m, feeds, false)
					for _, v := range feeds {
						for i := range v.F32 { // reach the activations' tails and clamps
							v.F32[i] *= 8
						}
					}
					// A spelling that overflows float32 (see
					// TestFuseOverflowSpellings) may be infinite there:
					// it is then compared on the unscaled inputs.
					if w8 := runOut(t, m, feeds, false); allFinite(w8) {
						want = w8
					} else if feeds, err = RandomFeeds(m, 7, 6); err != nil {
						t.Fatal(err)
					}
					if !allFinite(want) { // else the comparison below would hold nothing
						t.Fatal("the original is not finite on the test inputs")
					}
					rep, err := Rewrite(m, Options{Check: true})
					if err != nil {
						t.Fatal(err)
					}
					if len(rep.Fused) != 1 {
						t.Fatalf("%d fused", len(rep.Fused))
					}
					checkActSpec(t, &rep.Fused[0].Block.Spec, cs)
					for _, pf := range []bool{false, true} {
						if d := maxRelDiff(want, runOut(t, m, feeds, pf)); d > 1e-4 {
							t.Errorf("fused (function body %v) differs from the original by %.3g", pf, d)
						}
					}
				})
			}
		}
	}
}

// TestFuseActivationUnknownRefused: a block whose activation no row
// computes is refused, naming the ops.
func TestFuseActivationUnknownRefused(t *testing.T) {
	sp := models.Spelling{Name: "x·tanh(x³)", Emit: func(b *moe.Builder, _, u string) string {
		return b.Op("Mul", []string{u, b.Op("Tanh", []string{b.Op("Pow", []string{u, b.Scalar(3)})})})
	}}
	m := respelledBlock(t, models.ShapeDense, sp, 1)
	_, err := Rewrite(m, Options{Check: true})
	if err == nil || !strings.Contains(err.Error(), "expert activation is not a known function (made of Pow, Tanh, Mul)") {
		t.Fatalf("want a refusal naming the ops, got %v", err)
	}
}

// TestSharedExpertActivation: the shared expert's activation is identified
// the same way: SwiGLU in another spelling is fused as the shared expert;
// a branch with another activation, which the contract's shared expert
// cannot carry, is left in the graph beside the fused block, and the model
// computes what it did.
func TestSharedExpertActivation(t *testing.T) {
	for _, tc := range []struct{ act, spelling, refuse string }{ // refuse: "left" when the branch stays in the graph
		{moe.SwiGLU, "tanh-half", ""},
		{moe.SwiGLU, "x-over-1-exp", ""},
		{moe.GeGLU, "erf-div", "left"},
		{moe.ReGLU, "max0", "left"},
	} {
		t.Run(tc.act+"/"+tc.spelling, func(t *testing.T) {
			var sp models.Spelling
			for _, s := range models.ActivationCase(tc.act).Spellings {
				if s.Name == tc.spelling {
					sp = s
				}
			}
			m, err := models.Build(models.Config{Shape: models.ShapeDense, Layers: 1, Experts: 4, TopK: 2, Hidden: 16, Inter: 8, SharedInter: 8, Normalize: true, Tokens: 6})
			if err != nil {
				t.Fatal(err)
			}
			if err := models.Respell(m, sp, 8); err != nil {
				t.Fatal(err)
			}
			feeds, err := RandomFeeds(m, 3, 6)
			if err != nil {
				t.Fatal(err)
			}
			want := runOut(t, m, feeds, false)
			rep, err := Rewrite(m, Options{Check: true})
			if err != nil {
				t.Fatal(err)
			}
			wantShared := 8
			if tc.refuse == "left" {
				wantShared = 0
			}
			if len(rep.Fused) != 1 || rep.Fused[0].Block.Spec.SharedInter != wantShared {
				t.Fatalf("want one block with shared width %d, got %+v", wantShared, rep.Fused)
			}
			if d := maxRelDiff(want, runOut(t, m, feeds, true)); d > 1e-4 {
				t.Fatalf("fused differs from the original by %.3g", d)
			}
		})
	}
}

// TestHalfPrecisionActivations: a synthetic block converted to float16 or
// bfloat16 whole (weights, constants, every op) fuses with its own
// activation, the exact and the tanh GELU apart, and matches the
// half-precision original to the type's precision.
func TestHalfPrecisionActivations(t *testing.T) {
	for _, act := range []string{moe.GELU, moe.GELUTanh, moe.GeGLU, moe.GeGLUTanh, moe.SiLU, moe.ReLU2, moe.SwiGLUOAI} {
		cs := models.ActivationCase(act)
		for _, dt := range []pb.TensorProto_DataType{pb.TensorProto_FLOAT16, pb.TensorProto_BFLOAT16} {
			t.Run(act+"/"+dt.String(), func(t *testing.T) {
				orig := respelledBlock(t, models.ShapeDense, cs.Spellings[1], 5)
				toHalf(t, orig, dt)
				fused := &graph.Model{Proto: proto.Clone(orig.Proto).(*pb.ModelProto), Path: "fused"}
				rep, err := Rewrite(fused, Options{Check: true})
				if err != nil {
					t.Fatal(err)
				}
				if len(rep.Fused) != 1 || rep.Fused[0].Block.Spec.Activation != act {
					t.Fatalf("fused %d blocks as %v, want one %s", len(rep.Fused), rep.Fused, act)
				}
				matchesHalf(t, orig, fused, dt, rep.Fused[0].Block.Spec)
			})
		}
	}
}

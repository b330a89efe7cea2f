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
)

// overflowSpellings are the spellings of models.ActivationCases written
// with Exp the way a hand port does, which overflow float32 to inf or NaN
// at large inputs where the function they spell is finite.
var overflowSpellings = [][2]string{
	{moe.Softplus, "naive"}, {moe.Softplus, "log1p-exp"}, {moe.Softplus, "neg-log-sigmoid"},
	{moe.SigmoidAct, "exp-ratio"}, {moe.SiLU, "exp-ratio"}, {moe.SiLU, "x-exp-over-1-exp"},
	{moe.Tanh, "exp2"}, {moe.Tanh, "exp-pair"}, {moe.GELUTanh, "pow-exp-tanh"}, {moe.GeGLUTanh, "pow-exp-tanh"},
	{moe.Swish, "exp-ratio"}, {moe.QuickGELU, "exp-ratio"}, {moe.Mish, "exp-only"}, {moe.Mish, "tanh-exp-softplus"},
	{moe.ELU, "mask-mul"}, {moe.CELU, "mask-mul"}, {moe.SELU, "mask-mul"}, {moe.SwiGLU, "exp-ratio"},
	{moe.QuickGeGLU, "exp-ratio"}, {moe.SwishGLU, "exp-ratio"},
}

// finiteSpellings are hand spellings of the same rows that stay finite
// (Where picks the finite branch, Reciprocal of inf is 0, a clip): they
// must fuse as well, excused nowhere.
var finiteSpellings = [][2]string{
	{moe.SigmoidAct, "div-exp"}, {moe.SigmoidAct, "reciprocal"}, {moe.SigmoidAct, "tanh-half"},
	{moe.SiLU, "reciprocal"}, {moe.SwiGLU, "reciprocal"}, {moe.Swish, "reciprocal-neg"}, {moe.ELU, "where-le"},
	{moe.CELU, "min-exp"}, {moe.HardSwish, "relu6-min-max"}, {moe.HardSwish, "relu6-relu-min"},
	{moe.HardSwish, "clip-hardsigmoid"}, {moe.GeGLUTanh, "pow"},
}

// spellingOf returns the spelling named name of activation act's case.
func spellingOf(t *testing.T, act, name string) models.Spelling {
	t.Helper()
	cs := models.ActivationCase(act)
	if cs == nil {
		t.Fatalf("no case for %s", act)
	}
	for _, sp := range cs.Spellings {
		if sp.Name == name {
			return sp
		}
	}
	t.Fatalf("%s has no spelling %q", act, name)
	return models.Spelling{}
}

// spellingNonFinite evaluates spelling sp of a gated or ungated activation
// alone at large inputs and reports whether any value is infinite or NaN.
func spellingNonFinite(t *testing.T, gated bool, sp models.Spelling) bool {
	t.Helper()
	_, m := actModelW(t, gated, sp.Opset, sp.MS, sp.Write)
	if m == nil {
		t.Fatal("the spelling does not run in the interpreter")
	}
	xs := []float32{-1000, -100, -50, 50, 100, 1000}
	feeds := map[string]*eval.Tensor{"u": eval.NewFloat32([]int{len(xs)}, xs)}
	if gated {
		feeds["g"] = eval.NewFloat32([]int{len(xs)}, xs)
		feeds["u"] = eval.NewFloat32([]int{len(xs)}, []float32{1, 1, 1, 1, 1, 1})
	}
	res, err := eval.Run(context.Background(), m, feeds, eval.Options{})
	if err != nil {
		t.Fatal(err)
	}
	for _, v := range res["a"].F32 {
		if math.IsNaN(float64(v)) || math.IsInf(float64(v), 0) {
			return true
		}
	}
	return false
}

// allFinite reports whether every element of v is finite.
func allFinite(v []float32) bool {
	for _, x := range v {
		if math.IsNaN(float64(x)) || math.IsInf(float64(x), 0) {
			return false
		}
	}
	return true
}

// TestFuseOverflowSpellings: hand spellings that overflow float32 at large
// inputs (a softplus as log(1 + eˣ), a tanh as (e²ˣ − 1)/(e²ˣ + 1), a SiLU
// as x·eˣ/(1 + eˣ), an ELU as masks times x and α(eˣ − 1), ...) are
// identified as the function they spell, as are finite hand spellings of
// the same rows; each fuses in the dense, unrolled and, gated, batched
// shapes, and the fused model, run by the reference semantics and by its
// function body, computes the original graph's numbers in the interpreter
// (on inputs where the original is finite). Each overflow spelling is
// checked to be non-finite at large inputs, so that the excuse is what
// lets it through.
func TestFuseOverflowSpellings(t *testing.T) {
	for _, list := range []struct {
		overflows bool
		cases     [][2]string
	}{{true, overflowSpellings}, {false, finiteSpellings}} {
		for _, c := range list.cases {
			def := moe.LookupActivation(c[0])
			sp := spellingOf(t, c[0], c[1])
			if got := spellingNonFinite(t, def.Gated, sp); got != list.overflows {
				t.Errorf("%s/%s: non-finite at large inputs %v, want %v", c[0], c[1], got, list.overflows)
				continue
			}
			for si, shape := range actShapes(def.Gated) {
				t.Run(fmt.Sprintf("%s/%s/%s", c[0], c[1], shape), func(t *testing.T) {
					fuseAndCompare(t, shape, sp, int64(si+5), c[0])
				})
			}
		}
	}
}

// fuseAndCompare builds a block of shape with activation spelling sp,
// fuses it (numerical check on) and compares the fused model with the
// original in the interpreter.
func fuseAndCompare(t *testing.T, shape string, sp models.Spelling, seed int64, act string) {
	t.Helper()
	m := respelledBlock(t, shape, sp, seed)
	feeds, err := RandomFeeds(m, uint64(seed), 6)
	if err != nil {
		t.Fatal(err)
	}
	for _, v := range feeds {
		for i := range v.F32 {
			v.F32[i] *= 4
		}
	}
	want := runOut(t, m, feeds, false)
	if !allFinite(want) {
		t.Fatal("the original is not finite on the test inputs")
	}
	rep, err := Rewrite(m, Options{Check: true})
	if err != nil {
		t.Fatal(err)
	}
	if len(rep.Fused) != 1 || rep.Fused[0].Block.Spec.Activation != act {
		t.Fatalf("fused %d blocks %v, want one %s", len(rep.Fused), rep.Fused, act)
	}
	for _, pf := range []bool{false, true} {
		got := runOut(t, m, feeds, pf)
		if d := maxRelDiff(want, got); !allFinite(got) || d > 1e-4 {
			t.Errorf("fused (function body %v) differs from the original by %.3g", pf, d)
		}
	}
}

// TestFuseOverflowSpellingsRefused: a spelling that overflows like the
// accepted ones but computes another function (a wrong constant) is not
// excused into a row: the block is refused, naming the ops and how many
// probes were not finite.
func TestFuseOverflowSpellingsRefused(t *testing.T) {
	op := func(b *moe.Builder, o string, in ...string) string { return b.Op(o, in) }
	sc := func(b *moe.Builder, f float32) string { return b.Scalar(f) }
	cases := []struct {
		name   string
		emit   func(b *moe.Builder, g, u string) string
		reason string
	}{
		{"softplus log(2 + eˣ)", func(b *moe.Builder, _, u string) string {
			return op(b, "Log", op(b, "Add", sc(b, 2), op(b, "Exp", u)))
		}, "expert activation is not a known function (made of Exp, Add, Log): it is infinite or NaN at"},
		{"tanh (e²ˣ − 1)/(e²ˣ + 2)", func(b *moe.Builder, _, u string) string {
			e := op(b, "Exp", op(b, "Mul", u, sc(b, 2)))
			return op(b, "Div", op(b, "Sub", e, sc(b, 1)), op(b, "Add", e, sc(b, 2)))
		}, "expert activation is not a known function (made of Mul, Exp, Sub, Add, Div): it is infinite or NaN at"},
		{"sigmoid eˣ/(1.01 + eˣ)", func(b *moe.Builder, _, u string) string {
			e := op(b, "Exp", u)
			return op(b, "Div", e, op(b, "Add", sc(b, 1.01), e))
		}, "expert activation is not a known function (made of Exp, Add, Div): it is infinite or NaN at"},
		{"silu x·eˣ/(2 + eˣ)", func(b *moe.Builder, _, u string) string {
			e := op(b, "Exp", u)
			return op(b, "Div", op(b, "Mul", u, e), op(b, "Add", e, sc(b, 2)))
		}, "expert activation is not a known function (made of Exp, Mul, Add, Div): it is infinite or NaN at"},
		{"elu masks with eˣ − 2", func(b *moe.Builder, _, u string) string {
			toF := graph.IntAttr("to", int64(pb.TensorProto_FLOAT))
			pos := b.Op("Cast", []string{op(b, "Greater", u, sc(b, 0))}, toF)
			neg := b.Op("Cast", []string{op(b, "LessOrEqual", u, sc(b, 0))}, toF)
			return op(b, "Add", op(b, "Mul", u, pos), op(b, "Mul", op(b, "Sub", op(b, "Exp", u), sc(b, 2)), neg))
		}, "not a known function (made of Greater, Cast, LessOrEqual, Mul, Exp, Sub, Add): it is infinite or NaN at 2 of its"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			m := respelledBlock(t, models.ShapeDense, models.Spelling{Name: tc.name, Emit: tc.emit}, 2)
			_, err := Rewrite(m, Options{Check: true})
			if err == nil || !strings.Contains(err.Error(), tc.reason) {
				t.Fatalf("want a refusal containing %q, got %v", tc.reason, err)
			}
		})
	}
}

// TestActScoreOverflowExcuse holds the rule that excuses a spelling's
// overflow: a probe where the graph is infinite or NaN and the row finite
// is excused only at |x| ≥ actOverflowMin, only while at most a third of
// the probes are excused, and only if every finite probe agrees.
func TestActScoreOverflowExcuse(t *testing.T) {
	def := moe.LookupActivation(moe.Softplus)
	p := moe.ActParams{Alpha: 1}
	// 12 probes: 8 small, 4 large.
	u := []float64{-3, -2, -1, -0.5, 0, 0.5, 1, 2, 10, 20, 50, 100}
	ref := func() []float64 {
		y := make([]float64, len(u))
		for i, x := range u {
			y[i] = def.Eval(0, x, p)
		}
		return y
	}
	cases := []struct {
		name  string
		edit  func(y []float64)
		units []float64 // overrides u when set
		ok    bool
	}{
		{"exact", func([]float64) {}, nil, true},
		{"inf at the 4 large probes (a third)", func(y []float64) { y[8], y[9], y[10], y[11] = math.Inf(1), math.Inf(1), math.NaN(), math.Inf(1) }, nil, true},
		{"inf at a small probe", func(y []float64) { y[7] = math.Inf(1) }, nil, false},
		{"NaN at x = 8, below the bound", func(y []float64) { y[7] = math.NaN() }, []float64{-3, -2, -1, -0.5, 0, 0.5, 1, 8, 10, 20, 50, 100}, false},
		{"overflow excused but a finite probe off", func(y []float64) { y[10], y[11] = math.Inf(1), math.Inf(1); y[2] *= 1.01 }, nil, false},
		{"a finite large probe off", func(y []float64) { y[11] = 101 }, nil, false},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			saved := u
			if tc.units != nil {
				u = tc.units
			}
			defer func() { u = saved }()
			y := ref()
			tc.edit(y)
			sc := actScore(def, p, nil, u, y, 0x1p-23)
			if ok := !math.IsInf(sc, 1); ok != tc.ok {
				t.Fatalf("score %v: accepted %v, want %v", sc, ok, tc.ok)
			}
		})
	}
	// More than a third excused: 5 large probes non-finite of 13.
	u2 := append([]float64{}, u...)
	u2 = append(u2, 1000)
	y := make([]float64, len(u2))
	for i, x := range u2 {
		y[i] = def.Eval(0, x, p)
		if x >= actOverflowMin {
			y[i] = math.Inf(1)
		}
	}
	if sc := actScore(def, p, nil, u2, y, 0x1p-23); !math.IsInf(sc, 1) {
		t.Fatalf("5 of 13 probes excused: score %v, want a refusal", sc)
	}
}

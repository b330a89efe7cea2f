package passes

import (
	"math"
	"slices"

	pb "github.com/mokopt/mokopt/graph/onnxpb"
	"github.com/mokopt/mokopt/moe"
)

// An expert's activation is identified by what it computes: the elementwise
// subgraph between the first-layer projection(s) and the down projection
// (actSubgraph) is evaluated on probe values and compared with every row
// of moe.Activations. Spellings do not matter; a function no row computes
// is refused naming its ops.

// actID is an identified activation: its table row, its parameters and,
// for a gated one, whether the subgraph's second input is the gate.
type actID struct {
	def   *moe.ActivationDef
	p     moe.ActParams
	swap  bool
	score float64 // the largest error in units of the tolerance (≤ 1)
}

// actProbeBase are the magnitudes probed (each with both signs, and 0):
// a subnormal, near zero, the range where the exact and tanh GELU differ
// most (|x| 1.5..3.5, by up to ~2e-4), the tails, and large values.
var actProbeBase = []float64{1e-40, 1e-30, 1e-6, 1e-3, 0.1, 0.25, 0.5, 0.75, 1, 1.25, 1.5, 1.75, 2, 2.25, 2.5,
	2.75, 3, 3.25, 3.5, 4, 4.5, 5, 6, 8, 10, 15, 20, 30, 50, 100, 1000}

// actProbeOther are the magnitudes probed for the other input of a gated
// activation while one input runs over actProbeBase.
var actProbeOther = []float64{1e-30, 1e-3, 0.5, 1, 2.5, 3, 30, 1000}

// actProbes returns 0, ±mags and, around each scalar constant s the
// subgraph reads (a clamp limit, say), ±s/2, ±s, ±1.5s.
func actProbes(mags, scalars []float64) []float32 {
	vals := []float64{0}
	add := func(m float64) { vals = append(vals, m, -m) }
	for _, m := range mags {
		add(m)
	}
	for _, s := range scalars {
		if s = math.Abs(s); s > 1e-3 && s < 1e4 {
			add(s / 2)
			add(s)
			add(1.5 * s)
		}
	}
	out := make([]float32, len(vals))
	for i, v := range vals {
		out[i] = float32(v)
	}
	slices.Sort(out)
	return slices.Compact(out)
}

// actParamCands lists the parameters to try for row d: alpha and limit
// candidates are the subgraph's scalar constants; an alpha may also be
// written negated or as its reciprocal (x/(1+e^(−β·x)) reads −β, x·σ(x/τ)
// reads τ = 1/β). −1 is always tried: a negation is a Neg, with no
// constant (x·σ(−x)).
func actParamCands(d *moe.ActivationDef, scalars []float64) []moe.ActParams {
	alphas := []float32{1}
	if d.Alpha {
		alphas = append(alphas, -1)
		for _, s := range scalars {
			if s == 0 {
				continue
			}
			for _, a := range []float64{s, -s, 1 / s, -1 / s} {
				if a32 := float32(a); a32 != 1 && !math.IsInf(float64(a32), 0) && a32 != 0 && !slices.Contains(alphas, a32) {
					alphas = append(alphas, a32)
				}
			}
		}
	}
	var limits []float32
	if d.Limit != moe.LimitRequired {
		limits = append(limits, 0)
	}
	if d.Limit != moe.LimitNone {
		for _, s := range scalars {
			if l := float32(math.Abs(s)); l != 0 && !slices.Contains(limits, l) {
				limits = append(limits, l)
			}
		}
	}
	var out []moe.ActParams
	for _, a := range alphas {
		for _, l := range limits {
			out = append(out, moe.ActParams{Alpha: a, Limit: l})
		}
	}
	return out
}

// actOverflowMin is the smallest probe magnitude at which a non-finite
// value of the subgraph may be excused: a spelling written with Exp (a
// softplus as log(1 + eˣ), a tanh as (e²ˣ − 1)/(e²ˣ + 1)) overflows float32
// in its tails, where the function it spells is finite.
const actOverflowMin = 9.5

// actScore compares row d (parameters p; gate and up as given) with the
// evaluated outputs y: the largest error in units of the tolerance, or
// +Inf as soon as one probe is outside it. A probe where y is infinite or
// NaN, the row is finite and an input is at least actOverflowMin in
// magnitude is excused (the spelling overflowed there), provided at most a
// third of the probes are; every finite probe must agree.
func actScore(d *moe.ActivationDef, p moe.ActParams, g, u, y []float64, eps float64) float64 {
	rtol, atol := max(d.RTol, 2*eps), max(d.ATol, 2*eps) // eps: of the constants' type
	worst, excused := 0.0, 0
	for i := range y {
		gi := 0.0
		if g != nil {
			gi = g[i]
		}
		want := d.Eval(gi, u[i], p)
		got := y[i]
		wantFinite, gotFinite := !math.IsNaN(want) && !math.IsInf(want, 0), !math.IsNaN(got) && !math.IsInf(got, 0)
		if !gotFinite && wantFinite && max(math.Abs(gi), math.Abs(u[i])) >= actOverflowMin {
			excused++
			continue
		}
		if !wantFinite || !gotFinite {
			if want == got || math.IsNaN(want) && math.IsNaN(got) {
				continue
			}
			return math.Inf(1)
		}
		tol := rtol*math.Abs(want) + atol*(1+math.Abs(gi))*(1+math.Abs(u[i]))
		e := math.Abs(got-want) / tol
		if e > 1 {
			return math.Inf(1)
		}
		worst = max(worst, e)
	}
	if 3*excused > len(y) {
		return math.Inf(1)
	}
	return worst
}

// actNonFinite counts the probes where the subgraph's value is infinite or
// NaN, for the refusal of a function no row computes.
func actNonFinite(y []float64) int {
	n := 0
	for _, v := range y {
		if math.IsNaN(v) || math.IsInf(v, 0) {
			n++
		}
	}
	return n
}

// identifyAct evaluates the activation subgraph on probes and returns the
// table row it computes. With want, only want's row and parameters are
// tried (the other experts of a block whose first expert was identified),
// to tell which input is the gate.
func (c *ctx) identifyAct(a *actGraph, want *actID) (*actID, error) {
	key := a.key()
	if id, ok := c.actMemo[key]; ok {
		if want != nil && (id.def != want.def || id.p != want.p) {
			return nil, rejectf("expert activation %s (ops: %s) differs from the first expert's %s", id.def.Name, a.opsList(), want.def.Name)
		}
		return id, nil
	}
	id, err := c.identifyActEval(a, want)
	if err == nil && want == nil {
		if c.actMemo == nil {
			c.actMemo = map[string]*actID{}
		}
		c.actMemo[key] = id
	}
	return id, err
}

// identifyActEval is identifyAct without the memo.
func (c *ctx) identifyActEval(a *actGraph, want *actID) (*actID, error) {
	gated := len(a.ins) == 2
	P := actProbes(actProbeBase, a.scalars)
	var cols [][]float32
	if gated {
		Q := actProbes(actProbeOther, a.scalars)
		x0 := make([]float32, 0, 2*len(P)*len(Q))
		x1 := make([]float32, 0, 2*len(P)*len(Q))
		for _, p := range P {
			for _, q := range Q {
				x0, x1 = append(x0, p, q), append(x1, q, p)
			}
		}
		cols = [][]float32{x0, x1}
	} else {
		cols = [][]float32{P}
	}
	ins, y, err := a.run(c, cols)
	if err != nil {
		return nil, err
	}
	eps := floatEps(a.low)
	var fits []*actID
	try := func(d *moe.ActivationDef, p moe.ActParams) {
		for _, swap := range []bool{false, true} {
			if swap && !gated {
				break
			}
			g, u := ins[0], []float64(nil)
			switch {
			case !gated:
				g, u = nil, ins[0]
			case swap:
				g, u = ins[1], ins[0]
			default:
				u = ins[1]
			}
			if sc := actScore(d, p, g, u, y, eps); !math.IsInf(sc, 1) {
				fits = append(fits, &actID{def: d, p: p, swap: swap, score: sc})
			}
		}
	}
	if want != nil {
		try(want.def, want.p)
	} else {
		for i := range moe.Activations {
			d := &moe.Activations[i]
			if d.Gated != gated {
				continue
			}
			for _, p := range actParamCands(d, a.scalars) {
				try(d, p)
			}
		}
	}
	var best *actID
	for _, f := range fits {
		if best == nil || actBetter(f, best) {
			best = f
		}
	}
	switch {
	case best == nil && want != nil:
		return nil, rejectf("expert activation (ops: %s) differs from the first expert's %s", a.opsList(), want.def.Name)
	case best == nil:
		if n := actNonFinite(y); n > 0 {
			return nil, rejectf("expert activation is not a known function (made of %s): it is infinite or NaN at %d of its %d probe values", a.opsList(), n, len(y))
		}
		return nil, rejectf("expert activation is not a known function (made of %s)", a.opsList())
	}
	// Where the row fits both assignments of the two projections (a
	// symmetric function, bilinear g·u), they compute the same: the first
	// projection is taken as the gate.
	for _, f := range fits {
		if f.def == best.def && f.p == best.p && !f.swap {
			return f, nil
		}
	}
	return best, nil
}

// actBetter reports whether fit f is preferred to fit b: a row without
// parameters over a parametrised one (both fit only where they compute the
// same function: SiLU and Swish with β = 1, QuickGELU and β = 1.702), else
// the smaller error; on a tie the row earlier in the table stays.
func actBetter(f, b *actID) bool {
	if fp, bp := f.def.Parametrised(), b.def.Parametrised(); fp != bp {
		return !fp
	}
	return f.score < b.score
}

// expertAct identifies the activation between first-layer values ins and
// the down projection's input out. With analyse it is written into s;
// otherwise it must be s's (another expert of the same block).
func (c *ctx) expertAct(out string, ins []string, dt pb.TensorProto_DataType, s *moe.Spec, analyse bool) (*actID, error) {
	a, err := c.actSubgraph(out, ins, dt)
	if err != nil {
		return nil, err
	}
	var want *actID
	if !analyse {
		if d := s.ActivationDef(); d != nil {
			want = &actID{def: d, p: s.ActParams()}
		}
	}
	id, err := c.identifyAct(a, want)
	if err != nil {
		return nil, err
	}
	if analyse {
		s.Activation, s.SwiGLUAlpha, s.SwiGLULimit = id.def.Name, id.p.Alpha, id.p.Limit
	}
	return id, nil
}

// actType is the element type the activation's probes are fed in: that of
// the first-layer projection's output, else of its activation input, else
// float32.
func (c *ctx) actType(e *emm) pb.TensorProto_DataType {
	for _, v := range []string{e.out, e.act} {
		if dt := c.elemType(v); isFloatType(dt) {
			return dt
		}
	}
	return pb.TensorProto_FLOAT
}

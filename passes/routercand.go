package passes

import (
	"fmt"
	"math"
	"slices"

	"github.com/mokopt/mokopt/graph/eval"
	pb "github.com/mokopt/mokopt/graph/onnxpb"
	"github.com/mokopt/mokopt/moe"
)

// The routers the fused op's contract expresses, as candidates for
// routerByEval: every combination of router_activation (softmax, sigmoid),
// router_order, normalize_topk, a correction bias (each constant vector
// the graph adds to the scores before the top-k, or none) and expert
// groups (as groupInfo reads them from a group mask, or none). The
// routed_scaling_factor is not enumerated: it is fitted from the ratio of
// the graph's weights to the candidate's, then confirmed. Candidates the
// op walk read come first, so that where two readings are the same
// function (a softmax over the k selected logits and a renormalised
// softmax top-k) the walk's stands.

// refRouting is a candidate's reference routing on the probe logits.
type refRouting struct {
	ids   [][]int
	w     [][]float32
	skip  []bool // near ties, not compared
	idxOK bool   // the graph's TopK selects the same experts
}

// routerCandidates lists the contract's routers for the block's TopK with
// their reference routings on run's probe logits.
//
// The references are computed lazily, by the function returned: the
// first candidate usually matches.
func (c *ctx) routerCandidates(tk *pb.NodeProto, ri *routerInfo, run *routingRun, postBias []float32) ([]routerCand, func(int) *refRouting) {
	acts, orders := []string{moe.Softmax, moe.Sigmoid}, []string{moe.ActivationThenTopK, moe.TopKThenActivation}
	if ri.act == moe.Sigmoid {
		acts = []string{moe.Sigmoid, moe.Softmax}
	}
	if !ri.generic && ri.act == "" {
		orders = []string{moe.TopKThenActivation, moe.ActivationThenTopK}
	}
	corrs := c.corrCandidates(tk, ri, run)
	groups := c.groupCandidates(tk, ri)
	var cands []routerCand
	for _, act := range acts {
		for _, order := range orders {
			for _, norm := range []bool{false, true} {
				base := moe.Spec{NumExperts: run.E, TopK: run.k, Hidden: run.E, RouterActivation: act, RouterOrder: order,
					NormalizeTopK: norm, RoutedScalingFactor: 1, NGroup: 1, TopKGroup: 1, EPSize: 1}
				if order == moe.TopKThenActivation {
					cands = append(cands, routerCand{spec: base})
					continue
				}
				for _, corr := range corrs {
					for _, g := range groups {
						s := base
						s.NGroup, s.TopKGroup, s.GroupScore = g.NGroup, g.TopKGroup, g.GroupScore
						cands = append(cands, routerCand{spec: s, corr: corr})
					}
				}
			}
		}
	}
	refs := make([]*refRouting, len(cands))
	ref := func(i int) *refRouting {
		if refs[i] == nil {
			refs[i] = c.reference(cands[i], run, postBias)
		}
		return refs[i]
	}
	return cands, ref
}

// corrCandidates lists the correction biases to try: none, and each
// constant vector of the TopK's width added to the scores before the top-k
// (the op walk's first).
func (c *ctx) corrCandidates(tk *pb.NodeProto, ri *routerInfo, run *routingRun) []*pb.TensorProto {
	out := []*pb.TensorProto{nil}
	if ri.corr != nil {
		out = []*pb.TensorProto{ri.corr, nil}
	}
	var adds []*pb.NodeProto
	for n := range c.backwardTo(tk.Input[0], isLinear) {
		if n.GetOpType() == "Add" && len(n.Input) == 2 && run.vals[n.Output[0]] != nil {
			adds = append(adds, n)
		}
	}
	c.sortByOrder(adds)
	for _, n := range adds {
		for _, in := range n.Input {
			t := c.constTensor(in)
			if t != nil && vectorLike(t) && int(t.GetDims()[len(t.GetDims())-1]) == run.E && !slices.Contains(out, t) {
				out = append(out, t)
			}
		}
	}
	return out
}

// groupCandidates lists the expert groupings to try: none, and what
// groupInfo reads behind each group mask (Where) on the way to the TopK
// (the op walk's first).
func (c *ctx) groupCandidates(tk *pb.NodeProto, ri *routerInfo) []moe.Spec {
	one := moe.Spec{NGroup: 1, TopKGroup: 1}
	out := []moe.Spec{one}
	add := func(r *routerInfo) {
		g := moe.Spec{NGroup: r.nGroup, TopKGroup: r.topkGroup}
		if r.groupMax {
			g.GroupScore = moe.GroupScoreMax
		}
		if r.nGroup > 1 && !slices.Contains(out, g) {
			out = append(out, g)
		}
	}
	add(ri)
	if ri.nGroup > 1 {
		out[0], out[1] = out[1], out[0]
	}
	var wheres []*pb.NodeProto
	for n := range c.backwardTo(tk.Input[0], isLinear) {
		if n.GetOpType() == "Where" {
			wheres = append(wheres, n)
		}
	}
	c.sortByOrder(wheres)
	for _, w := range wheres {
		r := &routerInfo{nGroup: 1, topkGroup: 1}
		if c.groupInfo(w, r) == nil {
			add(r)
		}
	}
	return out
}

// reference computes a candidate's routing on the probe logits (the router
// linear an identity, so that the logits are the probe's), with the
// tokens whose selection is a near tie at the logits' precision marked to
// be skipped.
func (c *ctx) reference(cd routerCand, run *routingRun, postBias []float32) *refRouting {
	s := cd.spec
	E := run.E
	if E != run.W {
		return &refRouting{}
	}
	eye := make([]float32, E*E)
	for i := 0; i < E; i++ {
		eye[i*E+i] = 1
	}
	w := &moe.Weights{RouterW: eye, RouterB: postBias, CorrectionBias: c.corrOf(cd)}
	if s.NGroup > 1 && (E%s.NGroup != 0 || s.TopKGroup < 1 || s.TopKGroup > s.NGroup) || s.TopK > E {
		return &refRouting{}
	}
	ids, ws := moe.Route(&s, w, run.logits, run.T)
	r := &refRouting{ids: ids, w: ws, skip: make([]bool, run.T), idxOK: true}
	if run.half {
		// Rounded logits can tie; float32 probes have no ties.
		for t, g := range moe.RouteGaps(&s, w, run.logits, run.T) {
			r.skip[t] = g < 2e-2
		}
	}
	for t := 0; t < run.T; t++ {
		if r.skip[t] {
			continue
		}
		got := slices.Clone(run.idx[t*run.k : (t+1)*run.k])
		want := make([]int64, len(ids[t]))
		for i, e := range ids[t] {
			want[i] = int64(e)
		}
		slices.Sort(got)
		slices.Sort(want)
		if !slices.Equal(got, want) {
			r.idxOK = false
		}
	}
	return r
}

// matches reports whether the evaluated value t holds a candidate's
// routing weights (per token and choice, aligned with the TopK's indices,
// or scattered into a [.., E] routing matrix) up to a constant positive
// scale, and returns the scale.
func (run *routingRun) matches(ref *refRouting, t *eval.Tensor) (float32, bool) {
	if ref == nil || !ref.idxOK || !run.fits(t) {
		return 0, false
	}
	var got, want []float32
	switch {
	case run.aligned(t):
		for tok := 0; tok < run.T; tok++ {
			if ref.skip[tok] {
				continue
			}
			for j := 0; j < run.k; j++ {
				e := int(run.idx[tok*run.k+j])
				got = append(got, t.F32[tok*run.k+j])
				want = append(want, ref.weightOf(tok, e))
			}
		}
	case len(t.F32) == run.T*run.E && t.Shape[len(t.Shape)-1] == run.E:
		for tok := 0; tok < run.T; tok++ {
			if ref.skip[tok] {
				continue
			}
			for e := 0; e < run.E; e++ {
				got = append(got, t.F32[tok*run.E+e])
				want = append(want, ref.weightOf(tok, e))
			}
		}
	default:
		return 0, false
	}
	return fitScale(got, want, run.half)
}

// aligned reports whether t holds one value per token and choice.
func (run *routingRun) aligned(t *eval.Tensor) bool {
	return len(t.F32) == run.T*run.k && (t.Shape[len(t.Shape)-1] == run.k || len(t.Shape) == 1)
}

// fits reports whether t could hold routing weights: float values, one
// per token and choice or one per token and expert.
func (run *routingRun) fits(t *eval.Tensor) bool {
	if t == nil || t.F32 == nil || len(t.Shape) == 0 {
		return false
	}
	return run.aligned(t) || len(t.F32) == run.T*run.E && t.Shape[len(t.Shape)-1] == run.E
}

// weightOf is the reference weight of expert e for token t (0 when not
// selected).
func (r *refRouting) weightOf(t, e int) float32 {
	for i, x := range r.ids[t] {
		if x == e {
			return r.w[t][i]
		}
	}
	return 0
}

// fitScale fits got ≈ scale·want by least squares and confirms it
// elementwise. The scale written is the shortest decimal (1 first) that
// still confirms, so that a factor of 2.5 is 2.5 however the graph rounds.
func fitScale(got, want []float32, half bool) (float32, bool) {
	var gw, ww float64
	for i := range got {
		gw += float64(got[i]) * float64(want[i])
		ww += float64(want[i]) * float64(want[i])
	}
	if ww == 0 || len(got) == 0 {
		return 0, false
	}
	fit := gw / ww
	if math.IsNaN(fit) || math.IsInf(fit, 0) || fit <= 0 {
		return 0, false
	}
	rtol, atol := 1e-4, 1e-6
	if half {
		rtol, atol = 4e-2, 4e-3
	}
	try := []float64{1}
	for digits := 1; digits <= 8; digits++ {
		p := math.Pow(10, float64(digits)-1-math.Floor(math.Log10(fit)))
		try = append(try, math.Round(fit*p)/p)
	}
	try = append(try, fit)
	scaled := make([]float32, len(want))
	for _, sc := range try {
		for i, v := range want {
			scaled[i] = float32(sc * float64(v))
		}
		if closeTo(got, scaled, rtol, atol) {
			return float32(sc), true
		}
	}
	return 0, false
}

// explain says what the router computes that no candidate expresses.
func (run *routingRun) explain(cands []routerCand, ref func(int) *refRouting) string {
	if why := run.wideSoftmax(); why != "" {
		return why
	}
	if run.E != run.W {
		return fmt.Sprintf("the router's linear layer has %d outputs but the TopK ranks %d scores made from them in a way no router of ai.mok::MoE reproduces (for example a softmax over all %d outputs, those that are no expert's included, before the top-k over %d)", run.W, run.E, run.W, run.E)
	}
	for i := range cands {
		r := ref(i)
		if r.idxOK && run.rawLogits(r) {
			return "no router activation: the weights applied to the experts' outputs are the router logits themselves (times a constant), not their softmax or sigmoid, which ai.mok::MoE cannot express"
		}
		if r.idxOK {
			s := cands[i].spec
			return fmt.Sprintf("the TopK selects the experts a %s %s router selects, but the weights applied to the experts' outputs are none of ai.mok::MoE's (the %s scores, renormalised or not, times a constant)", s.RouterActivation, s.RouterOrder, s.RouterActivation)
		}
	}
	return "the experts the TopK selects on probe router logits are not those of any router ai.mok::MoE expresses (the top-k of the router logits or of their softmax or sigmoid, with or without a correction bias added and expert groups)"
}

// rawLogits reports whether a value that depends on the TopK holds the
// selected router logits themselves, up to a constant scale (the routing
// weights then have no activation).
func (run *routingRun) rawLogits(r *refRouting) bool {
	raw := &refRouting{ids: r.ids, w: make([][]float32, run.T), skip: r.skip, idxOK: true}
	for t := range raw.w {
		raw.w[t] = make([]float32, len(r.ids[t]))
		for i, e := range r.ids[t] {
			raw.w[t][i] = run.logits[t*run.W+e]
		}
	}
	for _, v := range run.order {
		if run.dep[v] {
			if _, ok := run.matches(raw, run.vals[v]); ok {
				return true
			}
		}
	}
	return false
}

// nullExperts reports whether t holds a candidate's weights with those of
// experts n and above zeroed (null experts, which contribute nothing), and
// returns n.
func (run *routingRun) nullExperts(cands []routerCand, ref func(int) *refRouting, t *eval.Tensor) (int, bool) {
	if !run.aligned(t) {
		return 0, false
	}
	for i := range cands {
		r := ref(i)
		if !r.idxOK {
			continue
		}
		n := run.E
		var got, want []float32
		for tok := 0; tok < run.T; tok++ {
			for j := 0; j < run.k; j++ {
				e, g := int(run.idx[tok*run.k+j]), t.F32[tok*run.k+j]
				if g == 0 && r.weightOf(tok, e) != 0 {
					n = min(n, e)
					continue
				}
				got, want = append(got, g), append(want, r.weightOf(tok, e))
			}
		}
		if n == run.E || n == 0 {
			continue
		}
		ok := true
		for tok := 0; tok < run.T && ok; tok++ {
			for j := 0; j < run.k; j++ {
				if e := int(run.idx[tok*run.k+j]); e >= n && t.F32[tok*run.k+j] != 0 {
					ok = false
				}
			}
		}
		if _, fit := fitScale(got, want, run.half); ok && fit {
			return n, true
		}
	}
	return 0, false
}

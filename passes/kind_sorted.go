package passes

import (
	"github.com/mokopt/mokopt/graph"
	pb "github.com/mokopt/mokopt/graph/onnxpb"
	"github.com/mokopt/mokopt/moe"
)

// KindSorted is sort-based grouped dispatch (the MegaBlocks shape, as
// JetMoE's and GraniteMoE's ParallelExperts write it): the token/expert
// pairs are sorted by expert id, the tokens gathered in that order and split
// into one contiguous group per expert by the per-expert counts, each group
// goes through its expert's projections, and the weighted results are
// scattered back to token order with an additive scatter.
const KindSorted = "sorted"

// sortedDispatch is the dispatch machinery of a sort-based block.
type sortedDispatch struct {
	perm   string // the sort's permutation of the token/expert pairs
	tok    string // token of each sorted pair (perm div top_k)
	gates  string // routing weight of each sorted pair
	xs     string // the tokens gathered in sorted order
	counts string // per-expert pair counts (the group sizes)
}

// isSortTopK reports whether n sorts the expert ids another TopK selected:
// a TopK with largest=0 whose input is (through noise) a TopK's indices.
// Such a TopK permutes the token/expert pairs; it selects nothing.
func (c *ctx) isSortTopK(n *pb.NodeProto) bool {
	if n.GetOpType() != "TopK" || n.GetDomain() != "" || graph.AttrInt(n, "largest", 1) != 0 || len(n.Input) < 1 {
		return false
	}
	v := c.through(n.Input[0])
	p := c.g.Producer(v)
	return p != nil && p.GetOpType() == "TopK" && len(p.Output) > 1 && p.Output[1] == v
}

// consumersThrough lists the consumers of v and of values derived from it
// by noise ops, leaving out the noise ops themselves.
func (c *ctx) consumersThrough(v string) []*pb.NodeProto {
	var out []*pb.NodeProto
	seen := map[string]bool{}
	stack := []string{v}
	for len(stack) > 0 {
		x := stack[len(stack)-1]
		stack = stack[:len(stack)-1]
		if seen[x] {
			continue
		}
		seen[x] = true
		for _, n := range c.g.Consumers(x) {
			if noiseOps[n.GetOpType()] && len(n.Input) > 0 && n.Input[0] == x {
				stack = append(stack, n.Output...)
				continue
			}
			out = append(out, n)
		}
	}
	return out
}

// sortOf returns the TopK that sorts tk's expert ids, or nil when tk's
// indices are not sorted (not a sort-based block).
func (c *ctx) sortOf(tk *pb.NodeProto) (*pb.NodeProto, error) {
	if len(tk.Output) < 2 {
		return nil, nil
	}
	var found *pb.NodeProto
	for _, n := range c.consumersThrough(tk.Output[1]) {
		if c.inLimit(n) && c.isSortTopK(n) {
			if found != nil && found != n {
				a, b := graph.NodeLabel(found), graph.NodeLabel(n)
				return nil, rejectf("the expert ids are sorted twice (%q and %q)", min(a, b), max(a, b))
			}
			found = n
		}
	}
	return found, nil
}

// sortedTag says where a value stands in a sort-based block's expert
// pipeline: its stage (0: the gathered tokens, 1: after the first
// projection(s), 2: after the down projection, 3: weighted by the routing
// weights), the expert group it holds (-1: every sorted pair) and, once
// the outputs are put back in pair order by the inverse of the sort, their
// layout (order: 0 sorted, 1 pairs [T·k, ·], 2 pairs [T, k, ·]).
type sortedTag struct{ stage, seg, order int }

// sortedReader carries the state of reading one sort-based block's experts
// (see sortedExperts): the dispatch found so far, and the tags of the values
// of the expert pipeline that follows the gathered tokens.
type sortedReader struct {
	c       *ctx
	b       *Block
	tk      *pb.NodeProto
	sortTK  *pb.NodeProto
	ri      *routerInfo
	s       *moe.Spec
	shared  map[*pb.NodeProto]bool
	E, k    int
	sd      sortedDispatch
	ids     expertIDs
	xIn     string               // the router's input, through noise
	other   []*pb.NodeProto      // gathers by the permutation of something else
	gateSeg map[string]int       // sorted routing weights (through noise) -> their expert group (-1: all)
	tags    map[string]sortedTag // values of the expert pipeline
	scatter *pb.NodeProto        // the additive scatter back to token order
	combine *pb.NodeProto        // the weighted sum over each token's k pairs (pair order)
	segs    []sortedSeg
	// group value -> the Concat output that joins the groups
	concatOf map[string]string
	// group value -> the sorted rows Split into the groups
	splitOf map[string]string
}

// sortedSeg holds one expert group's projections: first layer(s) and down.
type sortedSeg struct{ l1, l2 []*emm }

// sortedExperts reads a sort-based block's experts: it checks that the
// dispatch permutes, groups and scatters back the token/expert pairs
// consistently, and fills plan with each expert's weights (see KindSorted).
func (c *ctx) sortedExperts(b *Block, tk, sortTK *pb.NodeProto, ri *routerInfo, s *moe.Spec, shared map[*pb.NodeProto]bool, plan *WeightPlan) (string, error) {
	r := &sortedReader{c: c, b: b, tk: tk, sortTK: sortTK, ri: ri, s: s, shared: shared, E: s.NumExperts, k: s.TopK}
	for _, step := range []func() error{r.checkSort, r.readPermutation, r.readTokens, r.checkOtherGathers, r.readGates, r.followPipeline, r.checkCombine} {
		if err := step(); err != nil {
			return "", err
		}
	}
	if err := r.fillPlan(plan); err != nil {
		return "", err
	}
	return KindSorted, nil
}

// checkSort checks that the sort orders the flattened token/expert pairs,
// and takes its permutation.
func (r *sortedReader) checkSort() error {
	c, sortTK := r.c, r.sortTK
	if len(sortTK.Output) < 2 || len(sortTK.Input) < 2 {
		return rejectf("sort %q lacks its permutation output", graph.NodeLabel(sortTK))
	}
	r.ids = expertIDs{c.through(r.tk.Output[1]), c.through(sortTK.Output[0])}
	if ax := graph.AttrInt(sortTK, "axis", -1); ax != 0 && ax != -1 {
		return rejectf("sort %q runs along axis %d, not over the flattened pairs", graph.NodeLabel(sortTK), ax)
	}
	if graph.AttrInt(sortTK, "sorted", 1) != 1 {
		return rejectf("sort %q does not order its output", graph.NodeLabel(sortTK))
	}
	if !c.flattens(sortTK.Input[0]) {
		return rejectf("sort %q does not sort the flattened token/expert pairs", graph.NodeLabel(sortTK))
	}
	r.sd.perm = sortTK.Output[1]
	return nil
}

// readPermutation reads what the permutation gives each sorted pair: its
// token (perm div k) and its routing weight (the flattened weights gathered
// by perm).
func (r *sortedReader) readPermutation() error {
	c := r.c
	r.xIn = c.through(r.ri.x)
	for _, n := range c.consumersThrough(r.sd.perm) {
		if !c.inLimit(n) {
			continue
		}
		if err := r.permutationReader(n); err != nil {
			return err
		}
	}
	if r.sd.tok == "" && r.k == 1 {
		r.sd.tok = r.sd.perm
	}
	if r.sd.tok == "" {
		return rejectf("the sort permutation does not give the pairs' tokens (a division by top_k)")
	}
	return nil
}

// permutationReader reads one consumer n of the sort permutation.
func (r *sortedReader) permutationReader(n *pb.NodeProto) error {
	c, sd, k := r.c, &r.sd, r.k
	switch op := n.GetOpType(); {
	case op == "Div" || op == "Mul" && c.constOperand(n) != "":
		if op == "Div" && c.through(n.Input[0]) != c.through(sd.perm) {
			return rejectf("%q divides by the sort permutation", graph.NodeLabel(n))
		}
		q, err := c.quotientOf(n, k)
		if err != nil {
			return err
		}
		return c.setOnce(&sd.tok, q, "token index")
	case op == "Gather" || op == "GatherND":
		data, idx, ok := c.gatherRows(n)
		if !ok || c.through(idx) != c.through(sd.perm) {
			return rejectf("%q gathers by the sort permutation other than row by row", graph.NodeLabel(n))
		}
		if k == 1 && c.through(data) == r.xIn {
			return c.setOnce(&sd.xs, n.Output[0], "gathered tokens")
		}
		if c.pairTokens(data, k) {
			return c.setOnce(&sd.tok, n.Output[0], "token index")
		}
		if !c.flattens(data) || !c.isRoutingWeights(r.tk, r.ri, r.s, data) {
			r.other = append(r.other, n) // the pipeline's, or refused below
			return nil
		}
		return c.setOnce(&sd.gates, n.Output[0], "sorted routing weights")
	case op == "Shape" || op == "Size":
	case op == "ScatterND" || op == "TopK" && c.isSortTopK(n):
		// putting the outputs back in pair order (checked in the pipeline)
	default:
		if k != 1 {
			return rejectf("unexpected %s %q reads the sort permutation", op, graph.NodeLabel(n))
		}
	}
	return nil
}

// readTokens finds the tokens gathered in sorted order; the scatter back
// is checked from the scatter.
func (r *sortedReader) readTokens() error {
	c, sd := r.c, &r.sd
	for _, n := range c.consumersThrough(sd.tok) {
		if !c.inLimit(n) {
			continue
		}
		switch op := n.GetOpType(); {
		case op == "Gather" || op == "GatherND":
			data, idx, ok := c.gatherRows(n)
			if ok && c.through(idx) == c.through(sd.tok) && c.through(data) == r.xIn {
				if err := c.setOnce(&sd.xs, n.Output[0], "gathered tokens"); err != nil {
					return err
				}
				continue
			}
			if sd.tok != sd.perm { // with top_k 1 the permutation also gathers the weights
				return rejectf("%q gathers by the pairs' tokens something other than the router's input", graph.NodeLabel(n))
			}
		case op == "ScatterND" || op == "ScatterElements" || op == "Expand" || op == "Shape" || op == "Size":
		default:
			if sd.tok != sd.perm {
				return rejectf("unexpected %s %q reads the pairs' tokens", op, graph.NodeLabel(n))
			}
		}
	}
	if sd.xs == "" {
		return rejectf("the tokens are not gathered in sorted order")
	}
	return nil
}

// checkOtherGathers refuses gathers by the permutation that neither the
// routing weights nor the expert pipeline explain.
func (r *sortedReader) checkOtherGathers() error {
	if len(r.other) == 0 {
		return nil
	}
	fromX := r.c.reachFrom(r.sd.xs)
	for _, n := range r.other {
		if !fromX.has(n) { // else the expert pipeline checks it
			return rejectf("%q gathers by the sort permutation something other than the flattened routing weights", graph.NodeLabel(n))
		}
	}
	return nil
}

// readGates reads the sorted routing weights, whole or split into the
// expert groups.
func (r *sortedReader) readGates() error {
	c, sd := r.c, &r.sd
	r.gateSeg = map[string]int{}
	if sd.gates == "" {
		return nil
	}
	r.gateSeg[c.through(sd.gates)] = -1
	for _, n := range c.consumersThrough(sd.gates) {
		switch {
		case !c.inLimit(n):
		case n.GetOpType() == "Split" && c.splitAxis(n) == 0 && len(n.Input) > 1 && len(n.Output) == r.E:
			if err := r.setCounts(n.Input[1]); err != nil {
				return err
			}
			for e, o := range n.Output {
				r.gateSeg[o] = e
			}
		case n.GetOpType() == "Slice" && c.rowSlice(n):
			e, err := r.groupSliceCounts(n)
			if err != nil {
				return err
			}
			r.gateSeg[n.Output[0]] = e
		}
	}
	return nil
}

// setCounts checks that cnt holds the per-expert counts and records them.
func (r *sortedReader) setCounts(cnt string) error {
	cnt, err := r.c.countsOf(cnt, r.ids, r.E)
	if err != nil {
		return err
	}
	return r.c.setOnce(&r.sd.counts, cnt, "per-expert counts")
}

// groupSliceCounts reads a Slice of one expert group's rows, between the
// counts' running sums: it records the counts and returns the expert.
func (r *sortedReader) groupSliceCounts(n *pb.NodeProto) (int, error) {
	e, cnt, err := r.c.groupSlice(n, r.E)
	if err != nil {
		return 0, err
	}
	return e, r.setCounts(cnt)
}

// followPipeline follows the gathered tokens through the per-expert groups
// to the scatter back or the sum over the pairs, each node by the first of
// sortedRules that matches it.
func (r *sortedReader) followPipeline() error {
	r.tags = map[string]sortedTag{r.sd.xs: {0, -1, 0}}
	r.segs = make([]sortedSeg, r.E)
	r.concatOf, r.splitOf = map[string]string{}, map[string]string{}
	for _, n := range r.c.forwardNodes(r.sd.xs) {
		x, err := r.pipelineNode(n)
		if err != nil {
			return err
		}
		if x == nil {
			continue
		}
		for _, rule := range sortedRules {
			if rule.match(r, x) {
				if err := rule.apply(r, x); err != nil {
					return err
				}
				break
			}
		}
	}
	return nil
}

// pipelineNode describes n as a node of the expert pipeline (nil when it
// reads no tagged value); it refuses a node that mixes groups or stages.
func (r *sortedReader) pipelineNode(n *pb.NodeProto) (*sortedNode, error) {
	x := &sortedNode{n: n, op: n.GetOpType(), tagged: -1}
	for i, v := range n.Input {
		if t, ok := r.tags[v]; ok && v != "" {
			x.in = append(x.in, t)
			if x.tagged < 0 {
				x.tagged = i
			}
		}
	}
	if len(x.in) == 0 {
		return nil, nil
	}
	x.t = x.in[0]
	for _, t := range x.in[1:] {
		if t.stage != x.t.stage || t.order != x.t.order || t.seg != x.t.seg && x.op != "Concat" {
			return nil, rejectf("%q mixes values of different expert groups or stages", graph.NodeLabel(n))
		}
	}
	return x, nil
}

// set tags the values outs with t.
func (r *sortedReader) set(t sortedTag, outs ...string) {
	for _, o := range outs {
		if o != "" {
			r.tags[o] = t
		}
	}
}

// checkCombine checks that the block output is the scatter back to token
// order or the weighted sum over each token's pairs, and that the groups
// were split by the counts.
func (r *sortedReader) checkCombine() error {
	c := r.c
	switch {
	case r.scatter != nil && r.combine != nil:
		return rejectf("the expert outputs are both scattered back to their tokens and summed in pair order")
	case r.scatter != nil:
		if err := c.checkScatterBack(r.scatter, r.sd.tok); err != nil {
			return err
		}
		if c.combineInput(r.b.Output, r.shared) != r.scatter.Output[0] {
			return rejectf("the block output is not the scatter back to token order")
		}
	case r.combine != nil:
		if c.combineInput(r.b.Output, r.shared) != r.combine.Output[0] {
			return rejectf("the block output is not the weighted sum over each token's pairs")
		}
	default:
		return rejectf("the weighted expert outputs are not scattered back to token order")
	}
	if r.sd.counts == "" {
		return rejectf("the sorted pairs are not split by the per-expert counts")
	}
	return nil
}

// lift returns the Concat output joining all groups when v is a group's
// value (through Identity and Cast), else v.
func (r *sortedReader) lift(v string) string {
	for {
		if o, ok := r.concatOf[v]; ok {
			return o
		}
		cons := r.c.g.Consumers(v)
		if len(cons) != 1 || (cons[0].GetOpType() != "Identity" && cons[0].GetOpType() != "Cast") {
			return v
		}
		v = cons[0].Output[0]
	}
}

// fillPlan fills plan with each expert's weights, and s with the
// intermediate size and whether the experts carry biases.
func (r *sortedReader) fillPlan(plan *WeightPlan) error {
	plan.Experts = make([]ExpertProj, r.E)
	for e := range r.E {
		var err error
		if plan.Experts[e], err = r.expertProj(e); err != nil {
			return err
		}
	}
	r.s.Inter = expertInter(plan)
	e0 := plan.Experts[0]
	r.s.ExpertBias = e0.GateB != nil || e0.UpB != nil || e0.DownB != nil
	return nil
}

// expertProj reads expert e's projections from its group.
func (r *sortedReader) expertProj(e int) (ExpertProj, error) {
	sg := r.segs[e]
	if len(sg.l1) == 0 || len(sg.l1) > 2 || len(sg.l2) != 1 {
		return ExpertProj{}, rejectf("expert %d's group has %d input and %d down projections, want 1 or 2 and 1", e, len(sg.l1), len(sg.l2))
	}
	l1 := make([]*emm, len(sg.l1))
	for i, m := range sg.l1 {
		cp := *m
		cp.out = r.lift(m.out)
		l1[i] = &cp
	}
	l2 := *sg.l2[0]
	l2.out = r.lift(l2.out)
	if v, ok := r.splitOf[l2.act]; ok {
		l2.act = v // the activation of every sorted pair, read once
	}
	rs, err := r.c.roles(l1, &l2, r.s, e == 0)
	if err != nil {
		return ExpertProj{}, err
	}
	if err := r.c.firstGemmBiases(l1, &rs); err != nil {
		return ExpertProj{}, err
	}
	for _, rr := range []*roleRef{rs.gate, rs.up, rs.down, rs.gateB, rs.upB, rs.downB} {
		if rr == nil || rr.w.sel == selConst || rr.w.sel == selNone && (len(rr.w.t.GetDims()) == 2 && !rr.isBias || len(rr.w.t.GetDims()) == 1 && rr.isBias) {
			continue
		}
		return ExpertProj{}, rejectf("expert %d's weight %q is not one expert's matrix", e, rr.w.t.GetName())
	}
	mk := func(rr *roleRef) *Proj {
		if rr == nil {
			return nil
		}
		idx := -1
		if rr.w.sel == selConst {
			idx = rr.w.expert
		}
		return &Proj{Init: rr.w.t, Expert: idx, InOut: rr.inOut, Part: rr.part}
	}
	return ExpertProj{Gate: mk(rs.gate), Up: mk(rs.up), Down: mk(rs.down), GateB: mk(rs.gateB), UpB: mk(rs.upB), DownB: mk(rs.downB)}, nil
}

// pairTokens reports whether v holds each token/expert pair's token, pair
// i being token i div k: a constant so made, or arange(tokens) given a
// second axis, expanded to k along it and flattened.
func (c *ctx) pairTokens(v string, k int) bool {
	if t := c.constTensor(v); t != nil {
		is := c.constInts(v)
		if len(is) == 0 || len(is)%k != 0 {
			return false
		}
		for i, x := range is {
			if int(x) != i/k {
				return false
			}
		}
		return true
	}
	if !c.flattens(v) {
		return false
	}
	ex := c.producerOp(v)
	if ex == nil || ex.GetOpType() != "Expand" || len(ex.Input) < 2 {
		return false
	}
	if sh := c.constInts(ex.Input[1]); len(sh) != 2 || int(sh[1]) != k {
		cat := c.producerOp(ex.Input[1])
		if cat == nil || cat.GetOpType() != "Concat" || len(cat.Input) != 2 {
			return false
		}
		if kk := c.constInts(cat.Input[1]); len(kk) != 1 || int(kk[0]) != k {
			return false
		}
	}
	if c.unitLast(ex.Input[0]) == "" {
		return false
	}
	r := c.producerOp(ex.Input[0])
	if r == nil || r.GetOpType() != "Range" || len(r.Input) < 3 {
		return false
	}
	st, ok1 := c.scalarInt(r.Input[0])
	d, ok2 := c.scalarInt(r.Input[2])
	return ok1 && ok2 && st == 0 && d == 1
}

// permutes reports whether n puts rows back in pair order by the inverse of
// the sort permutation perm: ScatterND into zeros at rows perm (reduction
// none or add: perm has no repeats), or a row Gather by the permutation
// that sorts perm (its inverse).
func (c *ctx) permutes(n *pb.NodeProto, perm string) bool {
	switch n.GetOpType() {
	case "ScatterND":
		if len(n.Input) < 3 {
			return false
		}
		v := c.rowIndex(n.Input[1])
		return v != "" && c.through(v) == c.through(perm)
	case "Gather", "GatherND":
		_, idx, ok := c.gatherRows(n)
		if !ok {
			return false
		}
		p := c.producerOp(idx)
		return p != nil && p.GetOpType() == "TopK" && graph.AttrInt(p, "largest", 1) == 0 && c.through(p.Input[0]) == c.through(perm) &&
			len(p.Output) > 1 && c.through(idx) == p.Output[1]
	}
	return false
}

// permutedInput is the input position of the rows a permuting node (see
// permutes) moves.
func (c *ctx) permutedInput(n *pb.NodeProto) int {
	if n.GetOpType() == "ScatterND" {
		return 2
	}
	return 0
}

// pairOrder handles a node reading expert outputs put back in pair order
// (see sortedTag): a reshape of the [T·k, ·] rows to [T, k, ·], their
// multiplication by the routing weights in pair order, and the sum over
// the k slots, which combines the experts (it reports true for that sum).
// A permutation of values before the down projection puts per-pair
// activations back in pair order: that is no MoE feed-forward block.
func (c *ctx) pairOrder(n *pb.NodeProto, t sortedTag, tagged int, sd *sortedDispatch, tk *pb.NodeProto, ri *routerInfo, s *moe.Spec, set func(sortedTag, ...string)) (bool, error) {
	op := n.GetOpType()
	if t.stage < 2 {
		return false, rejectf("%s %q puts the sorted pairs back in pair order before the experts' down projections: per-pair outputs (as a mixture of attention heads writes them), not the experts' outputs summed per token", op, graph.NodeLabel(n))
	}
	switch {
	case op == "Shape" || op == "Size":
		return false, nil
	case op == "Identity" || op == "Cast":
		set(t, n.Output...)
		return false, nil
	case op == "Reshape" && tagged == 0 && t.order == 1:
		if sh := c.constInts(n.Input[1]); len(sh) != 3 || int(sh[1]) != s.TopK || sh[2] != -1 && int(sh[2]) != s.Hidden {
			return false, rejectf("%q does not reshape the pairs to [tokens, %d, %d]", graph.NodeLabel(n), s.TopK, s.Hidden)
		}
		set(sortedTag{t.stage, -1, 2}, n.Output...)
		return false, nil
	case op == "Mul" && t.stage == 2 && len(n.Input) == 2:
		other := n.Input[1-tagged]
		if sd.gates != "" && c.through(other) == c.through(sd.gates) || !c.isRoutingWeights(tk, ri, s, other) {
			return false, rejectf("%q weights the expert outputs in pair order by something other than the routing weights", graph.NodeLabel(n))
		}
		set(sortedTag{3, -1, t.order}, n.Output...)
		return false, nil
	case op == "ReduceSum" && t.stage == 3 && t.order == 2 && tagged == 0:
		var axes []int64
		if len(n.Input) > 1 && n.Input[1] != "" {
			axes = c.constInts(n.Input[1])
		} else {
			axes = graph.AttrInts(n, "axes")
		}
		if len(axes) != 1 || axes[0] != 1 && axes[0] != -2 || graph.AttrInt(n, "keepdims", 1) != 0 {
			return false, rejectf("%q does not sum the weighted outputs over each token's %d pairs", graph.NodeLabel(n), s.TopK)
		}
		return true, nil
	}
	return false, rejectf("unexpected %s %q on the expert outputs in pair order", op, graph.NodeLabel(n))
}

// firstGemmBiases adds to rs, where roles has not, the biases that first
// projections written as Gemm carry in their third input: the gate's and the up projection's
// (their halves of a fused gate_up bias).
func (c *ctx) firstGemmBiases(l1 []*emm, rs *roleSet) error {
	for _, m := range l1 {
		b := gemmBias(m.n)
		if b == "" {
			continue
		}
		w := c.matmulWeight(b)
		for _, r := range []struct {
			proj *roleRef
			bias **roleRef
		}{{rs.gate, &rs.gateB}, {rs.up, &rs.upB}} {
			if r.proj == nil || r.proj.w != m.w {
				continue
			}
			if *r.bias != nil {
				continue // roles read it (projOut refuses a second bias)
			}
			*r.bias = &roleRef{w: w, isBias: true, part: r.proj.part}
		}
	}
	return nil
}

// rowSlice reports whether a Slice cuts only the first axis, with step 1.
func (c *ctx) rowSlice(n *pb.NodeProto) bool {
	if len(n.Input) < 3 {
		return false
	}
	if len(n.Input) > 3 && n.Input[3] != "" {
		if ax := c.constInts(n.Input[3]); len(ax) != 1 || ax[0] != 0 {
			return false
		}
	}
	if len(n.Input) > 4 && n.Input[4] != "" {
		if st := c.constInts(n.Input[4]); len(st) != 1 || st[0] != 1 {
			return false
		}
	}
	return true
}

// groupSlice reads a Slice of the sorted rows from one expert group's
// start to its end: both bounds are running sums of the per-expert counts
// (CumSum, inclusive or exclusive, an inclusive one behind a leading 0,
// or one less the counts), the start 0 for the first group and the end
// past the last row for the last. It returns the group and the counts value.
func (c *ctx) groupSlice(n *pb.NodeProto, E int) (int, string, error) {
	bs, cs := c.groupBound(n.Input[1], E)
	be, ce := c.groupBound(n.Input[2], E)
	cnt := cs
	if cnt == "" {
		cnt = ce
	}
	if bs == -2 || be == -2 {
		return 0, "", rejectf("%q slices the sorted rows at constant bounds: a trace baked in the group sizes of its own input, so the graph is right only for inputs routed exactly like it; the bounds must be running sums of the per-expert counts", graph.NodeLabel(n))
	}
	if bs < 0 || be != bs+1 || bs >= E || cnt == "" || cs != "" && ce != "" && cs != ce {
		return 0, "", rejectf("%q slices the sorted rows other than from one expert group's start to its end", graph.NodeLabel(n))
	}
	return bs, cnt, nil
}

// groupBound returns which group boundary v holds (b: the number of rows
// of experts 0..b-1) and the counts it sums ("" for a constant bound), or
// -1, or -2 for a constant row number other than the first or past the
// last.
func (c *ctx) groupBound(v string, E int) (int, string) {
	if is := c.constInts(v); len(is) == 1 {
		switch {
		case is[0] == 0:
			return 0, ""
		case is[0] >= 1<<31-1: // past the end
			return E, ""
		}
		return -2, "" // a row number baked in by a trace
	}
	offs, j := c.countPiece(v)
	if offs == "" {
		return -1, ""
	}
	p := c.g.Producer(offs)
	if p == nil {
		return -1, ""
	}
	if p.GetOpType() == "Concat" && len(p.Input) == 2 {
		// [0, cumsum...]: entry j is the inclusive sum of the first j counts
		if z := c.constInts(p.Input[0]); len(z) != 1 || z[0] != 0 {
			return -1, ""
		}
		q := c.producerOp(p.Input[1])
		if q == nil || q.GetOpType() != "CumSum" || graph.AttrInt(q, "exclusive", 0) != 0 {
			return -1, ""
		}
		p, j = q, j-1
	}
	exclusive := false
	if p.GetOpType() == "Sub" && len(p.Input) == 2 {
		// cumsum(counts) - counts: the exclusive sums
		q := c.producerOp(p.Input[0])
		if q == nil || q.GetOpType() != "CumSum" || graph.AttrInt(q, "exclusive", 0) != 0 || len(q.Input) < 2 || c.through(q.Input[0]) != c.through(p.Input[1]) {
			return -1, ""
		}
		p, exclusive = q, true
	}
	if p.GetOpType() != "CumSum" || len(p.Input) < 2 || graph.AttrInt(p, "reverse", 0) != 0 {
		return -1, ""
	}
	if ax, ok := c.scalarInt(p.Input[1]); !ok || ax != 0 && ax != -1 {
		return -1, ""
	}
	if exclusive || graph.AttrInt(p, "exclusive", 0) != 0 {
		return j, p.Input[0]
	}
	return j + 1, p.Input[0]
}

// quotientOf returns the value holding div's input divided by k and
// rounded toward zero: div itself when it divides integers by the constant
// k, or, for a float division by k, the floor after it (Floor, or
// Floor(Abs(q)) * Sign(q), the truncation exporters write for
// rounding_mode="trunc"), before any cast back to integers.
func (c *ctx) quotientOf(div *pb.NodeProto, k int) (string, error) {
	if div.GetOpType() == "Div" {
		if d, ok := c.scalarInt(div.Input[1]); ok {
			if int(d) != k {
				return "", rejectf("%q divides the sort permutation by %d, not by top_k %d: not the pairs' tokens", graph.NodeLabel(div), d, k)
			}
			return div.Output[0], nil
		}
	}
	// in floating point: divided by k, or multiplied by 1/k (rounded)
	cv := div.Input[1]
	if div.GetOpType() == "Mul" {
		cv = c.constOperand(div)
	}
	f, ok := c.scalarFloat(cv)
	if div.GetOpType() == "Mul" {
		ok = ok && f != 0 && (float32(1/float64(f)) == float32(k) || f == float32(1/float64(k)))
	} else {
		ok = ok && f == float32(k)
	}
	if !ok {
		return "", rejectf("%q divides the sort permutation by %v, not by top_k %d: not the pairs' tokens", graph.NodeLabel(div), cv, k)
	}
	q := div.Output[0]
	cons := c.g.Consumers(q)
	ops := map[string]*pb.NodeProto{}
	for _, n := range cons {
		ops[n.GetOpType()] = n
	}
	switch {
	case len(cons) == 1 && ops["Floor"] != nil:
		return ops["Floor"].Output[0], nil
	case len(cons) == 2 && ops["Abs"] != nil && ops["Sign"] != nil:
		fl := c.g.Consumers(ops["Abs"].Output[0])
		if len(fl) == 1 && fl[0].GetOpType() == "Floor" {
			mul := c.g.Consumers(fl[0].Output[0])
			sg := ops["Sign"].Output[0]
			if len(mul) == 1 && mul[0].GetOpType() == "Mul" && len(mul[0].Input) == 2 && (mul[0].Input[0] == sg || mul[0].Input[1] == sg) {
				return mul[0].Output[0], nil
			}
		}
	}
	return "", rejectf("%q divides the sort permutation by top_k in floating point without rounding the quotient down", graph.NodeLabel(div))
}

// constOperand is the constant operand of binary n when exactly one is
// constant, else "".
func (c *ctx) constOperand(n *pb.NodeProto) string {
	if len(n.Input) != 2 || c.isConst(n.Input[0]) == c.isConst(n.Input[1]) {
		return ""
	}
	if c.isConst(n.Input[0]) {
		return n.Input[0]
	}
	return n.Input[1]
}

// gatherRows reads a gather of whole rows along the first axis: Gather
// with axis 0, or GatherND (batch_dims 0) whose indices are a vector with
// a trailing unit axis added. It returns the data and the row indices.
func (c *ctx) gatherRows(n *pb.NodeProto) (data, idx string, ok bool) {
	if len(n.Input) < 2 {
		return "", "", false
	}
	switch n.GetOpType() {
	case "Gather":
		if graph.AttrInt(n, "axis", 0) != 0 {
			return "", "", false
		}
		return n.Input[0], n.Input[1], true
	case "GatherND":
		if graph.AttrInt(n, "batch_dims", 0) != 0 {
			return "", "", false
		}
		if v := c.rowIndex(n.Input[1]); v != "" {
			return n.Input[0], v, true
		}
	}
	return "", "", false
}

// rowIndex returns v when idx is a vector v given a trailing unit axis
// (Unsqueeze on the last axis, or a Reshape to [-1, 1]): the [n, 1]
// indices of ScatterND and GatherND addressing whole rows. It returns ""
// otherwise.
func (c *ctx) rowIndex(idx string) string {
	p := c.g.Producer(idx)
	if p == nil || len(p.Input) == 0 {
		return ""
	}
	switch p.GetOpType() {
	case "Unsqueeze":
		axes := graph.AttrInts(p, "axes")
		if len(p.Input) > 1 && p.Input[1] != "" {
			axes = c.constInts(p.Input[1])
		}
		r := c.rankOf(p.Input[0])
		if len(axes) == 1 && (axes[0] == -1 || axes[0] == 1 && r <= 1) && r <= 1 {
			return p.Input[0]
		}
	case "Reshape":
		if sh := c.constInts(p.Input[1]); len(sh) == 2 && sh[1] == 1 && (sh[0] == -1 || sh[0] > 0) {
			return p.Input[0]
		}
	case "Identity", "Cast":
		return c.rowIndex(p.Input[0])
	}
	return ""
}

// setOnce sets *dst to v, failing when it already holds another value.
func (c *ctx) setOnce(dst *string, v, what string) error {
	if *dst != "" && *dst != v {
		a, b := min(*dst, v), max(*dst, v)
		return rejectf("two candidates for the %s of a sort-based block (%q and %q)", what, a, b)
	}
	*dst = v
	return nil
}

// flattens reports whether v is a flattening of a value to one axis: a
// Reshape to [-1] (or a one-element shape), a Flatten, or a value of
// declared rank 1.
func (c *ctx) flattens(v string) bool {
	for {
		if c.rankOf(v) == 1 {
			return true
		}
		p := c.g.Producer(v)
		if p == nil {
			return false
		}
		switch p.GetOpType() {
		case "Reshape":
			if sh := c.constInts(p.Input[1]); len(sh) == 1 {
				return true
			}
			// a computed one-element shape
			if c.rankOf(p.Output[0]) == 1 {
				return true
			}
			return false
		case "Identity", "Cast":
			v = p.Input[0]
		default:
			return false
		}
	}
}

// isRoutingWeights reports whether v (through noise) is the routing
// weights of tk's selection: computed from the top-k values (through the
// router activation when it comes after the top-k), or gathered from the
// activated scores by the top-k indices.
func (c *ctx) isRoutingWeights(tk *pb.NodeProto, ri *routerInfo, s *moe.Spec, v string) bool {
	v = c.through(v)
	if s.RouterOrder == moe.TopKThenActivation {
		// the weights are activated after the top-k: on the way from it
		for _, n := range c.backNodes(v, tk.Output[0]) {
			if op := n.GetOpType(); op == "Softmax" || op == "Sigmoid" {
				return c.reachFrom(tk.Output[0]).has(n)
			}
		}
		return false
	}
	if v == c.through(tk.Output[0]) {
		return true
	}
	p := c.g.Producer(v)
	if p == nil {
		return false
	}
	if c.reachFrom(tk.Output[0]).has(p) {
		return true
	}
	if ri.scores != "" && p.GetOpType() == "GatherElements" && c.through(p.Input[0]) == c.through(ri.scores) && c.through(p.Input[1]) == c.through(tk.Output[1]) {
		return true
	}
	// Any other float value computed from the selection (scores gathered
	// by the indices, then renormalised, scaled, ...): what it computes is
	// decided by evaluation (pickWeights) and the numerical check.
	return c.reachFrom(tk.Output[1]).has(p) && isFloatType(c.elemType(v))
}

// isFloatType reports whether t is a floating-point element type.
func isFloatType(t pb.TensorProto_DataType) bool {
	switch t {
	case pb.TensorProto_FLOAT, pb.TensorProto_FLOAT16, pb.TensorProto_BFLOAT16, pb.TensorProto_DOUBLE:
		return true
	}
	return false
}

// splitAxis returns a Split's axis (normalised against a declared rank
// where negative), or -99 when not a Split.
func (c *ctx) splitAxis(n *pb.NodeProto) int {
	if n.GetOpType() != "Split" {
		return -99
	}
	return c.normAxis(n.Input[0], int(graph.AttrInt(n, "axis", 0)))
}

// concatAxis returns a Concat's axis, normalised like splitAxis.
func (c *ctx) concatAxis(n *pb.NodeProto) int {
	if len(n.Input) == 0 {
		return -99
	}
	return c.normAxis(n.Input[0], int(graph.AttrInt(n, "axis", 0)))
}

// normAxis normalises a negative axis of v by its declared rank; the
// sorted pairs are two-dimensional ([pairs, features]) when undeclared.
func (c *ctx) normAxis(v string, ax int) int {
	if ax >= 0 {
		return ax
	}
	r := c.rankOf(v)
	if r < 0 {
		r = 2
	}
	return ax + r
}

// lastAxisOnly reports whether a Split or Slice cuts only the last axis of
// its (two-dimensional, when undeclared) input.
func (c *ctx) lastAxisOnly(n *pb.NodeProto) bool {
	r := c.rankOf(n.Input[0])
	if r < 0 {
		r = 2
	}
	if n.GetOpType() == "Split" {
		return c.normAxis(n.Input[0], int(graph.AttrInt(n, "axis", 0))) == r-1
	}
	// Slice: starts, ends[, axes[, steps]]
	if len(n.Input) < 4 || n.Input[3] == "" {
		return r == 1
	}
	axes := c.constInts(n.Input[3])
	if len(axes) == 0 {
		return false
	}
	for _, a := range axes {
		if c.normAxis(n.Input[0], int(a)) != r-1 {
			return false
		}
	}
	return true
}

// countsOf checks that v, a Split's sizes, is the number of pairs routed to
// each of the E experts, in expert order, counted from the expert ids, and
// returns the counts value. The counts are a sum over the tokens (and
// top-k slots) of a one-hot of the ids: ScatterElements of ones into zeros
// along the expert axis, OneHot, or a comparison with every expert id; they
// may be listed element by element (see countPiece).
func (c *ctx) countsOf(v string, ids expertIDs, E int) (string, error) {
	v = c.through(v)
	if sz := c.constInts(v); sz != nil {
		return "", rejectf("the split sizes are constants %v: a trace baked in the group sizes of its own input, so the graph is right only for inputs routed exactly like it; the per-expert counts must be computed from the top-k indices", sz)
	}
	if p := c.g.Producer(v); p != nil && p.GetOpType() == "Concat" {
		if len(p.Input) != E {
			return "", rejectf("the split sizes list %d counts for %d experts", len(p.Input), E)
		}
		src := ""
		for e, in := range p.Input {
			from, at := c.countPiece(in)
			if from == "" || at != e {
				return "", rejectf("the split sizes are not the per-expert counts in expert order (%q)", in)
			}
			if src != "" && src != from {
				return "", rejectf("the split sizes mix two count vectors")
			}
			src = from
		}
		v = src
	}
	counts := v
	var reds []*pb.NodeProto // the sums, outermost first
	for steps := 0; steps < 8; steps++ {
		p := c.g.Producer(v)
		if p == nil {
			break
		}
		switch p.GetOpType() {
		case "Cast", "Identity":
			v = p.Input[0]
			continue
		case "Squeeze", "Reshape", "Flatten":
			if len(reds) > 0 {
				break // reshaping the one-hot before it is summed: not read
			}
			v = p.Input[0]
			continue
		case "ReduceSum":
			reds = append(reds, p)
			v = p.Input[0]
			continue
		case "ScatterElements":
			// ones scattered into [tokens, experts] zeros along the expert axis
			ax := c.normAxis(p.Input[0], int(graph.AttrInt(p, "axis", 0)))
			if ax != 1 || !ids.is(c, p.Input[1]) || !c.isFilled(p.Input[0], 0) || !c.isFilled(p.Input[2], 1) {
				return "", rejectf("%q is not a one-hot of the top-k indices", graph.NodeLabel(p))
			}
			if r := graph.AttrString(p, "reduction", "none"); r != "none" && r != "add" && r != "max" {
				return "", rejectf("%q scatters with reduction %s", graph.NodeLabel(p), r)
			}
			return counts, c.checkCountAxes(reds, 2)
		case "OneHot":
			vals := c.constFloatsAny(p.Input[2])
			if !ids.is(c, p.Input[0]) || graph.AttrInt(p, "axis", -1) != -1 || len(vals) != 2 || vals[0] != 0 || vals[1] != 1 {
				return "", rejectf("%q is not a one-hot of the top-k indices", graph.NodeLabel(p))
			}
			if d, ok := c.scalarInt(p.Input[1]); !ok || int(d) != E {
				return "", rejectf("%q has depth other than the %d experts", graph.NodeLabel(p), E)
			}
			return counts, c.checkCountAxes(reds, ids.rank(c, p.Input[0])+1)
		case "Equal":
			// ids[..., None] == arange(E): a one-hot by comparison
			for i := range 2 {
				v, rng := p.Input[i], p.Input[1-i]
				if !ids.is(c, v) || !c.isExpertRange(rng, E) {
					continue
				}
				raw := c.unitLast(v)
				if raw == "" {
					return "", rejectf("%q compares the top-k indices with the expert ids along an axis other than a new last one", graph.NodeLabel(p))
				}
				return counts, c.checkCountAxes(reds, ids.rank(c, raw)+1)
			}
			return "", rejectf("%q is not a comparison of the top-k indices with every expert id", graph.NodeLabel(p))
		}
		break
	}
	return "", rejectf("the split sizes are not per-expert counts of the top-k indices")
}

// expertIDs are the values holding the routed expert ids: the top-k
// indices, and their sorted copy (the sort's values), either of which the
// per-expert counts may count (looked through noise).
type expertIDs struct{ idx, sorted string }

// is reports whether v (through noise) holds the expert ids.
func (ids expertIDs) is(c *ctx, v string) bool {
	v = c.through(v)
	return v == ids.idx || v == ids.sorted
}

// rank is the rank of the expert ids v as a one-hot reads them: 1 when
// flattened (the sort's values always are), else 2 ([tokens, k]).
func (ids expertIDs) rank(c *ctx, v string) int {
	if c.flattens(v) || c.through(v) == ids.sorted {
		return 1
	}
	return 2
}

// checkCountAxes checks that reds (ReduceSums, outermost first) applied to
// a one-hot of the given rank, the experts on its last axis, sum it over
// every axis but that last one.
func (c *ctx) checkCountAxes(reds []*pb.NodeProto, rank int) error {
	dims := make([]int, rank) // the one-hot's axes still present
	for i := range dims {
		dims[i] = i
	}
	summed := map[int]bool{}
	for i := len(reds) - 1; i >= 0; i-- {
		p := reds[i]
		var axes []int64
		if len(p.Input) > 1 && p.Input[1] != "" {
			axes = c.constInts(p.Input[1])
		} else {
			axes = graph.AttrInts(p, "axes")
		}
		if len(axes) == 0 {
			return rejectf("the per-expert counts reduce %q over all axes", graph.NodeLabel(p))
		}
		drop := map[int]bool{}
		for _, a := range axes {
			if a < 0 {
				a += int64(len(dims))
			}
			if a < 0 || int(a) >= len(dims) {
				return rejectf("%q reduces axis %d of a rank-%d one-hot", graph.NodeLabel(p), a, len(dims))
			}
			summed[dims[a]] = true
			drop[int(a)] = true
		}
		if graph.AttrInt(p, "keepdims", 1) == 0 {
			kept := dims[:0:0]
			for j, d := range dims {
				if !drop[j] {
					kept = append(kept, d)
				}
			}
			dims = kept
		}
	}
	if len(summed) != rank-1 || summed[rank-1] {
		return rejectf("the per-expert counts do not sum the one-hot of the top-k indices over the tokens and slots, only over the experts")
	}
	return nil
}

// isExpertRange reports whether v is the expert ids 0..E-1 in order: a
// constant (of any shape holding E elements) or Range(0, E, 1).
func (c *ctx) isExpertRange(v string, E int) bool {
	if t := c.constTensor(v); t != nil {
		is := c.constInts(v)
		if len(is) != E {
			return false
		}
		for i, x := range is {
			if int(x) != i {
				return false
			}
		}
		return true
	}
	p := c.producerOp(v)
	if p == nil || p.GetOpType() != "Range" || len(p.Input) < 3 {
		return false
	}
	st, ok1 := c.scalarInt(p.Input[0])
	lim, ok2 := c.scalarInt(p.Input[1])
	dl, ok3 := c.scalarInt(p.Input[2])
	return ok1 && ok2 && ok3 && st == 0 && int(lim) == E && dl == 1
}

// unitLast returns x when v is x with a new unit last axis (Unsqueeze at
// the end, or a Reshape whose constant shape ends in 1), else "".
func (c *ctx) unitLast(v string) string {
	for {
		p := c.g.Producer(v)
		if p == nil || len(p.Input) == 0 {
			return ""
		}
		switch p.GetOpType() {
		case "Identity", "Cast":
			v = p.Input[0]
			continue
		case "Unsqueeze":
			axes := graph.AttrInts(p, "axes")
			if len(p.Input) > 1 && p.Input[1] != "" {
				axes = c.constInts(p.Input[1])
			}
			if len(axes) != 1 {
				return ""
			}
			r := c.rankOf(p.Input[0])
			if q := c.producerOp(p.Input[0]); r < 0 && (c.flattens(p.Input[0]) || q != nil && q.GetOpType() == "Range") {
				r = 1
			}
			if axes[0] == -1 || r >= 0 && int(axes[0]) == r {
				return p.Input[0]
			}
		case "Reshape":
			if sh := c.constInts(p.Input[1]); len(sh) >= 2 && sh[len(sh)-1] == 1 {
				return p.Input[0]
			}
		}
		return ""
	}
}

// countPiece reads one listed count: element e of a count vector, taken by
// a Gather of index e along axis 0, a Slice [e, e+1) of the first axis
// (then possibly a Gather of its only element) or output e of a Split into
// one-element pieces, through noise. It returns
// the vector (looked through noise) and e, or "" when v is not such.
func (c *ctx) countPiece(v string) (string, int) {
	p := c.producerOp(v)
	if p == nil || len(p.Input) < 1 || len(p.Input) < 2 && p.GetOpType() != "Split" {
		return "", -1
	}
	switch p.GetOpType() {
	case "Gather":
		i, ok := c.scalarInt(p.Input[1])
		if !ok || graph.AttrInt(p, "axis", 0) != 0 {
			return "", -1
		}
		// element 0 of a one-element piece (a Slice [e, e+1), or a picked
		// element unsqueezed) is that piece's count
		if q := c.producerOp(p.Input[0]); q != nil && (q.GetOpType() == "Slice" || q.GetOpType() == "Gather" && len(q.Input) == 2 && c.oneInt(q.Input[1])) {
			if i != 0 {
				return "", -1
			}
			return c.countPiece(p.Input[0])
		}
		return c.through(p.Input[0]), int(i)
	case "Split":
		// unbind: the counts split into one-element pieces
		v = c.through(v)
		if c.splitAxis(p) != 0 && graph.AttrInt(p, "axis", 0) != -1 {
			return "", -1
		}
		if len(p.Input) > 1 && p.Input[1] != "" {
			sz := c.constInts(p.Input[1])
			if len(sz) != len(p.Output) {
				return "", -1
			}
			for _, x := range sz {
				if x != 1 {
					return "", -1
				}
			}
		}
		for i, o := range p.Output {
			if o == v {
				return c.through(p.Input[0]), i
			}
		}
		return "", -1
	case "Slice":
		if len(p.Input) < 3 {
			return "", -1
		}
		st, en := c.constInts(p.Input[1]), c.constInts(p.Input[2])
		if len(st) != 1 || len(en) != 1 || en[0] != st[0]+1 || st[0] < 0 {
			return "", -1
		}
		if len(p.Input) > 3 && p.Input[3] != "" {
			if ax := c.constInts(p.Input[3]); len(ax) != 1 || ax[0] != 0 && ax[0] != -1 {
				return "", -1
			}
		}
		if len(p.Input) > 4 && p.Input[4] != "" {
			if sp := c.constInts(p.Input[4]); len(sp) != 1 || sp[0] != 1 {
				return "", -1
			}
		}
		return c.through(p.Input[0]), int(st[0])
	}
	return "", -1
}

// constFloatsAny reads a constant (of at most a million elements) as
// float64s, whatever its numeric type.
func (c *ctx) constFloatsAny(v string) []float64 {
	t, b := c.constBytes(v, 1<<20)
	if t == nil {
		return nil
	}
	if f := c.floatsOf(t, b); f != nil {
		out := make([]float64, len(f))
		for i, x := range f {
			out[i] = float64(x)
		}
		return out
	}
	if is := intsOf(t, b); is != nil {
		out := make([]float64, len(is))
		for i, x := range is {
			out[i] = float64(x)
		}
		return out
	}
	return nil
}

// isFilled reports whether v holds the value f everywhere: a constant whose
// elements all equal f, ConstantOfShape with that value, or an Expand of
// such a constant.
func (c *ctx) isFilled(v string, f float64) bool {
	v = c.through(v)
	if t := c.constTensor(v); t != nil {
		if f == 0 { // zeros of a static shape, however many: all bytes zero
			b, err := c.m.TensorBytes(t)
			if err != nil || len(b) == 0 {
				return false
			}
			for _, x := range b {
				if x != 0 {
					return false
				}
			}
			return true
		}
		vals := c.constFloatsAny(v)
		if vals == nil {
			return false
		}
		for _, x := range vals {
			if x != f {
				return false
			}
		}
		return len(vals) > 0
	}
	p := c.g.Producer(v)
	if p == nil {
		return false
	}
	switch p.GetOpType() {
	case "ConstantOfShape":
		t := graph.AttrTensor(p, "value")
		if t == nil {
			return f == 0
		}
		b, err := c.m.TensorBytes(t)
		if err != nil {
			return false
		}
		vals := c.floatsOf(t, b)
		if vals != nil {
			return len(vals) == 1 && float64(vals[0]) == f
		}
		is := intsOf(t, b)
		return len(is) == 1 && float64(is[0]) == f
	case "Expand":
		return c.isFilled(p.Input[0], f)
	case "Mul":
		if f == 0 {
			for _, in := range p.Input {
				if x, ok := c.scalarFloat(in); ok && x == 0 {
					return true
				}
			}
		}
	}
	return false
}

// checkScatterBack checks that n adds each weighted sorted pair into a zero
// tensor at its token's row: ScatterND(zeros, tok as [pairs, 1], updates,
// reduction=add), or ScatterElements along axis 0 with tok expanded over
// the features and reduction=add.
func (c *ctx) checkScatterBack(n *pb.NodeProto, tok string) error {
	if graph.AttrString(n, "reduction", "none") != "add" {
		return rejectf("%q scatters the expert outputs back without adding them up (reduction %q)", graph.NodeLabel(n), graph.AttrString(n, "reduction", "none"))
	}
	if !c.isFilled(n.Input[0], 0) {
		return rejectf("%q scatters the expert outputs into something other than zeros", graph.NodeLabel(n))
	}
	idx := n.Input[1]
	switch n.GetOpType() {
	case "ScatterND":
		if v := c.rowIndex(idx); v == "" || c.through(v) != c.through(tok) {
			return rejectf("%q scatters back to rows other than the sorted pairs' tokens", graph.NodeLabel(n))
		}
	case "ScatterElements":
		if c.normAxis(n.Input[0], int(graph.AttrInt(n, "axis", 0))) != 0 {
			return rejectf("%q scatters back along an axis other than the tokens'", graph.NodeLabel(n))
		}
		p := c.producerOp(idx)
		if p == nil || p.GetOpType() != "Expand" || c.through(p.Input[0]) != c.through(tok) {
			return rejectf("%q scatters back to rows other than the sorted pairs' tokens", graph.NodeLabel(n))
		}
	}
	return nil
}

// combineInput walks back from a block output over noise and a
// shared-expert Add to the value that combines the routed experts.
func (c *ctx) combineInput(y string, shared map[*pb.NodeProto]bool) string {
	for steps := 0; steps < 16; steps++ {
		p := c.g.Producer(y)
		if p == nil {
			return y
		}
		switch {
		case noiseOps[p.GetOpType()]:
			y = p.Input[0]
		case p.GetOpType() == "Add" && shared != nil && len(p.Input) == 2:
			a := c.g.Producer(p.Input[0])
			if a != nil && shared[a] {
				y = p.Input[1]
			} else {
				y = p.Input[0]
			}
		default:
			return y
		}
	}
	return y
}

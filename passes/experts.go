package passes

import (
	"fmt"
	"slices"
	"sort"
	"strings"

	"github.com/mokopt/mokopt/graph"
	pb "github.com/mokopt/mokopt/graph/onnxpb"
	"github.com/mokopt/mokopt/moe"
)

// How an expert weight operand selects experts from its initializer.
const (
	selNone   = iota // the initializer is used whole (dense stacked, or one expert's 2-D matrix)
	selRouted        // gathered per token by the routing indices
	selConst         // gathered by a constant expert id
	selSlot          // gathered by a data-dependent scalar id (a traced loop over hit experts)
)

// wtrace is a weight operand traced back to its initializer.
type wtrace struct {
	t       *pb.TensorProto
	swapped bool // the last two axes were transposed on the way
	sel     int
	expert  int    // selConst
	slotKey string // selSlot
}

// matmulWeight traces v back to a constant weight, or returns nil.
func (c *ctx) matmulWeight(v string) *wtrace {
	w := &wtrace{}
	for steps := 0; steps < 16; steps++ {
		if t := c.g.Initializer(v); t != nil {
			if len(t.GetDims()) < 1 {
				return nil
			}
			w.t = t
			return w
		}
		p := c.g.Producer(v)
		if p == nil {
			return nil
		}
		switch op := p.GetOpType(); {
		case op == "Constant":
			if t := graph.AttrTensor(p, "value"); t != nil && len(t.GetDims()) >= 1 {
				w.t = t
				return w
			}
			return nil
		case noiseOps[op]:
			v = p.Input[0]
		case op == "Transpose":
			perm := graph.AttrInts(p, "perm")
			n := len(perm)
			if n < 2 || perm[n-1] != int64(n-2) || perm[n-2] != int64(n-1) {
				if n == 0 {
					w.swapped = !w.swapped
				} else if !(n >= 2 && perm[n-1] == int64(n-1) && perm[n-2] == int64(n-2)) {
					return nil
				}
			} else {
				w.swapped = !w.swapped
			}
			v = p.Input[0]
		case op == "Gather":
			if graph.AttrInt(p, "axis", 0) != 0 || w.sel != selNone {
				return nil
			}
			idx := p.Input[1]
			if e, ok := c.scalarInt(idx); ok {
				w.sel, w.expert = selConst, int(e)
			} else if c.isScalarIndex(idx) {
				w.sel, w.slotKey = selSlot, c.through(idx)
			} else {
				w.sel = selRouted
			}
			v = p.Input[0]
		case op == "GatherND":
			if w.sel != selNone || graph.AttrInt(p, "batch_dims", 0) != 0 {
				return nil
			}
			w.sel = selRouted
			v = p.Input[0]
		default:
			return nil
		}
	}
	return nil
}

// isScalarIndex reports whether idx is a data-dependent scalar: a Gather of
// one element by a constant scalar index (one id out of a list of hit experts).
func (c *ctx) isScalarIndex(idx string) bool {
	p := c.producerOp(idx)
	if p == nil || p.GetOpType() != "Gather" {
		return false
	}
	_, ok := c.scalarInt(p.Input[1])
	return ok
}

// emm is one expert matmul.
type emm struct {
	n        *pb.NodeProto
	w        *wtrace
	act, out string
	inOut    bool
	layer2   bool
	key      string
	pos      int32 // topological position of n (set by experts)
}

func (c *ctx) expertMatMul(n *pb.NodeProto) *emm {
	switch n.GetOpType() {
	case "MatMul":
		if w := c.matmulWeight(n.Input[1]); w != nil && len(w.t.GetDims()) >= 2 {
			return &emm{n: n, w: w, act: n.Input[0], out: n.Output[0], inOut: !w.swapped}
		}
		if w := c.matmulWeight(n.Input[0]); w != nil && len(w.t.GetDims()) >= 2 {
			return &emm{n: n, w: w, act: n.Input[1], out: n.Output[0], inOut: w.swapped}
		}
	case "Gemm":
		if graph.AttrInt(n, "transA", 0) != 0 || graph.AttrFloat(n, "alpha", 1) != 1 {
			return nil
		}
		if w := c.matmulWeight(n.Input[1]); w != nil && len(w.t.GetDims()) >= 2 {
			e := &emm{n: n, w: w, act: n.Input[0], out: n.Output[0]}
			e.inOut = (graph.AttrInt(n, "transB", 0) == 0) != w.swapped
			return e
		}
	}
	return nil
}

// gemmBias returns the bias input of a Gemm, if any.
func gemmBias(n *pb.NodeProto) string {
	if n.GetOpType() == "Gemm" && len(n.Input) > 2 {
		return n.Input[2]
	}
	return ""
}

// projOut returns a first-layer projection's output after its bias and
// the bias: a Gemm's C input, or an Add of a constant after it (not both).
func (c *ctx) projOut(e *emm) (string, *wtrace, error) {
	v, bias := c.afterBias(e.out)
	if gb := gemmBias(e.n); gb != "" {
		w := c.matmulWeight(gb)
		switch {
		case w == nil:
			return v, nil, rejectf("expert projection %s has a bias that is not a constant weight", graph.NodeLabel(e.n))
		case bias != nil:
			return v, nil, rejectf("expert projection %s has two biases (its C input and an Add)", graph.NodeLabel(e.n))
		}
		bias = w
	}
	return v, bias, nil
}

// afterBias follows v through noise and an Add of a constant (or gathered
// constant) bias; it returns the value after them and the bias trace.
func (c *ctx) afterBias(v string) (string, *wtrace) {
	var bias *wtrace
	for {
		cons := c.g.Consumers(v)
		if len(cons) != 1 {
			return v, bias
		}
		n := cons[0]
		if noiseOps[n.GetOpType()] && n.GetOpType() != "Cast" {
			v = n.Output[0]
			continue
		}
		if n.GetOpType() == "Add" && bias == nil {
			other := n.Input[0]
			if other == v {
				other = n.Input[1]
			}
			if w := c.matmulWeight(other); w != nil {
				bias = w
				v = n.Output[0]
				continue
			}
		}
		return v, bias
	}
}

// expertBranch is one branch of a block's experts: its first projection(s)
// and down projection, the expert it computes (-1: not known yet), and
// whether it computes every expert from stacked weights.
type expertBranch struct {
	key     string
	l1      []*emm
	l2      *emm
	expert  int
	stacked bool
}

// expertReader carries the state of reading a block's experts (see
// experts): the expert matmuls of the region and their branches.
type expertReader struct {
	c          *ctx
	b          *Block
	tk         *pb.NodeProto
	ri         *routerInfo
	s          *moe.Spec
	shared     map[*pb.NodeProto]bool
	ems        []*emm
	byPos      map[int32]*emm
	deps       map[*emm][]int32 // down projection -> the positions it depends on
	allStacked bool
	kind       string
	branches   []*expertBranch
	bykey      map[string]*expertBranch
}

// experts reads the experts of block b: the expert matmuls of its region,
// grouped into branches (one per expert, or one for stacked weights), their
// expert ids, and each expert's weights in plan. It returns the shape kind;
// a sort-based block is handed to sortedExperts.
func (c *ctx) experts(b *Block, tk *pb.NodeProto, ri *routerInfo, s *moe.Spec, shared map[*pb.NodeProto]bool, plan *WeightPlan) (string, error) {
	st, err := c.sortOf(tk)
	if err != nil {
		return "", err
	}
	if st != nil {
		return c.sortedExperts(b, tk, st, ri, s, shared, plan)
	}
	r := &expertReader{c: c, b: b, tk: tk, ri: ri, s: s, shared: shared}
	for _, step := range []func() error{r.findMatMuls, r.groupBranches, r.pairDown, r.branchIDs, r.tracedBranches, r.coverage} {
		if err := step(); err != nil {
			return "", err
		}
	}
	if err := r.fillPlan(plan); err != nil {
		return "", err
	}
	s.Inter = expertInter(plan)
	s.ExpertBias = plan.Experts[0].GateB != nil || plan.Experts[0].UpB != nil || plan.Experts[0].DownB != nil
	return r.kind, nil
}

// findMatMuls lists the expert matmuls of the region (but the router's and
// the shared expert's) and marks the down projections: those that depend on
// another expert matmul, whose dependencies pair them with their branch.
func (r *expertReader) findMatMuls() error {
	c, b := r.c, r.b
	r.byPos = map[int32]*emm{}
	for i, n := range b.Region {
		if n == r.ri.linear || r.shared[n] {
			continue
		}
		if e := c.expertMatMul(n); e != nil {
			r.ems = append(r.ems, e)
			if len(b.regionPos) == len(b.Region) {
				e.pos = b.regionPos[i]
			} else {
				e.pos, _ = c.posOf(n)
			}
			r.byPos[e.pos] = e
		}
	}
	if len(r.ems) == 0 {
		return rejectf("no expert matmuls between the router and the combine")
	}
	stop := c.valueIDs(b.Input)
	r.deps = map[*emm][]int32{}
	var scratch []int32
	for _, e := range r.ems {
		scratch = c.backPosInto(scratch[:0], e.act, stop)
		for _, p := range scratch {
			if r.byPos[p] != nil {
				e.layer2 = true
				r.deps[e] = slices.Clone(scratch)
				break
			}
		}
	}
	return nil
}

// branch returns the branch of key k, new ones in the order first asked.
func (r *expertReader) branch(k string) *expertBranch {
	if br := r.bykey[k]; br != nil {
		return br
	}
	br := &expertBranch{key: k, expert: -1}
	r.bykey[k] = br
	r.branches = append(r.branches, br)
	return br
}

// groupBranches groups the first projections into branches: one for
// stacked weights used by every token (batched or dense), else one per
// constant expert index, traced loop slot or activation input (unrolled).
func (r *expertReader) groupBranches() error {
	r.allStacked = true
	for _, e := range r.ems {
		if e.w.sel == selConst || e.w.sel == selSlot || (e.w.sel == selNone && len(e.w.t.GetDims()) == 2) {
			r.allStacked = false
		}
	}
	r.kind = KindBatched
	r.bykey = map[string]*expertBranch{}
	for _, e := range r.ems {
		if e.layer2 {
			continue
		}
		switch {
		case r.allStacked:
			e.key = "all"
			if e.w.sel == selNone {
				r.kind = KindDense
			}
		case e.w.sel == selConst:
			e.key = fmt.Sprintf("const:%d", e.w.expert)
		case e.w.sel == selSlot:
			e.key = "slot:" + e.w.slotKey
		default:
			e.key = "act:" + r.c.through(e.act)
		}
		r.branch(e.key).l1 = append(r.branch(e.key).l1, e)
	}
	if !r.allStacked {
		r.kind = KindUnrolled
	}
	return nil
}

// pairDown gives each branch the one down projection that depends on its
// first projections.
func (r *expertReader) pairDown() error {
	l1Branch := map[int32]*expertBranch{}
	for _, br := range r.branches {
		for _, l1 := range br.l1 {
			l1Branch[l1.pos] = br
		}
	}
	for _, e := range r.ems {
		if !e.layer2 {
			continue
		}
		var owner *expertBranch
		for _, p := range r.deps[e] {
			if br := l1Branch[p]; br != nil {
				if owner != nil && owner != br {
					return rejectf("down projection %q depends on two expert branches", graph.NodeLabel(e.n))
				}
				owner = br
			}
		}
		if owner == nil || owner.l2 != nil {
			return rejectf("cannot pair down projection %q with its expert", graph.NodeLabel(e.n))
		}
		owner.l2 = e
	}
	for _, br := range r.branches {
		if br.l2 == nil || len(br.l1) == 0 || len(br.l1) > 2 {
			return rejectf("expert branch with %d input projections and no single down projection", len(br.l1))
		}
	}
	return nil
}

// branchIDs reads each branch's expert id: stacked, a constant index, or
// the id that selects the branch's tokens.
func (r *expertReader) branchIDs() error {
	for _, br := range r.branches {
		switch {
		case br.key == "all":
			br.stacked = true
		case strings.HasPrefix(br.key, "const:"):
			br.expert = br.l1[0].w.expert
		case strings.HasPrefix(br.key, "slot:"):
			br.stacked = true
		default:
			e, err := r.c.branchExpert(br.l1[0].act, r.b.Input, r.tk)
			if err != nil {
				return err
			}
			br.expert = e
		}
	}
	return nil
}

// tracedBranches checks the branches of a traced loop over hit experts
// (one per iteration, all on the same stacked weights) and keeps one of
// them, which stands for all.
func (r *expertReader) tracedBranches() error {
	slots, E := 0, r.s.NumExperts
	for _, br := range r.branches {
		if strings.HasPrefix(br.key, "slot:") {
			slots++
		}
	}
	if slots == 0 {
		return nil
	}
	if slots != len(r.branches) {
		return rejectf("mixed traced-loop and constant expert branches")
	}
	if slots < E && r.c.restore {
		r.b.TracedExperts = slots
	} else if slots < E {
		return rejectf("the trace unrolled its loop over hit experts %d times but there are %d experts: tokens routed to the %d expert(s) not hit at trace time are lost (the graph is right only for inputs that hit at most %d experts; the RestoreTracedExperts option, mokopt rewrite --restore-traced-experts, rebuilds all experts from the stacked weights)", slots, E, E-slots, slots)
	}
	if slots > E {
		return rejectf("%d traced expert branches for %d experts", slots, E)
	}
	// Every traced branch reads the same stacked weights: any one of
	// them stands for all, whichever the node order lists first.
	for _, br := range r.branches[1:] {
		if !sameWeights(br.l1, r.branches[0].l1) || br.l2.w.t != r.branches[0].l2.w.t {
			return rejectf("traced expert branches read different weights")
		}
	}
	r.branches = r.branches[:1]
	return nil
}

// coverage puts the branches in expert order, so that the activation is
// read from the same branch (expert 0's) whatever the node order, and
// checks that per-expert branches compute each expert once.
func (r *expertReader) coverage() error {
	branches, E := r.branches, r.s.NumExperts
	sort.SliceStable(branches, func(i, j int) bool { return branches[i].expert < branches[j].expert })
	if branches[0].stacked {
		return nil
	}
	seen := map[int]bool{}
	for _, br := range branches {
		if br.expert < 0 || br.expert >= E {
			return rejectf("expert branch with id %d outside 0..%d", br.expert, E-1)
		}
		if seen[br.expert] {
			return rejectf("expert %d computed by two branches", br.expert)
		}
		seen[br.expert] = true
	}
	var missing []string
	for e := 0; e < E; e++ {
		if !seen[e] {
			missing = append(missing, fmt.Sprint(e))
		}
	}
	if len(missing) > 0 {
		r.b.NullExperts = r.c.nullExperts(r.b, r.tk, seen, E) // nullexperts.go
	}
	if len(missing) > 0 && r.b.NullExperts == 0 {
		return rejectf("expert(s) %s missing from the graph: %d of %d experts have compute (a trace that baked in only the experts hit at trace time, or router outputs without expert weights, such as zero-computation experts, which ai.mok::MoE cannot express)", strings.Join(missing, ", "), len(branches), E)
	}
	return nil
}

// fillPlan reads each branch's roles (the activation from the first
// branch) and fills plan with each expert's weights.
func (r *expertReader) fillPlan(plan *WeightPlan) error {
	c, s, E := r.c, r.s, r.s.NumExperts
	plan.Experts = make([]ExpertProj, E)
	rwDeps := c.reachFrom(r.tk.Output[0])
	for bi, br := range r.branches {
		roles, err := c.roles(br.l1, br.l2, s, bi == 0)
		if err != nil {
			return err
		}
		if br.stacked {
			if err := c.checkStacked(roles, E); err != nil {
				return err
			}
		}
		if p := c.g.Producer(br.l1[0].act); p != nil && rwDeps.has(p) {
			s.WeightsOnInput = true
		}
		for e := 0; e < E; e++ {
			if br.stacked || e == br.expert {
				plan.Experts[e] = branchProj(br, roles, e)
			}
		}
	}
	return nil
}

// branchProj is expert e's weights in branch br with roles.
func branchProj(br *expertBranch, roles roleSet, e int) ExpertProj {
	idx := -1
	if br.stacked || br.l1[0].w.sel == selConst {
		idx = e
	}
	mk := func(r *roleRef) *Proj {
		if r == nil {
			return nil
		}
		i := idx
		if len(r.w.t.GetDims()) == 1 || (len(r.w.t.GetDims()) == 2 && r.isBias && r.w.sel == selNone) || (len(r.w.t.GetDims()) == 2 && !r.isBias) {
			i = -1
		}
		return &Proj{Init: r.w.t, Expert: i, InOut: r.inOut, Part: r.part}
	}
	return ExpertProj{Gate: mk(roles.gate), Up: mk(roles.up), Down: mk(roles.down), GateB: mk(roles.gateB), UpB: mk(roles.upB), DownB: mk(roles.downB)}
}

// expertInter is the intermediate size, from the first expert's up
// projection.
func expertInter(plan *WeightPlan) int {
	up := plan.Experts[0].Up
	d := up.Init.GetDims()
	out := int(d[len(d)-2])
	if up.InOut {
		out = int(d[len(d)-1])
	}
	if up.Part != PartWhole {
		out /= 2
	}
	return out
}

// sameWeights reports whether two branches' input projections read the
// same initializers (as sets).
func sameWeights(a, b []*emm) bool {
	if len(a) != len(b) {
		return false
	}
	for _, x := range a {
		if !slices.ContainsFunc(b, func(y *emm) bool { return y.w.t == x.w.t }) {
			return false
		}
	}
	return true
}

// branchExpert finds the constant expert id that selects a branch's tokens:
// Gather(mask-from-indices, e) or Equal(indices, e) behind the branch input.
func (c *ctx) branchExpert(act, x0 string, tk *pb.NodeProto) (int, error) {
	if c.idxDeps == nil {
		c.idxDeps = c.reachFrom(tk.Output[1]) // shared by the block's branches
	}
	idxDeps := c.idxDeps
	found := -1
	for _, p := range c.backPos(act, c.valueIDs(x0)) {
		if !idxDeps.hasPos(p) {
			continue
		}
		n := c.topo[p]
		var cand []string
		switch n.GetOpType() {
		case "Gather":
			// a row of NonZero's coordinates (the token or the slot of
			// the selected positions) is picked by its axis, not an expert
			if p := c.g.Producer(n.Input[0]); p != nil && idxDeps.has(p) && !c.nonZeroCoords(p) {
				cand = []string{n.Input[1]}
			}
		case "Equal":
			cand = n.Input
		}
		for _, v := range cand {
			if e, ok := c.scalarInt(v); ok {
				if found >= 0 && found != int(e) {
					return 0, rejectf("expert branch selected by two constants (%d and %d)", found, e)
				}
				found = int(e)
			}
		}
	}
	if found < 0 {
		return 0, rejectf("cannot tell which expert a branch computes")
	}
	return found, nil
}

// nonZeroCoords reports whether p computes NonZero's coordinates, as they
// are or transposed (a row per position, as torch's nonzero gives them).
func (c *ctx) nonZeroCoords(p *pb.NodeProto) bool {
	if p.GetOpType() == "Transpose" && p.GetDomain() == "" {
		p = c.g.Producer(p.Input[0])
	}
	return p != nil && p.GetOpType() == "NonZero" && p.GetDomain() == ""
}

type roleRef struct {
	w      *wtrace
	inOut  bool
	part   int
	isBias bool
}

type roleSet struct{ gate, up, down, gateB, upB, downB *roleRef }

// roles assigns gate/up/down to a branch's matmuls by identifying its
// activation (expertAct): when analyse is set the activation is read into
// the spec, otherwise the branch must compute the spec's.
func (c *ctx) roles(l1 []*emm, l2 *emm, s *moe.Spec, analyse bool) (roleSet, error) {
	var rs roleSet
	rs.down = &roleRef{w: l2.w, inOut: l2.inOut}
	if gb := gemmBias(l2.n); gb != "" {
		if w := c.matmulWeight(gb); w != nil {
			rs.downB = &roleRef{w: w, isBias: true}
		}
	}
	if _, bias := c.afterBias(l2.out); bias != nil {
		rs.downB = &roleRef{w: bias, isBias: true}
	}
	dt := c.actType(l1[0])
	if len(l1) == 2 {
		a, aBias, err := c.projOut(l1[0])
		if err != nil {
			return roleSet{}, err
		}
		bv, bBias, err := c.projOut(l1[1])
		if err != nil {
			return roleSet{}, err
		}
		id, err := c.expertAct(l2.act, []string{a, bv}, dt, s, analyse)
		if err != nil {
			return roleSet{}, err
		}
		gi, ui := 0, 1
		gBias, uBias := aBias, bBias
		if id.swap {
			gi, ui = 1, 0
			gBias, uBias = bBias, aBias
		}
		rs.gate = &roleRef{w: l1[gi].w, inOut: l1[gi].inOut}
		rs.up = &roleRef{w: l1[ui].w, inOut: l1[ui].inOut}
		if gBias != nil {
			rs.gateB = &roleRef{w: gBias, isBias: true}
		}
		if uBias != nil {
			rs.upB = &roleRef{w: uBias, isBias: true}
		}
		return rs, nil
	}
	v, bias, err := c.projOut(l1[0])
	if err != nil {
		return roleSet{}, err
	}
	parts := c.splitParts(v)
	if parts == nil {
		// A two-layer MLP without gate: GELU, ReLU or another ungated row.
		if _, err := c.expertAct(l2.act, []string{v}, dt, s, analyse); err != nil {
			return roleSet{}, err
		}
		rs.up = &roleRef{w: l1[0].w, inOut: l1[0].inOut}
		if bias != nil {
			rs.upB = &roleRef{w: bias, isBias: true}
		}
		return rs, nil
	}
	id, err := c.expertAct(l2.act, []string{parts[0].v, parts[1].v}, dt, s, analyse)
	if err != nil {
		return roleSet{}, err
	}
	g, u := parts[0], parts[1]
	if id.swap {
		g, u = u, g
	}
	rs.gate = &roleRef{w: l1[0].w, inOut: l1[0].inOut, part: g.part}
	rs.up = &roleRef{w: l1[0].w, inOut: l1[0].inOut, part: u.part}
	if bias != nil {
		rs.gateB = &roleRef{w: bias, isBias: true, part: g.part}
		rs.upB = &roleRef{w: bias, isBias: true, part: u.part}
	}
	s.GateUpInterleaved = g.part == PartEven || g.part == PartOdd
	return rs, nil
}

type part struct {
	v    string
	part int
}

// splitParts finds how a fused gate_up output is split in two along its
// last axis: Split into two, or two Slices (halves, or step-2 interleave).
func (c *ctx) splitParts(v string) []part {
	cons := c.g.Consumers(v)
	if len(cons) == 1 && cons[0].GetOpType() == "Split" && len(cons[0].Output) == 2 {
		return []part{{cons[0].Output[0], PartFirstHalf}, {cons[0].Output[1], PartSecondHalf}}
	}
	var out []part
	for _, n := range cons {
		if n.GetOpType() != "Slice" || len(n.Input) < 3 {
			continue
		}
		st, ok := c.scalarInt(n.Input[1])
		if !ok {
			st = -1
			if p := c.g.Producer(n.Input[1]); p != nil {
				st = -2 // computed start: the second half
			}
		}
		step := int64(1)
		if len(n.Input) > 4 && n.Input[4] != "" {
			step, _ = c.scalarInt(n.Input[4])
		}
		switch {
		case step == 2 && st == 0:
			out = append(out, part{n.Output[0], PartEven})
		case step == 2 && st == 1:
			out = append(out, part{n.Output[0], PartOdd})
		case step == 1 && st == 0:
			out = append(out, part{n.Output[0], PartFirstHalf})
		case step == 1:
			out = append(out, part{n.Output[0], PartSecondHalf})
		default:
			return nil
		}
	}
	if len(out) != 2 || out[0].part == out[1].part {
		return nil
	}
	sort.Slice(out, func(i, j int) bool { return out[i].part < out[j].part })
	return out
}

// sharedExpert reads an (optionally sigmoid-gated) SwiGLU shared expert.
func (c *ctx) sharedExpert(v, x0 string, s *moe.Spec, plan *WeightPlan) error {
	nodes := c.backNodes(v, x0)
	var ems []*emm
	byNode := map[*pb.NodeProto]*emm{}
	for _, n := range nodes {
		if e := c.expertMatMul(n); e != nil && e.w.sel == selNone && len(e.w.t.GetDims()) == 2 {
			ems = append(ems, e)
			byNode[n] = e
		}
	}
	var gateW *emm
	var rest []*emm
	for _, e := range ems {
		d := e.w.t.GetDims()
		if d[0] == 1 || d[1] == 1 {
			gateW = e
		} else {
			rest = append(rest, e)
		}
	}
	var l1 []*emm
	var l2 *emm
	for _, e := range rest {
		isL2 := false
		for _, n := range c.backNodes(e.act, x0) {
			if byNode[n] != nil && byNode[n] != gateW {
				isL2 = true
			}
		}
		if isL2 {
			if l2 != nil {
				return rejectf("shared expert has two down projections")
			}
			l2 = e
		} else {
			l1 = append(l1, e)
		}
	}
	if l2 == nil || len(l1) != 2 && len(l1) != 1 {
		return rejectf("shared expert is not a SwiGLU MLP (%d input projections)", len(l1))
	}
	tmp := moe.Spec{}
	rs, err := c.roles(l1, l2, &tmp, true)
	if err != nil {
		return err
	}
	if tmp.Activation != moe.SwiGLU {
		return rejectf("shared expert's activation is %s; ai.mok::MoE's shared expert is SwiGLU only", tmp.Activation)
	}
	if rs.gateB != nil || rs.upB != nil || rs.downB != nil {
		return rejectf("shared expert has biases; ai.mok::MoE's shared expert is a SwiGLU MLP without biases")
	}
	plan.SharedGate = &Proj{Init: rs.gate.w.t, Expert: -1, InOut: rs.gate.inOut, Part: rs.gate.part}
	plan.SharedUp = &Proj{Init: rs.up.w.t, Expert: -1, InOut: rs.up.inOut, Part: rs.up.part}
	plan.SharedDown = &Proj{Init: rs.down.w.t, Expert: -1, InOut: rs.down.inOut}
	d := rs.down.w.t.GetDims()
	s.SharedInter = int(d[1])
	if rs.down.inOut {
		s.SharedInter = int(d[0])
	}
	if gateW != nil {
		s.SharedGated = true
		plan.SharedGateW = &Proj{Init: gateW.w.t, Expert: -1, InOut: gateW.inOut}
	}
	return nil
}

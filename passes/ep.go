package passes

import (
	"fmt"
	"maps"
	"slices"
	"strconv"

	"github.com/mokopt/mokopt/graph"
	pb "github.com/mokopt/mokopt/graph/onnxpb"
	"github.com/mokopt/mokopt/internal/ep"
	"github.com/mokopt/mokopt/moe"
	"google.golang.org/protobuf/proto"
)

// Shape kinds of expert-parallel blocks (one rank's shard).
const (
	// KindEPAllToAll is a block whose tokens reach the expert ranks through
	// all_to_all collectives (com.microsoft::AllToAll).
	KindEPAllToAll = "ep-alltoall"
	// KindEPDispatch is a block with DeepEP-style dispatch/combine nodes.
	KindEPDispatch = "ep-dispatch"
	// KindEPAllGather is a block whose tokens are all-gathered to every
	// rank and whose partial expert sums are all-reduced (com.microsoft
	// AllGather / AllReduce, Megatron's all-gather dispatcher).
	KindEPAllGather = "ep-allgather"
)

// Metadata keys of a per-rank EP model (metadata_props): the file's rank
// in its EP group and the group size.
const (
	MetaEPRank = "ai.mok.ep_rank"
	MetaEPSize = "ai.mok.ep_size"
)

// Router-weight placements of an EP block (Block.Placement).
const (
	PlacementBeforeCombine = "before_combine"
	PlacementAfterCombine  = "after_combine"
)

// epOps returns the collective nodes of the graph in topological order.
func (c *ctx) epOps() map[*pb.NodeProto]ep.Op {
	out := map[*pb.NodeProto]ep.Op{}
	for _, n := range c.topo {
		if o, ok := c.epTable.Lookup(n.GetDomain(), n.GetOpType()); ok {
			out[n] = o
		}
	}
	return out
}

// reachCollectives returns the collective nodes reachable from vals
// without crossing another collective, in topological order.
func (c *ctx) reachCollectives(cols map[*pb.NodeProto]ep.Op, vals ...string) []*pb.NodeProto {
	seen := map[*pb.NodeProto]bool{}
	var hit []*pb.NodeProto
	stack := append([]string(nil), vals...)
	for len(stack) > 0 {
		v := stack[len(stack)-1]
		stack = stack[:len(stack)-1]
		for _, n := range c.g.Consumers(v) {
			if seen[n] {
				continue
			}
			seen[n] = true
			if _, ok := cols[n]; ok {
				hit = append(hit, n)
				continue
			}
			stack = append(stack, n.Output...)
		}
	}
	c.sortByOrder(hit)
	return hit
}

// detectEPAt recognises one rank's EP block around the router TopK tk:
// dispatch collectives reached from the router without crossing another
// collective, one combine collective reached from them, the local experts
// between the two, and the router-weight multiply before or after combine.
func (c *ctx) detectEPAt(tk *pb.NodeProto, cols map[*pb.NodeProto]ep.Op) (b *Block, err error) {
	if err := attempt(func() (e error) { b, e = c.epBlock(tk, cols); return e }); err != nil {
		return nil, err
	}
	return b, nil
}

// epReader carries the state of recognising one rank's EP block (see
// detectEPAt): the router, the dispatch and combine collectives, the local
// experts between them and the block's output.
type epReader struct {
	c       *ctx
	tk      *pb.NodeProto
	cols    map[*pb.NodeProto]ep.Op
	s       moe.Spec
	ri      *routerInfo
	E       int
	x0      string          // the router's input, through noise
	disp    []*pb.NodeProto // the dispatch collectives, in topological order
	dOuts   []string        // their outputs
	kind    string          // KindEPAllToAll, KindEPAllGather or KindEPDispatch
	group   int             // the EP group size the collectives agree on (-1: none read yet)
	cn      *pb.NodeProto   // the combine collective
	G, L    int             // group size, local experts per rank
	local   map[*pb.NodeProto]bool
	roles   roleSet
	xDeps   map[*pb.NodeProto]bool // nodes computed from x0
	wDeps   map[*pb.NodeProto]bool // nodes computed from the top-k weights
	y       string                 // the block output
	after   bool                   // the routing weights multiply after the combine
	shared  string                 // the shared expert's output added after the combine
	region  []*pb.NodeProto
	placing string
	plan    *WeightPlan
}

func (c *ctx) epBlock(tk *pb.NodeProto, cols map[*pb.NodeProto]ep.Op) (*Block, error) {
	r := &epReader{c: c, tk: tk, cols: cols, s: moe.Spec{RoutedScalingFactor: 1, SwiGLUAlpha: 1}, group: -1}
	for _, step := range []func() error{r.readRouter, r.readDispatch, r.readCombine, r.readLocalExperts, r.readOutput, r.readPlacement, r.readRegion, r.fillPlan, r.setSharding} {
		if err := step(); err != nil {
			return nil, err
		}
	}
	b := &Block{Kind: r.kind, Spec: r.s, Input: c.inputLike(r.x0, r.ri.x, r.y), Router: r.ri.x, Output: r.y, TopK: tk,
		Region: r.region, Nodes: len(r.region), W: r.plan, Placement: r.placing}
	b.Name = blockName(r.y, r.ri.w.GetName(), r.region)
	return b, nil
}

// readRouter reads the top-k, the router and its shape.
func (r *epReader) readRouter() error {
	c, tk, s := r.c, r.tk, &r.s
	k, ok := c.scalarInt(tk.Input[1])
	if !ok {
		return rejectf("TopK k is not a constant")
	}
	s.TopK = int(k)
	ri, err := c.router(tk)
	if err != nil {
		return err
	}
	r.ri = ri
	s.RouterActivation, s.RouterOrder, s.NGroup, s.TopKGroup = ri.act, ri.order, ri.nGroup, ri.topkGroup
	if err := c.routerShape(ri, s); err != nil {
		return err
	}
	r.E = s.NumExperts
	return nil
}

// readDispatch finds the dispatch: the collectives reached from the top-k
// indices, plus those reached from the top-k weights that are not
// downstream of the former (weights applied after combine flow on to later
// layers), plus an all-gather of the block input itself (tokens gathered
// apart from the routing).
func (r *epReader) readDispatch() error {
	c, tk := r.c, r.tk
	first := c.reachCollectives(r.cols, tk.Output[1])
	if len(first) == 0 {
		return rejectf("no collective after the router")
	}
	var firstOuts []string
	for _, n := range first {
		firstOuts = append(firstOuts, n.Output...)
	}
	later := c.forward(firstOuts...)
	disp := first
	for _, n := range c.reachCollectives(r.cols, tk.Output[0]) {
		if !later[n] && !containsNode(disp, n) {
			disp = append(disp, n)
		}
	}
	r.x0 = c.through(r.ri.x)
	for n, o := range r.cols {
		if o.Kind == ep.AllGather && len(n.Input) > 0 && c.through(n.Input[0]) == r.x0 && !containsNode(disp, n) {
			disp = append(disp, n)
		}
	}
	c.sortByOrder(disp)
	r.disp = disp
	for _, n := range disp {
		if err := r.dispatchKind(n); err != nil {
			return err
		}
		if err := r.checkGroup(n); err != nil {
			return err
		}
		r.dOuts = append(r.dOuts, n.Output...)
	}
	return nil
}

// dispatchKind reads the block's kind from one dispatch collective n; the
// collectives of one dispatch must agree on it.
func (r *epReader) dispatchKind(n *pb.NodeProto) error {
	switch r.cols[n].Kind {
	case ep.AllToAll, ep.AllGather:
		k := KindEPAllToAll
		if r.cols[n].Kind == ep.AllGather {
			k = KindEPAllGather
		}
		if r.kind != "" && r.kind != k {
			return rejectf("mixed %s and %s collectives after the router (%q)", r.kind, k, graph.NodeLabel(n))
		}
		r.kind = k
	case ep.Dispatch:
		if r.kind != "" {
			return rejectf("more than one dispatch after the router (%q)", graph.NodeLabel(n))
		}
		r.kind = KindEPDispatch
		if e, ok := attrIntOK(n, r.cols[n].ExpertsAttr); ok && int(e) != r.E {
			return rejectf("dispatch %q routes %d experts but the router has %d", graph.NodeLabel(n), e, r.E)
		}
	default:
		return rejectf("%s collective %q after the router: an EP dispatch is all_to_all, all_gather or dispatch", r.cols[n].Kind, graph.NodeLabel(n))
	}
	return nil
}

// checkGroup reads collective n's EP group size; the collectives of one
// block must agree on it.
func (r *epReader) checkGroup(n *pb.NodeProto) error {
	o := r.cols[n]
	gs, ok := attrIntOK(n, o.GroupAttr)
	if !ok || gs < 1 {
		return rejectf("%s::%s %q has no %s attribute (the EP group size)", o.Domain, o.Name, graph.NodeLabel(n), o.GroupAttr)
	}
	if r.group >= 0 && int(gs) != r.group {
		return rejectf("collectives of one block disagree on the group size (%d and %d at %q)", r.group, gs, graph.NodeLabel(n))
	}
	r.group = int(gs)
	return nil
}

// readCombine finds the one collective after the dispatch, checks that it
// combines what the dispatch sent, and derives the local expert count.
func (r *epReader) readCombine() error {
	comb := r.c.reachCollectives(r.cols, r.dOuts...)
	if len(comb) != 1 {
		return rejectf("%d collectives after the dispatch, want exactly one combine", len(comb))
	}
	cn := comb[0]
	ck := r.cols[cn].Kind
	switch {
	case r.kind == KindEPAllToAll && ck == ep.AllToAll, r.kind == KindEPDispatch && ck == ep.Combine,
		r.kind == KindEPAllGather && ck == ep.AllReduce:
	default:
		return rejectf("the collective after the dispatch (%q, %s) is not its combine", graph.NodeLabel(cn), ck)
	}
	if err := r.checkGroup(cn); err != nil {
		return err
	}
	r.cn, r.G = cn, r.group
	if r.E%r.G != 0 {
		return rejectf("the EP group of %d ranks does not divide the router's %d experts", r.G, r.E)
	}
	r.L = r.E / r.G
	return nil
}

// readLocalExperts reads the local experts' matmuls between the dispatch
// and the combine, and their roles.
func (r *epReader) readLocalExperts() error {
	c := r.c
	r.local = map[*pb.NodeProto]bool{}
	fwd := c.forward(r.dOuts...)
	for n := range c.backward(r.cn.Input[0], nil) {
		if fwd[n] {
			r.local[n] = true
		}
	}
	var ems []*emm
	byNode := map[*pb.NodeProto]*emm{}
	for _, n := range c.topo {
		if r.local[n] {
			if e := c.expertMatMul(n); e != nil && len(e.w.t.GetDims()) == 3 {
				ems = append(ems, e)
				byNode[n] = e
			}
		}
	}
	if len(ems) < 2 {
		return rejectf("%d expert matmuls between dispatch and combine, want 2 or 3 (gate/up or fused gate_up, down)", len(ems))
	}
	l1, l2, err := r.layers(ems, byNode)
	if err != nil {
		return err
	}
	for _, e := range ems {
		if d := e.w.t.GetDims(); int(d[0]) != r.L {
			return rejectf("local expert weight %q has %d experts, the group of %d ranks over %d experts needs %d per rank", e.w.t.GetName(), d[0], r.G, r.E, r.L)
		}
	}
	c.setLimit(slices.Collect(maps.Keys(r.local)))
	r.roles, err = c.roles(l1, l2, &r.s, true)
	c.setLimit(nil)
	return err
}

// layers splits the local expert matmuls into first projections (no expert
// matmul before them) and the one down projection.
func (r *epReader) layers(ems []*emm, byNode map[*pb.NodeProto]*emm) ([]*emm, *emm, error) {
	var l1 []*emm
	var l2 *emm
	for _, e := range ems {
		second := false
		for n := range r.c.backward(e.act, nil) {
			if byNode[n] != nil {
				second = true
			}
		}
		if !second {
			l1 = append(l1, e)
		} else if l2 != nil {
			return nil, nil, rejectf("two down projections between dispatch and combine (%q, %q)", graph.NodeLabel(l2.n), graph.NodeLabel(e.n))
		} else {
			l2 = e
		}
	}
	if l2 == nil || len(l1) == 0 || len(l1) > 2 {
		return nil, nil, rejectf("expert compute with %d input projections and no single down projection", len(l1))
	}
	return l1, l2, nil
}

// readOutput follows the combine to the block output: through noise, the
// sum over source ranks and slots, the router-weight multiply, and a shared
// expert.
func (r *epReader) readOutput() error {
	c := r.c
	r.xDeps = c.forward(r.x0)
	r.wDeps = c.forward(r.tk.Output[0])
	r.y = r.cn.Output[0]
	fwdComb := c.forward(r.y)
	for {
		cons := c.g.Consumers(r.y)
		if len(cons) != 1 || c.g.IsOutput(r.y) {
			return nil
		}
		next, ok := r.outputStep(cons[0], fwdComb)
		if !ok {
			return nil
		}
		r.y = next
	}
}

// outputStep reports whether n, the one consumer of the output so far,
// extends the block output, and the output then.
func (r *epReader) outputStep(n *pb.NodeProto, fwdComb map[*pb.NodeProto]bool) (string, bool) {
	c := r.c
	op := n.GetOpType()
	if noiseOps[op] && op != "Cast" || op == "ReduceSum" || op == "Slice" && r.kind == KindEPAllGather {
		return n.Output[0], true
	}
	if op == "Mul" && !r.after {
		other := otherInput(n, r.y)
		if p := c.g.Producer(other); other == r.tk.Output[0] || p != nil && r.wDeps[p] && !fwdComb[p] {
			r.after = true
			return n.Output[0], true
		}
	}
	if op == "Add" && r.shared == "" {
		other := otherInput(n, r.y)
		if p := c.g.Producer(other); p != nil && r.xDeps[p] && !r.wDeps[p] && c.hasWeightMatMul(other, r.x0) {
			r.shared = other
			return n.Output[0], true
		}
	}
	return "", false
}

// otherInput is the input of a binary node n that is not y (its first when
// neither or both are).
func otherInput(n *pb.NodeProto, y string) string {
	if n.Input[0] == y {
		return n.Input[1]
	}
	return n.Input[0]
}

// readPlacement decides whether the routing weights multiply before the
// combine (a dispatched tensor carrying them is used locally) or after.
func (r *epReader) readPlacement() error {
	before := false
	for _, d := range r.disp {
		for i, in := range d.Input {
			if p := r.c.g.Producer(in); in != r.tk.Output[0] && (p == nil || !r.wDeps[p]) {
				continue
			}
			out := d.Output[0]
			if r.kind == KindEPDispatch {
				if i != 2 || len(d.Output) < 3 {
					continue
				}
				out = d.Output[2]
			}
			for n := range r.c.forward(out) {
				if r.local[n] {
					before = true
				}
			}
		}
	}
	r.placing = PlacementAfterCombine
	switch {
	case before && r.after:
		return rejectf("the routing weights are applied both before and after combine")
	case !before && !r.after:
		return rejectf("the routing weights are applied neither before nor after combine")
	case before:
		r.placing = PlacementBeforeCombine
	}
	return nil
}

// readRegion takes the block's region, refuses another collective inside
// it, and reads what the router computes after the top-k within it.
func (r *epReader) readRegion() error {
	c := r.c
	r.region = c.regionBetween(r.x0, r.y, r.xDeps)
	for _, n := range r.region {
		if _, ok := r.cols[n]; ok && n != r.cn && !containsNode(r.disp, n) {
			return rejectf("another collective %q inside the block", graph.NodeLabel(n))
		}
	}
	c.setLimit(r.region)
	defer c.setLimit(nil)
	if err := c.routerPost(r.tk, r.ri, &r.s); err != nil {
		return rejectf("%v", err)
	}
	return nil
}

// fillPlan fills the weight plan of the L local experts, the intermediate
// size, and the shared expert.
func (r *epReader) fillPlan() error {
	ri, roles, s := r.ri, r.roles, &r.s
	plan := &WeightPlan{Router: Proj{Init: ri.w, Expert: -1, InOut: ri.wInOut}, Experts: make([]ExpertProj, r.L)}
	if ri.bias != nil {
		plan.RouterB = &Proj{Init: ri.bias, Expert: -1}
	}
	if ri.corr != nil {
		plan.Corr = &Proj{Init: ri.corr, Expert: -1}
	}
	mk := func(rr *roleRef, e int) *Proj {
		if rr == nil {
			return nil
		}
		return &Proj{Init: rr.w.t, Expert: e, InOut: rr.inOut, Part: rr.part}
	}
	for e := 0; e < r.L; e++ {
		plan.Experts[e] = ExpertProj{Gate: mk(roles.gate, e), Up: mk(roles.up, e), Down: mk(roles.down, e),
			GateB: mk(roles.gateB, e), UpB: mk(roles.upB, e), DownB: mk(roles.downB, e)}
	}
	up := plan.Experts[0].Up
	d := up.Init.GetDims()
	s.Inter = int(d[1])
	if up.InOut {
		s.Inter = int(d[2])
	}
	if up.Part != PartWhole {
		s.Inter /= 2
	}
	s.ExpertBias = roles.gateB != nil || roles.upB != nil || roles.downB != nil
	r.plan = plan
	if r.shared != "" {
		return r.c.sharedExpert(r.shared, r.x0, s, plan)
	}
	return nil
}

// setSharding records this rank's shard in the spec and validates it.
func (r *epReader) setSharding() error {
	rank, err := r.c.epRank(r.G)
	if err != nil {
		return err
	}
	s := &r.s
	s.EPSize, s.ExpertOffset, s.LocalExperts = r.G, rank*r.L, r.L
	if r.G == 1 {
		s.LocalExperts = 0
	}
	if err := s.Validate(); err != nil {
		return rejectf("%v", err)
	}
	return nil
}

func containsNode(ns []*pb.NodeProto, n *pb.NodeProto) bool {
	for _, x := range ns {
		if x == n {
			return true
		}
	}
	return false
}

// epRank reads this file's rank in its EP group of size G from
// metadata_props (MetaEPRank, and MetaEPSize when present).
func (c *ctx) epRank(G int) (int, error) {
	v, ok := c.m.Metadata(MetaEPRank)
	if !ok {
		return 0, rejectf("an EP block (group of %d ranks) in %s, but the file does not say its rank: set metadata_props %s (mokopt rewrite --ep-rank R, or --merge-ranks with the files in rank order)", G, c.m.Name(), MetaEPRank)
	}
	r, err := strconv.Atoi(v)
	if err != nil || r < 0 || r >= G {
		return 0, rejectf("%s: metadata %s=%q is not a rank in 0..%d", c.m.Name(), MetaEPRank, v, G-1)
	}
	if sz, ok := c.m.Metadata(MetaEPSize); ok && sz != strconv.Itoa(G) {
		return 0, rejectf("%s: metadata %s=%s but the collectives' group size is %d", c.m.Name(), MetaEPSize, sz, G)
	}
	return r, nil
}

// shardingEP reads an EP size from ONNX IR 10+ sharding annotations of a
// (global) block: device_configurations of region nodes that split axis 0
// of a stacked routed-expert weight into num_shards shards. It returns 1
// when there is none, and fails on annotations that disagree or do not
// divide the experts.
func (c *ctx) shardingEP(b *Block) (int, error) {
	experts := map[string]bool{}
	for _, e := range b.W.Experts {
		for _, q := range []*Proj{e.Gate, e.Up, e.Down} {
			if q != nil && q.Expert >= 0 && len(q.Init.GetDims()) == 3 {
				experts[q.Init.GetName()] = true
			}
		}
	}
	found := 0
	for _, n := range b.Region {
		for _, dc := range n.GetDeviceConfigurations() {
			for _, sp := range dc.GetShardingSpec() {
				if !experts[sp.GetTensorName()] {
					continue
				}
				for _, sd := range sp.GetShardedDim() {
					if sd.GetAxis() != 0 {
						return 0, rejectf("sharding of expert weight %q on node %q splits axis %d, not the expert axis 0 (tensor parallel experts are not EP)", sp.GetTensorName(), graph.NodeLabel(n), sd.GetAxis())
					}
					shards := int64(1)
					for _, ss := range sd.GetSimpleSharding() {
						shards *= ss.GetNumShards()
					}
					if shards < 1 || b.Spec.NumExperts%int(shards) != 0 {
						return 0, rejectf("sharding of expert weight %q on node %q: %d shards do not divide %d experts", sp.GetTensorName(), graph.NodeLabel(n), shards, b.Spec.NumExperts)
					}
					if found != 0 && found != int(shards) {
						return 0, rejectf("expert weights sharded %d and %d ways in one block", found, shards)
					}
					found = int(shards)
				}
			}
		}
	}
	return max(found, 1), nil
}

// attrIntOK returns an integer attribute and whether the node has it.
func attrIntOK(n *pb.NodeProto, name string) (int64, bool) {
	for _, a := range n.GetAttribute() {
		if a.GetName() == name && a.GetType() == pb.AttributeProto_INT {
			return a.GetI(), true
		}
	}
	return 0, false
}

// applySharding sets a global block's ep_size from its sharding annotations.
func (c *ctx) applySharding(b *Block) error {
	return attempt(func() error {
		g, err := c.shardingEP(b)
		if err != nil {
			return err
		}
		if g > 1 {
			b.Spec.EPSize = g
			b.Placement = "sharding"
			if err := b.Spec.Validate(); err != nil {
				return rejectf("%v", err)
			}
		}
		return nil
	})
}

// shardCheckNote explains why a model with EP shard blocks is not checked
// numerically on its own: its collectives need the other ranks. It returns
// "" when no block is a shard.
func shardCheckNote(blocks []*Block) string {
	n := 0
	for _, b := range blocks {
		if b.Spec.Shard() {
			n++
		}
	}
	if n == 0 {
		return ""
	}
	return fmt.Sprintf("%d EP shard block(s): the numerical check of one rank needs the whole group; mokopt rewrite --merge-ranks checks the group in lockstep", n)
}

// checkStacked refuses stacked expert weights that do not hold one matrix
// per routed expert, naming the cause the graph supports: router outputs
// without expert weights (null experts, or outputs that are not experts)
// and, only when the graph holds ops of another domain that could be
// collectives, one EP rank's E/EP experts behind collectives the op table
// does not name.
func (c *ctx) checkStacked(rs roleSet, E int) error {
	for _, r := range []*roleRef{rs.gate, rs.up, rs.down} {
		if r == nil {
			continue
		}
		d := r.w.t.GetDims()
		if len(d) != 3 || int(d[0]) == E {
			continue
		}
		name, n := r.w.t.GetName(), int(d[0])
		if n > E {
			return rejectf("stacked expert weight %q holds %d experts but the router scores only %d", name, n, E)
		}
		msg := fmt.Sprintf("the router scores %d experts but stacked expert weight %q holds %d: router outputs %d..%d have no expert weights (null experts, which contribute nothing, or router outputs that are not experts), which ai.mok::MoE cannot express", E, name, n, n, E-1)
		if op := c.foreignOp(); op != "" {
			msg += fmt.Sprintf("; or this is one rank of an expert-parallel model whose collectives (such as %s) are not in the EP op table (see --ep-ops)", op)
		}
		return rejectf("%s", msg)
	}
	return nil
}

// foreignOp names one op of the graph outside the default and ai.mok
// domains (a possible collective), or returns "".
func (c *ctx) foreignOp() string {
	for _, n := range c.topo {
		if d := n.GetDomain(); d != "" && d != "ai.onnx" && d != moe.Domain {
			return d + "::" + n.GetOpType()
		}
	}
	return ""
}

// claimEPLocal marks, for a TopK whose EP block could not be read, the
// nodes between its dispatch collectives and the next collectives as
// claimed, so that its local expert compute is reported once (as the EP
// near-miss) and not again as routerless experts.
func (c *ctx) claimEPLocal(tk *pb.NodeProto, cols map[*pb.NodeProto]ep.Op, claimed []bool) {
	var outs []string
	for _, n := range c.reachCollectives(cols, tk.Output...) {
		outs = append(outs, n.Output...)
	}
	seen := map[*pb.NodeProto]bool{}
	for len(outs) > 0 {
		v := outs[len(outs)-1]
		outs = outs[:len(outs)-1]
		for _, n := range c.g.Consumers(v) {
			if _, ok := cols[n]; ok || seen[n] {
				continue
			}
			seen[n] = true
			c.claimNodes(claimed, []*pb.NodeProto{n})
			outs = append(outs, n.Output...)
		}
	}
}

// KindEPShardedMoE is one rank's com.microsoft::ShardedMoE node.
const KindEPShardedMoE = "ep-sharded-moe"

// detectShardedMoE reads a com.microsoft::ShardedMoE node as one EP rank's
// shard: the node is read like com.microsoft::MoE (same inputs and
// attributes, [E_local, …] expert weights) through a stand-in node, and
// shardedSpec turns the spec into a shard's.
func (c *ctx) detectShardedMoE(n *pb.NodeProto) (*Block, error) {
	as := proto.Clone(n).(*pb.NodeProto)
	as.OpType = proto.String("MoE")
	kept := as.Attribute[:0]
	for _, a := range as.Attribute {
		if a.GetName() != "local_experts_start_index" && a.GetName() != "tensor_shards" {
			kept = append(kept, a)
		}
	}
	as.Attribute = kept
	if c.epClone == nil {
		c.epClone = map[*pb.NodeProto]*pb.NodeProto{}
	}
	c.epClone[as] = n
	b, err := c.detectORT(as)
	if err != nil {
		return nil, err
	}
	for i, r := range b.Region {
		if r == as {
			b.Region[i] = n
		}
	}
	b.Kind, b.Placement = KindEPShardedMoE, PlacementAfterCombine
	return b, nil
}

// shardedSpec turns the spec read from the stand-in of a ShardedMoE node
// into a shard spec: E from the router, ep_size E/E_local, expert_offset
// local_experts_start_index. Tensor-parallel sharding (tensor_shards > 1)
// is refused. Other nodes are left alone.
func (c *ctx) shardedSpec(as *pb.NodeProto, s *moe.Spec, plan *WeightPlan) error {
	n := c.epClone[as]
	if n == nil {
		return nil
	}
	if ts := graph.AttrInt(n, "tensor_shards", 1); ts != 1 {
		return rejectf("ShardedMoE %q with tensor_shards=%d shards each expert (tensor parallel), which ai.mok::MoE does not express", graph.NodeLabel(n), ts)
	}
	d := plan.Router.Init.GetDims()
	E := int(d[0])
	if plan.Router.InOut {
		E = int(d[1])
	}
	L := len(plan.Experts)
	if L == 0 || E%L != 0 {
		return rejectf("ShardedMoE %q holds %d experts, which does not divide the router's %d", graph.NodeLabel(n), L, E)
	}
	start := int(graph.AttrInt(n, "local_experts_start_index", -1))
	if start < 0 || start%L != 0 || start+L > E {
		return rejectf("ShardedMoE %q: local_experts_start_index %d is not a multiple of its %d experts within 0..%d", graph.NodeLabel(n), start, L, E-1)
	}
	s.NumExperts, s.EPSize, s.ExpertOffset, s.LocalExperts = E, E/L, start, L
	if L == E {
		s.EPSize, s.LocalExperts = 1, 0
	}
	return nil
}

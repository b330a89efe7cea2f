package passes

import (
	"context"
	"errors"
	"fmt"
	"math"
	"runtime"
	"slices"
	"strings"
	"sync"
	"sync/atomic"

	"github.com/mokopt/mokopt/graph"
	pb "github.com/mokopt/mokopt/graph/onnxpb"
	"github.com/mokopt/mokopt/internal/ep"
	"github.com/mokopt/mokopt/moe"
)

// Shape kinds of an MoE block, as exporters write them.
const (
	KindBatched  = "batched"  // top-k indices gather stacked expert weights
	KindUnrolled = "unrolled" // one branch per expert (loop traced or unrolled)
	KindDense    = "dense"    // every expert on every token, weighted by a routing matrix
	KindORT      = "ort"      // an ONNX Runtime com.microsoft::MoE node
)

// Block is one detected MoE block: its semantics, where it sits, and where
// its weights come from.
type Block struct {
	Name   string   `json:"name"`
	Kind   string   `json:"kind"`
	Spec   moe.Spec `json:"spec"`
	Input  string   `json:"input"`  // block input value (hidden states)
	Output string   `json:"output"` // block output value
	Nodes  int      `json:"nodes"`  // nodes in the region the fused node replaces
	// Placement is where an EP block multiplies the routing weights
	// (before_combine or after_combine), or "sharding" for a global block
	// whose EP size comes from sharding annotations; empty otherwise.
	Placement string `json:"placement,omitempty"`

	// Router is the value fed to the router linear (may be a reshaped Input).
	Router string          `json:"-"`
	Region []*pb.NodeProto `json:"-"`
	W      *WeightPlan     `json:"-"`
	TopK   *pb.NodeProto   `json:"-"`

	// TracedExperts, when non-zero, says the block was rebuilt from a trace
	// that unrolled its loop over the experts hit at trace time this many
	// times (fewer than Spec.NumExperts): the fused node runs every expert
	// from the stacked weights, where the original graph dropped the
	// contributions of experts past the first TracedExperts hit.
	TracedExperts int `json:"traced_experts,omitempty"`

	// regionPos holds the topological positions of Region's nodes, when
	// detection found them by position (nil otherwise).
	regionPos []int32
}

// NearMiss is a candidate (a TopK feeding expert-like compute) that was not
// fused, with the first reason.
type NearMiss struct {
	Node   string `json:"node"`
	Reason string `json:"reason"`
	// Class, when set, names a kind of block no matcher change fuses as it
	// is (ClassCapacity, ClassQuantized); Capacity lists the expert
	// capacities a capacity-limited router was read to have.
	Class    string  `json:"class,omitempty"`
	Capacity []int64 `json:"capacity,omitempty"`
}

// Detection is the detector's result for a model.
type Detection struct {
	Blocks   []*Block   `json:"blocks"`
	NearMiss []NearMiss `json:"near_misses"`
}

// errMatcherFault starts the reason of a candidate whose analysis hit a
// runtime error: a bug in the matcher that a malformed model exposed.
const errMatcherFault = "matcher fault on a malformed model (please report)"

// reject is the error that refuses a candidate: its message is the
// near-miss reason.
type reject struct{ msg string }

func (r reject) Error() string { return r.msg }

// rejectf returns a refusal of the candidate with a formatted reason.
func rejectf(format string, args ...any) error { return reject{fmt.Sprintf(format, args...)} }

// DetectOptions changes what Detect accepts.
type DetectOptions struct {
	// RestoreTracedExperts accepts a TorchScript trace whose loop over the
	// experts hit at trace time was unrolled fewer times than there are
	// experts, when every expert's weights are in stacked initializers: the
	// block is rebuilt with all experts (Block.TracedExperts says so).
	RestoreTracedExperts bool
	// Context is checked before each candidate; nil means
	// context.Background().
	Context context.Context
	// Progress, when set, is called with the candidates examined so far and
	// the number of nodes that may start one.
	Progress func(done, total int)
	// EPTable names the EP collectives to recognise; nil means
	// ep.DefaultTable().
	EPTable *ep.Table
}

// Detect finds every MoE block in m's main graph. It never edits the model.
func Detect(m *graph.Model) (*Detection, error) { return DetectWith(m, DetectOptions{}) }

// DetectWith is Detect with options.
// Detection runs on a canonical working copy of m (see package canon) when
// canonicalization changes anything; the blocks then name its values.
func DetectWith(m *graph.Model, opt DetectOptions) (*Detection, error) {
	return detectCanonical(m, opt)
}

// detectIn is DetectWith over an index g of m's main graph.
func detectIn(m *graph.Model, g *graph.Graph, opt DetectOptions) (*Detection, error) {
	cx := opt.Context
	if cx == nil {
		cx = context.Background()
	}
	progress := opt.Progress
	tbl := opt.EPTable
	if tbl == nil {
		tbl = ep.DefaultTable()
	}
	c, err := newCtx(m, g)
	if err != nil {
		return nil, err
	}
	c.restore, c.epTable = opt.RestoreTracedExperts, tbl
	topo := c.topo
	det := &Detection{}
	claimed := make([]bool, len(topo)) // by position: nodes of a found block
	var missed []*pb.NodeProto         // TopK candidates reported as near-misses
	total, done := 0, 0
	cols := c.epOps()
	for _, n := range topo {
		if n.GetOpType() == "TopK" || isORTMoE(n) {
			total++
		}
	}
	syn, found, err := c.speculate(cx, cols)
	if err != nil {
		return nil, err
	}
	inner := c.innerSelections(syn, found)
	for i, n := range topo {
		if n.GetOpType() == "TopK" || isORTMoE(n) {
			if err := cx.Err(); err != nil {
				return nil, err
			}
			if done++; progress != nil {
				progress(done, total)
			}
		}
		if n.GetOpType() == ep.ShardedMoEOp && n.GetDomain() == ep.ShardedMoEDomain {
			b, err := c.detectShardedMoE(n)
			if err != nil {
				det.NearMiss = append(det.NearMiss, NearMiss{Node: graph.NodeLabel(n), Reason: err.Error()})
				continue
			}
			det.Blocks = append(det.Blocks, b)
			continue
		}
		if isORTMoE(n) {
			b, err := c.detectORT(n)
			if err != nil {
				det.NearMiss = append(det.NearMiss, NearMiss{Node: graph.NodeLabel(n), Reason: err.Error()})
				continue
			}
			det.Blocks = append(det.Blocks, b)
			continue
		}
		if n.GetOpType() == "ArgMax" && !claimed[i] && syn[i] != nil {
			n = syn[i] // a sparsemixer router's selection, as a TopK
		}
		if n.GetOpType() != "TopK" || n.GetDomain() != "" || claimed[i] && n == topo[i] || inner[int32(i)] {
			continue
		}
		if c.isAuxTopK(n) {
			continue
		}
		if len(cols) > 0 && len(c.reachCollectives(cols, n.Output...)) > 0 {
			b, err := c.detectEPAt(n, cols)
			if err != nil {
				det.NearMiss = append(det.NearMiss, NearMiss{Node: graph.NodeLabel(n), Reason: err.Error()})
				c.claimEPLocal(n, cols, claimed)
				continue
			}
			c.claim(claimed, b)
			det.Blocks = append(det.Blocks, b)
			continue
		}
		r := found[n]
		if r == nil { // not foreseen by speculate (cannot happen)
			r = c.detectTopK(n)
		}
		if r.err != nil {
			if !r.candidate {
				continue // a TopK used for something else entirely: not a candidate
			}
			det.NearMiss = append(det.NearMiss, NearMiss{Node: graph.NodeLabel(n), Reason: r.err.Error()})
			missed = append(missed, n)
			continue
		}
		c.claim(claimed, r.b)
		det.Blocks = append(det.Blocks, r.b)
	}
	c.dropOverlaps(det)
	// Expert compute selected by a TopK that was reported already is not
	// routerless: only what no TopK reaches is reported by routerlessExperts.
	covered := claimed
	if len(missed) > 0 {
		covered = slices.Clone(claimed)
		for _, tk := range missed {
			for _, p := range c.selectedPos(tk) {
				covered[p] = true
			}
		}
	}
	det.NearMiss = append(det.NearMiss, c.routerlessExperts(covered)...)
	c.refuseCapacity(det)  // capacity.go
	c.refuseQuantized(det) // quantized.go
	kept := det.Blocks[:0]
	for _, b := range det.Blocks {
		if err := attempt(func() error { return c.setIOType(b) }); err != nil {
			det.NearMiss = append(det.NearMiss, NearMiss{Node: graph.NodeLabel(b.TopK), Reason: err.Error()})
			continue
		}
		kept = append(kept, b)
	}
	det.Blocks = kept
	for i, b := range det.Blocks {
		if b.Name == "" {
			b.Name = fmt.Sprintf("moe_%d", i)
		}
	}
	uniqueBlockNames(det.Blocks)
	return det, nil
}

// innerSelections returns the positions of the selections (TopKs, or the
// ArgMax of a sparsemixer router) whose speculated block succeeded but
// that lie inside the region of another successful block: they are part
// of that block's compute, not blocks of their own. Deciding this from all
// results at once, rather than skipping what a block found earlier in the
// node list covers, keeps the outcome independent of the node order.
func (c *ctx) innerSelections(syn map[int]*pb.NodeProto, found map[*pb.NodeProto]*topKResult) map[int32]bool {
	type success struct {
		pos int32
		b   *Block
	}
	var ok []success
	for i, n := range c.topo {
		if s := syn[i]; s != nil {
			n = s
		}
		if r := found[n]; r != nil && r.err == nil {
			ok = append(ok, success{int32(i), r.b})
		}
	}
	if len(ok) < 2 {
		return nil
	}
	in := map[int32][]int{} // position -> the successful blocks whose region holds it
	for k, s := range ok {
		for _, p := range c.blockPos(s.b) {
			in[p] = append(in[p], k)
		}
	}
	// A selection inside a larger block is inner; of two blocks that hold
	// each other's selection with regions of one size (two selections of
	// one block), the one listed first stands for both.
	inner := map[int32]bool{}
	for k, s := range ok {
		for _, o := range in[s.pos] {
			if o == k {
				continue
			}
			if no, ns := len(c.blockPos(ok[o].b)), len(c.blockPos(s.b)); no > ns || no == ns && o < k {
				inner[s.pos] = true
			}
		}
	}
	return inner
}

// blockPos returns the positions of b's region.
func (c *ctx) blockPos(b *Block) []int32 {
	if len(b.regionPos) == len(b.Region) {
		return b.regionPos
	}
	ps := make([]int32, 0, len(b.Region))
	for _, n := range b.Region {
		if p, ok := c.posOf(n); ok {
			ps = append(ps, p)
		}
	}
	return ps
}

// dropOverlaps refuses every pair of blocks whose regions share a node:
// fusing both would delete nodes the other's fused node stands for (the
// detector's boundaries keep blocks apart, chained ones included, so this
// only fails closed on a graph they misjudge). Both are refused, so that
// the outcome does not depend on which was found first.
func (c *ctx) dropOverlaps(det *Detection) {
	if len(det.Blocks) < 2 {
		return
	}
	owner := make(map[int32]int, 0)
	bad := make([]int, len(det.Blocks)) // 1 + the index of a block it overlaps
	for i, b := range det.Blocks {
		for _, p := range c.blockPos(b) {
			if j, ok := owner[p]; ok && j != i {
				bad[i], bad[j] = j+1, i+1
				continue
			}
			owner[p] = i
		}
	}
	kept := det.Blocks[:0]
	for i, b := range det.Blocks {
		if bad[i] == 0 {
			kept = append(kept, b)
			continue
		}
		o := det.Blocks[bad[i]-1]
		det.NearMiss = append(det.NearMiss, NearMiss{Node: graph.NodeLabel(b.TopK), Reason: fmt.Sprintf(
			"the block's nodes overlap those of the block selected by %q (output %q): neither is fused", graph.NodeLabel(o.TopK), o.Output)})
	}
	det.Blocks = kept
}

// selectedPos returns the positions of the nodes a TopK's outputs reach
// without walking past a MatMul or Gemm with a constant weight (which are
// included): the expert
// compute it selects, not the blocks after it, so that the cost stays that
// of its own block.
func (c *ctx) selectedPos(tk *pb.NodeProto) []int32 {
	d := c.d
	mk := c.mk
	ep := mk.next()
	var out []int32
	stack := c.valueIDs(tk.Output...)
	for len(stack) > 0 {
		j := stack[len(stack)-1]
		stack = stack[:len(stack)-1]
		for _, p := range d.consumers(j) {
			if mk.at[p] == ep {
				continue
			}
			mk.at[p] = ep
			out = append(out, p)
			if c.weightMatMulAt(p) {
				continue
			}
			for _, o := range d.outVal[d.outOff[p]:d.outOff[p+1]] {
				if o >= 0 {
					stack = append(stack, o)
				}
			}
		}
	}
	return out
}

// topKResult is what detection made of one TopK (see speculate).
type topKResult struct {
	b   *Block
	err error
	// candidate: on failure, whether the TopK looked like a router or
	// selected expert compute (a near-miss), not an unrelated TopK.
	candidate bool
}

// speculate detects, on parallel workers, the block of every TopK that the
// sequential pass of detectIn may analyze: plain TopKs and the selections
// of sparsemixer routers (syn, by the ArgMax's position), except auxiliary
// TopKs and those behind EP collectives, which that pass handles itself.
// Analysing a TopK reads the graph only, so its result does not depend on
// which others were analyzed first; the sequential pass then applies the
// results in topological order, skipping TopKs inside a block found
// before, exactly as if it had analyzed them one by one.
func (c *ctx) speculate(cx context.Context, cols map[*pb.NodeProto]ep.Op) (map[int]*pb.NodeProto, map[*pb.NodeProto]*topKResult, error) {
	// Build the lazily made shared state before the workers read it.
	c.declare()
	c.selectors()
	syn := map[int]*pb.NodeProto{}
	var cands []*pb.NodeProto
	for i, n := range c.topo {
		if n.GetOpType() == "ArgMax" {
			if s := c.sparseMixerAt(n); s != nil {
				syn[i], n = s, s
			}
		}
		if n.GetOpType() != "TopK" || n.GetDomain() != "" || c.isAuxTopK(n) {
			continue
		}
		if len(cols) > 0 && len(c.reachCollectives(cols, n.Output...)) > 0 {
			continue
		}
		cands = append(cands, n)
	}
	res := make([]*topKResult, len(cands))
	workers := min(runtime.GOMAXPROCS(0), len(cands), 8)
	var next atomic.Int64
	run := func(w *ctx) error {
		for {
			i := int(next.Add(1) - 1)
			if i >= len(cands) {
				return nil
			}
			if err := cx.Err(); err != nil {
				return err
			}
			res[i] = w.detectTopK(cands[i])
		}
	}
	if workers <= 1 {
		if err := run(c); err != nil {
			return nil, nil, err
		}
	} else {
		errs := make([]error, workers)
		var wg sync.WaitGroup
		for k := range workers {
			w := c.worker()
			wg.Go(func() { errs[k] = run(w) })
		}
		wg.Wait()
		if err := errors.Join(errs...); err != nil {
			return nil, nil, cx.Err()
		}
	}
	found := make(map[*pb.NodeProto]*topKResult, len(cands))
	for i, n := range cands {
		found[n] = res[i]
	}
	return syn, found, nil
}

// worker returns a copy of c for another goroutine: the shared, read-only
// indexes and caches, with walk state of its own.
func (c *ctx) worker() *ctx {
	w := *c
	w.mk = &marks{at: make([]uint32, len(c.topo))}
	w.anc, w.ancRoot, w.lim, w.limBuf, w.limSet, w.idxDeps = nil, 0, nil, nil, nil, nil
	w.after, w.wmm, w.ancAdded, w.ancStack = memo{}, memo{}, nil, nil
	return &w
}

// detectTopK analyzes the block a TopK selects for.
func (c *ctx) detectTopK(n *pb.NodeProto) *topKResult {
	b, err := c.detectAt(n)
	if err == nil {
		err = c.applySharding(b)
	}
	if err != nil {
		return &topKResult{err: err, candidate: c.routerFed(n) || c.feedsExpertCompute(n)}
	}
	return &topKResult{b: b}
}

// claim marks the nodes of b's region in claimed (by position).
func (c *ctx) claim(claimed []bool, b *Block) {
	if len(b.regionPos) == len(b.Region) {
		for _, p := range b.regionPos {
			claimed[p] = true
		}
		return
	}
	c.claimNodes(claimed, b.Region)
}

// claimNodes marks nodes in claimed.
func (c *ctx) claimNodes(claimed []bool, nodes []*pb.NodeProto) {
	for _, n := range nodes {
		if p, ok := c.posOf(n); ok {
			claimed[p] = true
		}
	}
}

// newCtx indexes g, the main graph of m, for detection.
func newCtx(m *graph.Model, g *graph.Graph) (*ctx, error) {
	c := &ctx{m: m, g: g}
	topo, err := c.g.TopoSort()
	if err != nil {
		return nil, &graph.InputError{File: m.Name(), Msg: err.Error(), Err: err}
	}
	c.topo = topo
	c.byNode = &nodePositions{}
	c.d = newDense(g, topo)
	c.mk = &marks{at: make([]uint32, len(topo))}
	return c, nil
}

// isAuxTopK reports whether a TopK only feeds other TopKs (the group
// selection of group-limited routing): whether a TopK is reached from its
// outputs without crossing a MatMul or Gemm (a later layer's router is not
// ours).
func (c *ctx) isAuxTopK(n *pb.NodeProto) bool {
	if c.auxTopK == nil {
		// reachesTopK[p]: node p is a TopK, or p is not a MatMul/Gemm and
		// one of its consumers reaches a TopK. Consumers come later in
		// topological order, so one reverse pass settles every node.
		c.auxTopK = make([]bool, len(c.topo))
		for i := len(c.topo) - 1; i >= 0; i-- {
			switch c.topo[i].GetOpType() {
			case "TopK":
				// A sort of the selected expert ids permutes, not selects.
				c.auxTopK[i] = !c.isSortTopK(c.topo[i])
				continue
			case "MatMul", "Gemm":
				continue
			}
			c.auxTopK[i] = c.feedsTopK(c.d.outVal[c.d.outOff[i]:c.d.outOff[i+1]])
		}
	}
	return c.isSortTopK(n) || c.feedsTopK(c.valueIDs(n.Output...))
}

// feedsTopK reports whether a consumer of the values outs (value numbers)
// reaches a TopK (see isAuxTopK).
func (c *ctx) feedsTopK(outs []int32) bool {
	for _, j := range outs {
		if j < 0 {
			continue
		}
		for _, p := range c.d.consumers(j) {
			if c.auxTopK[p] {
				return true
			}
		}
	}
	return false
}

// routerFed reports whether a TopK is fed by a linear layer with a constant
// weight, i.e. it looks like a router and a failure is worth reporting.
func (c *ctx) routerFed(n *pb.NodeProto) bool {
	return attempt(func() error { _, err := c.router(n); return err }) == nil
}

func (c *ctx) detectAt(tk *pb.NodeProto) (b *Block, err error) {
	if err := attempt(func() (e error) { b, e = c.analyze(tk); return e }); err != nil {
		return nil, err
	}
	return b, nil
}

// attempt runs f, one candidate's analysis, and returns its error: a
// refusal (reject) says why the candidate is no block. Refusals are
// ordinary error returns; the recover here is the package's only one and
// is a safety net, not control flow: a runtime error (an index past a
// malformed node's inputs, a nil tensor) is a matcher bug that a hostile
// or malformed model exposed, and it becomes a refusal of this candidate
// that says so (errMatcherFault), so that one bad candidate yields a
// near-miss instead of a crash of the whole detection; the fuzz target
// treats it as a failure. Any other panic propagates.
func attempt(f func() error) (err error) {
	defer func() {
		if r := recover(); r != nil {
			re, ok := r.(runtime.Error)
			if !ok {
				panic(r)
			}
			err = reject{fmt.Sprintf("%s: %v", errMatcherFault, re)}
		}
	}()
	return f()
}

// routerInfo is what the walk back from the selection TopK finds.
type routerInfo struct {
	linear     *pb.NodeProto
	x          string // router input
	w          *pb.TensorProto
	wInOut     bool // stored [H, E]
	bias       *pb.TensorProto
	corr       *pb.TensorProto
	act, order string
	nGroup     int
	topkGroup  int
	groupMax   bool   // groups scored by their best expert, not the two best
	scores     string // value of activated scores (act_then_topk)
}

// analyze reads the block the selection tk routes for, or says why it is
// no block ai.mok::MoE expresses.
func (c *ctx) analyze(tk *pb.NodeProto) (*Block, error) {
	s := moe.Spec{RoutedScalingFactor: 1, EPSize: 1, SwiGLUAlpha: 1}
	sm := c.sparse[tk]
	if sm != nil {
		s.TopK = sm.k
	} else {
		k, ok := c.scalarInt(tk.Input[1])
		if !ok {
			return nil, rejectf("TopK k is not a constant")
		}
		if graph.AttrInt(tk, "largest", 1) != 1 {
			return nil, rejectf("TopK selects the smallest values, not a router")
		}
		s.TopK = int(k)
	}
	ri, err := c.router(tk)
	if err != nil {
		return nil, err
	}
	s.RouterActivation, s.RouterOrder, s.NGroup, s.TopKGroup = ri.act, ri.order, ri.nGroup, ri.topkGroup
	if ri.groupMax && ri.nGroup > 1 {
		s.GroupScore = moe.GroupScoreMax
	}
	if sm != nil {
		if ri.act != "" || ri.corr != nil || ri.nGroup > 1 {
			return nil, rejectf("sparsemixer router with an activation, correction bias or groups before it")
		}
		s.RouterActivation, s.RouterOrder, s.SparseMixerThreshold = moe.SparseMixer, moe.TopKThenActivation, sm.thr
	}
	if err := c.routerShape(ri, &s); err != nil {
		return nil, err
	}
	E := s.NumExperts
	if s.TopK > E {
		return nil, rejectf("TopK k=%d exceeds the router's %d outputs", s.TopK, E)
	}
	x0 := c.inputBoundary(ri.x)
	y := c.postDominator(tk, ri.linear)
	if y == "" {
		return nil, rejectf("no single value combines the experts' outputs after the router")
	}
	// Extend through shape noise, a cast back to a half-precision input's
	// type (exports of float16/bfloat16 models combine in float32) and a
	// shared-expert Add.
	xDeps := c.reachFrom(x0)
	var sharedVal string
	castBack := false
	for {
		cons := c.g.Consumers(y)
		if len(cons) != 1 || c.g.IsOutput(y) {
			break
		}
		if c.feedsRouter(c.g.ValueID(y)) {
			// y reaches the next block's router through shape ops only:
			// the blocks meet at the boundary of that chain (see boundary),
			// which the next block finds from its side too.
			y = c.boundary(y)
			break
		}
		n := cons[0]
		if noiseOps[n.GetOpType()] && n.GetOpType() != "Cast" || n.GetOpType() == "ReduceSum" && sharedVal == "" {
			y = n.Output[0]
			continue
		}
		if n.GetOpType() == "Cast" && (!castBack && c.castsBackTo(n, x0) || c.upcasts(n)) {
			castBack = castBack || !c.upcasts(n)
			y = n.Output[0]
			continue
		}
		if n.GetOpType() == "Add" && sharedVal == "" {
			other := n.Input[0]
			if other == y {
				other = n.Input[1]
			}
			if p := c.g.Producer(other); p != nil && xDeps.has(p) && c.hasWeightMatMul(other, x0) {
				sharedVal = other
				y = n.Output[0]
				continue
			}
		}
		break
	}
	regionPos := c.regionPos(x0, y, xDeps.hasPos)
	region := c.nodesAt(regionPos)
	b := &Block{Kind: "", Input: c.inputLike(x0, ri.x, y), Router: ri.x, Output: y, TopK: tk}
	b.Region, b.regionPos = region, regionPos
	b.Nodes = len(region)
	// Router post-processing: nodes downstream of the top-k values (and of a
	// gather of the scores by the indices) that do not touch expert compute.
	var sharedNodes map[*pb.NodeProto]bool
	if sharedVal != "" {
		sharedNodes = c.backward(sharedVal, map[string]bool{x0: true})
	}
	c.setLimitPos(regionPos)
	c.idxDeps = nil
	defer func() { c.setLimit(nil); c.idxDeps = nil }()
	if err := c.routerPost(tk, ri, &s); err != nil {
		return nil, rejectf("%v", err)
	}
	plan := &WeightPlan{}
	kind, err := c.experts(b, tk, ri, &s, sharedNodes, plan)
	if err != nil {
		return nil, err
	}
	b.Kind = kind
	if sharedVal != "" {
		if err := c.sharedExpert(sharedVal, x0, &s, plan); err != nil {
			return nil, err
		}
	}
	plan.Router = Proj{Init: ri.w, Expert: -1, InOut: ri.wInOut}
	if ri.bias != nil {
		plan.RouterB = &Proj{Init: ri.bias, Expert: -1}
	}
	if ri.corr != nil {
		plan.Corr = &Proj{Init: ri.corr, Expert: -1}
	}
	b.W = plan
	b.Spec = s
	if err := s.Validate(); err != nil {
		return nil, rejectf("%v", err)
	}
	b.Name = blockName(y, ri.w.GetName(), region)
	return b, nil
}

// router walks back from the selection TopK to the router linear, or says
// why the TopK is not fed by one.
func (c *ctx) router(tk *pb.NodeProto) (*routerInfo, error) {
	ri := &routerInfo{order: moe.TopKThenActivation, nGroup: 1, topkGroup: 1}
	v := tk.Input[0]
	for steps := 0; steps < 32; steps++ {
		v = c.through(v)
		p := c.g.Producer(v)
		if p == nil {
			return nil, rejectf("the TopK input does not come from a router linear layer")
		}
		switch p.GetOpType() {
		case "Where":
			// Group-limited routing: Where(mask, scores, -inf) or Where(notmask, -inf, scores).
			a, bb := p.Input[1], p.Input[2]
			if fa, ok := c.scalarFloat(a); ok && isInf(fa, -1) || ok && fa == 0 {
				v = bb
			} else {
				v = a
			}
			if err := c.groupInfo(p, ri); err != nil {
				return nil, rejectf("%v", err)
			}
			continue
		case "Add":
			a, bb := p.Input[0], p.Input[1]
			if t := c.constTensor(bb); t != nil && vectorLike(t) {
				if ri.act != "" || c.isActivated(a) {
					ri.corr = t
				} else {
					ri.bias = t
				}
				v = a
				continue
			}
			if t := c.constTensor(a); t != nil && vectorLike(t) {
				if c.isActivated(bb) {
					ri.corr = t
				} else {
					ri.bias = t
				}
				v = bb
				continue
			}
			return nil, rejectf("unexpected Add %q between router and TopK", graph.NodeLabel(p))
		case "Softmax", "Sigmoid":
			if ri.act != "" {
				return nil, rejectf("two router activations")
			}
			ri.act = strings.ToLower(p.GetOpType())
			ri.order = moe.ActivationThenTopK
			ri.scores = p.Output[0]
			v = p.Input[0]
			continue
		case "Gemm":
			w := c.constTensor(p.Input[1])
			if w == nil || graph.AttrInt(p, "transA", 0) != 0 {
				return nil, rejectf("router Gemm %q has no constant weight", graph.NodeLabel(p))
			}
			ri.linear, ri.x, ri.w = p, p.Input[0], w
			ri.wInOut = graph.AttrInt(p, "transB", 0) == 0
			if len(p.Input) > 2 && p.Input[2] != "" {
				if t := c.constTensor(p.Input[2]); t != nil {
					ri.bias = t
				}
			}
			if graph.AttrFloat(p, "alpha", 1) != 1 {
				return nil, rejectf("router Gemm with alpha != 1")
			}
			return ri, nil
		case "MatMul":
			if w := c.matmulWeight(p.Input[1]); w != nil {
				ri.linear, ri.x, ri.w, ri.wInOut = p, p.Input[0], w.t, !w.swapped
				return ri, nil
			}
			return nil, rejectf("router MatMul %q has no constant weight", graph.NodeLabel(p))
		default:
			return nil, rejectf("unexpected %s %q between router and TopK", p.GetOpType(), graph.NodeLabel(p))
		}
	}
	return nil, rejectf("router chain too long")
}

// routerShape sets the spec's router biases, expert count and hidden size
// from the router linear's weight ([E, H], or [H, E] when stored in-out),
// or says why it cannot.
func (c *ctx) routerShape(ri *routerInfo, s *moe.Spec) error {
	s.RouterBias, s.CorrectionBias = ri.bias != nil, ri.corr != nil
	dims := ri.w.GetDims()
	if len(dims) != 2 {
		return rejectf("router weight %q is not a matrix", ri.w.GetName())
	}
	E, H := int(dims[0]), int(dims[1])
	if ri.wInOut {
		E, H = H, E
	}
	s.NumExperts, s.Hidden = E, H
	return nil
}

// vectorLike reports whether t is a vector, possibly with leading unit
// dims ([E] or [1, E], as a per-expert bias kept per expert group is).
func vectorLike(t *pb.TensorProto) bool {
	d := t.GetDims()
	if len(d) == 0 {
		return false
	}
	for _, x := range d[:len(d)-1] {
		if x != 1 {
			return false
		}
	}
	return true
}

// isActivated reports whether v (looked through noise) is a Sigmoid/Softmax output.
func (c *ctx) isActivated(v string) bool {
	p := c.producerOp(v)
	return p != nil && (p.GetOpType() == "Sigmoid" || p.GetOpType() == "Softmax")
}

// groupInfo reads n_group, topk_group and the group score from the
// group-selection machinery behind a Where mask: a TopK over group scores
// (its k is topk_group) whose input reduces a [.., n_group, E/n_group]
// reshape of the choice scores, either as the sum of each group's two best
// (a ReduceSum over an inner TopK, DeepSeek-V3) or as each group's best
// (a ReduceMax, DeepSeek-V2's group_limited_greedy). It says why when they
// cannot be read.
func (c *ctx) groupInfo(where *pb.NodeProto, ri *routerInfo) error {
	// The group selection lies between the router linear and the mask: the
	// walk does not go on through weight matmuls into earlier layers.
	back := c.backwardTo(where.Input[0], func(n *pb.NodeProto) bool { return c.expertMatMul(n) != nil })
	// The nodes come from a map: what is read must not depend on which is
	// seen first, so two different readings refuse the block.
	groupsRead, topkRead := false, false
	var err error
	readGroups := func(reshape *pb.NodeProto) {
		if reshape == nil || reshape.GetOpType() != "Reshape" {
			return
		}
		if sh := c.constInts(reshape.Input[1]); len(sh) >= 2 && sh[len(sh)-2] > 0 {
			if groupsRead && ri.nGroup != int(sh[len(sh)-2]) && err == nil {
				err = fmt.Errorf("group-limited routing: two group counts (%d and %d)", ri.nGroup, sh[len(sh)-2])
			}
			ri.nGroup, groupsRead = int(sh[len(sh)-2]), true
		}
	}
	setTopK := func(k int64) {
		if topkRead && ri.topkGroup != int(k) && err == nil {
			err = fmt.Errorf("group-limited routing: two group selections (topk_group %d and %d)", ri.topkGroup, k)
		}
		ri.topkGroup, topkRead = int(k), true
	}
	for n := range back {
		if n.GetOpType() != "TopK" {
			continue
		}
		p := c.producerOp(n.Input[0])
		if k, ok := c.scalarInt(n.Input[1]); ok && p != nil {
			switch p.GetOpType() {
			case "ReduceSum": // over the inner TopK's two best
				setTopK(k)
			case "ReduceMax":
				setTopK(k)
				ri.groupMax = true
				readGroups(c.g.Producer(p.Input[0]))
			}
		}
		readGroups(c.g.Producer(n.Input[0])) // the inner TopK reads the reshape
	}
	if err != nil {
		return err
	}
	// One group (GLM-4.5 style configs keep the machinery with n_group=1)
	// is plain top-k routing.
	if !groupsRead || ri.nGroup < 1 || ri.topkGroup < 1 || ri.topkGroup > ri.nGroup {
		return fmt.Errorf("group-limited routing: cannot read the number of groups (n_group %d, topk_group %d)", ri.nGroup, ri.topkGroup)
	}
	return nil
}

// postDominator finds the combine point: the first value after the TopK
// through which every path from the TopK's outputs passes (its nearest
// post-dominator among values) that comes after expert compute. The walk
// visits the nodes reached from the TopK in topological-position order (a
// heap, not a scan of the node list), keeping the values whose consumers
// are not all visited yet: a value is a post-dominator exactly when it is
// the only one left right after its producer, whatever valid order the
// graph's nodes are listed in. The walk stops, failing, at the router
// linear of another selection: what lies past it is the next block, so a
// candidate that fails costs its own block's nodes, not the rest of the
// model.
func (c *ctx) postDominator(tk, routerLinear *pb.NodeProto) string {
	// The combine point comes after expert compute: a MatMul/Gemm with a
	// constant weight other than the router.
	anc := c.ancestors(tk.Input[0]) // an earlier layer's experts are not ours
	d := c.d
	router := int32(-1)
	if routerLinear != nil {
		if p, ok := c.posOf(routerLinear); ok {
			router = p
		}
	}
	after := &c.after
	after.reset(len(c.topo))
	// afterExpert(p): node p is reached from the output of such a matmul.
	// An ancestor of the router input never is (the matmul would be one too).
	var afterExpert func(p int32) bool
	afterExpert = func(p int32) bool {
		if known, yes := after.get(p); known {
			return yes
		}
		after.set(p, false)
		if anc[p] {
			return false
		}
		for _, q := range d.inPred[d.inOff[p]:d.inOff[p+1]] {
			if q < 0 {
				continue
			}
			if c.weightMatMulAt(q) && q != router && !anc[q] || afterExpert(q) {
				after.set(p, true)
				return true
			}
		}
		return false
	}
	// pending[v]: consumers of derived value v not yet visited.
	pending := map[int32]int32{}
	mk := c.mk
	ep := mk.next()
	h := &graph.MinHeap[int32]{}
	addVal := func(j int32) {
		if j < 0 {
			return
		}
		n := d.consOff[j+1] - d.consOff[j]
		if d.isOut[j] {
			n++ // never closes
		}
		if n > 0 {
			pending[j] = n
		}
		for _, p := range d.consumers(j) {
			if mk.at[p] != ep {
				mk.at[p] = ep
				h.Push(p)
			}
		}
	}
	for _, j := range c.valueIDs(tk.Output...) {
		addVal(j)
	}
	c.selectors()
	for h.Len() > 0 {
		i := h.Pop()
		if c.routerAt[i] && i != router {
			return "" // the next block's router: no combine point before it
		}
		for _, j := range d.inVal[d.inOff[i]:d.inOff[i+1]] {
			if cnt, ok := pending[j]; ok {
				if cnt == 1 {
					delete(pending, j)
				} else {
					pending[j] = cnt - 1
				}
			}
		}
		outs := d.outVal[d.outOff[i]:d.outOff[i+1]]
		for _, j := range outs {
			addVal(j)
		}
		if len(pending) == 1 && len(outs) == 1 {
			n := c.topo[i]
			if _, ok := pending[outs[0]]; ok && isFloatCompute(n) && afterExpert(i) && (!c.feedsWeightMatMul(n.Output[0]) || c.feedsRouter(outs[0])) {
				return n.Output[0]
			}
		}
		if len(pending) == 0 {
			return ""
		}
	}
	return ""
}

// boundary returns where two directly chained blocks meet on the chain of
// shape-only ops (noiseOps, Cast included) that starts at v0, a value no
// such op produces: following single consumers from v0 while they are
// shape ops, the first value of the highest (inferred) rank. Both blocks
// work it out from the chain alone, so the one's output is the other's
// input and no node belongs to both; a highest rank keeps the token axes
// the model's own block I/O has (a [B, S, H] value rather than its [B·S, H]
// reshape), so the fused nodes read and write that value directly.
func (c *ctx) boundary(v0 string) string {
	best, bestRank := v0, c.rankInfer(v0)
	if bestRank < 0 {
		return v0 // nothing to compare with: both sides stay at v0
	}
	v := v0
	for steps := 0; steps < 64 && !c.g.IsOutput(v); steps++ {
		cons := c.g.Consumers(v)
		if len(cons) != 1 || !noiseOps[cons[0].GetOpType()] || len(cons[0].Input) == 0 || cons[0].Input[0] != v || len(cons[0].Output) != 1 {
			break
		}
		v = cons[0].Output[0]
		if r := c.rankInfer(v); r > bestRank {
			best, bestRank = v, r
		}
	}
	return best
}

// inputBoundary returns a block's input given its router's input: the
// value the router input is reshaped from (through), or, when that is
// produced by another node, the boundary of the chain of shape ops from it
// when the router input lies on that chain (the previous block's output,
// see boundary).
func (c *ctx) inputBoundary(routerIn string) string {
	x0 := c.through(routerIn)
	if c.g.Producer(x0) == nil {
		return x0
	}
	b := c.boundary(x0)
	for v := routerIn; ; {
		if v == b {
			return b
		}
		p := c.g.Producer(v)
		if v == x0 || p == nil || !noiseOps[p.GetOpType()] || len(p.Input) == 0 {
			return x0
		}
		v = p.Input[0]
	}
}

// selectors computes, once, which nodes are router linears (routerAt): a
// MatMul or Gemm with a constant weight from whose outputs a selection (a
// TopK, or the ArgMax of a sparsemixer router) is reached without crossing
// another MatMul or Gemm. Consumers come later in topological order, so one
// reverse pass settles every node.
func (c *ctx) selectors() {
	if c.routerAt != nil {
		return
	}
	toSel := make([]bool, len(c.topo)) // a selection is reached from the node's outputs, matmuls not crossed
	routerAt := make([]bool, len(c.topo))
	d := c.d
	reaches := func(p int) bool {
		for _, j := range d.outVal[d.outOff[p]:d.outOff[p+1]] {
			if j < 0 {
				continue
			}
			for _, q := range d.consumers(j) {
				if toSel[q] {
					return true
				}
			}
		}
		return false
	}
	for i := len(c.topo) - 1; i >= 0; i-- {
		switch c.topo[i].GetOpType() {
		case "TopK", "ArgMax":
			toSel[i] = true
		case "MatMul", "Gemm":
			routerAt[i] = reaches(i) && c.weightMatMulAt(int32(i))
		default:
			toSel[i] = reaches(i)
		}
	}
	c.routerAt = routerAt
}

// feedsRouter reports whether value j (a value number) is read, through
// noise ops only, by a router linear (see selectors): then it is the input
// of the next block.
func (c *ctx) feedsRouter(j int32) bool {
	c.selectors()
	d := c.d
	for steps, stack := 0, []int32{j}; len(stack) > 0 && steps < 64; steps++ {
		v := stack[len(stack)-1]
		stack = stack[:len(stack)-1]
		for _, p := range d.consumers(v) {
			if c.routerAt[p] {
				return true
			}
			if n := c.topo[p]; noiseOps[n.GetOpType()] && d.inVal[d.inOff[p]] == v {
				for _, o := range d.outVal[d.outOff[p]:d.outOff[p+1]] {
					if o >= 0 {
						stack = append(stack, o)
					}
				}
			}
		}
	}
	return false
}

// weightMatMulAt reports whether the node at position p is a MatMul/Gemm
// with a constant weight, remembering the answer (per goroutine).
func (c *ctx) weightMatMulAt(p int32) bool {
	if op := c.topo[p].GetOpType(); op != "MatMul" && op != "Gemm" {
		return false
	}
	if c.wmm.at == nil {
		c.wmm.reset(len(c.topo))
	}
	if known, yes := c.wmm.get(p); known {
		return yes
	}
	yes := c.expertMatMul(c.topo[p]) != nil
	c.wmm.set(p, yes)
	return yes
}

// feedsWeightMatMul reports whether v (through noise) is an input of a
// MatMul/Gemm with a constant weight: then it is not a combine point.
func (c *ctx) feedsWeightMatMul(v string) bool {
	for _, n := range c.g.Consumers(v) {
		if noiseOps[n.GetOpType()] {
			if c.feedsWeightMatMul(n.Output[0]) {
				return true
			}
			continue
		}
		if c.expertMatMul(n) != nil {
			return true
		}
	}
	return false
}

// isFloatCompute excludes index/shape ops as combine points.
func isFloatCompute(n *pb.NodeProto) bool {
	switch n.GetOpType() {
	case "Shape", "Size", "NonZero", "TopK", "ArgMax", "Equal", "Greater", "Less", "Not", "OneHot", "Range", "ConstantOfShape":
		return false
	}
	return true
}

// regionBetween lists, in topological order, the nodes that depend on x0 and
// that y depends on (plus the constant-only feeders only they use, which
// dead-code removal takes care of).
func (c *ctx) regionBetween(x0, y string, xDeps map[*pb.NodeProto]bool) []*pb.NodeProto {
	return c.regionWhere(x0, y, func(p int32) bool { return xDeps[c.topo[p]] })
}

// regionWhere is regionBetween with "depends on x0" given as a predicate
// on topological positions (a lazy reach, so that big models are not
// walked past the block).
func (c *ctx) regionWhere(x0, y string, dependsOnX0 func(int32) bool) []*pb.NodeProto {
	return c.nodesAt(c.regionPos(x0, y, dependsOnX0))
}

// regionPos is regionWhere returning topological positions.
func (c *ctx) regionPos(x0, y string, dependsOnX0 func(int32) bool) []int32 {
	back := c.backPos(y, c.valueIDs(x0))
	out := back[:0]
	for _, p := range back {
		if dependsOnX0(p) {
			out = append(out, p)
		}
	}
	slices.Sort(out)
	return out
}

// hasWeightMatMul reports whether v is computed from x0 through a MatMul or
// Gemm with a constant weight.
func (c *ctx) hasWeightMatMul(v, x0 string) bool {
	for _, n := range c.backNodes(v, x0) {
		if (n.GetOpType() == "MatMul" || n.GetOpType() == "Gemm") && len(n.Input) > 1 {
			if c.matmulWeight(n.Input[1]) != nil || c.matmulWeight(n.Input[0]) != nil {
				return true
			}
		}
	}
	return false
}

// routerPost reads renormalisation, scaling and (for top-k-then-activation)
// the activation from the nodes between the top-k values and the experts,
// or says why they cannot be read.
func (c *ctx) routerPost(tk *pb.NodeProto, ri *routerInfo, s *moe.Spec) error {
	seeds := []string{tk.Output[0]}
	// With a correction bias the weights are the unbiased scores gathered by the indices.
	if ri.scores != "" {
		for _, n := range c.forwardNodes(tk.Output[1]) {
			if n.GetOpType() == "GatherElements" && c.through(n.Input[0]) == c.through(ri.scores) {
				seeds = append(seeds, n.Output[0])
			}
		}
	}
	// The nodes the routing weights reach without crossing expert compute
	// (a MatMul or Gemm), within the block (c.lim): a set, whatever the
	// order of the graph's nodes.
	for _, n := range c.routingNodes(seeds...) {
		switch n.GetOpType() {
		case "Softmax", "Sigmoid":
			if s.RouterOrder == moe.TopKThenActivation && s.RouterActivation == "" {
				s.RouterActivation = strings.ToLower(n.GetOpType())
			}
		case "Div":
			p := c.producerOp(n.Input[1])
			p = c.epsilonGuard(p)
			// ReduceL1 (DBRX's p=1 normalisation) is the sum: the routing
			// weights it divides are probabilities, never negative.
			if p != nil && (p.GetOpType() == "ReduceSum" || p.GetOpType() == "ReduceL1") {
				s.NormalizeTopK = true
			}
		case "Mul":
			for _, in := range n.Input {
				if f, ok := c.scalarFloat(in); ok && f != 1 {
					if s.RoutedScalingFactor != 1 && s.RoutedScalingFactor != f {
						return fmt.Errorf("routing weights scaled twice (by %g and %g)", s.RoutedScalingFactor, f)
					}
					s.RoutedScalingFactor = f
				}
			}
		}
	}
	if s.RouterActivation == "" {
		return errors.New("no router activation (softmax or sigmoid) found around the TopK")
	}
	return nil
}

// routingNodes lists the nodes reached from vals (within c.lim) without
// walking past a MatMul or Gemm, which are not listed.
func (c *ctx) routingNodes(vals ...string) []*pb.NodeProto {
	d := c.d
	mk := c.mk
	ep := mk.next()
	var out []int32
	stack := c.valueIDs(vals...)
	for len(stack) > 0 {
		j := stack[len(stack)-1]
		stack = stack[:len(stack)-1]
		for _, p := range d.consumers(j) {
			if mk.at[p] == ep || c.lim != nil && !c.lim[p] {
				continue
			}
			mk.at[p] = ep
			if op := c.topo[p].GetOpType(); op == "MatMul" || op == "Gemm" {
				continue
			}
			out = append(out, p)
			for _, o := range d.outVal[d.outOff[p]:d.outOff[p+1]] {
				if o >= 0 {
					stack = append(stack, o)
				}
			}
		}
	}
	slices.Sort(out)
	return c.nodesAt(out)
}

// epsilonGuard looks through the guard a renormalisation puts on its
// denominator — sum + eps, Clip(sum, min=eps) or Max(sum, eps) with a tiny
// eps (at most 1e-5, such as LFM2's 1e-6 and Ernie's 1e-12) — and returns the producer of the sum (p itself when unguarded). The
// guard only matters for sums below eps, which routing weights never reach.
func (c *ctx) epsilonGuard(p *pb.NodeProto) *pb.NodeProto {
	if p == nil {
		return nil
	}
	tiny := func(v string) bool {
		f, ok := c.scalarFloat(v)
		return ok && f >= 0 && f <= 1e-5
	}
	switch p.GetOpType() {
	case "Add", "Max":
		if len(p.Input) == 2 {
			for i, in := range p.Input {
				if tiny(in) {
					return c.producerOp(p.Input[1-i])
				}
			}
		}
	case "Clip":
		noMax := len(p.Input) < 3 || p.Input[2] == ""
		if !noMax {
			if f, ok := c.scalarFloat(p.Input[2]); ok && math.IsInf(float64(f), 1) {
				noMax = true
			}
		}
		if len(p.Input) >= 2 && tiny(p.Input[1]) && noMax {
			return c.producerOp(p.Input[0])
		}
	}
	return p
}

// rankOf returns the rank of v from the graph's declared types, or -1.
func (c *ctx) rankOf(v string) int {
	c.declare()
	if r, ok := c.ranks[v]; ok {
		return r
	}
	return -1
}

// declare reads, once, the ranks and element types the graph declares for
// its inputs, outputs and value_info.
func (c *ctx) declare() {
	if c.ranks != nil {
		return
	}
	c.ranks, c.types = map[string]int{}, map[string]pb.TensorProto_DataType{}
	gp := c.g.P
	for _, list := range [][]*pb.ValueInfoProto{gp.Input, gp.Output, gp.ValueInfo} {
		for _, vi := range list {
			tt := vi.GetType().GetTensorType()
			if tt == nil {
				continue
			}
			if sh := tt.GetShape(); sh != nil {
				c.ranks[vi.GetName()] = len(sh.Dim)
			}
			if et := pb.TensorProto_DataType(tt.GetElemType()); et != pb.TensorProto_UNDEFINED {
				c.types[vi.GetName()] = et
			}
		}
	}
}

// inputLike picks, among the block input x0 and the values between it and
// the router input, the one whose declared rank matches the block output's,
// so the fused node (whose output has its input's shape) keeps y's shape.
func (c *ctx) inputLike(x0, routerIn, y string) string {
	ry := c.rankInfer(y)
	if ry < 0 || c.rankInfer(x0) == ry {
		return x0
	}
	unknown := ""
	for v := routerIn; v != x0; {
		switch c.rankInfer(v) {
		case ry:
			return v
		case -1:
			if unknown == "" {
				unknown = v
			}
		}
		p := c.g.Producer(v)
		if p == nil || !noiseOps[p.GetOpType()] {
			break
		}
		v = p.Input[0]
	}
	if unknown != "" {
		return unknown
	}
	return x0
}

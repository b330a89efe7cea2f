package passes

import (
	"errors"
	"fmt"
	"math"
	"slices"
	"strings"

	"github.com/mokopt/mokopt/graph"
	pb "github.com/mokopt/mokopt/graph/onnxpb"
	"github.com/mokopt/mokopt/moe"
)

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
	// generic: found by structure (routerByStructure), its semantics left to
	// evaluation; logits is then the value holding the folded logits.
	generic bool
	logits  string
}

// router walks back from the selection TopK to the router linear, or says
// why the TopK is not fed by one.
func (c *ctx) router(tk *pb.NodeProto) (*routerInfo, error) {
	ri, err := c.routerWalk(tk)
	if err != nil {
		// A router the walk does not read is found by structure; what it
		// computes is decided by evaluation (routerByEval).
		return c.routerByStructure(tk)
	}
	return ri, nil
}

// routerWalk is router's op walk over the spellings it knows.
func (c *ctx) routerWalk(tk *pb.NodeProto) (*routerInfo, error) {
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
			// Group-limited routing: Where(mask, scores, -inf) or Where(notmask, -inf, scores)
			// (-inf or its finite stand-in, or 0).
			a, bb := p.Input[1], p.Input[2]
			if fa, ok := c.scalarFloat(a); ok && (masksOut(fa) || fa == 0) {
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
		if reshape == nil {
			return
		}
		groups := int64(0)
		switch reshape.GetOpType() {
		case "Reshape":
			if sh := c.constInts(reshape.Input[1]); len(sh) >= 2 && sh[len(sh)-2] > 0 {
				groups = sh[len(sh)-2]
			}
		case "Unsqueeze": // one group: a unit axis inserted second to last
			if c.unsqueezesSecondToLast(reshape) {
				groups = 1
			}
		}
		if groups == 0 {
			return
		}
		if groupsRead && ri.nGroup != int(groups) && err == nil {
			err = fmt.Errorf("group-limited routing: two group counts (%d and %d)", ri.nGroup, groups)
		}
		ri.nGroup, groupsRead = int(groups), true
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
				readGroups(c.producerPastCasts(p.Input[0]))
			}
		}
		readGroups(c.producerPastCasts(n.Input[0])) // the inner TopK reads the reshape
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

// producerPastCasts returns the producer of v, looking past Casts (a
// float16 conversion casts around the ops it keeps in float32), or nil.
func (c *ctx) producerPastCasts(v string) *pb.NodeProto {
	for range 8 {
		p := c.g.Producer(v)
		if p == nil || p.GetOpType() != "Cast" || len(p.Input) == 0 {
			return p
		}
		v = p.Input[0]
	}
	return nil
}

// routerPost reads renormalisation, scaling and (for top-k-then-activation)
// the activation from the nodes between the top-k values and the experts,
// or says why they cannot be read.
func (c *ctx) routerPost(tk *pb.NodeProto, ri *routerInfo, s *moe.Spec) error {
	if done, err := c.routerByEval(tk, ri, s); done || err != nil {
		return err
	}
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

// unsqueezesSecondToLast reports whether Unsqueeze n inserts one axis, the
// second to last of its output.
func (c *ctx) unsqueezesSecondToLast(n *pb.NodeProto) bool {
	var axes []int64
	if len(n.Input) > 1 {
		axes = c.constInts(n.Input[1])
	} else {
		axes = graph.AttrInts(n, "axes")
	}
	if len(axes) != 1 {
		return false
	}
	if axes[0] == -2 {
		return true
	}
	r := c.rankInfer(n.Input[0])
	return r >= 1 && axes[0] == int64(r-1)
}

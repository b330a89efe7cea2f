package passes

import (
	"slices"

	"github.com/mokopt/mokopt/graph"
	pb "github.com/mokopt/mokopt/graph/onnxpb"
)

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
	return c.postDominatorBeside(tk, routerLinear, nil)
}

// routerPos returns the topological position of the router linear, or -1.
func (c *ctx) routerPos(routerLinear *pb.NodeProto) int32 {
	if routerLinear != nil {
		if p, ok := c.posOf(routerLinear); ok {
			return p
		}
	}
	return -1
}

// afterExpertFunc returns afterExpert(p): node p is reached from the
// output of a MatMul/Gemm with a constant weight other than the router at
// position router, where the combine point of the selection whose router
// input has the ancestors anc comes. An ancestor of the router input
// never is (the matmul would be one too). Answers are kept in c.after.
func (c *ctx) afterExpertFunc(anc []bool, router int32) func(p int32) bool {
	d := c.d
	after := &c.after
	after.reset(len(c.topo))
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
	return afterExpert
}

// postDominatorBeside is postDominator where the nodes for which side
// holds do not count (nil: none): computations beside the block that read
// its router's values and never meet its experts (see routerSides). Their
// edges neither keep a value open nor are walked, and a value that is a
// graph output keeps itself open only when it comes after expert compute.
func (c *ctx) postDominatorBeside(tk, routerLinear *pb.NodeProto, side []bool) string {
	anc := c.ancestors(tk.Input[0]) // an earlier layer's experts are not ours
	d := c.d
	router := c.routerPos(routerLinear)
	afterExpert := c.afterExpertFunc(anc, router)
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
		if side != nil {
			for _, p := range d.consumers(j) {
				if side[p] {
					n--
				}
			}
		}
		if d.isOut[j] && (side == nil || d.prod[j] >= 0 && afterExpert(d.prod[j])) {
			n++ // never closes
		}
		if n > 0 {
			pending[j] = n
		}
		for _, p := range d.consumers(j) {
			if mk.at[p] != ep && (side == nil || !side[p]) {
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

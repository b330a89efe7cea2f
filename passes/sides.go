package passes

import (
	"slices"

	pb "github.com/mokopt/mokopt/graph/onnxpb"
)

// Router values used twice: a selection's outputs (and the scores before
// it) may also feed computations beside the block, such as an auxiliary
// load-balancing loss made of the chosen experts and the router's
// probabilities, or a model output of the chosen ids. Those computations
// never meet the experts; they keep reading the router's values, which
// stay in the graph (recomputed from the fused node's router_logits output,
// see logits.go), and the block is what is left: from the block input to
// the combine.

// combineBeside finds the combine point of the selection tk when its
// outputs also feed computations beside the block (see routerSides): the
// post-dominator of tk's outputs over the nodes that meet expert compute.
// It returns "" when there is none, or when nothing is beside the block
// (then postDominator already said all there is).
func (c *ctx) combineBeside(tk, routerLinear *pb.NodeProto) string {
	side := c.routerSides(tk, routerLinear)
	if side == nil {
		return ""
	}
	return c.postDominatorBeside(tk, routerLinear, side)
}

// routerSides returns, indexed by topological position, the nodes beside
// the block of the selection tk: those reached from tk's outputs from
// which no path meets the block's expert compute. A node meets it when it
// is a MatMul/Gemm with a constant weight, or when it depends on the
// output of one through a path that does not cross a router linear (so
// another block's router values, an auxiliary loss of a later layer say,
// are not expert compute of this one; an ancestor of the router input
// never is). The walk goes forward from tk's outputs and stops at the
// nodes that meet expert compute, so it costs the router's consumers, not
// the model after the block. nil when no node is beside the block.
func (c *ctx) routerSides(tk, routerLinear *pb.NodeProto) []bool {
	anc := c.ancestors(tk.Input[0])
	router := c.routerPos(routerLinear)
	c.selectors()
	d := c.d
	meets := map[int32]bool{} // by position: expertAfter, memoized
	var expertAfter func(p int32) bool
	expertAfter = func(p int32) bool {
		if v, ok := meets[p]; ok {
			return v
		}
		meets[p] = false
		if anc[p] || c.routerAt[p] {
			return false
		}
		for _, q := range d.inPred[d.inOff[p]:d.inOff[p+1]] {
			if q < 0 || anc[q] || q == router {
				continue
			}
			if c.weightMatMulAt(q) && !c.routerAt[q] || expertAfter(q) {
				meets[p] = true
				return true
			}
		}
		return false
	}
	// Forward from tk's outputs, not past the nodes that meet experts.
	mk := c.mk
	ep := mk.next()
	var reached []int32
	joins := map[int32]bool{}
	stack := c.valueIDs(tk.Output...)
	for len(stack) > 0 {
		j := stack[len(stack)-1]
		stack = stack[:len(stack)-1]
		for _, p := range d.consumers(j) {
			if mk.at[p] == ep {
				continue
			}
			mk.at[p] = ep
			reached = append(reached, p)
			if c.weightMatMulAt(p) || expertAfter(p) {
				joins[p] = true
				continue
			}
			for _, o := range d.outVal[d.outOff[p]:d.outOff[p+1]] {
				if o >= 0 {
					stack = append(stack, o)
				}
			}
		}
	}
	// A node is beside the block when it does not meet experts and none
	// of its consumers does or leads to one that does: consumers come
	// later in topological order, so one pass from the last settles all.
	slices.Sort(reached)
	var side []bool
	for i := len(reached) - 1; i >= 0; i-- {
		p := reached[i]
		if joins[p] {
			continue
		}
		beside := true
		for _, o := range d.outVal[d.outOff[p]:d.outOff[p+1]] {
			if o < 0 {
				continue
			}
			for _, q := range d.consumers(o) {
				if side == nil || !side[q] {
					beside = false
				}
			}
		}
		if beside {
			if side == nil {
				side = make([]bool, len(c.topo))
			}
			side[p] = true
		}
	}
	return side
}

package passes

import (
	"slices"
	"strconv"
	"strings"

	"github.com/mokopt/mokopt/graph"
	pb "github.com/mokopt/mokopt/graph/onnxpb"
)

// The fused op routes each token by a linear layer of the token itself:
// its router and its experts read one value, the block input. A router
// linear whose input is something else (a constant, another graph input, a
// value computed from neither the hidden state nor anything the experts
// read) routes every token by a value that is not that token's: the block
// reads its input x0 from the router's side, so such a block would be
// fused reading the wrong value, or reported for a failure it does not
// have (experts that seem to be missing, a numerical check that fails).
// checkRouterInput refuses it first, saying what the router reads.

// checkRouterInput refuses the block whose router linear ri.linear reads
// x0 (the block input, found from the router's side) when no expert reads
// x0's values: following the region's nodes forward from x0, neither
// through the router linear (everything the routing computes lies behind
// it) nor through a read of x0's shape alone (Shape, Size), no MatMul or
// Gemm but the shared expert's (shared) is reached. y is the block output,
// from which the refusal finds what the experts read.
func (c *ctx) checkRouterInput(ri *routerInfo, x0, y string, regionPos []int32, shared map[*pb.NodeProto]bool) error {
	in := make(map[int32]bool, len(regionPos))
	for _, p := range regionPos {
		in[p] = true
	}
	router, ok := c.posOf(ri.linear)
	if !ok {
		router = -1
	}
	seen := map[int32]bool{}
	stack := c.valueIDs(x0)
	for len(stack) > 0 {
		j := stack[len(stack)-1]
		stack = stack[:len(stack)-1]
		for _, p := range c.d.consumers(j) {
			n := c.topo[p]
			if seen[p] || !in[p] || p == router || n.GetOpType() == "Shape" || n.GetOpType() == "Size" {
				continue
			}
			seen[p] = true
			if op := n.GetOpType(); (op == "MatMul" || op == "Gemm") && !shared[n] {
				return nil
			}
			for _, o := range c.d.outVal[c.d.outOff[p]:c.d.outOff[p+1]] {
				if o >= 0 {
					stack = append(stack, o)
				}
			}
		}
	}
	return c.routerInputRefusal(ri, y)
}

// routerInputRefusal says what router linear ri.linear reads that the
// experts do not: constants alone, graph inputs the experts do not read
// (the block output y, not counting what it reads through the router
// linear), or another value of the hidden state.
func (c *ctx) routerInputRefusal(ri *routerInfo, y string) error {
	router := graph.NodeLabel(ri.linear)
	rin := c.graphInputsRead(ri.x, nil)
	if len(rin) == 0 {
		return rejectf("routing does not depend on the hidden state: router linear %q reads %q, which is computed from constants alone (every token is routed alike); ai.mok::MoE routes each token by a linear layer of its hidden state",
			router, ri.x)
	}
	ein := c.graphInputsRead(y, ri.linear)
	if !slices.ContainsFunc(rin, func(v string) bool { return slices.Contains(ein, v) }) {
		experts := "constants alone"
		if len(ein) > 0 {
			experts = quoteList(ein)
		}
		return rejectf("routing does not depend on the hidden state: router linear %q reads %q, computed from %s, which the experts do not read (they compute from %s); ai.mok::MoE routes each token by a linear layer of the hidden state its experts read",
			router, ri.x, quoteList(rin), experts)
	}
	return rejectf("router linear %q reads %q, a value computed from the hidden state that no expert reads (the experts compute from another value of it); ai.mok::MoE's router and experts read one block input",
		router, ri.x)
}

// graphInputsRead lists the graph inputs (not initializers) whose values v
// is computed from: not through a read of a shape alone (Shape, Size), and
// not through the inputs of node stop.
func (c *ctx) graphInputsRead(v string, stop *pb.NodeProto) []string {
	return c.graphInputsReadStop(v, func(n *pb.NodeProto) bool { return n == stop })
}

// graphInputsReadStop is graphInputsRead not through the inputs of the
// nodes for which stop holds.
func (c *ctx) graphInputsReadStop(v string, stop func(*pb.NodeProto) bool) []string {
	isInput := func(name string) bool { return c.g.IsInput(name) && c.g.Initializer(name) == nil }
	var out []string
	if isInput(v) {
		out = append(out, v)
	}
	shapeRead := func(n *pb.NodeProto) bool { return n.GetOpType() == "Shape" || n.GetOpType() == "Size" }
	for n := range c.backwardTo(v, func(n *pb.NodeProto) bool { return stop(n) || shapeRead(n) }) {
		if stop(n) || shapeRead(n) {
			continue
		}
		for _, in := range n.Input {
			if isInput(in) && !slices.Contains(out, in) {
				out = append(out, in)
			}
		}
	}
	slices.Sort(out)
	return out
}

// quoteList writes names quoted, comma-separated.
func quoteList(names []string) string {
	q := make([]string, len(names))
	for i, n := range names {
		q[i] = strconv.Quote(n)
	}
	return strings.Join(q, ", ")
}

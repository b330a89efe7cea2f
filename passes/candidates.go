package passes

import (
	"fmt"

	"github.com/mokopt/mokopt/graph"
	pb "github.com/mokopt/mokopt/graph/onnxpb"
)

// feedsExpertCompute reports whether a TopK's indices reach a MatMul or Gemm
// with a constant weight: the TopK selects what weight compute runs, so it is
// an MoE candidate even when its router could not be read
// (a failure then is a near-miss worth reporting, not an unrelated TopK).
func (c *ctx) feedsExpertCompute(tk *pb.NodeProto) bool {
	if len(tk.Output) < 2 {
		return false
	}
	// The walk does not go past a weight MatMul or Gemm: expert compute the
	// indices select is reached before any, and the blocks after it are
	// not walked (a failing candidate costs its own block).
	for _, p := range c.selectedPos(&pb.NodeProto{Output: tk.Output[1:2]}) {
		n := c.topo[p]
		if op := n.GetOpType(); op != "MatMul" && op != "Gemm" {
			continue
		}
		for _, in := range n.Input[:min(2, len(n.Input))] {
			if c.matmulWeight(in) != nil {
				return true
			}
		}
	}
	return false
}

// meetsStackedExperts reports whether a TopK's outputs, without crossing
// a MatMul or Gemm, meet the output of one whose constant weight is a stack
// of expert matrices ([E, in, out]): the TopK weights experts' outputs (as
// a dense block's routing matrix does), so it is an MoE candidate even when
// its scores come from no router linear (a refusal then says so).
func (c *ctx) meetsStackedExperts(tk *pb.NodeProto) bool {
	for _, n := range c.routingNodes(tk.Output...) {
		for _, in := range n.Input {
			p := c.producerOp(in)
			if p == nil || p.GetOpType() != "MatMul" && p.GetOpType() != "Gemm" || len(p.Input) < 2 {
				continue
			}
			for _, w := range p.Input[:2] {
				if t := c.matmulWeight(w); t != nil && len(t.t.GetDims()) == 3 && t.sel == selNone {
					return true
				}
			}
		}
	}
	return false
}

// routerlessExperts reports expert-like compute that no block claimed: a
// MatMul or Gemm whose weight is a slice of a stacked [E, ...] initializer
// chosen by data-dependent indices. Such a block routes tokens without a
// TopK (for example PhiMoE's sparsemixer, which picks experts with ArgMax
// and masked softmaxes), which mokopt cannot fuse: it is reported once per
// stacked weight as a near-miss.
func (c *ctx) routerlessExperts(claimed []bool) []NearMiss {
	seen := map[string]bool{}
	var out []NearMiss
	for p, n := range c.topo {
		if op := n.GetOpType(); (op != "MatMul" && op != "Gemm") || claimed[p] {
			continue
		}
		for _, in := range n.Input[:min(2, len(n.Input))] {
			w := c.matmulWeight(in)
			if w == nil || (w.sel != selRouted && w.sel != selSlot) || len(w.t.GetDims()) < 3 || seen[w.t.GetName()] {
				continue
			}
			seen[w.t.GetName()] = true
			out = append(out, NearMiss{Node: graph.NodeLabel(n), Reason: fmt.Sprintf(
				"expert weights %q %v are gathered per token by data-dependent indices, but no TopK router selects them: routing without TopK (e.g. sparsemixer's ArgMax and masked softmax) is not supported",
				w.t.GetName(), w.t.GetDims())})
		}
	}
	return out
}

// unreadArgMaxes reports each ArgMax that selects experts but stands for no
// router's TopK, outside what a block or a reported selection covers:
// canonicalization reads a top-1 ArgMax as the TopK it is, so what is left
// takes the last of equal scores (select_last_index=1), or is one pick of
// an iterative selection that is not a sparsemixer router (syn holds the
// selections read as one). Without this, such a model would fuse nothing
// and say nothing.
func (c *ctx) unreadArgMaxes(covered []bool, syn map[int]*pb.NodeProto) []NearMiss {
	var out []NearMiss
	for p, n := range c.topo {
		if n.GetOpType() != "ArgMax" || n.GetDomain() != "" || covered[p] || syn[p] != nil || len(n.Output) != 1 || n.Output[0] == "" {
			continue
		}
		sel := &pb.NodeProto{Output: []string{n.Output[0], n.Output[0]}}
		if !c.feedsExpertCompute(sel) && !c.meetsStackedExperts(sel) {
			continue
		}
		why := "it is one pick of an iterative selection that is not a sparsemixer router"
		if graph.AttrInt(n, "select_last_index", 0) != 0 {
			why = "it takes the last of equal scores (select_last_index=1), which no TopK selects"
		}
		out = append(out, NearMiss{Node: graph.NodeLabel(n), Reason: "experts are selected by an ArgMax that is not read as a router's top-k: " + why})
	}
	return out
}

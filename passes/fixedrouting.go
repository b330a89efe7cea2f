package passes

import (
	"fmt"
	"slices"
	"strings"

	"github.com/mokopt/mokopt/graph"
	pb "github.com/mokopt/mokopt/graph/onnxpb"
)

// rowSelectOps pick elements of their first input at the indices their
// second input holds.
var rowSelectOps = map[string]bool{"Gather": true, "GatherND": true, "GatherElements": true, "Compress": true}

// fixedBranch is one piece of expert-like compute whose tokens are chosen
// by indices that depend on no graph input.
type fixedBranch struct {
	sel     *pb.NodeProto // the selection of the source's rows
	weights []string      // the constant weights of the matmuls it feeds
}

// fixedRoutedExperts reports expert-like compute that no block claimed
// whose routing does not depend on the hidden state: two or more
// selections of one value computed from the graph's inputs, each at
// indices that are not computed from that value (from constants alone: a
// hash of token positions, a fixed table that a trace folded; or from
// other inputs: expert ids hashed from the token ids), each feeding
// MatMuls or Gemms with constant weights of their own. The fused op routes by a linear layer of
// its input and cannot express such a block; without this report a
// rewrite would fuse nothing and say nothing.
func (c *ctx) fixedRoutedExperts(claimed []bool) []NearMiss {
	var ins []string
	for _, vi := range c.m.Proto.Graph.GetInput() {
		if c.g.Initializer(vi.GetName()) == nil {
			ins = append(ins, vi.GetName())
		}
	}
	if len(ins) == 0 {
		return nil
	}
	r := c.reachFrom(ins...)
	fromInputs := func(v string) bool {
		if c.g.IsInput(v) {
			return c.g.Initializer(v) == nil
		}
		p := c.g.Producer(v)
		return p != nil && r.has(p)
	}
	bySource := map[string][]*fixedBranch{}
	var sources []string
	seen := map[*pb.NodeProto]*fixedBranch{}
	for p, n := range c.topo {
		if op := n.GetOpType(); (op != "MatMul" && op != "Gemm") || claimed[p] || len(n.Input) < 2 {
			continue
		}
		w := c.linearWeight(n)
		sel := c.producerOp(n.Input[0])
		if w == nil || sel == nil || !rowSelectOps[sel.GetOpType()] || len(sel.Input) < 2 {
			continue
		}
		b, ok := seen[sel]
		if !ok {
			src := c.through(sel.Input[0])
			if !fromInputs(sel.Input[0]) || c.readsValues(sel.Input[1], src) {
				seen[sel] = nil
				continue
			}
			b = &fixedBranch{sel: sel}
			seen[sel] = b
			if bySource[src] == nil {
				sources = append(sources, src)
			}
			bySource[src] = append(bySource[src], b)
		}
		if b == nil {
			continue
		}
		if name := w.t.GetName(); !slices.Contains(b.weights, name) {
			b.weights = append(b.weights, name)
		}
	}
	var out []NearMiss
	for _, src := range sources {
		if nm, ok := fixedRoutingMiss(src, bySource[src]); ok {
			out = append(out, nm)
		}
	}
	return out
}

// readsValues reports whether v is computed from the values of src (not
// only from its shape, read by Shape or Size): src's producer or a reader
// of src is among v's ancestors, not counting the paths through a Shape or
// Size.
func (c *ctx) readsValues(v, src string) bool {
	shapeRead := func(n *pb.NodeProto) bool { return n.GetOpType() == "Shape" || n.GetOpType() == "Size" }
	if v == src {
		return true
	}
	p := c.g.Producer(src)
	for n := range c.backwardTo(v, shapeRead) {
		if n == p || !shapeRead(n) && slices.Contains(n.Input, src) {
			return true
		}
	}
	return false
}

// fixedRoutingMiss is the near-miss for the branches that select rows of
// src at constant indices, when there are two or more with weights of
// their own.
func fixedRoutingMiss(src string, bs []*fixedBranch) (NearMiss, bool) {
	var weights []string
	for _, b := range bs {
		for _, w := range b.weights {
			if !slices.Contains(weights, w) {
				weights = append(weights, w)
			}
		}
	}
	if len(bs) < 2 || len(weights) < 2 {
		return NearMiss{}, false
	}
	shown := weights
	if len(shown) > 4 {
		shown = shown[:4]
	}
	q := make([]string, len(shown))
	for i, w := range shown {
		q[i] = fmt.Sprintf("%q", w)
	}
	more := ""
	if len(weights) > len(shown) {
		more = fmt.Sprintf(" and %d more", len(weights)-len(shown))
	}
	return NearMiss{Node: graph.NodeLabel(bs[0].sel), Reason: fmt.Sprintf(
		"routing does not depend on the hidden state: %d expert branches (weights %s%s) each take the rows of %q at indices not computed from it (a fixed routing table, a hash of the token positions or of the token ids), not chosen by a router of the hidden state; ai.mok::MoE cannot express that (its router is a linear layer of the block input)",
		len(bs), strings.Join(q, ", "), more, src)}, true
}

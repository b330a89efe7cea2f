package passes

import (
	"context"
	"fmt"
	"slices"

	"github.com/mokopt/mokopt/graph"
	"github.com/mokopt/mokopt/graph/eval"
	pb "github.com/mokopt/mokopt/graph/onnxpb"
	"google.golang.org/protobuf/proto"
)

// A dense block runs every expert on every token and weights the outputs
// by a routing matrix. When no TopK is left and those weights are computed
// from constants alone (a constant vector, the softmax of one, a per-token
// table a trace folded), every token takes every expert in one fixed
// mixture: no router reads the hidden state, and ai.mok::MoE, which routes
// by a linear layer of its input, cannot express it. Without a report
// such a block would be left as it is and the rewrite would say nothing.

// fixedDenseExperts reports the dense expert compute no block claimed
// whose mixture does not depend on the hidden state: a MatMul or Gemm
// whose weight is a stack of E ≥ 2 expert matrices used whole, whose other
// operand is computed from a graph input's values, and whose output,
// before any other MatMul or Gemm, is multiplied by a mixture (or whose
// input is scaled by one: weights on the input): a value computed from
// constants alone with a dimension of E and more than one element. An
// output mixture must then be summed (ReduceSum, ReduceMean or Sum). Each
// mixture is reported once.
func (c *ctx) fixedDenseExperts(claimed []bool) []NearMiss {
	var out []NearMiss
	reported := map[*pb.NodeProto]bool{}
	c.eachStackedExperts(claimed, func(n *pb.NodeProto, w *pb.TensorProto, data string) {
		E := w.GetDims()[0]
		at, mix, onInput := c.fixedMixture(n, data, E, claimed)
		if at == nil || reported[at] || len(c.graphInputsRead(data, nil)) == 0 {
			return
		}
		reported[at] = true
		how := fmt.Sprintf("their outputs are weighted by %q", mix)
		if onInput {
			how = fmt.Sprintf("each expert's input is scaled by %q", mix)
		}
		out = append(out, NearMiss{Node: graph.NodeLabel(at), Reason: fmt.Sprintf(
			"routing does not depend on the hidden state: %d dense experts (stacked weights %q %v) run on every token and %s, which is computed from constants alone: a fixed mixture, with no TopK and no router of the hidden state; ai.mok::MoE cannot express that (its router is a linear layer of the block input)",
			E, w.GetName(), w.GetDims(), how)})
	})
	return out
}

// eachStackedExperts calls fn, in topological order, for every MatMul or
// Gemm no block claimed that uses a stack of expert matrices whole
// (stackedExperts), with that stack and its other operand.
func (c *ctx) eachStackedExperts(claimed []bool, fn func(n *pb.NodeProto, w *pb.TensorProto, data string)) {
	for p, n := range c.topo {
		if claimed[p] {
			continue
		}
		if w, data := c.stackedExperts(n); w != nil {
			fn(n, w, data)
		}
	}
}

// stackedExperts returns the stacked expert weight [E, in, out] (E ≥ 2)
// that MatMul or Gemm n uses whole, and n's other operand; nil if none.
func (c *ctx) stackedExperts(n *pb.NodeProto) (*pb.TensorProto, string) {
	if op := n.GetOpType(); op != "MatMul" && op != "Gemm" || len(n.Input) < 2 {
		return nil, ""
	}
	for i, in := range n.Input[:2] {
		w := c.matmulWeight(in)
		if w == nil || w.sel != selNone || len(w.t.GetDims()) != 3 || w.t.GetDims()[0] < 2 {
			continue
		}
		return w.t, n.Input[1-i]
	}
	return nil, ""
}

// fixedMixture finds the fixed mixture of expert matmul n (E experts, data
// its other operand): the unclaimed Mul after it that multiplies its output
// by a mixture, whose product is summed, and where the sum reads no graph
// input but through the stacked experts (no router of the hidden state
// weights it besides); or the Mul before it that scales its input, a copy
// of the hidden state (no product), by one. It returns the Mul, the mixture
// value and whether it scales the input; a nil Mul when there is none.
func (c *ctx) fixedMixture(n *pb.NodeProto, data string, E int64, claimed []bool) (*pb.NodeProto, string, bool) {
	if m := c.producerOp(data); m != nil && m.GetOpType() == "Mul" && len(m.Input) == 2 {
		for i, in := range m.Input {
			if c.isMixture(in, E) && !c.isProduct(m.Input[1-i]) {
				return m, in, true
			}
		}
	}
	experts := func(r *pb.NodeProto) bool { w, _ := c.stackedExperts(r); return w != nil }
	for _, m := range c.routingNodes(n.Output[0]) {
		if p, ok := c.posOf(m); m.GetOpType() != "Mul" || !ok || claimed[p] {
			continue
		}
		for _, in := range m.Input {
			if !c.isMixture(in, E) {
				continue
			}
			for _, r := range c.routingNodes(m.Output[0]) {
				if op := r.GetOpType(); (op == "ReduceSum" || op == "ReduceMean" || op == "Sum") && len(c.graphInputsReadStop(r.Output[0], experts)) == 0 {
					return m, in, false
				}
			}
		}
	}
	return nil, "", false
}

// isProduct reports whether v, looked through shape ops and Expand or
// Tile, is a Mul or Div: a value already weighted, not a copy of the
// hidden state.
func (c *ctx) isProduct(v string) bool {
	for steps := 0; steps < 64; steps++ {
		p := c.g.Producer(v)
		if p == nil || len(p.Input) == 0 {
			return false
		}
		switch op := p.GetOpType(); {
		case op == "Mul" || op == "Div":
			return true
		case noiseOps[op] || op == "Expand" || op == "Tile":
			v = p.Input[0]
		default:
			return false
		}
	}
	return false
}

// isMixture reports whether v can weight E experts without reading the
// hidden state: a value computed from constants alone (no graph input, not
// even its shape) with a dimension of E and more than one element.
func (c *ctx) isMixture(v string, E int64) bool {
	dims, ok := c.constDims(v)
	if !ok {
		return false
	}
	n := int64(1)
	for _, d := range dims {
		n *= d
	}
	return n > 1 && slices.Contains(dims, E)
}

// constDims returns the dims of v when it is computed from constants alone:
// a constant, or at most 64 nodes of initializers and constants that the
// interpreter runs (a softmax of a constant vector that canonicalization
// left unfolded).
func (c *ctx) constDims(v string) ([]int64, bool) {
	if t := c.constTensor(v); t != nil {
		return t.GetDims(), true
	}
	sub := &pb.GraphProto{Name: proto.String("mixture"), Output: []*pb.ValueInfoProto{{Name: proto.String(v)}}}
	seen := map[string]bool{}
	stack := []string{v}
	for len(stack) > 0 {
		u := stack[len(stack)-1]
		stack = stack[:len(stack)-1]
		if u == "" || seen[u] {
			continue
		}
		seen[u] = true
		if t := c.g.Initializer(u); t != nil {
			sub.Initializer = append(sub.Initializer, t)
			continue
		}
		p := c.g.Producer(u)
		if p == nil || len(sub.Node) == 64 || slices.ContainsFunc(p.Attribute, func(a *pb.AttributeProto) bool { return a.G != nil || len(a.Graphs) > 0 }) {
			return nil, false // a graph input, or too much to run
		}
		sub.Node = append(sub.Node, p)
		stack = append(stack, p.Input...)
	}
	slices.SortFunc(sub.Node, func(a, b *pb.NodeProto) int { qa, _ := c.posOf(a); qb, _ := c.posOf(b); return int(qa - qb) })
	res, err := eval.Run(context.Background(), c.m.WithGraph(sub), nil, eval.Options{MemLimit: 1 << 24, Threads: 1, Kernels: evalKernels()})
	if err != nil || res[v] == nil {
		return nil, false
	}
	dims := make([]int64, len(res[v].Shape))
	for i, d := range res[v].Shape {
		dims[i] = int64(d)
	}
	return dims, true
}

package passes

import (
	"fmt"
	"slices"

	"github.com/mokopt/mokopt/graph"
	pb "github.com/mokopt/mokopt/graph/onnxpb"
)

// A soft (dense) mixture of experts runs every expert on every token and
// weights each by a softmax or sigmoid of a router over all E experts,
// with no TopK. ai.mok::MoE routes each token to its top-k experts, so
// such a block is left as it is; the rewrite says so in a warning rather
// than passing over it in silence (nothing is wrong with the model, so it
// is not a refusal).

// softDenseExperts returns a warning for each soft mixture of dense
// expert compute no block claimed: a MatMul or Gemm whose weight is a
// stack of E ≥ 2 expert matrices used whole, whose output is multiplied by
// a soft mixture (isSoftMixture) and the product summed, or whose input is
// scaled by one. Each mixture is reported once.
func (c *ctx) softDenseExperts(claimed []bool) []string {
	var out []string
	reported := map[string]bool{}
	c.eachStackedExperts(claimed, func(n *pb.NodeProto, w *pb.TensorProto, data string) {
		E := w.GetDims()[0]
		mix, act := c.softMixtureOf(n, data, E, claimed)
		if mix == "" || reported[mix] {
			return
		}
		reported[mix] = true
		out = append(out, fmt.Sprintf("%s: soft routing left unfused: %d dense experts (stacked weights %q %v) run on every token, weighted by %q, the %s of a router over all %d experts, with no TopK; ai.mok::MoE routes each token to its top-k experts",
			graph.NodeLabel(n), E, w.GetName(), w.GetDims(), mix, act, E))
	})
	return out
}

// softMixtureOf finds the soft mixture weighting expert matmul n (E
// experts, data its other operand): a Mul before it scaling its input by
// one (also behind scalings by constants), or an unclaimed Mul after it multiplying its output by one whose
// product is summed. It returns the mixture value and its activation
// (Softmax or Sigmoid); "" when there is none.
func (c *ctx) softMixtureOf(n *pb.NodeProto, data string, E int64, claimed []bool) (string, string) {
	for steps := 0; steps < 8; steps++ { // the input, through scalings by constants
		m := c.producerOp(data)
		if m == nil || m.GetOpType() != "Mul" || len(m.Input) != 2 {
			break
		}
		for _, in := range m.Input {
			if act := c.isSoftMixture(in, E); act != "" {
				return in, act
			}
		}
		switch {
		case c.constTensor(m.Input[1]) != nil:
			data = m.Input[0]
		case c.constTensor(m.Input[0]) != nil:
			data = m.Input[1]
		default:
			steps = 8
		}
	}
	for _, m := range c.routingNodes(n.Output[0]) {
		if p, ok := c.posOf(m); m.GetOpType() != "Mul" || !ok || claimed[p] {
			continue
		}
		for _, in := range m.Input {
			act := c.isSoftMixture(in, E)
			if act == "" {
				continue
			}
			for _, r := range c.routingNodes(m.Output[0]) {
				if op := r.GetOpType(); op == "ReduceSum" || op == "ReduceMean" || op == "Sum" {
					return in, act
				}
			}
		}
	}
	return "", ""
}

// isSoftMixture reports, as its activation, whether v is, through shape
// ops and scalings by constants, a Softmax or Sigmoid of the output of a
// MatMul or Gemm by a constant weight with a dimension of E (a router's
// logits over all E experts); "" otherwise.
func (c *ctx) isSoftMixture(v string, E int64) string {
	for steps := 0; steps < 64; steps++ {
		p := c.g.Producer(v)
		if p == nil || len(p.Input) == 0 || p.GetDomain() != "" {
			return ""
		}
		switch op := p.GetOpType(); {
		case noiseOps[op] || op == "Transpose" || op == "Expand" || op == "Tile":
			v = p.Input[0]
		case (op == "Mul" || op == "Div") && len(p.Input) == 2 && c.constTensor(p.Input[1]) != nil:
			v = p.Input[0]
		case op == "Mul" && len(p.Input) == 2 && c.constTensor(p.Input[0]) != nil:
			v = p.Input[1]
		case op == "Softmax" || op == "Sigmoid":
			lin := c.producerOp(p.Input[0])
			if lin == nil || (lin.GetOpType() != "MatMul" && lin.GetOpType() != "Gemm") || len(lin.Input) < 2 {
				return ""
			}
			if t := c.constTensor(lin.Input[1]); t != nil && slices.Contains(t.GetDims(), E) {
				return op
			}
			return ""
		default:
			return ""
		}
	}
	return ""
}

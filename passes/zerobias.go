package passes

import (
	"github.com/mokopt/mokopt/graph"
	"github.com/mokopt/mokopt/moe"
)

// zeroBiases gives a fused node with expert biases a zero initializer for
// each expert bias its block lacks (an up bias without a down bias, say):
// the function body reads every expert bias of a variant with biases, and
// zero adds nothing, so the node computes what the block did.
func zeroBiases(g *graph.Graph, b *Block, in []string) {
	s := &b.Spec
	if !s.ExpertBias {
		return
	}
	E, I, H := int64(s.StoredExperts()), int64(s.Inter), int64(s.Hidden)
	for _, r := range []struct {
		pos  int
		role string
		n    int64
		need bool
	}{{moe.InGateBias, "gate_bias", I, s.Gated()}, {moe.InUpBias, "up_bias", I, true}, {moe.InDownBias, "down_bias", H, true}} {
		if !r.need || in[r.pos] != "" {
			continue
		}
		name := g.UniqueName(b.Name + "/" + r.role + "_zero")
		g.AddInitializer(moe.Float32TensorOwned(name, []int64{E, r.n}, make([]float32, E*r.n)))
		in[r.pos] = name
	}
}

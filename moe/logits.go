package moe

import (
	"fmt"

	"github.com/mokopt/mokopt/graph"
)

// Output positions of the fused node. The second output is optional: a
// node without it has one output (or "" in its place).
const (
	OutY = iota
	OutRouterLogits
	NumOutputs
)

// OutputNames are the formal output names of the fused node's function.
var OutputNames = [NumOutputs]string{"output", "router_logits"}

// RouterLogits computes the optional second output of the fused node for
// x, T tokens of H values: the router linear's output before any
// activation, z = x · router_weightᵀ (+ router_bias), float32 [T, E]. It
// is what a graph's other consumers of the router logits or scores (a
// model output, an auxiliary load-balancing loss) read once the block is
// fused; their own ops (a softmax, a top-k) stay outside the node.
func RouterLogits(s *Spec, w *Weights, x []float32, T int) ([]float32, error) {
	E, H := s.NumExperts, s.Hidden
	if len(x) != T*H {
		return nil, fmt.Errorf("MoE input has %d values, want %d tokens x %d", len(x), T, H)
	}
	if len(w.RouterW) != E*H || w.RouterB != nil && len(w.RouterB) != E {
		return nil, fmt.Errorf("router weights hold %d values and the bias %d, want %d x %d and %d", len(w.RouterW), len(w.RouterB), E, H, E)
	}
	z := make([]float32, T*E)
	for t := 0; t < T; t++ {
		xt := x[t*H : (t+1)*H]
		for e := 0; e < E; e++ {
			z[t*E+e] = Dot(xt, w.RouterW[e*H:(e+1)*H])
			if w.RouterB != nil {
				z[t*E+e] += w.RouterB[e]
			}
		}
	}
	return z, nil
}

// logitsOutput appends to the body the node that names the router Gemm's
// output logits ([T, E], float32) as the function's router_logits output,
// and returns that name.
func logitsOutput(b *Builder, logits string) string {
	b.Nodes = append(b.Nodes, graph.NewNode("Identity", "", "", []string{logits}, []string{OutputNames[OutRouterLogits]}))
	return OutputNames[OutRouterLogits]
}

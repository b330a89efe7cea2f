package passes

import (
	"fmt"
	"math"
)

// wideSoftmax says, when the TopK ranks E of the router's W > E outputs
// and the weights a value of the routing subgraph holds are the chosen
// entries of a softmax over all W outputs, not renormalised over the
// chosen ones, what that computes that the contract cannot express; ""
// otherwise. (Renormalised, the columns that are not experts cancel and
// routerslice.go folds them away.)
func (run *routingRun) wideSoftmax() string {
	if run.E >= run.W || len(run.idx) != run.T*run.k {
		return ""
	}
	want := make([]float32, run.T*run.k)
	for t := range run.T {
		row := run.logits[t*run.W : (t+1)*run.W]
		m := math.Inf(-1)
		for _, v := range row {
			m = math.Max(m, float64(v))
		}
		sum := 0.0
		for _, v := range row {
			sum += math.Exp(float64(v) - m)
		}
		for j := range run.k {
			i := run.idx[t*run.k+j]
			if i < 0 || int(i) >= run.E {
				return ""
			}
			want[t*run.k+j] = float32(math.Exp(float64(row[i])-m) / sum)
		}
	}
	for _, v := range run.order {
		x := run.vals[v]
		if x == nil || len(x.F32) != len(want) || !run.dep[v] {
			continue
		}
		if closeTo(x.F32, want, 1e-4, 1e-6) {
			return fmt.Sprintf("the router's softmax normalises over %d columns that are not experts and the weights are not renormalised; the fused op's router cannot express that (its linear layer has %d outputs, the TopK ranks %d)", run.W-run.E, run.W, run.E)
		}
	}
	return ""
}

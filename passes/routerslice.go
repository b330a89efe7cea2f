package passes

import (
	"slices"

	pb "github.com/mokopt/mokopt/graph/onnxpb"
	"github.com/mokopt/mokopt/moe"
)

// routerOverSlice reads a router whose TopK ranks a constant selection of
// the columns of scores made from all the router's outputs (outputs that
// are no expert's activated together with the experts'): when the routing
// equals a candidate's on the selected logits alone — always for a
// sigmoid, which acts per column, and for a softmax whose selected weights
// are renormalised — the selection is folded into the router weight, and
// the router is that candidate. It returns false when there is no such
// selection or no candidate matches (the caller then explains why).
func (c *ctx) routerOverSlice(tk *pb.NodeProto, ri *routerInfo, s *moe.Spec, run *routingRun) (bool, error) {
	var cols []int
	for _, n := range run.nodes {
		if n.GetOpType() != "Slice" || run.dep[n.Output[0]] {
			continue
		}
		in, out := run.vals[n.Input[0]], run.vals[n.Output[0]]
		if in == nil || out == nil || len(in.Shape) == 0 || in.Shape[len(in.Shape)-1] != run.W || out.Shape[len(out.Shape)-1] != run.E {
			continue
		}
		f := &routerFold{width: run.W, logits: n.Input[0]}
		if !c.foldSlice(n, f) || len(f.cols) != run.E || cols != nil && !slices.Equal(cols, f.cols) {
			return false, nil
		}
		cols = f.cols
	}
	if cols == nil {
		return false, nil
	}
	sub := *run
	sub.W = run.E
	sub.logits = make([]float32, run.T*run.E)
	for t := 0; t < run.T; t++ {
		for j, e := range cols {
			sub.logits[t*run.E+j] = run.logits[t*run.W+e]
		}
	}
	cands, ref := c.routerCandidates(tk, ri, &sub, nil)
	pick, err := c.pickWeights(&sub, cands, ref)
	if err != nil || pick == nil {
		return false, nil
	}
	f := &routerFold{scale: 1, cols: cols, width: run.W, logits: ri.logits}
	if ri.bias != nil {
		b := c.floatsOf(ri.bias, mustBytes(c, ri.bias))
		if len(b) != run.W {
			return false, nil
		}
		for _, e := range cols {
			f.bias = append(f.bias, b[e])
		}
	}
	if err := c.applyFold(ri, f); err != nil {
		return true, err
	}
	cd := cands[pick.cand]
	cd.spec.RoutedScalingFactor = pick.scale
	c.adoptRouter(ri, s, cd, &sub, nil)
	s.NumExperts = run.E
	return true, nil
}

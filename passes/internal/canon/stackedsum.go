package canon

import (
	"slices"

	"github.com/mokopt/mokopt/graph"
	pb "github.com/mokopt/mokopt/graph/onnxpb"
)

// StackedSum turns ReduceSum(Concat(x_1, …, x_n, axis a), axes [a]) into
// Sum(x_1, …, x_n) when every x_i is one element wide on a: a sum written
// by stacking its terms on a new axis and reducing it (torch's
// torch.stack(terms).sum(0), a combine that stacks the experts' outputs).
// With keepdims 0 and every x_i an Unsqueeze(y_i, [a]) it becomes
// Sum(y_1, …, y_n); with keepdims 1, Sum(x_1, …, x_n). Concat's inputs
// agree on every other axis, so the Sum broadcasts nothing. SumToAdd then
// makes the Adds that block matching reads.
var StackedSum = Rule{
	Name: "stacked-sum",
	Ops:  []string{"ReduceSum"},
	Apply: func(w *Work, n *pb.NodeProto) (bool, error) {
		terms, ok := stackedTerms(w, n)
		if !ok {
			return false, nil
		}
		w.Replace(n, w.Node("Sum", "", n.GetName()+"/Sum", terms, n.Output))
		return true, nil
	},
}

// stackedTerms returns the terms the ReduceSum n adds up when it reduces a
// Concat of one-wide pieces over the Concat's axis (see StackedSum).
func stackedTerms(w *Work, n *pb.NodeProto) ([]string, bool) {
	if n.GetDomain() != "" || len(n.Input) == 0 || len(n.Output) != 1 || graph.AttrInt(n, "noop_with_empty_axes", 0) != 0 {
		return nil, false
	}
	c := w.Producer(n.Input[0])
	if c == nil || c.GetOpType() != "Concat" || c.GetDomain() != "" || len(c.Input) < 2 || slices.Contains(c.Input, "") {
		return nil, false
	}
	axis := graph.AttrInt(c, "axis", 0)
	if !sameAxis(w, c.Output[0], reduceAxes(w, n), axis) {
		return nil, false
	}
	keep := graph.AttrInt(n, "keepdims", 1) != 0
	pos := axis
	if r, ok := w.Rank(c.Output[0]); ok && axis < 0 {
		pos += int64(r)
	}
	if keep && pos < 0 {
		return nil, false
	}
	terms := make([]string, 0, len(c.Input))
	for _, x := range c.Input {
		if keep {
			if d, ok := w.dim(x, pos); !ok || d != 1 {
				return nil, false
			}
			terms = append(terms, x)
			continue
		}
		u := w.Producer(x)
		if u == nil || u.GetOpType() != "Unsqueeze" || u.GetDomain() != "" {
			return nil, false
		}
		ax, ok := w.squeezeAxes(u)
		if !ok || !sameAxis(w, x, ax, axis) {
			return nil, false
		}
		terms = append(terms, u.Input[0])
	}
	return terms, true
}

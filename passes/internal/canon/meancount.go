package canon

import (
	"github.com/mokopt/mokopt/graph"
	pb "github.com/mokopt/mokopt/graph/onnxpb"
)

// MeanTimesCount turns ReduceMean(x, axes) · n, where n is the number of
// elements each mean is over (the product of x's static dims on axes),
// into ReduceSum(x, axes): a sum written as the mean scaled back, as a
// combine of the top-k experts' outputs may be. The ReduceMean must be read
// by the Mul alone and reduce explicit axes; the Mul keeps its name and
// output. Up to float rounding the value is the same.
var MeanTimesCount = Rule{
	Name: "mean-times-count",
	Ops:  []string{"Mul"},
	Apply: func(w *Work, n *pb.NodeProto) (bool, error) {
		if n.GetDomain() != "" || len(n.Input) != 2 || len(n.Output) != 1 {
			return false, nil
		}
		for side := range 2 {
			rm := w.Producer(n.Input[side])
			c, ok := w.ConstScalar(n.Input[1-side])
			if rm == nil || !ok || rm.GetOpType() != "ReduceMean" || rm.GetDomain() != "" || len(w.Consumers(rm.Output[0])) != 1 || w.G.IsOutput(rm.Output[0]) {
				continue
			}
			axes := reduceAxes(w, rm)
			rank, ok := w.Rank(rm.Input[0])
			if len(axes) == 0 || !ok {
				continue
			}
			axes = normAxes(axes, rank)
			count := int64(1)
			for _, a := range axes {
				d, ok := w.dim(rm.Input[0], a)
				if !ok {
					return false, nil
				}
				count *= d
			}
			if c != float64(count) {
				continue
			}
			attrs := []*pb.AttributeProto{graph.IntAttr("keepdims", graph.AttrInt(rm, "keepdims", 1))}
			in := []string{rm.Input[0]}
			if w.Opset() >= 13 {
				in = append(in, w.Int64s(n.GetName()+"/axes", false, axes...))
			} else {
				attrs = append(attrs, graph.IntsAttr("axes", axes...))
			}
			w.Replace(n, w.InPlaceOf(n, "ReduceSum", in, attrs...))
			return true, nil
		}
		return false, nil
	},
}

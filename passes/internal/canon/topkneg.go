package canon

import (
	"github.com/mokopt/mokopt/graph"
	pb "github.com/mokopt/mokopt/graph/onnxpb"
	"google.golang.org/protobuf/proto"
)

// TopKOfNeg turns TopK(Neg(x), largest=0) — the k smallest of the negated
// scores — into TopK(x, largest=1) with its values negated back, and, for
// integer x, TopK(Neg(x), largest=1) into TopK(x, largest=0): the same indices (ONNX
// TopK puts the lower index first among equal values either way) and the
// same values, exactly. Routers written as a top-k on negated scores then
// read as the top-k of the scores, and an ascending sort of expert ids
// written as a descending sort of their negation reads as the sort.
var TopKOfNeg = Rule{
	Name: "topk-of-neg",
	Ops:  []string{"TopK"},
	Apply: func(w *Work, n *pb.NodeProto) (bool, error) {
		largest := graph.AttrInt(n, "largest", 1)
		if largest != 0 && largest != 1 || len(n.Input) < 2 || len(n.Output) != 2 {
			return false, nil
		}
		p := w.Producer(n.Input[0])
		if p == nil || p.GetOpType() != "Neg" || p.GetDomain() != "" || len(p.Input) != 1 {
			return false, nil
		}
		if t := w.ElemType(p.Input[0]); largest == 1 && t != int32(pb.TensorProto_INT64) && t != int32(pb.TensorProto_INT32) {
			return false, nil // the largest of negated scores: left to the router's evaluation
		}
		var attrs []*pb.AttributeProto
		for _, a := range n.GetAttribute() {
			if a.GetName() != "largest" {
				attrs = append(attrs, proto.Clone(a).(*pb.AttributeProto))
			}
		}
		attrs = append(attrs, graph.IntAttr("largest", 1-largest))
		vals := n.Output[0]
		if vals == "" {
			w.Replace(n, w.Node("TopK", "", n.GetName()+"/largest", []string{p.Input[0], n.Input[1]}, []string{"", n.Output[1]}, attrs...))
			return true, nil
		}
		tmp := w.Temp(n, "largest_values")
		w.Replace(n,
			w.Node("TopK", "", n.GetName()+"/largest", []string{p.Input[0], n.Input[1]}, []string{tmp, n.Output[1]}, attrs...),
			w.Node("Neg", "", n.GetName()+"/neg_back", []string{tmp}, []string{vals}))
		return true, nil
	},
}

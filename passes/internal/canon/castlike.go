package canon

import (
	"github.com/mokopt/mokopt/graph"
	pb "github.com/mokopt/mokopt/graph/onnxpb"
)

// CastLikeToCast turns CastLike(x, like) into Cast(x, to=T) where T is
// like's element type, when it is known (saturate carries over).
var CastLikeToCast = Rule{
	Name: "castlike-to-cast",
	Ops:  []string{"CastLike"},
	Apply: func(w *Work, n *pb.NodeProto) (bool, error) {
		if len(n.Input) != 2 || len(n.Output) != 1 {
			return false, nil
		}
		t := w.ElemType(n.Input[1])
		if t == 0 {
			return false, nil
		}
		attrs := []*pb.AttributeProto{graph.IntAttr("to", int64(t))}
		if a := graph.Attr(n, "saturate"); a != nil {
			attrs = append(attrs, a)
		}
		w.Replace(n, w.Node("Cast", "", n.GetName()+"/Cast", n.Input[:1], n.Output, attrs...))
		return true, nil
	},
}

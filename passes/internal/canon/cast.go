package canon

import (
	"github.com/mokopt/mokopt/graph"
	pb "github.com/mokopt/mokopt/graph/onnxpb"
)

// DropNoOpCast removes a Cast to the element type its input already has.
var DropNoOpCast = Rule{
	Name: "drop-noop-cast",
	Ops:  []string{"Cast"},
	Apply: func(w *Work, n *pb.NodeProto) (bool, error) {
		if len(n.Input) != 1 {
			return false, nil
		}
		to := graph.AttrInt(n, "to", 0)
		if to == 0 || int64(w.ElemType(n.Input[0])) != to {
			return false, nil
		}
		return w.Drop(n, n.Input[0]), nil
	},
}

package canon

import (
	"github.com/mokopt/mokopt/graph"
	pb "github.com/mokopt/mokopt/graph/onnxpb"
)

// DropIdentityTranspose removes a Transpose whose perm leaves every axis in
// place (or, without perm, of a value of rank at most 1).
var DropIdentityTranspose = Rule{
	Name: "drop-identity-transpose",
	Ops:  []string{"Transpose"},
	Apply: func(w *Work, n *pb.NodeProto) (bool, error) {
		if len(n.Input) != 1 {
			return false, nil
		}
		perm := graph.AttrInts(n, "perm")
		if graph.Attr(n, "perm") == nil {
			r, ok := w.Rank(n.Input[0])
			if !ok || r > 1 {
				return false, nil
			}
		}
		for i, p := range perm {
			if p != int64(i) {
				return false, nil
			}
		}
		return w.Drop(n, n.Input[0]), nil
	},
}

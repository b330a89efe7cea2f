package canon

import (
	pb "github.com/mokopt/mokopt/graph/onnxpb"
)

// WhereOfNot writes Where(Not(c), a, b) as Where(c, b, a): the branches
// swapped instead of the condition negated. DropDead removes the Not when
// nothing else reads it.
var WhereOfNot = Rule{
	Name: "where-of-not",
	Ops:  []string{"Where"},
	Apply: func(w *Work, n *pb.NodeProto) (bool, error) {
		if n.GetDomain() != "" || len(n.Input) != 3 || len(n.Output) != 1 {
			return false, nil
		}
		not := w.Producer(n.Input[0])
		if not == nil || not.GetOpType() != "Not" || not.GetDomain() != "" || len(not.Input) != 1 {
			return false, nil
		}
		w.Replace(n, w.InPlaceOf(n, "Where", []string{not.Input[0], n.Input[2], n.Input[1]}))
		return true, nil
	},
}

package canon

import pb "github.com/mokopt/mokopt/graph/onnxpb"

// NegOfNeg drops a Neg of a Neg: -(-x) is x bit for bit, for floats (a sign
// flip twice) and for two's-complement integers alike. Values written on
// negated scores and negated back (a top-k taken as the smallest of the
// negation) then reach their consumers in as few hops as the plain
// spelling, which the router's bounded evaluation relies on.
var NegOfNeg = Rule{
	Name: "neg-of-neg",
	Ops:  []string{"Neg"},
	Apply: func(w *Work, n *pb.NodeProto) (bool, error) {
		if len(n.Input) != 1 {
			return false, nil
		}
		p := w.Producer(n.Input[0])
		if p == nil || p.GetOpType() != "Neg" || p.GetDomain() != "" || len(p.Input) != 1 {
			return false, nil
		}
		return w.Drop(n, p.Input[0]), nil
	},
}

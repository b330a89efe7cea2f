package canon

import pb "github.com/mokopt/mokopt/graph/onnxpb"

// MulReciprocal turns a · Reciprocal(b) (either operand order) into a / b:
// the same quotient up to one rounding. A normalisation written as a
// product with the reciprocal of its sum then reads as the division that
// router evaluation reaches in as many nodes as the plain spelling.
var MulReciprocal = Rule{
	Name: "mul-reciprocal",
	Ops:  []string{"Mul"},
	Apply: func(w *Work, n *pb.NodeProto) (bool, error) {
		if n.GetDomain() != "" || len(n.Input) != 2 || len(n.Output) != 1 {
			return false, nil
		}
		for i := range 2 {
			r := w.Producer(n.Input[i])
			if r == nil || r.GetOpType() != "Reciprocal" || r.GetDomain() != "" || len(r.Input) != 1 {
				continue
			}
			w.Replace(n, w.Node("Div", "", n.GetName(), []string{n.Input[1-i], r.Input[0]}, []string{n.Output[0]}))
			return true, nil
		}
		return false, nil
	},
}

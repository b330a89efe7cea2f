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

// PowOfConstant turns Pow(x, e) of a constant exponent that names a
// simpler op into that op: -1 → Reciprocal(x), 0.5 → Sqrt(x), 1 → x; the
// same values up to one rounding. A normalisation written with a power of
// its sum then reads as the ops the other rules and the matchers know
// (a · Pow(b, -1) becomes a · Reciprocal(b), then a / b). Other exponents
// stay (a square is left to the evaluations that decide activations and
// routers, and a refusal then names the Pow the model holds).
var PowOfConstant = Rule{
	Name: "pow-of-constant",
	Ops:  []string{"Pow"},
	Apply: func(w *Work, n *pb.NodeProto) (bool, error) {
		if len(n.Input) != 2 || len(n.Output) != 1 {
			return false, nil
		}
		c, ok := w.Const(n.Input[1])
		if !ok || c.Len() != 1 || !isFloatType(w.ElemType(n.Input[0])) {
			return false, nil
		}
		if r, ok := w.Rank(n.Input[0]); !ok || len(c.Shape) > r {
			return false, nil // a constant of higher rank broadcasts x up
		}
		x := n.Input[0]
		switch e := c.Float64At(0); e {
		case -1:
			w.Replace(n, w.Node("Reciprocal", "", n.GetName(), []string{x}, n.Output))
		case 0.5:
			w.Replace(n, w.Node("Sqrt", "", n.GetName(), []string{x}, n.Output))
		case 1:
			w.Replace(n, w.Node("Identity", "", n.GetName(), []string{x}, n.Output))
		default:
			return false, nil
		}
		return true, nil
	},
}

// isFloatType reports whether element type dt is a floating-point type.
func isFloatType(dt int32) bool {
	switch pb.TensorProto_DataType(dt) {
	case pb.TensorProto_FLOAT, pb.TensorProto_FLOAT16, pb.TensorProto_BFLOAT16, pb.TensorProto_DOUBLE:
		return true
	}
	return false
}

package canon

import pb "github.com/mokopt/mokopt/graph/onnxpb"

// DropNeutral removes an arithmetic op with its neutral element: x·1, 1·x,
// x/1, x+0, 0+x and x−0 become x (its consumers read x). The constant must
// hold one element and broadcast to no new axis (a scalar, or of a rank no
// higher than x's known rank), so the result has x's shape and values.
var DropNeutral = Rule{
	Name: "drop-neutral",
	Ops:  []string{"Mul", "Div", "Add", "Sub"},
	Apply: func(w *Work, n *pb.NodeProto) (bool, error) {
		if len(n.Input) != 2 || len(n.Output) != 1 {
			return false, nil
		}
		neutral := 0.0
		if op := n.GetOpType(); op == "Mul" || op == "Div" {
			neutral = 1
		}
		sides := []int{1}
		if op := n.GetOpType(); op == "Mul" || op == "Add" {
			sides = []int{1, 0} // commutative: the constant on either side
		}
		for _, ci := range sides {
			x, c := n.Input[1-ci], n.Input[ci]
			if t, ok := w.Const(c); !ok || t.Len() != 1 || t.Float64At(0) != neutral || !w.noNewAxes(x, len(t.Shape)) {
				continue
			}
			if _, isConst := w.Const(x); isConst {
				return false, nil // folded instead
			}
			return w.Drop(n, x), nil
		}
		return false, nil
	},
}

// noNewAxes reports whether broadcasting a value of rank r against x adds
// no axis to x.
func (w *Work) noNewAxes(x string, r int) bool {
	if r == 0 {
		return true
	}
	xr, ok := w.Rank(x)
	return ok && r <= xr
}

// NegationAsNeg turns x·(−1), (−1)·x and x/(−1) into Neg(x), keeping the
// node's name and output: a negation written as arithmetic reads as the
// Neg that top-k-of-negated-scores and Neg-of-Neg recognise. The constant
// is as DropNeutral's: one element that adds no axis. Negation is exact,
// so the values are the same bit for bit.
var NegationAsNeg = Rule{
	Name: "negation-as-neg",
	Ops:  []string{"Mul", "Div"},
	Apply: func(w *Work, n *pb.NodeProto) (bool, error) {
		if len(n.Input) != 2 || len(n.Output) != 1 {
			return false, nil
		}
		sides := []int{1}
		if n.GetOpType() == "Mul" {
			sides = []int{1, 0}
		}
		for _, ci := range sides {
			x, c := n.Input[1-ci], n.Input[ci]
			if t, ok := w.Const(c); !ok || t.Len() != 1 || t.Float64At(0) != -1 || !w.noNewAxes(x, len(t.Shape)) {
				continue
			}
			if _, isConst := w.Const(x); isConst {
				return false, nil // folded instead
			}
			w.Replace(n, w.InPlaceOf(n, "Neg", []string{x}))
			return true, nil
		}
		return false, nil
	},
}

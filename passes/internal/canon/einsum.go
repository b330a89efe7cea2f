package canon

import (
	"strings"

	"github.com/mokopt/mokopt/graph"
	pb "github.com/mokopt/mokopt/graph/onnxpb"
)

// EinsumMatMul turns a two-operand Einsum that is a matrix product into
// MatMul: "...i,ij->...j" (a linear layer, any batch prefix, with or
// without an ellipsis), "bti,bij->btj" (a batched product over equal
// leading axes), and the same with the second operand's last two axes
// swapped ("...i,ji->...j", a weight stored [out, in]), which becomes a
// MatMul of its Transpose. Linear layers written as Einsum then read as the
// MatMuls that routers, experts and shared experts are matched by. Any
// other equation (a diagonal, a sum over an axis, an operand order with
// the weight first) is left as it is.
var EinsumMatMul = Rule{
	Name: "einsum-matmul",
	Ops:  []string{"Einsum"},
	Apply: func(w *Work, n *pb.NodeProto) (bool, error) {
		if n.GetDomain() != "" || len(n.Input) != 2 || len(n.Output) != 1 {
			return false, nil
		}
		swapped, ok := einsumAsMatMul(graph.AttrString(n, "equation", ""))
		if !ok {
			return false, nil
		}
		b := n.Input[1]
		if !swapped {
			w.Replace(n, w.Node("MatMul", "", n.GetName(), []string{n.Input[0], b}, []string{n.Output[0]}))
			return true, nil
		}
		r, ok := w.Rank(b)
		if !ok || r < 2 {
			return false, nil
		}
		t := w.Temp(n, "weight_t")
		w.Replace(n,
			w.Node("Transpose", "", n.GetName()+"/transpose", []string{b}, []string{t}, graph.IntsAttr("perm", swapLastTwo(r)...)),
			w.Node("MatMul", "", n.GetName(), []string{n.Input[0], t}, []string{n.Output[0]}))
		return true, nil
	},
}

// einsumAsMatMul reports whether eq is a matrix product of its two operands
// (see EinsumMatMul) and whether the second's last two axes are swapped.
func einsumAsMatMul(eq string) (swapped, ok bool) {
	eq = strings.ReplaceAll(eq, " ", "")
	lhs, out, found := strings.Cut(eq, "->")
	a, b, two := strings.Cut(lhs, ",")
	if !found || !two || strings.Contains(b, ",") {
		return false, false
	}
	a, ea := strings.CutPrefix(a, "...")
	out, eo := strings.CutPrefix(out, "...")
	if ea != eo || strings.Contains(a+b+out, ".") || !distinct(a) || !distinct(b) || !distinct(out) ||
		len(a) < 1 || len(b) < 2 || len(out) != len(a) {
		return false, false
	}
	c := a[len(a)-1]      // contracted
	j := out[len(out)-1]  // the second operand's free axis
	batch := b[:len(b)-2] // the second operand's leading axes
	last := b[len(b)-2:]  // its matrix axes
	if out[:len(out)-1] != a[:len(a)-1] || strings.IndexByte(out, c) >= 0 || strings.IndexByte(a, j) >= 0 {
		return false, false
	}
	if len(batch) > 0 && (ea || len(a) != len(b) || a[:len(batch)] != batch) {
		return false, false
	}
	switch last {
	case string([]byte{c, j}):
		return false, true
	case string([]byte{j, c}):
		return true, true
	}
	return false, false
}

// distinct reports whether no letter repeats in s.
func distinct(s string) bool {
	for i := range s {
		if strings.IndexByte(s[i+1:], s[i]) >= 0 {
			return false
		}
	}
	return true
}

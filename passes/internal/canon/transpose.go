package canon

import (
	"slices"

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

// TransposeOfMatMul turns (A·B)ᵀ, a Transpose swapping the last two axes of
// a MatMul's product, into Bᵀ·Aᵀ when A or B is itself such a Transpose,
// which then cancels: (Wᵀ·xᵀ)ᵀ is x·W again, exactly (the same products and
// sums). A linear layer written on transposed operands then reads as
// x·W.
var TransposeOfMatMul = Rule{
	Name: "transpose-of-matmul",
	Ops:  []string{"Transpose"},
	Apply: func(w *Work, n *pb.NodeProto) (bool, error) {
		if n.GetDomain() != "" || len(n.Input) != 1 || len(n.Output) != 1 {
			return false, nil
		}
		mm := w.Producer(n.Input[0])
		if mm == nil || mm.GetOpType() != "MatMul" || mm.GetDomain() != "" || len(mm.Input) != 2 {
			return false, nil
		}
		r, ok := w.Rank(n.Input[0])
		if !ok || r < 2 || !slices.Equal(transposePerm(n, r), swapLastTwo(r)) {
			return false, nil
		}
		var nodes []*pb.NodeProto
		ops := [2]string{}
		unwrapped := false
		for i, v := range []string{mm.Input[1], mm.Input[0]} { // Bᵀ, then Aᵀ
			ri, ok := w.Rank(v)
			if !ok || ri < 2 {
				return false, nil
			}
			if t := w.Producer(v); t != nil && t.GetOpType() == "Transpose" && t.GetDomain() == "" && len(t.Input) == 1 &&
				slices.Equal(transposePerm(t, ri), swapLastTwo(ri)) {
				ops[i], unwrapped = t.Input[0], true
				continue
			}
			ops[i] = w.Temp(n, "operand_t")
			nodes = append(nodes, w.Node("Transpose", "", n.GetName()+"/operand", []string{v}, []string{ops[i]}, graph.IntsAttr("perm", swapLastTwo(ri)...)))
		}
		if !unwrapped {
			return false, nil
		}
		nodes = append(nodes, w.Node("MatMul", "", n.GetName()+"/matmul", ops[:], []string{n.Output[0]}))
		w.Replace(n, nodes...)
		return true, nil
	},
}

// transposePerm is the perm of Transpose node n of a rank-r input: its
// attribute, or the axes reversed, ONNX's default, without one.
func transposePerm(n *pb.NodeProto, r int) []int64 {
	if graph.Attr(n, "perm") != nil {
		return graph.AttrInts(n, "perm")
	}
	perm := make([]int64, r)
	for i := range perm {
		perm[i] = int64(r - 1 - i)
	}
	return perm
}

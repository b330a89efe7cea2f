package canon

import (
	"fmt"

	"github.com/mokopt/mokopt/graph"
	pb "github.com/mokopt/mokopt/graph/onnxpb"
)

// FusedMatMul decomposes com.microsoft::FusedMatMul(A, B; alpha, transA,
// transB), alpha * (A' @ B') with A', B' transposed on their last two axes
// when asked, into Transpose, MatMul and a Mul by alpha (left out when alpha
// is 1). A transpose needs its operand's rank. transBatchA/transBatchB are
// left fused, with a note. com.microsoft::TransposeMatMul, the op's older
// name with the same attributes, is read the same way.
var FusedMatMul = Rule{
	Name: "contrib-fusedmatmul",
	Ops:  []string{msDomain + "::FusedMatMul", msDomain + "::TransposeMatMul"},
	Apply: func(w *Work, n *pb.NodeProto) (bool, error) {
		if len(n.Input) != 2 || len(n.Output) != 1 {
			return false, nil
		}
		if graph.AttrInt(n, "transBatchA", 0) != 0 || graph.AttrInt(n, "transBatchB", 0) != 0 {
			w.note(fmt.Sprintf("com.microsoft::%s %s kept: batch transposes are not decomposed", n.GetOpType(), graph.NodeLabel(n)))
			return false, nil
		}
		var nodes []*pb.NodeProto
		ins := make([]string, 2)
		for i, attr := range []string{"transA", "transB"} {
			ins[i] = n.Input[i]
			if graph.AttrInt(n, attr, 0) == 0 {
				continue
			}
			r, ok := w.Rank(n.Input[i])
			if !ok || r < 2 {
				return false, nil
			}
			ins[i] = w.Temp(n, attr)
			nodes = append(nodes, w.Node("Transpose", "", n.GetName()+"/Transpose", []string{n.Input[i]}, []string{ins[i]}, graph.IntsAttr("perm", swapLastTwo(r)...)))
		}
		alpha := graph.AttrFloat(n, "alpha", 1)
		if alpha == 1 {
			nodes = append(nodes, w.Node("MatMul", "", n.GetName()+"/MatMul", ins, n.Output))
			w.Replace(n, nodes...)
			return true, nil
		}
		t := w.Temp(n, "matmul")
		scale, ok := w.Scale(n, n.Input[0], t, n.Output[0], float64(alpha), "alpha")
		if !ok {
			return false, nil
		}
		nodes = append(nodes, w.Node("MatMul", "", n.GetName()+"/MatMul", ins, []string{t}), scale)
		w.Replace(n, nodes...)
		return true, nil
	},
}

// swapLastTwo is the Transpose permutation of rank r that swaps the last
// two axes (a matrix transpose of each matrix of a batch).
func swapLastTwo(r int) []int64 {
	perm := make([]int64, r)
	for j := range perm {
		perm[j] = int64(j)
	}
	perm[r-2], perm[r-1] = perm[r-1], perm[r-2]
	return perm
}

package canon

import (
	"github.com/mokopt/mokopt/graph"
	pb "github.com/mokopt/mokopt/graph/onnxpb"
)

// GemmComputedBias splits a Gemm whose C input is computed (not a
// constant) into a Gemm without C and an Add of C (times beta when beta is
// not 1). ONNX Runtime's MatMulAddFusion writes the sum of a linear and
// another branch this way (a shared expert's down projection plus the
// routed experts' output); as an Add, the sum is a combine the matcher
// sees. Gemm broadcasts C to its [M, N] output one way, Add both ways: the
// same result wherever the Gemm was valid. A constant C (a bias) stays.
var GemmComputedBias = Rule{
	Name: "gemm-computed-bias",
	Ops:  []string{"Gemm"},
	Apply: func(w *Work, n *pb.NodeProto) (bool, error) {
		if len(n.Input) < 3 || n.Input[2] == "" || len(n.Output) != 1 {
			return false, nil
		}
		c := n.Input[2]
		if _, ok := w.Const(c); ok {
			return false, nil
		}
		attrs := attrsNamed(n, "alpha", "transA", "transB")
		var nodes []*pb.NodeProto
		if beta := graph.AttrFloat(n, "beta", 1); beta != 1 {
			scaled := w.Temp(n, "scaled_c")
			scale, ok := w.Scale(n, c, c, scaled, float64(beta), "beta")
			if !ok {
				return false, nil
			}
			nodes = append(nodes, scale)
			c = scaled
		}
		g := w.Temp(n, "gemm")
		nodes = append(nodes, w.Node("Gemm", "", n.GetName()+"/Gemm", n.Input[:2], []string{g}, attrs...))
		nodes = append(nodes, w.Node("Add", "", n.GetName()+"/add_c", []string{g, c}, n.Output))
		w.Replace(n, nodes...)
		return true, nil
	},
}

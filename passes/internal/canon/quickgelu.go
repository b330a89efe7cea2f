package canon

import (
	"github.com/mokopt/mokopt/graph"
	pb "github.com/mokopt/mokopt/graph/onnxpb"
)

// msDomain is ONNX Runtime's contrib op domain.
const msDomain = "com.microsoft"

// QuickGelu decomposes com.microsoft::QuickGelu(X; alpha, default 1.702),
// which computes X * Sigmoid(alpha * X), into Sigmoid and Mul (and a Mul by
// alpha unless alpha is 1: ONNX Runtime writes SiLU this way).
var QuickGelu = Rule{
	Name: "contrib-quickgelu",
	Ops:  []string{msDomain + "::QuickGelu"},
	Apply: func(w *Work, n *pb.NodeProto) (bool, error) {
		if len(n.Input) != 1 || len(n.Output) != 1 {
			return false, nil
		}
		x := n.Input[0]
		alpha := graph.AttrFloat(n, "alpha", 1.702)
		in := x
		var nodes []*pb.NodeProto
		if alpha != 1 {
			in = w.Temp(n, "scaled")
			scale, ok := w.Scale(n, x, x, in, float64(alpha), "alpha")
			if !ok {
				return false, nil
			}
			nodes = append(nodes, scale)
		}
		sig := w.Temp(n, "sigmoid")
		nodes = append(nodes,
			w.Node("Sigmoid", "", n.GetName()+"/Sigmoid", []string{in}, []string{sig}),
			w.Node("Mul", "", n.GetName()+"/Mul", []string{x, sig}, n.Output))
		w.Replace(n, nodes...)
		return true, nil
	},
}

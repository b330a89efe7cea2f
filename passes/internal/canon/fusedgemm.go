package canon

import (
	"fmt"

	"github.com/mokopt/mokopt/graph"
	pb "github.com/mokopt/mokopt/graph/onnxpb"
)

// FusedGemm decomposes com.microsoft::FusedGemm, Gemm followed by the
// activation its attributes name, into Gemm (alpha, beta, transA, transB
// kept) and the standard activation op: Relu, Sigmoid, Tanh, LeakyRelu
// (activation_alpha), HardSigmoid (activation_alpha, activation_beta) or
// Elu (activation_alpha); no activation leaves a plain Gemm. Other
// activations are left fused, with a note.
var FusedGemm = Rule{
	Name: "contrib-fusedgemm",
	Ops:  []string{msDomain + "::FusedGemm"},
	Apply: func(w *Work, n *pb.NodeProto) (bool, error) {
		if len(n.Input) < 2 || len(n.Output) != 1 {
			return false, nil
		}
		act := graph.AttrString(n, "activation", "")
		var actAttrs []*pb.AttributeProto
		aa := graph.Attr(n, "activation_alpha")
		ab := graph.Attr(n, "activation_beta")
		switch act {
		case "", "Relu", "Sigmoid", "Tanh":
		case "LeakyRelu", "Elu":
			if aa != nil {
				actAttrs = append(actAttrs, graph.FloatAttr("alpha", aa.GetF()))
			}
		case "HardSigmoid":
			if aa != nil {
				actAttrs = append(actAttrs, graph.FloatAttr("alpha", aa.GetF()))
			}
			if ab != nil {
				actAttrs = append(actAttrs, graph.FloatAttr("beta", ab.GetF()))
			}
		default:
			w.note(fmt.Sprintf("com.microsoft::FusedGemm %s kept: activation %q has no decomposition here", graph.NodeLabel(n), act))
			return false, nil
		}
		attrs := attrsNamed(n, "alpha", "beta", "transA", "transB")
		if act == "" {
			w.Replace(n, w.Node("Gemm", "", n.GetName()+"/Gemm", n.Input, n.Output, attrs...))
			return true, nil
		}
		t := w.Temp(n, "gemm")
		w.Replace(n,
			w.Node("Gemm", "", n.GetName()+"/Gemm", n.Input, []string{t}, attrs...),
			w.Node(act, "", n.GetName()+"/"+act, []string{t}, n.Output, actAttrs...))
		return true, nil
	},
}

package canon

import pb "github.com/mokopt/mokopt/graph/onnxpb"

// DropIdentity removes an Identity: its consumers read its input. A graph
// output, or a value a subgraph reads, keeps its Identity.
var DropIdentity = Rule{
	Name: "drop-identity",
	Ops:  []string{"Identity"},
	Apply: func(w *Work, n *pb.NodeProto) (bool, error) {
		if len(n.Input) != 1 {
			return false, nil
		}
		return w.Drop(n, n.Input[0]), nil
	},
}

// DropInferenceDropout turns a Dropout that is an identity into an
// Identity (which DropIdentity then removes): one not in training mode (no
// training_mode input, or a constant false one, from opset 12; always before,
// where the mode is the runtime's and inference copies the input), whose
// mask output is not read. A model exported in training mode, or whose mask
// is used, keeps its Dropout.
var DropInferenceDropout = Rule{
	Name: "drop-inference-dropout",
	Ops:  []string{"Dropout"},
	Apply: func(w *Work, n *pb.NodeProto) (bool, error) {
		if len(n.Input) == 0 || n.Input[0] == "" || len(n.Output) == 0 || n.Output[0] == "" {
			return false, nil
		}
		if len(n.Input) > 2 && n.Input[2] != "" {
			v, ok := w.ConstScalar(n.Input[2])
			if !ok || v != 0 {
				return false, nil
			}
		}
		if len(n.Output) > 1 && n.Output[1] != "" && (w.G.IsOutput(n.Output[1]) || len(w.Consumers(n.Output[1])) > 0) {
			return false, nil
		}
		w.Replace(n, w.Node("Identity", "", n.GetName()+"/inference", n.Input[:1], n.Output[:1]))
		return true, nil
	},
}

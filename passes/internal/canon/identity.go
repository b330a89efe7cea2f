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

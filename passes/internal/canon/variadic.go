package canon

import pb "github.com/mokopt/mokopt/graph/onnxpb"

// SingleInputVariadic turns Max, Min, Sum, Mean or Concat of one input into
// an Identity of it (which DropIdentity then removes where it can).
var SingleInputVariadic = Rule{
	Name: "single-input-variadic",
	Ops:  []string{"Max", "Min", "Sum", "Mean", "Concat"},
	Apply: func(w *Work, n *pb.NodeProto) (bool, error) {
		if len(n.Input) != 1 || len(n.Output) != 1 || n.Input[0] == "" {
			return false, nil
		}
		w.Replace(n, w.Node("Identity", "", n.GetName()+"/Identity", n.Input, n.Output))
		return true, nil
	},
}

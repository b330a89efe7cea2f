package canon

import (
	"slices"

	pb "github.com/mokopt/mokopt/graph/onnxpb"
)

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

// SumToAdd turns a Sum of two or more inputs into a chain of Adds, left to
// right (ONNX leaves a Sum's order of accumulation open; for two inputs
// the result is the same bits). A combine or a residual written as Sum
// then reads as the Add that block matching looks for.
var SumToAdd = Rule{
	Name: "sum-to-add",
	Ops:  []string{"Sum"},
	Apply: func(w *Work, n *pb.NodeProto) (bool, error) {
		if n.GetDomain() != "" || len(n.Input) < 2 || len(n.Output) != 1 || slices.Contains(n.Input, "") {
			return false, nil
		}
		acc := n.Input[0]
		var nodes []*pb.NodeProto
		for i, in := range n.Input[1:] {
			out := n.Output[0]
			if i < len(n.Input)-2 {
				out = w.Temp(n, "partial")
			}
			nodes = append(nodes, w.Node("Add", "", n.GetName(), []string{acc, in}, []string{out}))
			acc = out
		}
		w.Replace(n, nodes...)
		return true, nil
	},
}

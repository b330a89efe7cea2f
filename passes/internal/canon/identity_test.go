package canon

import (
	"math/rand/v2"
	"testing"

	"github.com/mokopt/mokopt/graph"
	"github.com/mokopt/mokopt/graph/eval"
	pb "github.com/mokopt/mokopt/graph/onnxpb"
)

func TestDropIdentityRules(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	x := map[string]*eval.Tensor{"x": randF32(r, 2, 3)}
	runRuleCases(t, []Rule{DropIdentity, DropIdentityTranspose, DropNoOpCast, DropNoOpReshape, SingleInputVariadic}, []ruleCase{
		{name: "identity", nodes: []*pb.NodeProto{node("Identity", []string{"x"}, []string{"a"}), node("Relu", []string{"a"}, []string{"y"})},
			inputs: x, outputs: []string{"y"}, want: map[string]int{"Identity": 0, "Relu": 1}},
		{name: "identity read twice by one node", nodes: []*pb.NodeProto{node("Identity", []string{"x"}, []string{"a"}), node("Mul", []string{"a", "a"}, []string{"y"})},
			inputs: x, outputs: []string{"y"}, want: map[string]int{"Identity": 0, "Mul": 1}},
		{name: "identity graph output kept", nodes: []*pb.NodeProto{node("Identity", []string{"x"}, []string{"y"})},
			inputs: x, outputs: []string{"y"}, noChange: true},
		{name: "transpose identity perm", nodes: []*pb.NodeProto{node("Transpose", []string{"x"}, []string{"a"}, graph.IntsAttr("perm", 0, 1)), node("Relu", []string{"a"}, []string{"y"})},
			inputs: x, outputs: []string{"y"}, want: map[string]int{"Transpose": 0}},
		{name: "transpose real perm kept", nodes: []*pb.NodeProto{node("Transpose", []string{"x"}, []string{"a"}, graph.IntsAttr("perm", 1, 0)), node("Relu", []string{"a"}, []string{"y"})},
			inputs: x, outputs: []string{"y"}, noChange: true},
		{name: "cast to own type", nodes: []*pb.NodeProto{node("Cast", []string{"x"}, []string{"a"}, graph.IntAttr("to", int64(pb.TensorProto_FLOAT))), node("Relu", []string{"a"}, []string{"y"})},
			inputs: x, outputs: []string{"y"}, want: map[string]int{"Cast": 0}},
		{name: "cast to other type kept", nodes: []*pb.NodeProto{node("Cast", []string{"x"}, []string{"a"}, graph.IntAttr("to", int64(pb.TensorProto_DOUBLE))), node("Relu", []string{"a"}, []string{"y"})},
			inputs: x, outputs: []string{"y"}, noChange: true},
		{name: "reshape to own shape with 0 and -1", nodes: []*pb.NodeProto{node("Reshape", []string{"x", "s"}, []string{"a"}), node("Relu", []string{"a"}, []string{"y"})},
			inputs: x, inits: map[string]*eval.Tensor{"s": eval.NewInt64([]int{2}, []int64{0, -1})}, outputs: []string{"y"}, want: map[string]int{"Reshape": 0}},
		{name: "reshape to other shape kept", nodes: []*pb.NodeProto{node("Reshape", []string{"x", "s"}, []string{"a"}), node("Relu", []string{"a"}, []string{"y"})},
			inputs: x, inits: map[string]*eval.Tensor{"s": eval.NewInt64([]int{2}, []int64{3, 2})}, outputs: []string{"y"}, noChange: true},
		{name: "single-input max", nodes: []*pb.NodeProto{node("Max", []string{"x"}, []string{"a"}), node("Relu", []string{"a"}, []string{"y"})},
			inputs: x, outputs: []string{"y"}, want: map[string]int{"Max": 0, "Identity": 0}},
		{name: "two-input min kept", nodes: []*pb.NodeProto{node("Min", []string{"x", "x"}, []string{"y"})},
			inputs: x, outputs: []string{"y"}, noChange: true},
	})
}

func TestDropInferenceDropout(t *testing.T) {
	r := rand.New(rand.NewPCG(3, 4))
	x := map[string]*eval.Tensor{"x": randF32(r, 2, 3)}
	mode := func(on bool) map[string]*eval.Tensor {
		return map[string]*eval.Tensor{"ratio": eval.NewFloat32(nil, []float32{0.25}), "train": eval.NewBool(nil, []bool{on})}
	}
	relu := node("Relu", []string{"a"}, []string{"y"})
	runRuleCases(t, []Rule{DropInferenceDropout, DropIdentity, DropDead}, []ruleCase{
		{name: "inference dropout", nodes: []*pb.NodeProto{node("Dropout", []string{"x"}, []string{"a"}), relu},
			inputs: x, outputs: []string{"y"}, want: map[string]int{"Dropout": 0, "Identity": 0, "Relu": 1}},
		{name: "training_mode false, mask unread", nodes: []*pb.NodeProto{node("Dropout", []string{"x", "ratio", "train"}, []string{"a", "mask"}), relu},
			inputs: x, inits: mode(false), outputs: []string{"y"}, want: map[string]int{"Dropout": 0, "Relu": 1}},
		{name: "opset 11", opset: 11, nodes: []*pb.NodeProto{node("Dropout", []string{"x"}, []string{"a"}, graph.FloatAttr("ratio", 0.1)), relu},
			inputs: x, outputs: []string{"y"}, want: map[string]int{"Dropout": 0, "Relu": 1}},
		{name: "training mode kept", nodes: []*pb.NodeProto{node("Dropout", []string{"x", "ratio", "train"}, []string{"a"}), relu},
			inputs: x, inits: mode(true), outputs: []string{"y"}, noChange: true},
		{name: "mask read kept", nodes: []*pb.NodeProto{node("Dropout", []string{"x"}, []string{"a", "mask"}), relu,
			node("Not", []string{"mask"}, []string{"z"})},
			inputs: x, outputs: []string{"y", "z"}, noChange: true},
	})
}

package canon

import (
	"math/rand/v2"
	"testing"

	"github.com/mokopt/mokopt/graph"
	"github.com/mokopt/mokopt/graph/eval"
	pb "github.com/mokopt/mokopt/graph/onnxpb"
)

func TestRoundTripRules(t *testing.T) {
	r := rand.New(rand.NewPCG(3, 4))
	x := map[string]*eval.Tensor{"x": randF32(r, 2, 1)}
	ax := func(v ...int64) *eval.Tensor { return eval.NewInt64([]int{len(v)}, v) }
	relu := node("Relu", []string{"b"}, []string{"y"})
	runRuleCases(t, []Rule{SqueezeOfUnsqueeze, ExpandToOwnShape, SingleInputVariadic, DropIdentity}, []ruleCase{
		{name: "squeeze of unsqueeze, same axis", nodes: []*pb.NodeProto{
			node("Unsqueeze", []string{"x", "a1"}, []string{"a"}), node("Squeeze", []string{"a", "a1"}, []string{"b"}), relu},
			inputs: x, inits: map[string]*eval.Tensor{"a1": ax(1)}, outputs: []string{"y"}, want: map[string]int{"Squeeze": 0}},
		{name: "squeeze of unsqueeze, negative against positive axis", nodes: []*pb.NodeProto{
			node("Unsqueeze", []string{"x", "u"}, []string{"a"}), node("Squeeze", []string{"a", "s"}, []string{"b"}), relu},
			inputs: x, inits: map[string]*eval.Tensor{"u": ax(-1), "s": ax(2)}, outputs: []string{"y"}, want: map[string]int{"Squeeze": 0}},
		{name: "squeeze of unsqueeze, two axes in another order", nodes: []*pb.NodeProto{
			node("Unsqueeze", []string{"x", "u"}, []string{"a"}), node("Squeeze", []string{"a", "s"}, []string{"b"}), relu},
			inputs: x, inits: map[string]*eval.Tensor{"u": ax(0, 3), "s": ax(3, 0)}, outputs: []string{"y"}, want: map[string]int{"Squeeze": 0}},
		{name: "squeeze of unsqueeze, opset 11 attributes", opset: 11, nodes: []*pb.NodeProto{
			node("Unsqueeze", []string{"x"}, []string{"a"}, graph.IntsAttr("axes", 0)), node("Squeeze", []string{"a"}, []string{"b"}, graph.IntsAttr("axes", 0)), relu},
			inputs: x, outputs: []string{"y"}, want: map[string]int{"Squeeze": 0}},
		{name: "squeeze of another axis kept", nodes: []*pb.NodeProto{
			node("Unsqueeze", []string{"x", "u"}, []string{"a"}), node("Squeeze", []string{"a", "s"}, []string{"b"}), relu},
			inputs: x, inits: map[string]*eval.Tensor{"u": ax(0), "s": ax(2)}, outputs: []string{"y"}, noChange: true},
		{name: "squeeze of every unit axis kept", nodes: []*pb.NodeProto{
			node("Unsqueeze", []string{"x", "u"}, []string{"a"}), node("Squeeze", []string{"a"}, []string{"b"}), relu},
			inputs: x, inits: map[string]*eval.Tensor{"u": ax(0)}, outputs: []string{"y"}, noChange: true},
		{name: "expand to own shape", nodes: []*pb.NodeProto{
			node("Shape", []string{"x"}, []string{"s"}), node("Expand", []string{"x", "s"}, []string{"b"}), relu},
			inputs: x, outputs: []string{"y"}, want: map[string]int{"Expand": 0}},
		{name: "expand to a part of own shape kept", nodes: []*pb.NodeProto{
			node("Shape", []string{"x"}, []string{"s"}, graph.IntAttr("start", 1)), node("Expand", []string{"x", "s"}, []string{"b"}), relu},
			inputs: x, outputs: []string{"y"}, noChange: true},
		{name: "expand to another value's shape kept", nodes: []*pb.NodeProto{
			node("Shape", []string{"z"}, []string{"s"}), node("Expand", []string{"x", "s"}, []string{"b"}), relu},
			inputs: map[string]*eval.Tensor{"x": randF32(r, 2, 1), "z": randF32(r, 2, 3)}, outputs: []string{"y"}, noChange: true},
		{name: "single-input concat", nodes: []*pb.NodeProto{node("Concat", []string{"x"}, []string{"b"}, graph.IntAttr("axis", 0)), relu},
			inputs: x, outputs: []string{"y"}, want: map[string]int{"Concat": 0, "Identity": 0}},
	})
}

func TestExpandToOperand(t *testing.T) {
	r := rand.New(rand.NewPCG(23, 24))
	x := map[string]*eval.Tensor{"x": randF32(r, 3, 4)}
	consts := map[string]*eval.Tensor{"c": eval.NewFloat32(nil, []float32{2.5}), "c11": eval.NewFloat32([]int{1, 1}, []float32{-1}),
		"c1111": eval.NewFloat32([]int{1, 1, 1}, []float32{3}), "v": eval.NewFloat32([]int{4}, []float32{1, 2, 3, 4})}
	shape := node("Shape", []string{"x"}, []string{"s"})
	expand := func(c string) *pb.NodeProto { return node("Expand", []string{c, "s"}, []string{"e"}) }
	runRuleCases(t, []Rule{ExpandToOperand, DropDead}, []ruleCase{
		{name: "scale by a full tensor", nodes: []*pb.NodeProto{shape, expand("c"), node("Mul", []string{"x", "e"}, []string{"y"})},
			inputs: x, inits: consts, outputs: []string{"y"}, want: map[string]int{"Expand": 0, "Shape": 0, "Mul": 1}},
		{name: "expanded first, [1, 1] constant", nodes: []*pb.NodeProto{shape, expand("c11"), node("Sub", []string{"e", "x"}, []string{"y"})},
			inputs: x, inits: consts, outputs: []string{"y"}, want: map[string]int{"Expand": 0, "Sub": 1}},
		{name: "constant of higher rank kept", nodes: []*pb.NodeProto{shape, expand("c1111"), node("Add", []string{"x", "e"}, []string{"y"})},
			inputs: x, inits: consts, outputs: []string{"y"}, noChange: true},
		{name: "vector kept", nodes: []*pb.NodeProto{shape, expand("v"), node("Mul", []string{"x", "e"}, []string{"y"})},
			inputs: x, inits: consts, outputs: []string{"y"}, noChange: true},
		{name: "shape of another value kept", nodes: []*pb.NodeProto{node("Shape", []string{"z"}, []string{"s"}), expand("c"), node("Mul", []string{"x", "e"}, []string{"y"})},
			inputs: map[string]*eval.Tensor{"x": randF32(r, 1, 4), "z": randF32(r, 3, 4)}, inits: consts, outputs: []string{"y"}, noChange: true},
	})
}

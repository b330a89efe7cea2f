package canon

import (
	"math/rand/v2"
	"testing"

	"github.com/mokopt/mokopt/graph"
	"github.com/mokopt/mokopt/graph/eval"
	pb "github.com/mokopt/mokopt/graph/onnxpb"
)

func TestSpelledSoftmax(t *testing.T) {
	r := rand.New(rand.NewPCG(5, 6))
	x := map[string]*eval.Tensor{"x": randF32(r, 6, 8)}
	ax := func(a int64) map[string]*eval.Tensor {
		return map[string]*eval.Tensor{"ax": eval.NewInt64([]int{1}, []int64{a}), "ax0": eval.NewInt64([]int{1}, []int64{0})}
	}
	exp := node("Exp", []string{"x"}, []string{"e"})
	sum := node("ReduceSum", []string{"e", "ax"}, []string{"s"})
	shifted := []*pb.NodeProto{
		node("ReduceMax", []string{"x", "ax"}, []string{"m"}),
		node("Sub", []string{"x", "m"}, []string{"d"}),
		node("Exp", []string{"d"}, []string{"e"}),
		sum,
	}
	div := node("Div", []string{"e", "s"}, []string{"y"})
	recip := []*pb.NodeProto{node("Reciprocal", []string{"s"}, []string{"rs"}), node("Mul", []string{"rs", "e"}, []string{"y"})}
	runRuleCases(t, []Rule{SpelledSoftmax, DropDead}, []ruleCase{
		{name: "exp over its sum", opset: 18, nodes: []*pb.NodeProto{exp, sum, div},
			inputs: x, inits: ax(1), outputs: []string{"y"}, want: map[string]int{"Softmax": 1, "Exp": 0, "Div": 0, "ReduceSum": 0}},
		{name: "shifted by the max", opset: 18, nodes: append(append([]*pb.NodeProto{}, shifted...), div),
			inputs: x, inits: ax(-1), outputs: []string{"y"}, want: map[string]int{"Softmax": 1, "Sub": 0, "ReduceMax": 0}},
		{name: "times the reciprocal, operands swapped", opset: 18, nodes: append([]*pb.NodeProto{exp, sum}, recip...),
			inputs: x, inits: ax(1), outputs: []string{"y"}, want: map[string]int{"Softmax": 1, "Mul": 0}},
		{name: "over the first axis", opset: 18, nodes: []*pb.NodeProto{exp, node("ReduceSum", []string{"e", "ax0"}, []string{"s"}), div},
			inputs: x, inits: ax(1), outputs: []string{"y"}, want: map[string]int{"Softmax": 1}},
		{name: "opset 13, axes attribute on the max", opset: 13, nodes: []*pb.NodeProto{
			node("ReduceMax", []string{"x"}, []string{"m"}, graph.IntsAttr("axes", 1)),
			node("Sub", []string{"x", "m"}, []string{"d"}), node("Exp", []string{"d"}, []string{"e"}), sum, div},
			inputs: x, inits: ax(1), outputs: []string{"y"}, want: map[string]int{"Softmax": 1, "ReduceMax": 0}},
		// A max over another axis is not a shift along the softmax's axis:
		// the softmax is taken of the difference, as written.
		{name: "max over another axis kept", opset: 18, nodes: []*pb.NodeProto{
			node("ReduceMax", []string{"x", "ax0"}, []string{"m"}),
			node("Sub", []string{"x", "m"}, []string{"d"}), node("Exp", []string{"d"}, []string{"e"}), sum, div},
			inputs: x, inits: ax(1), outputs: []string{"y"}, want: map[string]int{"Softmax": 1, "ReduceMax": 1, "Sub": 1}},
		{name: "sum without its axis kept", opset: 18, nodes: []*pb.NodeProto{exp,
			node("ReduceSum", []string{"e", "ax"}, []string{"s"}, graph.IntAttr("keepdims", 0)), node("Unsqueeze", []string{"s", "ax"}, []string{"s1"}),
			node("Div", []string{"e", "s1"}, []string{"y"})},
			inputs: x, inits: ax(1), outputs: []string{"y"}, noChange: true},
		{name: "sum of another tensor kept", opset: 18, nodes: []*pb.NodeProto{exp, node("ReduceSum", []string{"x", "ax"}, []string{"s"}), div},
			inputs: x, inits: ax(1), outputs: []string{"y"}, noChange: true},
		{name: "sum over two axes kept", opset: 18, nodes: []*pb.NodeProto{exp, node("ReduceSum", []string{"e", "two"}, []string{"s"}), div},
			inputs: x, inits: map[string]*eval.Tensor{"two": eval.NewInt64([]int{2}, []int64{0, 1})}, outputs: []string{"y"}, noChange: true},
		{name: "opset 12, raised", opset: 12, nodes: []*pb.NodeProto{exp, node("ReduceSum", []string{"e"}, []string{"s"}, graph.IntsAttr("axes", 1)), div},
			inputs: x, outputs: []string{"y"}, want: map[string]int{"Softmax": 1, "ReduceSum": 0}},
	})
}

func TestSpelledLogSoftmax(t *testing.T) {
	r := rand.New(rand.NewPCG(24, 25))
	x := map[string]*eval.Tensor{"x": randF32(r, 6, 8)}
	ax := map[string]*eval.Tensor{"ax": eval.NewInt64([]int{1}, []int64{-1}), "ax01": eval.NewInt64([]int{2}, []int64{0, 1})}
	lse := node("ReduceLogSumExp", []string{"x", "ax"}, []string{"l"})
	logSum := []*pb.NodeProto{node("Exp", []string{"s"}, []string{"e"}), node("ReduceSum", []string{"e", "ax"}, []string{"z"}),
		node("Log", []string{"z"}, []string{"l"})}
	shift := []*pb.NodeProto{node("ReduceMax", []string{"x", "ax"}, []string{"m"}), node("Sub", []string{"x", "m"}, []string{"s"})}
	runRuleCases(t, []Rule{SpelledLogSoftmax, ExpOfLogSoftmax, DropDead}, []ruleCase{
		{name: "x minus its logsumexp", opset: 18, nodes: []*pb.NodeProto{lse, node("Sub", []string{"x", "l"}, []string{"y"})},
			inputs: x, inits: ax, outputs: []string{"y"}, want: map[string]int{"LogSoftmax": 1, "ReduceLogSumExp": 0, "Sub": 0}},
		{name: "exp of it is the softmax", opset: 18, nodes: []*pb.NodeProto{lse, node("Sub", []string{"x", "l"}, []string{"d"}),
			node("Exp", []string{"d"}, []string{"y"})},
			inputs: x, inits: ax, outputs: []string{"y"}, want: map[string]int{"Softmax": 1, "LogSoftmax": 0, "Exp": 0}},
		{name: "shifted, log of the sum of exps", opset: 18, nodes: append(append([]*pb.NodeProto{}, shift...),
			append(logSum, node("Sub", []string{"s", "l"}, []string{"y"}))...),
			inputs: x, inits: ax, outputs: []string{"y"}, want: map[string]int{"LogSoftmax": 1, "ReduceMax": 0, "Log": 0}},
		{name: "over two axes kept", opset: 18, nodes: []*pb.NodeProto{node("ReduceLogSumExp", []string{"x", "ax01"}, []string{"l"}),
			node("Sub", []string{"x", "l"}, []string{"y"})},
			inputs: x, inits: ax, outputs: []string{"y"}, noChange: true},
		{name: "another value's logsumexp kept", opset: 18, nodes: []*pb.NodeProto{node("Neg", []string{"x"}, []string{"n"}),
			node("ReduceLogSumExp", []string{"n", "ax"}, []string{"l"}), node("Sub", []string{"x", "l"}, []string{"y"})},
			inputs: x, inits: ax, outputs: []string{"y"}, noChange: true},
	})
}

package canon

import (
	"math/rand/v2"
	"testing"

	"github.com/mokopt/mokopt/graph"
	"github.com/mokopt/mokopt/graph/eval"
	pb "github.com/mokopt/mokopt/graph/onnxpb"
)

func TestStackedSum(t *testing.T) {
	r := rand.New(rand.NewPCG(40, 41))
	x := map[string]*eval.Tensor{"a": randF32(r, 3, 4), "b": randF32(r, 3, 4), "c": randF32(r, 3, 4), "w": randF32(r, 1, 3, 4)}
	ints := func(v ...int64) *eval.Tensor { return eval.NewInt64([]int{len(v)}, v) }
	inits := map[string]*eval.Tensor{"z": ints(0), "m1": ints(-1), "two": ints(2), "one": ints(1)}
	unsq := func(in, ax, out string) *pb.NodeProto { return node("Unsqueeze", []string{in, ax}, []string{out}) }
	stack := []*pb.NodeProto{unsq("a", "z", "ua"), unsq("b", "z", "ub"), unsq("c", "z", "uc"),
		node("Concat", []string{"ua", "ub", "uc"}, []string{"s"}, graph.IntAttr("axis", 0))}
	last := []*pb.NodeProto{unsq("a", "m1", "ua"), unsq("b", "two", "ub"),
		node("Concat", []string{"ua", "ub"}, []string{"s"}, graph.IntAttr("axis", -1))}
	reduce := func(ax string, keep int64) *pb.NodeProto {
		return node("ReduceSum", []string{"s", ax}, []string{"y"}, graph.IntAttr("keepdims", keep))
	}
	with := func(ns []*pb.NodeProto, n *pb.NodeProto) []*pb.NodeProto {
		return append(append([]*pb.NodeProto{}, ns...), n)
	}
	runRuleCases(t, []Rule{StackedSum, SumToAdd, DropDead}, []ruleCase{
		{name: "three stacked on a new first axis", nodes: with(stack, reduce("z", 0)), inputs: x, inits: inits,
			outputs: []string{"y"}, want: map[string]int{"Add": 2, "ReduceSum": 0, "Concat": 0, "Unsqueeze": 0}},
		{name: "stacked last, axes spelled two ways", nodes: with(last, reduce("two", 0)), inputs: x, inits: inits,
			outputs: []string{"y"}, want: map[string]int{"Add": 1, "ReduceSum": 0, "Concat": 0}},
		{name: "keepdims sums the unit-wide pieces", nodes: with(stack, reduce("z", 1)), inputs: x, inits: inits,
			outputs: []string{"y"}, want: map[string]int{"Add": 2, "ReduceSum": 0, "Unsqueeze": 3}},
		{name: "keepdims of a unit-wide input and its own", nodes: []*pb.NodeProto{
			node("Concat", []string{"w", "w"}, []string{"s"}, graph.IntAttr("axis", 0)), reduce("z", 1)}, inputs: x, inits: inits,
			outputs: []string{"y"}, want: map[string]int{"Add": 1, "ReduceSum": 0}},
		{name: "reduced over another axis", nodes: with(stack, reduce("one", 0)), inputs: x, inits: inits,
			outputs: []string{"y"}, noChange: true},
		{name: "pieces wider than one", nodes: []*pb.NodeProto{
			node("Concat", []string{"a", "b"}, []string{"s"}, graph.IntAttr("axis", 0)), reduce("z", 1)}, inputs: x, inits: inits,
			outputs: []string{"y"}, noChange: true},
		{name: "keepdims 0 of pieces not unsqueezed", nodes: []*pb.NodeProto{
			node("Concat", []string{"w", "w"}, []string{"s"}, graph.IntAttr("axis", 0)), reduce("z", 0)}, inputs: x, inits: inits,
			outputs: []string{"y"}, noChange: true},
	})
}

package canon

import (
	"math/rand/v2"
	"testing"

	"github.com/mokopt/mokopt/graph"
	"github.com/mokopt/mokopt/graph/eval"
	pb "github.com/mokopt/mokopt/graph/onnxpb"
)

func TestFoldConstants(t *testing.T) {
	r := rand.New(rand.NewPCG(9, 10))
	x := map[string]*eval.Tensor{"x": randF32(r, 2, 3, 4)}
	runRuleCases(t, []Rule{FoldConstants}, []ruleCase{
		{name: "shape arithmetic to a reshape target", nodes: []*pb.NodeProto{
			node("Shape", []string{"x"}, []string{"s"}),
			node("Gather", []string{"s", "i0"}, []string{"b"}, graph.IntAttr("axis", 0)),
			node("Gather", []string{"s", "i1"}, []string{"t"}, graph.IntAttr("axis", 0)),
			node("Mul", []string{"b", "t"}, []string{"bt"}),
			node("Unsqueeze", []string{"bt", "ax"}, []string{"bt1"}),
			node("Concat", []string{"bt1", "m1"}, []string{"shape"}, graph.IntAttr("axis", 0)),
			node("Reshape", []string{"x", "shape"}, []string{"y"}),
		}, inputs: x, inits: map[string]*eval.Tensor{"i0": eval.ScalarInt64(0), "i1": eval.ScalarInt64(1), "ax": eval.NewInt64([]int{1}, []int64{0}), "m1": eval.NewInt64([]int{1}, []int64{-1})},
			outputs: []string{"y"}, want: map[string]int{"Shape": 0, "Gather": 0, "Mul": 0, "Unsqueeze": 0, "Concat": 0, "Reshape": 1}},
		{name: "constant of shape and range", nodes: []*pb.NodeProto{
			node("Shape", []string{"x"}, []string{"s"}, graph.IntAttr("start", -1)),
			node("ConstantOfShape", []string{"s"}, []string{"z"}),
			node("Range", []string{"zero", "four", "one"}, []string{"rg"}),
			node("Cast", []string{"rg"}, []string{"rgf"}, graph.IntAttr("to", int64(pb.TensorProto_FLOAT))),
			node("Add", []string{"z", "rgf"}, []string{"zr"}),
			node("Add", []string{"x", "zr"}, []string{"y"}),
		}, inputs: x, inits: map[string]*eval.Tensor{"zero": eval.ScalarInt64(0), "four": eval.ScalarInt64(4), "one": eval.ScalarInt64(1)},
			outputs: []string{"y"}, want: map[string]int{"Shape": 0, "ConstantOfShape": 0, "Range": 0, "Cast": 0, "Add": 1}},
		{name: "symbolic shape kept", nodes: []*pb.NodeProto{node("Relu", []string{"x"}, []string{"u"}), node("Shape", []string{"u"}, []string{"y"})},
			inputs: x, outputs: []string{"y"}, noChange: true},
	})
}

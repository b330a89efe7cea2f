package canon

import (
	"math/rand/v2"
	"testing"

	"github.com/mokopt/mokopt/graph"
	"github.com/mokopt/mokopt/graph/eval"
	pb "github.com/mokopt/mokopt/graph/onnxpb"
)

func TestOneHotOfEqual(t *testing.T) {
	r := rand.New(rand.NewPCG(21, 22))
	x := map[string]*eval.Tensor{"x": randF32(r, 5, 8)}
	consts := map[string]*eval.Tensor{
		"k": eval.NewInt64([]int{1}, []int64{2}), "ax": eval.NewInt64([]int{1}, []int64{-1}),
		"ids": eval.NewInt64([]int{8}, []int64{0, 1, 2, 3, 4, 5, 6, 7}), "ids2": eval.NewInt64([]int{1, 8}, []int64{0, 1, 2, 3, 4, 5, 6, 7}),
		"perm": eval.NewInt64([]int{8}, []int64{1, 0, 2, 3, 4, 5, 6, 7}),
		"on":   eval.NewFloat32(nil, []float32{1}), "off": eval.NewFloat32(nil, []float32{0}), "hot": eval.NewFloat32(nil, []float32{3}),
		"d": eval.NewInt64(nil, []int64{8}), "zero": eval.NewInt64(nil, []int64{0}), "step": eval.NewInt64(nil, []int64{1}),
	}
	topk := node("TopK", []string{"x", "k"}, []string{"v", "i"}, graph.IntAttr("axis", -1))
	unsq := node("Unsqueeze", []string{"i", "ax"}, []string{"u"})
	eq := func(ids string) *pb.NodeProto { return node("Equal", []string{"u", ids}, []string{"m"}) }
	where := func(on string) *pb.NodeProto { return node("Where", []string{"m", on, "off"}, []string{"y"}) }
	cast := node("Cast", []string{"m"}, []string{"y"}, graph.IntAttr("to", int64(pb.TensorProto_FLOAT)))
	runRuleCases(t, []Rule{OneHotOfEqual, FoldConstants, DropDead}, []ruleCase{
		{name: "where of the mask", nodes: []*pb.NodeProto{topk, unsq, eq("ids"), where("on")}, inputs: x, inits: consts,
			outputs: []string{"y"}, want: map[string]int{"OneHot": 1, "Equal": 0, "Where": 0}},
		{name: "cast of the mask, ids [1, E], other values", nodes: []*pb.NodeProto{topk, unsq, eq("ids2"), cast}, inputs: x, inits: consts,
			outputs: []string{"y"}, want: map[string]int{"OneHot": 1, "Equal": 0}},
		{name: "on value 3", nodes: []*pb.NodeProto{topk, unsq, eq("ids"), where("hot")}, inputs: x, inits: consts,
			outputs: []string{"y"}, want: map[string]int{"OneHot": 1}},
		{name: "ids computed by Range", nodes: []*pb.NodeProto{topk, unsq, node("Range", []string{"zero", "d", "step"}, []string{"rg"}),
			eq("rg"), where("on")}, inputs: x, inits: consts, outputs: []string{"y"}, want: map[string]int{"OneHot": 1, "Range": 0}},
		{name: "ids not in order kept", nodes: []*pb.NodeProto{topk, unsq, eq("perm"), where("on")}, inputs: x, inits: consts,
			outputs: []string{"y"}, noChange: true},
		{name: "not selected ids kept", nodes: []*pb.NodeProto{node("ArgMin", []string{"x"}, []string{"i"}, graph.IntAttr("axis", -1)), unsq, eq("ids"), where("on")},
			inputs: x, inits: consts, outputs: []string{"y"}, noChange: true},
	})
}

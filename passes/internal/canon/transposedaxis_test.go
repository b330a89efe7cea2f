package canon

import (
	"math/rand/v2"
	"testing"

	"github.com/mokopt/mokopt/graph"
	"github.com/mokopt/mokopt/graph/eval"
	pb "github.com/mokopt/mokopt/graph/onnxpb"
)

func TestTransposedAxisOp(t *testing.T) {
	r := rand.New(rand.NewPCG(44, 45))
	x := map[string]*eval.Tensor{"x": randF32(r, 5, 6), "x3": randF32(r, 2, 3, 4)}
	tr := func(in, out string, perm ...int64) *pb.NodeProto {
		return node("Transpose", []string{in}, []string{out}, graph.IntsAttr("perm", perm...))
	}
	sm := func(op, in, out string, axis int64) *pb.NodeProto {
		return node(op, []string{in}, []string{out}, graph.IntAttr("axis", axis))
	}
	runRuleCases(t, []Rule{TransposedAxisOp, DropDead}, []ruleCase{
		{name: "softmax over the rows of the transpose", nodes: []*pb.NodeProto{tr("x", "t", 1, 0), sm("Softmax", "t", "s", 0), tr("s", "y", 1, 0)},
			inputs: x, outputs: []string{"y"}, want: map[string]int{"Transpose": 0, "Softmax": 1}},
		{name: "log-softmax, rank 3, a cycle of axes", nodes: []*pb.NodeProto{tr("x3", "t", 2, 0, 1), sm("LogSoftmax", "t", "s", -1), tr("s", "y", 1, 2, 0)},
			inputs: x, outputs: []string{"y"}, want: map[string]int{"Transpose": 0, "LogSoftmax": 1}},
		{name: "elementwise, perm left out", nodes: []*pb.NodeProto{node("Transpose", []string{"x"}, []string{"t"}),
			node("Sigmoid", []string{"t"}, []string{"s"}), node("Transpose", []string{"s"}, []string{"y"})},
			inputs: x, outputs: []string{"y"}, want: map[string]int{"Transpose": 0, "Sigmoid": 1}},
		{name: "the transpose read too", nodes: []*pb.NodeProto{tr("x", "t", 1, 0), sm("Softmax", "t", "s", 0), tr("s", "y", 1, 0)},
			inputs: x, outputs: []string{"y", "s"}, want: map[string]int{"Transpose": 1, "Softmax": 2}},
		{name: "not transposed back", nodes: []*pb.NodeProto{tr("x3", "t", 2, 0, 1), sm("Softmax", "t", "s", 0), tr("s", "y", 2, 0, 1)},
			inputs: x, outputs: []string{"y"}, noChange: true},
	})
}

func TestGatherNDOfOne(t *testing.T) {
	r := rand.New(rand.NewPCG(46, 47))
	x := map[string]*eval.Tensor{"x": randF32(r, 5, 3)}
	inits := map[string]*eval.Tensor{"i": eval.NewInt64([]int{4}, []int64{3, 0, -1, 3}), "i2": eval.NewInt64([]int{2, 1}, []int64{4, 1}),
		"m1": eval.NewInt64([]int{1}, []int64{-1}), "pair": eval.NewInt64([]int{1, 2}, []int64{1, 2})}
	runRuleCases(t, []Rule{GatherNDOfOne, DropDead}, []ruleCase{
		{name: "indices unsqueezed last", nodes: []*pb.NodeProto{node("Unsqueeze", []string{"i", "m1"}, []string{"u"}),
			node("GatherND", []string{"x", "u"}, []string{"y"})},
			inputs: x, inits: inits, outputs: []string{"y"}, want: map[string]int{"GatherND": 0, "Gather": 1, "Unsqueeze": 0}},
		{name: "static last dim of one", nodes: []*pb.NodeProto{node("GatherND", []string{"x", "i2"}, []string{"y"})},
			inputs: x, inits: inits, outputs: []string{"y"}, want: map[string]int{"GatherND": 0, "Gather": 1, "Squeeze": 1}},
		{name: "tuples of two kept", nodes: []*pb.NodeProto{node("GatherND", []string{"x", "pair"}, []string{"y"})},
			inputs: x, inits: inits, outputs: []string{"y"}, noChange: true},
	})
}

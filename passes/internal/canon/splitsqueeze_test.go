package canon

import (
	"math/rand/v2"
	"testing"

	"github.com/mokopt/mokopt/graph"
	"github.com/mokopt/mokopt/graph/eval"
	pb "github.com/mokopt/mokopt/graph/onnxpb"
)

func TestSplitSqueezeToGather(t *testing.T) {
	r := rand.New(rand.NewPCG(15, 16))
	x := map[string]*eval.Tensor{"x": randF32(r, 4, 3)}
	ones := map[string]*eval.Tensor{"sz": eval.NewInt64([]int{4}, []int64{1, 1, 1, 1}), "ax": eval.NewInt64([]int{1}, []int64{0})}
	split := node("Split", []string{"x", "sz"}, []string{"p0", "p1", "p2", "p3"}, graph.IntAttr("axis", 0))
	sq := func(p, out string) *pb.NodeProto { return node("Squeeze", []string{p, "ax"}, []string{out}) }
	runRuleCases(t, []Rule{SplitSqueezeToGather, DropDead}, []ruleCase{
		{name: "every piece", nodes: []*pb.NodeProto{split, sq("p0", "a"), sq("p1", "b"), sq("p2", "c"), sq("p3", "d")},
			inputs: x, inits: ones, outputs: []string{"a", "b", "c", "d"}, want: map[string]int{"Split": 0, "Squeeze": 0, "Gather": 4}},
		{name: "one piece, split kept for the others", nodes: []*pb.NodeProto{split, sq("p2", "c"), node("Relu", []string{"p0"}, []string{"a"})},
			inputs: x, inits: ones, outputs: []string{"a", "c"}, want: map[string]int{"Split": 1, "Gather": 1}},
		{name: "pair split kept", nodes: []*pb.NodeProto{node("Split", []string{"y", "two"}, []string{"q0", "q1"}, graph.IntAttr("axis", 0)), sq("q0", "a"), sq("q1", "b")},
			inputs: map[string]*eval.Tensor{"y": randF32(r, 2, 3)}, inits: map[string]*eval.Tensor{"two": eval.NewInt64([]int{2}, []int64{1, 1}), "ax": ones["ax"]},
			outputs: []string{"a", "b"}, noChange: true},
		{name: "axis longer than the pieces kept", nodes: []*pb.NodeProto{node("Split", []string{"z", "sz"}, []string{"p0", "p1", "p2", "p3"}, graph.IntAttr("axis", 0)), sq("p0", "a")},
			inputs: map[string]*eval.Tensor{"z": randF32(r, 5, 3)}, inits: ones, outputs: []string{"a"}, noChange: true},
	})
}

func TestDropDead(t *testing.T) {
	r := rand.New(rand.NewPCG(17, 18))
	x := map[string]*eval.Tensor{"x": randF32(r, 3)}
	runRuleCases(t, []Rule{DropDead}, []ruleCase{
		{name: "dead chain", nodes: []*pb.NodeProto{node("Neg", []string{"x"}, []string{"d1"}), node("Exp", []string{"d1"}, []string{"d2"}), node("Relu", []string{"x"}, []string{"y"})},
			inputs: x, outputs: []string{"y"}, want: map[string]int{"Neg": 0, "Exp": 0, "Relu": 1}},
		{name: "contrib node kept", nodes: []*pb.NodeProto{msNode("QuickGelu", []string{"x"}, []string{"d"}), node("Relu", []string{"x"}, []string{"y"})},
			extra: msImport, inputs: x, outputs: []string{"y"}, noChange: true},
	})
}

package canon

import (
	"math/rand/v2"
	"testing"

	"github.com/mokopt/mokopt/graph"
	"github.com/mokopt/mokopt/graph/eval"
	pb "github.com/mokopt/mokopt/graph/onnxpb"
)

func TestGatherOfTopK(t *testing.T) {
	r := rand.New(rand.NewPCG(9, 10))
	x := map[string]*eval.Tensor{"x": randF32(r, 5, 8), "z": randF32(r, 5, 8)}
	k := map[string]*eval.Tensor{"k": eval.NewInt64([]int{1}, []int64{3})}
	topk := func(outs ...string) *pb.NodeProto {
		return node("TopK", []string{"x", "k"}, outs, graph.IntAttr("axis", -1))
	}
	gather := func(data string, axis int64) *pb.NodeProto {
		return node("GatherElements", []string{data, "i"}, []string{"g"}, graph.IntAttr("axis", axis))
	}
	runRuleCases(t, []Rule{GatherOfTopK, DropIdentity, DropDead}, []ruleCase{
		{name: "indices only, scores gathered back", nodes: []*pb.NodeProto{topk("", "i"), gather("x", -1)},
			inputs: x, inits: k, outputs: []string{"g", "i"}, want: map[string]int{"TopK": 1, "GatherElements": 0}},
		{name: "values also used", nodes: []*pb.NodeProto{topk("v", "i"), gather("x", 1), node("Relu", []string{"v"}, []string{"y"})},
			inputs: x, inits: k, outputs: []string{"g", "y"}, want: map[string]int{"TopK": 1, "GatherElements": 0, "Relu": 1}},
		{name: "another tensor gathered kept", nodes: []*pb.NodeProto{topk("", "i"), gather("z", -1)},
			inputs: x, inits: k, outputs: []string{"g"}, noChange: true},
		{name: "another axis kept", nodes: []*pb.NodeProto{topk("", "i"), gather("x", 0)},
			inputs: map[string]*eval.Tensor{"x": randF32(r, 8, 8)}, inits: k, outputs: []string{"g"}, noChange: true},
	})
}

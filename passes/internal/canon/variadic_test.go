package canon

import (
	"math/rand/v2"
	"testing"

	"github.com/mokopt/mokopt/graph/eval"
	pb "github.com/mokopt/mokopt/graph/onnxpb"
)

func TestSumToAdd(t *testing.T) {
	r := rand.New(rand.NewPCG(16, 17))
	x := map[string]*eval.Tensor{"a": randF32(r, 3, 4), "b": randF32(r, 3, 4), "c": randF32(r, 4)}
	runRuleCases(t, []Rule{SumToAdd, DropDead}, []ruleCase{
		{name: "two inputs", nodes: []*pb.NodeProto{node("Sum", []string{"a", "b"}, []string{"y"})},
			inputs: x, outputs: []string{"y"}, want: map[string]int{"Add": 1, "Sum": 0}},
		{name: "three, broadcasting", nodes: []*pb.NodeProto{node("Sum", []string{"a", "b", "c"}, []string{"y"})},
			inputs: x, outputs: []string{"y"}, want: map[string]int{"Add": 2, "Sum": 0}},
		{name: "one input left to single-input-variadic", nodes: []*pb.NodeProto{node("Sum", []string{"a"}, []string{"y"})},
			inputs: x, outputs: []string{"y"}, noChange: true},
	})
}

package canon

import (
	"math"
	"math/rand/v2"
	"testing"

	"github.com/mokopt/mokopt/graph/eval"
	pb "github.com/mokopt/mokopt/graph/onnxpb"
)

func TestWhereOfNot(t *testing.T) {
	r := rand.New(rand.NewPCG(42, 43))
	a := randF32(r, 3, 4)
	a.F32[0] = float32(math.NaN())
	x := map[string]*eval.Tensor{"a": a, "b": randF32(r, 3, 4), "t": eval.NewFloat32([]int{}, []float32{0.25}), "c": randF32(r, 3, 4)}
	cases := []ruleCase{
		{name: "where of not", nodes: []*pb.NodeProto{node("Greater", []string{"a", "t"}, []string{"m"}),
			node("Not", []string{"m"}, []string{"n"}), node("Where", []string{"n", "b", "c"}, []string{"y"})},
			inputs: x, outputs: []string{"y"}, want: map[string]int{"Where": 1, "Not": 0}},
		{name: "where of not, the not also read", nodes: []*pb.NodeProto{node("Greater", []string{"a", "t"}, []string{"m"}),
			node("Not", []string{"m"}, []string{"n"}), node("Where", []string{"n", "b", "c"}, []string{"y"})},
			inputs: x, outputs: []string{"y", "n"}, want: map[string]int{"Where": 1, "Not": 1}},
		{name: "where of a comparison kept", nodes: []*pb.NodeProto{node("Greater", []string{"a", "t"}, []string{"m"}),
			node("Where", []string{"m", "b", "c"}, []string{"y"})}, inputs: x, outputs: []string{"y"}, noChange: true},
	}
	runRuleCases(t, []Rule{WhereOfNot, DropDead}, cases)
}

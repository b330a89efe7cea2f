package canon

import (
	"math/rand/v2"
	"testing"

	"github.com/mokopt/mokopt/graph/eval"
	pb "github.com/mokopt/mokopt/graph/onnxpb"
)

func TestCastLikeToCast(t *testing.T) {
	r := rand.New(rand.NewPCG(3, 4))
	runRuleCases(t, []Rule{CastLikeToCast}, []ruleCase{
		{name: "like a double input", nodes: []*pb.NodeProto{node("CastLike", []string{"x", "d"}, []string{"y"})},
			inputs: map[string]*eval.Tensor{"x": randF32(r, 4), "d": eval.NewFloat64([]int{1}, []float64{0})}, outputs: []string{"y"},
			want: map[string]int{"CastLike": 0, "Cast": 1}},
		{name: "like an int64 constant", nodes: []*pb.NodeProto{node("CastLike", []string{"x", "k"}, []string{"y"})},
			inputs: map[string]*eval.Tensor{"x": randF32(r, 4)}, inits: map[string]*eval.Tensor{"k": eval.ScalarInt64(1)}, outputs: []string{"y"},
			want: map[string]int{"CastLike": 0, "Cast": 1}},
		{name: "type followed through producers", nodes: []*pb.NodeProto{node("Exp", []string{"x"}, []string{"u"}), node("CastLike", []string{"x", "v"}, []string{"y"}), node("Relu", []string{"u"}, []string{"v"})},
			inputs: map[string]*eval.Tensor{"x": randF32(r, 4)}, outputs: []string{"y"}, want: map[string]int{"CastLike": 0}},
	})
}

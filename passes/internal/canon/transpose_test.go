package canon

import (
	"math/rand/v2"
	"testing"

	"github.com/mokopt/mokopt/graph"
	"github.com/mokopt/mokopt/graph/eval"
	pb "github.com/mokopt/mokopt/graph/onnxpb"
)

func TestTransposeOfMatMul(t *testing.T) {
	r := rand.New(rand.NewPCG(22, 23))
	x := map[string]*eval.Tensor{"x": randF32(r, 3, 8)}
	k := map[string]*eval.Tensor{"w": randF32(r, 8, 5)}
	perm := graph.IntsAttr("perm", 1, 0)
	runRuleCases(t, []Rule{TransposeOfMatMul, DropDead}, []ruleCase{
		{name: "(w^T x^T)^T", nodes: []*pb.NodeProto{node("Transpose", []string{"w"}, []string{"wt"}, perm),
			node("Transpose", []string{"x"}, []string{"xt"}, perm), node("MatMul", []string{"wt", "xt"}, []string{"yt"}),
			node("Transpose", []string{"yt"}, []string{"y"}, perm)},
			inputs: x, inits: k, outputs: []string{"y"}, want: map[string]int{"MatMul": 1, "Transpose": 0}},
		{name: "one operand transposed", nodes: []*pb.NodeProto{node("Transpose", []string{"x"}, []string{"xt"}, perm),
			node("MatMul", []string{"wtt", "xt"}, []string{"yt"}), node("Transpose", []string{"yt"}, []string{"y"}, perm)},
			inputs: x, inits: map[string]*eval.Tensor{"wtt": randF32(r, 5, 8)}, outputs: []string{"y"}, want: map[string]int{"MatMul": 1, "Transpose": 1}},
		{name: "2-D transposes without perm (axes reversed)", nodes: []*pb.NodeProto{node("Transpose", []string{"w"}, []string{"wt"}),
			node("Transpose", []string{"x"}, []string{"xt"}), node("MatMul", []string{"wt", "xt"}, []string{"yt"}),
			node("Transpose", []string{"yt"}, []string{"y"})},
			inputs: x, inits: k, outputs: []string{"y"}, want: map[string]int{"MatMul": 1, "Transpose": 0}},
		{name: "no operand transposed kept", nodes: []*pb.NodeProto{node("MatMul", []string{"x", "w"}, []string{"p"}),
			node("Transpose", []string{"p"}, []string{"y"}, perm)},
			inputs: x, inits: k, outputs: []string{"y"}, noChange: true},
	})
}

func TestUnitBatchWeight(t *testing.T) {
	r := rand.New(rand.NewPCG(28, 29))
	x3 := map[string]*eval.Tensor{"x": randF32(r, 2, 3, 8)}
	x2 := map[string]*eval.Tensor{"x": randF32(r, 3, 8)}
	w := map[string]*eval.Tensor{"w": randF32(r, 1, 8, 5), "w2": randF32(r, 2, 8, 5)}
	runRuleCases(t, []Rule{UnitBatchWeight, DropDead}, []ruleCase{
		{name: "rank-3 input by a [1, K, N] weight", nodes: []*pb.NodeProto{node("MatMul", []string{"x", "w"}, []string{"y"})},
			inputs: x3, inits: w, outputs: []string{"y"}, want: map[string]int{"MatMul": 1}},
		{name: "rank-2 input kept (the product gains an axis)", nodes: []*pb.NodeProto{node("MatMul", []string{"x", "w"}, []string{"y"})},
			inputs: x2, inits: w, outputs: []string{"y"}, noChange: true},
		{name: "a batch of two weights kept", nodes: []*pb.NodeProto{node("MatMul", []string{"x", "w2"}, []string{"y"})},
			inputs: x3, inits: w, outputs: []string{"y"}, noChange: true},
	})
}

package canon

import (
	"math/rand/v2"
	"testing"

	"github.com/mokopt/mokopt/graph"
	"github.com/mokopt/mokopt/graph/eval"
	pb "github.com/mokopt/mokopt/graph/onnxpb"
)

func TestTopKOfNeg(t *testing.T) {
	r := rand.New(rand.NewPCG(3, 4))
	x := map[string]*eval.Tensor{"x": randF32(r, 5, 8)}
	k := map[string]*eval.Tensor{"k": eval.NewInt64([]int{1}, []int64{3})}
	// Ties: every value repeated, so that the lower-index rule is exercised.
	tied := eval.NewFloat32([]int{2, 6}, []float32{1, 2, 1, 2, 0, 0, 3, 3, 3, -1, -1, 3})
	topk := func(largest int64, outs ...string) *pb.NodeProto {
		return node("TopK", []string{"n", "k"}, outs, graph.IntAttr("axis", -1), graph.IntAttr("largest", largest))
	}
	neg := node("Neg", []string{"x"}, []string{"n"})
	runRuleCases(t, []Rule{TopKOfNeg, DropDead}, []ruleCase{
		{name: "values and indices", nodes: []*pb.NodeProto{neg, topk(0, "v", "i")},
			inputs: x, inits: k, outputs: []string{"v", "i"}, want: map[string]int{"TopK": 1, "Neg": 1}},
		{name: "values negated back", nodes: []*pb.NodeProto{neg, topk(0, "v", "i"), node("Neg", []string{"v"}, []string{"y"})},
			inputs: x, inits: k, outputs: []string{"y", "i"}, want: map[string]int{"TopK": 1, "Neg": 2}},
		{name: "ties", nodes: []*pb.NodeProto{neg, topk(0, "v", "i")},
			inputs: map[string]*eval.Tensor{"x": tied}, inits: k, outputs: []string{"v", "i"}, want: map[string]int{"TopK": 1}},
		{name: "largest of the negated scores kept", nodes: []*pb.NodeProto{neg, topk(1, "v", "i")},
			inputs: x, inits: k, outputs: []string{"v", "i"}, noChange: true},
		{name: "largest of negated ids: an ascending sort", nodes: []*pb.NodeProto{neg, topk(1, "v", "i")},
			inputs: map[string]*eval.Tensor{"x": eval.NewInt64([]int{2, 6}, []int64{3, 1, 3, 0, 2, 1, 5, 5, 0, 4, 4, 1})}, inits: k,
			outputs: []string{"v", "i"}, want: map[string]int{"TopK": 1, "Neg": 1}},
		{name: "smallest of the scores kept", nodes: []*pb.NodeProto{node("TopK", []string{"x", "k"}, []string{"v", "i"}, graph.IntAttr("largest", 0))},
			inputs: x, inits: k, outputs: []string{"v", "i"}, noChange: true},
	})
}

func TestNegOfNeg(t *testing.T) {
	r := rand.New(rand.NewPCG(5, 6))
	x := map[string]*eval.Tensor{"x": randF32(r, 3, 4)}
	ids := map[string]*eval.Tensor{"x": eval.NewInt64([]int{4}, []int64{-9223372036854775808, -1, 0, 7})}
	n1 := node("Neg", []string{"x"}, []string{"a"})
	n2 := node("Neg", []string{"a"}, []string{"b"})
	relu := node("Relu", []string{"b"}, []string{"y"})
	runRuleCases(t, []Rule{NegOfNeg, DropDead}, []ruleCase{
		{name: "twice negated floats", nodes: []*pb.NodeProto{n1, n2, relu},
			inputs: x, outputs: []string{"y"}, want: map[string]int{"Neg": 0, "Relu": 1}},
		{name: "inner value still read", nodes: []*pb.NodeProto{n1, n2, relu},
			inputs: x, outputs: []string{"y", "a"}, want: map[string]int{"Neg": 1, "Relu": 1}},
		{name: "integers, the most negative included", nodes: []*pb.NodeProto{n1, n2, node("Abs", []string{"b"}, []string{"y"})},
			inputs: ids, outputs: []string{"y"}, want: map[string]int{"Neg": 0, "Abs": 1}},
		{name: "one Neg kept", nodes: []*pb.NodeProto{n1, node("Relu", []string{"a"}, []string{"y"})},
			inputs: x, outputs: []string{"y"}, noChange: true},
	})
}

package canon

import (
	"math/rand/v2"
	"testing"

	"github.com/mokopt/mokopt/graph"
	"github.com/mokopt/mokopt/graph/eval"
	pb "github.com/mokopt/mokopt/graph/onnxpb"
)

func TestStaticDim(t *testing.T) {
	r := rand.New(rand.NewPCG(7, 8))
	x := map[string]*eval.Tensor{"x": randF32(r, 5, 3)}
	w := map[string]*eval.Tensor{"w": randF32(r, 3, 4), "wt": randF32(r, 4, 3),
		"one": eval.NewInt64([]int{1}, []int64{1}), "last": eval.ScalarInt64(-1), "zero": eval.NewInt64([]int{1}, []int64{0})}
	// The router's scores: x·w, softmaxed; their shape is not declared.
	scores := func(mm *pb.NodeProto) []*pb.NodeProto {
		return []*pb.NodeProto{mm, node("Softmax", []string{"l"}, []string{"p"}, graph.IntAttr("axis", -1)),
			node("Shape", []string{"p"}, []string{"s"})}
	}
	mm := node("MatMul", []string{"x", "w"}, []string{"l"})
	gemm := node("Gemm", []string{"x", "wt"}, []string{"l"}, graph.IntAttr("transB", 1))
	dim := func(i string) *pb.NodeProto { return node("Gather", []string{"s", i}, []string{"d"}) }
	// The dimension is used as a TopK's k so that the model computes with it.
	topk := node("TopK", []string{"p", "d"}, []string{"v", "i"}, graph.IntAttr("axis", -1))
	runRuleCases(t, []Rule{StaticDim, DropDead}, []ruleCase{
		{name: "columns of a MatMul", nodes: append(scores(mm), dim("one"), topk), inputs: x, inits: w,
			outputs: []string{"v", "i"}, want: map[string]int{"Gather": 0, "Shape": 0}},
		{name: "scalar index -1, Gemm transB", nodes: append(scores(gemm), node("Unsqueeze", []string{"d0", "zero"}, []string{"d"}),
			node("Gather", []string{"s", "last"}, []string{"d0"}), topk), inputs: x, inits: w,
			outputs: []string{"v", "i"}, want: map[string]int{"Gather": 0}},
		{name: "number of tokens (dynamic) kept", nodes: append(scores(mm), dim("zero"),
			node("TopK", []string{"p", "d"}, []string{"v", "i"}, graph.IntAttr("axis", 0))), inputs: x, inits: w,
			outputs: []string{"v", "i"}, noChange: true},
	})
}

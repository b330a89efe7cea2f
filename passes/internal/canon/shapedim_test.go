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
		"w3": randF32(r, 3, 3, 4), "ar": eval.NewInt64([]int{3}, []int64{0, 1, 2}), "m1": eval.NewInt64([]int{1}, []int64{-1}),
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
	// Each token's expert weight gathered from a stacked constant (what an
	// unoptimized dynamo export writes), nothing declared: q = x·w3[argmax x]
	// is [5, 4], its columns followed back through Squeeze, MatMul, GatherND
	// (whose rank needs its index depth, 1) and Unsqueeze.
	gathered := []*pb.NodeProto{node("ArgMax", []string{"x"}, []string{"sel"}, graph.IntAttr("axis", 1), graph.IntAttr("keepdims", 0)),
		node("Unsqueeze", []string{"sel", "m1"}, []string{"ind"}), node("GatherND", []string{"w3", "ind"}, []string{"g"}),
		node("Unsqueeze", []string{"x", "one"}, []string{"xu"}), node("MatMul", []string{"xu", "g"}, []string{"y"}),
		node("Squeeze", []string{"y", "one"}, []string{"q"})}
	through := func(last ...*pb.NodeProto) []*pb.NodeProto {
		return append(append(append([]*pb.NodeProto{}, gathered...), last...), node("Shape", []string{"p"}, []string{"s"}))
	}
	runRuleCases(t, []Rule{StaticDim, DropDead}, []ruleCase{
		{name: "columns of a gathered expert weight", nodes: append(through(node("Softmax", []string{"q"}, []string{"p"})), dim("one"), topk),
			inputs: x, inits: w, outputs: []string{"v", "i"}, want: map[string]int{"Gather": 0, "Shape": 0}},
		{name: "broadcast against the expert ids", nodes: []*pb.NodeProto{
			node("ArgMax", []string{"x"}, []string{"sel"}, graph.IntAttr("axis", 1), graph.IntAttr("keepdims", 0)),
			node("Unsqueeze", []string{"sel", "m1"}, []string{"ind"}), node("Equal", []string{"ind", "ar"}, []string{"eq"}),
			node("Cast", []string{"eq"}, []string{"p"}, graph.IntAttr("to", int64(pb.TensorProto_FLOAT))),
			node("Shape", []string{"p"}, []string{"s"}), dim("one"), topk},
			inputs: x, inits: w, outputs: []string{"v", "i"}, want: map[string]int{"Gather": 0, "Shape": 0}},
		{name: "concatenated along the axis", nodes: append(through(node("Concat", []string{"q", "q"}, []string{"p"}, graph.IntAttr("axis", -1))),
			dim("one"), topk), inputs: x, inits: w, outputs: []string{"v", "i"}, want: map[string]int{"Gather": 0, "Shape": 0}},
		{name: "transposed", nodes: append(through(node("Transpose", []string{"q"}, []string{"p"}, graph.IntsAttr("perm", 1, 0))),
			dim("zero"), node("TopK", []string{"p", "d"}, []string{"v", "i"}, graph.IntAttr("axis", 0))), inputs: x, inits: w,
			outputs: []string{"v", "i"}, want: map[string]int{"Gather": 0, "Shape": 0}},
		{name: "tokens of a gathered weight (dynamic) kept", nodes: append(through(node("Softmax", []string{"q"}, []string{"p"})), dim("zero"),
			node("TopK", []string{"p", "d"}, []string{"v", "i"}, graph.IntAttr("axis", 0))), inputs: x, inits: w,
			outputs: []string{"v", "i"}, noChange: true, tokens: true},
		{name: "columns of a MatMul", nodes: append(scores(mm), dim("one"), topk), inputs: x, inits: w,
			outputs: []string{"v", "i"}, want: map[string]int{"Gather": 0, "Shape": 0}},
		{name: "scalar index -1, Gemm transB", nodes: append(scores(gemm), node("Unsqueeze", []string{"d0", "zero"}, []string{"d"}),
			node("Gather", []string{"s", "last"}, []string{"d0"}), topk), inputs: x, inits: w,
			outputs: []string{"v", "i"}, want: map[string]int{"Gather": 0}},
		{name: "number of tokens (dynamic) kept", nodes: append(scores(mm), dim("zero"),
			node("TopK", []string{"p", "d"}, []string{"v", "i"}, graph.IntAttr("axis", 0))), inputs: x, inits: w,
			outputs: []string{"v", "i"}, noChange: true, tokens: true},
	})
}

package canon

import (
	"math/rand/v2"
	"testing"

	"github.com/mokopt/mokopt/graph"
	"github.com/mokopt/mokopt/graph/eval"
	pb "github.com/mokopt/mokopt/graph/onnxpb"
)

func TestSequenceToSplit(t *testing.T) {
	r := rand.New(rand.NewPCG(5, 6))
	x := map[string]*eval.Tensor{"x": randF32(r, 2, 6)}
	// cols returns columns [lo, hi) of x (axis 1); row returns row i of x
	// without its axis (axis 0, keepdims 0): the truth SplitToSequence
	// and SequenceAt stand for.
	cols := func(lo, hi int) *eval.Tensor {
		var v []float32
		for i := range 2 {
			v = append(v, x["x"].F32[i*6+lo:i*6+hi]...)
		}
		return eval.NewFloat32([]int{2, hi - lo}, v)
	}
	row := func(i int) *eval.Tensor { return eval.NewFloat32([]int{6}, x["x"].F32[i*6:i*6+6]) }
	ref := func(m map[string]*eval.Tensor) func(map[string]*eval.Tensor) map[string]*eval.Tensor {
		return func(map[string]*eval.Tensor) map[string]*eval.Tensor { return m }
	}
	at := func(i int64, out string) []*pb.NodeProto {
		k := out + "_i"
		return []*pb.NodeProto{node("Constant", nil, []string{k}, graph.IntAttr("value_int", i)), node("SequenceAt", []string{"s", k}, []string{out})}
	}
	cat := func(ns ...[]*pb.NodeProto) []*pb.NodeProto {
		var out []*pb.NodeProto
		for _, n := range ns {
			out = append(out, n...)
		}
		return out
	}
	sizes := map[string]*eval.Tensor{"sz": eval.NewInt64([]int{2}, []int64{2, 4})}
	wProj := randF32(r, 6, 4)
	hCols := func(lo, hi int) *eval.Tensor { // columns [lo, hi) of x·wProj
		var v []float32
		for i := range 2 {
			for j := lo; j < hi; j++ {
				var acc float32
				for k := range 6 {
					acc += x["x"].F32[i*6+k] * wProj.F32[k*4+j]
				}
				v = append(v, acc)
			}
		}
		return eval.NewFloat32([]int{2, hi - lo}, v)
	}
	runRuleCases(t, []Rule{SequenceToSplit}, []ruleCase{
		{name: "explicit sizes", nodes: cat([]*pb.NodeProto{node("SplitToSequence", []string{"x", "sz"}, []string{"s"}, graph.IntAttr("axis", 1))}, at(0, "a"), at(-1, "b")),
			inputs: x, inits: sizes, outputs: []string{"a", "b"}, want: map[string]int{"SplitToSequence": 0, "SequenceAt": 0, "Split": 1},
			ref: ref(map[string]*eval.Tensor{"a": cols(0, 2), "b": cols(2, 6)})},
		{name: "chunk size", nodes: cat([]*pb.NodeProto{node("SplitToSequence", []string{"x", "c"}, []string{"s"}, graph.IntAttr("axis", -1))}, at(2, "a"), at(0, "b")),
			inputs: x, inits: map[string]*eval.Tensor{"c": eval.ScalarInt64(2)}, outputs: []string{"a", "b"}, want: map[string]int{"Split": 1},
			ref: ref(map[string]*eval.Tensor{"a": cols(4, 6), "b": cols(0, 2)})},
		{name: "chunks of an undeclared projection", nodes: cat([]*pb.NodeProto{node("MatMul", []string{"x", "w"}, []string{"h"}),
			node("SplitToSequence", []string{"h", "c"}, []string{"s"}, graph.IntAttr("axis", -1))}, at(1, "a"), at(0, "b")),
			inputs: x, inits: map[string]*eval.Tensor{"c": eval.ScalarInt64(2), "w": wProj}, outputs: []string{"a", "b"},
			want: map[string]int{"SplitToSequence": 0, "Split": 1}, ref: ref(map[string]*eval.Tensor{"a": hCols(2, 4), "b": hCols(0, 2)})},
		{name: "pieces of one squeezed", nodes: cat([]*pb.NodeProto{node("SplitToSequence", []string{"x"}, []string{"s"}, graph.IntAttr("axis", 0), graph.IntAttr("keepdims", 0))}, at(1, "a")),
			inputs: x, outputs: []string{"a"}, want: map[string]int{"Split": 1, "Squeeze": 1},
			ref: ref(map[string]*eval.Tensor{"a": row(1)})},
		{name: "same position read twice", nodes: cat([]*pb.NodeProto{node("SplitToSequence", []string{"x", "sz"}, []string{"s"}, graph.IntAttr("axis", 1))}, at(1, "a"), at(1, "b")),
			inputs: x, inits: sizes, outputs: []string{"a", "b"}, want: map[string]int{"Split": 1, "Identity": 1},
			ref: ref(map[string]*eval.Tensor{"a": cols(2, 6), "b": cols(2, 6)})},
		{name: "opset 11 split attribute", opset: 11, nodes: cat([]*pb.NodeProto{node("SplitToSequence", []string{"x", "sz"}, []string{"s"}, graph.IntAttr("axis", 1))}, at(0, "a")),
			inputs: x, inits: sizes, outputs: []string{"a"}, want: map[string]int{"Split": 1},
			ref: ref(map[string]*eval.Tensor{"a": cols(0, 2)})},
		{name: "sizes computed", nodes: cat([]*pb.NodeProto{node("Abs", []string{"szin"}, []string{"szc"}), node("SplitToSequence", []string{"x", "szc"}, []string{"s"}, graph.IntAttr("axis", 1))}, at(0, "a"), at(1, "b")),
			inputs: map[string]*eval.Tensor{"x": x["x"], "szin": eval.NewInt64([]int{2}, []int64{-2, 4})}, outputs: []string{"a", "b"}, want: map[string]int{"SplitToSequence": 0, "Split": 1},
			ref: ref(map[string]*eval.Tensor{"a": cols(0, 2), "b": cols(2, 6)})},
		{name: "position not constant kept", nodes: []*pb.NodeProto{node("SplitToSequence", []string{"x", "sz"}, []string{"s"}, graph.IntAttr("axis", 1)), node("SequenceAt", []string{"s", "p"}, []string{"a"})},
			inputs: map[string]*eval.Tensor{"x": x["x"], "p": eval.ScalarInt64(0)}, inits: sizes, outputs: []string{"a"}, noChange: true},
	})
}

func TestConstructToConcat(t *testing.T) {
	r := rand.New(rand.NewPCG(56, 57))
	x := map[string]*eval.Tensor{"a": randF32(r, 2, 3), "b": randF32(r, 2, 3)}
	seq := node("SequenceConstruct", []string{"a", "b"}, []string{"s"})
	runRuleCases(t, []Rule{ConstructToConcat, DropDead}, []ruleCase{
		{name: "concat", nodes: []*pb.NodeProto{seq, node("ConcatFromSequence", []string{"s"}, []string{"y"}, graph.IntAttr("axis", 1))},
			inputs: x, outputs: []string{"y"}, want: map[string]int{"Concat": 1, "SequenceConstruct": 0, "ConcatFromSequence": 0}},
		{name: "stack on the last axis", nodes: []*pb.NodeProto{seq, node("ConcatFromSequence", []string{"s"}, []string{"y"}, graph.IntAttr("axis", -1), graph.IntAttr("new_axis", 1))},
			inputs: x, outputs: []string{"y"}, want: map[string]int{"Concat": 1, "Unsqueeze": 2, "ConcatFromSequence": 0}},
		{name: "stack first, opset 11", opset: 11, nodes: []*pb.NodeProto{seq, node("ConcatFromSequence", []string{"s"}, []string{"y"}, graph.IntAttr("axis", 0), graph.IntAttr("new_axis", 1))},
			inputs: x, outputs: []string{"y"}, want: map[string]int{"Concat": 1, "Unsqueeze": 2}},
		{name: "a sequence input kept", nodes: []*pb.NodeProto{node("SplitToSequence", []string{"a"}, []string{"s"}, graph.IntAttr("axis", 0)), node("ConcatFromSequence", []string{"s"}, []string{"y"}, graph.IntAttr("axis", 0))},
			inputs: x, outputs: []string{"y"}, noChange: true},
	})
}

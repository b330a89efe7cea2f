package canon

import (
	"math/rand/v2"
	"testing"

	"github.com/mokopt/mokopt/graph"
	"github.com/mokopt/mokopt/graph/eval"
	pb "github.com/mokopt/mokopt/graph/onnxpb"
)

func TestTopKSlice(t *testing.T) {
	r := rand.New(rand.NewPCG(9, 10))
	x := map[string]*eval.Tensor{"x": randF32(r, 6, 5)}
	tied := map[string]*eval.Tensor{"x": eval.NewFloat32([]int{2, 5}, []float32{1, 2, 2, 2, 0, 3, 3, 1, 3, 3})}
	c := map[string]*eval.Tensor{"k": eval.NewInt64([]int{1}, []int64{5}), "z": eval.NewInt64([]int{1}, []int64{0}),
		"e": eval.NewInt64([]int{1}, []int64{2}), "a": eval.NewInt64([]int{1}, []int64{1}), "s": eval.NewInt64([]int{1}, []int64{1}),
		"a0": eval.NewInt64([]int{1}, []int64{0}), "e1": eval.NewInt64([]int{1}, []int64{1})}
	sort := func(sorted int64) *pb.NodeProto {
		return node("TopK", []string{"x", "k"}, []string{"v", "i"}, graph.IntAttr("axis", -1), graph.IntAttr("sorted", sorted))
	}
	sl := func(in, out, start, end, axis string) *pb.NodeProto {
		return node("Slice", []string{in, start, end, axis, "s"}, []string{out})
	}
	runRuleCases(t, []Rule{TopKSlice, DropDead}, []ruleCase{
		{name: "sort then first 2", nodes: []*pb.NodeProto{sort(1), sl("v", "v2", "z", "e", "a"), sl("i", "i2", "z", "e", "a")},
			inputs: x, inits: c, outputs: []string{"v2", "i2"}, want: map[string]int{"TopK": 1, "Slice": 0}},
		{name: "ties", nodes: []*pb.NodeProto{sort(1), sl("v", "v2", "z", "e", "a"), sl("i", "i2", "z", "e", "a")},
			inputs: tied, inits: c, outputs: []string{"v2", "i2"}, want: map[string]int{"TopK": 1, "Slice": 0}},
		{name: "indices only", nodes: []*pb.NodeProto{sort(1), sl("i", "i2", "z", "e", "a")},
			inputs: x, inits: c, outputs: []string{"i2"}, want: map[string]int{"TopK": 1, "Slice": 0}},
		{name: "different lengths kept", nodes: []*pb.NodeProto{sort(1), sl("v", "v2", "z", "e", "a"), sl("i", "i2", "z", "e1", "a")},
			inputs: x, inits: c, outputs: []string{"v2", "i2"}, noChange: true},
		{name: "not from 0 kept", nodes: []*pb.NodeProto{sort(1), sl("i", "i2", "e1", "e", "a")},
			inputs: x, inits: c, outputs: []string{"i2"}, noChange: true},
		{name: "other axis kept", nodes: []*pb.NodeProto{sort(1), sl("i", "i2", "z", "e", "a0")},
			inputs: x, inits: c, outputs: []string{"i2"}, noChange: true},
		{name: "indices read by two slices of the first 2", nodes: []*pb.NodeProto{sort(1), sl("i", "i2", "z", "e", "a"), sl("i", "i3", "z", "e", "a")},
			inputs: x, inits: c, outputs: []string{"i2", "i3"}, want: map[string]int{"TopK": 1, "Slice": 0, "Identity": 1}},
		{name: "unsorted kept", nodes: []*pb.NodeProto{sort(0), sl("i", "i2", "z", "e", "a")},
			inputs: x, inits: c, outputs: []string{"i2"}, noChange: true},
	})
}

func TestSliceOfGatherElements(t *testing.T) {
	r := rand.New(rand.NewPCG(26, 27))
	x := map[string]*eval.Tensor{"x": randF32(r, 6, 5)}
	c := map[string]*eval.Tensor{"k": eval.NewInt64([]int{1}, []int64{5}), "z": eval.NewInt64([]int{1}, []int64{0}),
		"e": eval.NewInt64([]int{1}, []int64{2}), "a": eval.NewInt64([]int{1}, []int64{1}), "a0": eval.NewInt64([]int{1}, []int64{0}),
		"s": eval.NewInt64([]int{1}, []int64{1}), "s2": eval.NewInt64([]int{1}, []int64{2}), "big": eval.NewInt64([]int{1}, []int64{9})}
	sm := node("Softmax", []string{"x"}, []string{"p"})
	sort := node("TopK", []string{"x", "k"}, []string{"v", "i"}, graph.IntAttr("axis", -1))
	gather := func(axis int64) *pb.NodeProto {
		return node("GatherElements", []string{"p", "i"}, []string{"pg"}, graph.IntAttr("axis", axis))
	}
	sl := func(in, out, start, end, axis, step string) *pb.NodeProto {
		return node("Slice", []string{in, start, end, axis, step}, []string{out})
	}
	runRuleCases(t, []Rule{SliceOfGatherElements, TopKSlice, DropDead}, []ruleCase{
		{name: "sort of the logits, probabilities gathered back, first 2", nodes: []*pb.NodeProto{sm, sort, gather(-1),
			sl("pg", "p2", "z", "e", "a", "s"), sl("i", "i2", "z", "e", "a", "s")},
			inputs: x, inits: c, outputs: []string{"p2", "i2"}, want: map[string]int{"TopK": 1, "Slice": 0, "GatherElements": 1}},
		{name: "every other entry (no top-k, the slice moves)", nodes: []*pb.NodeProto{sm, sort, gather(1), sl("pg", "y", "z", "big", "a", "s2")},
			inputs: x, inits: c, outputs: []string{"y"}, want: map[string]int{"TopK": 1, "Slice": 1, "GatherElements": 1}},
		{name: "slice over another axis kept", nodes: []*pb.NodeProto{sm, sort, gather(-1), sl("pg", "y", "z", "e", "a0", "s")},
			inputs: x, inits: c, outputs: []string{"y"}, noChange: true},
	})
}

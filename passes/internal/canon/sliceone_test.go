package canon

import (
	"math"
	"math/rand/v2"
	"testing"

	"github.com/mokopt/mokopt/graph"
	"github.com/mokopt/mokopt/graph/eval"
	pb "github.com/mokopt/mokopt/graph/onnxpb"
)

func TestSqueezeOfSliceToGather(t *testing.T) {
	r := rand.New(rand.NewPCG(48, 49))
	x := map[string]*eval.Tensor{"x": randF32(r, 5, 3)}
	i64 := func(v ...int64) *eval.Tensor { return eval.NewInt64([]int{len(v)}, v) }
	inits := map[string]*eval.Tensor{"two": i64(2), "three": i64(3), "one": i64(1), "m1": i64(-1), "big": i64(math.MaxInt64),
		"zero": i64(0), "ax1": i64(1), "ax0": i64(0), "axm1": i64(-1)}
	slice := func(st, en, ax string) *pb.NodeProto { return node("Slice", []string{"x", st, en, ax}, []string{"s"}) }
	sq := func(ax string) *pb.NodeProto { return node("Squeeze", []string{"s", ax}, []string{"y"}) }
	runRuleCases(t, []Rule{SqueezeOfSliceToGather, DropDead}, []ruleCase{
		{name: "one row", nodes: []*pb.NodeProto{slice("two", "three", "ax0"), sq("ax0")},
			inputs: x, inits: inits, outputs: []string{"y"}, want: map[string]int{"Gather": 1, "Slice": 0, "Squeeze": 0}},
		{name: "last column to the end, negative axes", nodes: []*pb.NodeProto{slice("m1", "big", "axm1"), sq("ax1")},
			inputs: x, inits: inits, outputs: []string{"y"}, want: map[string]int{"Gather": 1, "Slice": 0, "Squeeze": 0}},
		{name: "two wide kept", nodes: []*pb.NodeProto{slice("one", "three", "ax1"), node("Unsqueeze", []string{"s", "zero"}, []string{"y"})},
			inputs: x, inits: inits, outputs: []string{"y"}, noChange: true},
		{name: "another axis squeezed kept", nodes: []*pb.NodeProto{node("Slice", []string{"x", "zero", "one", "ax0"}, []string{"s0"}),
			node("Slice", []string{"s0", "zero", "one", "ax1"}, []string{"s"}), sq("ax0")},
			inputs: x, inits: inits, outputs: []string{"y"}, noChange: true},
		{name: "opset 9 attributes", opset: 9, nodes: []*pb.NodeProto{
			node("Slice", []string{"x"}, []string{"s"}, graph.IntsAttr("starts", 4), graph.IntsAttr("ends", 5), graph.IntsAttr("axes", 0)),
			node("Squeeze", []string{"s"}, []string{"y"}, graph.IntsAttr("axes", 0))},
			inputs: x, outputs: []string{"y"}, want: map[string]int{"Gather": 1, "Slice": 0, "Squeeze": 0}},
	})
}

func TestRowSplitMatMul(t *testing.T) {
	r := rand.New(rand.NewPCG(50, 51))
	x := map[string]*eval.Tensor{"x": randF32(r, 4, 6), "z": randF32(r, 4, 6)}
	i64 := func(v ...int64) *eval.Tensor { return eval.NewInt64([]int{len(v)}, v) }
	inits := map[string]*eval.Tensor{"w0": randF32(r, 3, 5), "w1": randF32(r, 3, 5), "wa": randF32(r, 2, 5), "wb": randF32(r, 2, 5), "wc": randF32(r, 2, 5),
		"p0": i64(0), "p2": i64(2), "p3": i64(3), "p4": i64(4), "p6": i64(6), "big": i64(math.MaxInt64), "ax": i64(-1), "ax1": i64(1)}
	shard := func(x, st, en, w, out string) []*pb.NodeProto {
		return []*pb.NodeProto{node("Slice", []string{x, st, en, "ax"}, []string{out + "_x"}), node("MatMul", []string{out + "_x", w}, []string{out})}
	}
	cat := func(ns ...[]*pb.NodeProto) []*pb.NodeProto {
		var out []*pb.NodeProto
		for _, n := range ns {
			out = append(out, n...)
		}
		return out
	}
	whole := map[string]int{"MatMul": 1, "Slice": 0, "Add": 0}
	runRuleCases(t, []Rule{RowSplitMatMul, DropDead}, []ruleCase{
		{name: "two halves", nodes: cat(shard("x", "p0", "p3", "w0", "a"), shard("x", "p3", "p6", "w1", "b"), []*pb.NodeProto{node("Add", []string{"a", "b"}, []string{"y"})}),
			inputs: x, inits: inits, outputs: []string{"y"}, want: whole},
		{name: "halves summed in the other order, the last to the end", nodes: cat(shard("x", "p0", "p3", "w0", "a"), shard("x", "p3", "big", "w1", "b"), []*pb.NodeProto{node("Add", []string{"b", "a"}, []string{"y"})}),
			inputs: x, inits: inits, outputs: []string{"y"}, want: whole},
		{name: "three shards", nodes: cat(shard("x", "p0", "p2", "wa", "a"), shard("x", "p2", "p4", "wb", "b"), shard("x", "p4", "p6", "wc", "c"),
			[]*pb.NodeProto{node("Add", []string{"a", "b"}, []string{"ab"}), node("Add", []string{"ab", "c"}, []string{"y"})}),
			inputs: x, inits: inits, outputs: []string{"y"}, want: whole},
		{name: "part of the features", nodes: cat(shard("x", "p0", "p2", "wa", "a"), shard("x", "p2", "p4", "wb", "b"), []*pb.NodeProto{node("Add", []string{"a", "b"}, []string{"y"})}),
			inputs: x, inits: inits, outputs: []string{"y"}, want: map[string]int{"MatMul": 1, "Slice": 1, "Add": 0}},
		{name: "a gap kept", nodes: cat(shard("x", "p0", "p2", "wa", "a"), shard("x", "p4", "p6", "wb", "b"), []*pb.NodeProto{node("Add", []string{"a", "b"}, []string{"y"})}),
			inputs: x, inits: inits, outputs: []string{"y"}, noChange: true},
		{name: "two inputs kept", nodes: cat(shard("x", "p0", "p3", "w0", "a"), shard("z", "p3", "p6", "w1", "b"), []*pb.NodeProto{node("Add", []string{"a", "b"}, []string{"y"})}),
			inputs: x, inits: inits, outputs: []string{"y"}, noChange: true},
		{name: "a shard read twice kept", nodes: cat(shard("x", "p0", "p3", "w0", "a"), shard("x", "p3", "p6", "w1", "b"), []*pb.NodeProto{node("Add", []string{"a", "b"}, []string{"y"}), node("Neg", []string{"a"}, []string{"y2"})}),
			inputs: x, inits: inits, outputs: []string{"y", "y2"}, noChange: true},
	})
}

func TestMeanTimesCount(t *testing.T) {
	r := rand.New(rand.NewPCG(52, 53))
	x := map[string]*eval.Tensor{"x": randF32(r, 4, 3, 5)}
	inits := map[string]*eval.Tensor{"three": eval.ScalarFloat32(3), "two": eval.ScalarFloat32(2), "fifteen": eval.ScalarFloat32(15),
		"ax1": eval.NewInt64([]int{1}, []int64{1}), "ax12": eval.NewInt64([]int{2}, []int64{-2, -1})}
	mean := func(attrs ...*pb.AttributeProto) *pb.NodeProto {
		return node("ReduceMean", []string{"x"}, []string{"m"}, attrs...)
	}
	runRuleCases(t, []Rule{MeanTimesCount, DropDead}, []ruleCase{
		{name: "one axis", nodes: []*pb.NodeProto{mean(graph.IntsAttr("axes", 1), graph.IntAttr("keepdims", 0)), node("Mul", []string{"m", "three"}, []string{"y"})},
			inputs: x, inits: inits, outputs: []string{"y"}, want: map[string]int{"ReduceSum": 1, "ReduceMean": 0, "Mul": 0}},
		{name: "count first, two axes kept", nodes: []*pb.NodeProto{mean(graph.IntsAttr("axes", -2, -1)), node("Mul", []string{"fifteen", "m"}, []string{"y"})},
			inputs: x, inits: inits, outputs: []string{"y"}, want: map[string]int{"ReduceSum": 1, "ReduceMean": 0, "Mul": 0}},
		{name: "opset 18 axes input", opset: 18, nodes: []*pb.NodeProto{node("ReduceMean", []string{"x", "ax12"}, []string{"m"}), node("Mul", []string{"m", "fifteen"}, []string{"y"})},
			inputs: x, inits: inits, outputs: []string{"y"}, want: map[string]int{"ReduceSum": 1, "ReduceMean": 0, "Mul": 0}},
		{name: "not the count kept", nodes: []*pb.NodeProto{mean(graph.IntsAttr("axes", 1)), node("Mul", []string{"m", "two"}, []string{"y"})},
			inputs: x, inits: inits, outputs: []string{"y"}, noChange: true},
		{name: "mean read elsewhere kept", nodes: []*pb.NodeProto{mean(graph.IntsAttr("axes", 1)), node("Mul", []string{"m", "three"}, []string{"y"}), node("Neg", []string{"m"}, []string{"y2"})},
			inputs: x, inits: inits, outputs: []string{"y", "y2"}, noChange: true},
	})
}

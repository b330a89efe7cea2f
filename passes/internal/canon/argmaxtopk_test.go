package canon

import (
	"math/rand/v2"
	"testing"

	"github.com/mokopt/mokopt/graph"
	"github.com/mokopt/mokopt/graph/eval"
	pb "github.com/mokopt/mokopt/graph/onnxpb"
)

func TestArgMaxToTopK(t *testing.T) {
	r := rand.New(rand.NewPCG(5, 6))
	x := map[string]*eval.Tensor{"x": randF32(r, 6, 4)}
	// Ties: the first of equal maxima must be selected, as ArgMax does.
	tied := map[string]*eval.Tensor{"x": eval.NewFloat32([]int{3, 4}, []float32{1, 3, 3, 0, 2, 2, 2, 2, -1, 0, -1, 0})}
	axes := map[string]*eval.Tensor{"ax": eval.NewInt64([]int{1}, []int64{-1}), "ax1": eval.NewInt64([]int{1}, []int64{1})}
	am := func(keep, last int64) *pb.NodeProto {
		return node("ArgMax", []string{"x"}, []string{"i"}, graph.IntAttr("axis", -1), graph.IntAttr("keepdims", keep), graph.IntAttr("select_last_index", last))
	}
	rmax := func(keep int64, ax string) *pb.NodeProto {
		return node("ReduceMax", []string{"x", ax}, []string{"m"}, graph.IntAttr("keepdims", keep))
	}
	gel := node("GatherElements", []string{"x", "i"}, []string{"m"}, graph.IntAttr("axis", -1))
	runRuleCases(t, []Rule{ArgMaxToTopK, DropIdentity, DropDead}, []ruleCase{
		{name: "indices only", opset: 18, nodes: []*pb.NodeProto{am(1, 0)}, inputs: x, outputs: []string{"i"},
			want: map[string]int{"TopK": 1, "ArgMax": 0}},
		{name: "keepdims=0", opset: 18, nodes: []*pb.NodeProto{am(0, 0)}, inputs: x, outputs: []string{"i"},
			want: map[string]int{"TopK": 1, "Squeeze": 1, "ArgMax": 0}},
		{name: "with ReduceMax (Switch top-1)", opset: 18, nodes: []*pb.NodeProto{rmax(1, "ax"), am(1, 0)}, inputs: x, inits: axes,
			outputs: []string{"m", "i"}, want: map[string]int{"TopK": 1, "ReduceMax": 0, "ArgMax": 0}},
		{name: "ReduceMax positive axis, keepdims=0", opset: 18, nodes: []*pb.NodeProto{rmax(0, "ax1"), am(0, 0)}, inputs: x, inits: axes,
			outputs: []string{"m", "i"}, want: map[string]int{"TopK": 1, "ReduceMax": 0, "Squeeze": 2}},
		{name: "ReduceMax axes attribute (opset 17)", opset: 17, nodes: []*pb.NodeProto{
			node("ReduceMax", []string{"x"}, []string{"m"}, graph.IntsAttr("axes", -1)), am(1, 0)}, inputs: x,
			outputs: []string{"m", "i"}, want: map[string]int{"TopK": 1, "ReduceMax": 0}},
		{name: "GatherElements at the index", opset: 18, nodes: []*pb.NodeProto{am(1, 0), gel}, inputs: x,
			outputs: []string{"m", "i"}, want: map[string]int{"TopK": 1, "GatherElements": 0}},
		{name: "ties: first index", opset: 18, nodes: []*pb.NodeProto{rmax(1, "ax"), am(1, 0)}, inputs: tied, inits: axes,
			outputs: []string{"m", "i"}, want: map[string]int{"TopK": 1}},
		{name: "ReduceMax over another axis kept", opset: 18, nodes: []*pb.NodeProto{
			node("ReduceMax", []string{"x", "ax0"}, []string{"m"}), am(1, 0)}, inputs: x,
			inits:   map[string]*eval.Tensor{"ax0": eval.NewInt64([]int{1}, []int64{0})},
			outputs: []string{"m", "i"}, want: map[string]int{"TopK": 1, "ReduceMax": 1}},
		{name: "select_last_index=1 kept", opset: 18, nodes: []*pb.NodeProto{am(1, 1)}, inputs: tied, outputs: []string{"i"}, noChange: true},
		{name: "iterative pick kept", opset: 18, nodes: []*pb.NodeProto{am(1, 0),
			node("ScatterElements", []string{"x", "i", "neg"}, []string{"x2"}, graph.IntAttr("axis", -1))}, inputs: x,
			inits:   map[string]*eval.Tensor{"neg": eval.NewFloat32([]int{6, 1}, []float32{-9, -9, -9, -9, -9, -9})},
			outputs: []string{"x2", "i"}, noChange: true},
		{name: "iterative pick on masked scores kept", opset: 18, nodes: []*pb.NodeProto{am(1, 0),
			node("Mul", []string{"x", "two"}, []string{"xs"}),
			node("ScatterElements", []string{"xs", "i", "neg"}, []string{"x2"}, graph.IntAttr("axis", -1))}, inputs: x,
			inits: map[string]*eval.Tensor{"neg": eval.NewFloat32([]int{6, 1}, []float32{-9, -9, -9, -9, -9, -9}),
				"two": eval.NewFloat32(nil, []float32{2})},
			outputs: []string{"x2", "i"}, noChange: true},
		// A top-1 router writing its weight into a tensor made from the
		// scores' shape only (Llama 4's scatter into -inf): no chain.
		{name: "scatter into a tensor of x's shape", opset: 18, nodes: []*pb.NodeProto{am(1, 0), rmax(1, "ax"),
			node("Shape", []string{"x"}, []string{"s"}),
			node("ConstantOfShape", []string{"s"}, []string{"full"}),
			node("ScatterElements", []string{"full", "i", "m"}, []string{"y"}, graph.IntAttr("axis", -1))}, inputs: x, inits: axes,
			outputs: []string{"y"}, want: map[string]int{"TopK": 1, "ArgMax": 0, "ReduceMax": 0}},
	})
}

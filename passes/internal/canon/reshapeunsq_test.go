package canon

import (
	"math/rand/v2"
	"testing"

	"github.com/mokopt/mokopt/graph"
	"github.com/mokopt/mokopt/graph/eval"
	pb "github.com/mokopt/mokopt/graph/onnxpb"
)

func TestReshapeOfOwnShape(t *testing.T) {
	r := rand.New(rand.NewPCG(20, 21))
	x := map[string]*eval.Tensor{"x": randF32(r, 2, 3, 4)}
	ints := func(v ...int64) *eval.Tensor { return eval.NewInt64([]int{len(v)}, v) }
	k := map[string]*eval.Tensor{"z": ints(0), "a1": ints(1), "e3": ints(3), "one": ints(1), "m1": ints(-1), "i2": ints(2)}
	shape := node("Shape", []string{"x"}, []string{"s"})
	head := node("Slice", []string{"s", "z", "a1"}, []string{"h"})
	tail := node("Slice", []string{"s", "a1", "e3"}, []string{"t"})
	reshape := func(target string) *pb.NodeProto { return node("Reshape", []string{"x", target}, []string{"y"}) }
	runRuleCases(t, []Rule{ReshapeOfOwnShape, DropDead}, []ruleCase{
		{name: "one inserted at axis 1", opset: 18, nodes: []*pb.NodeProto{shape, head, tail,
			node("Concat", []string{"h", "one", "t"}, []string{"c"}, graph.IntAttr("axis", 0)), reshape("c")},
			inputs: x, inits: k, outputs: []string{"y"}, tokens: true, want: map[string]int{"Unsqueeze": 1, "Reshape": 0, "Shape": 0}},
		{name: "one appended, shape sliced by start", opset: 18, nodes: []*pb.NodeProto{
			node("Shape", []string{"x"}, []string{"s"}, graph.IntAttr("end", 3)),
			node("Concat", []string{"s", "one"}, []string{"c"}, graph.IntAttr("axis", 0)), reshape("c")},
			inputs: x, inits: k, outputs: []string{"y"}, tokens: true, want: map[string]int{"Unsqueeze": 1, "Reshape": 0}},
		{name: "own shape: dropped", opset: 18, nodes: []*pb.NodeProto{shape, reshape("s"), node("Relu", []string{"y"}, []string{"o"})},
			inputs: x, inits: k, outputs: []string{"o"}, tokens: true, want: map[string]int{"Reshape": 0, "Relu": 1}},
		{name: "constant target of a static shape, ones inserted", opset: 18, nodes: []*pb.NodeProto{reshape("c3")},
			inputs: x, inits: map[string]*eval.Tensor{"c3": ints(2, 1, 3, 4, 1)}, outputs: []string{"y"}, want: map[string]int{"Unsqueeze": 1, "Reshape": 0}},
		{name: "constant target merging dims kept", opset: 18, nodes: []*pb.NodeProto{reshape("c3")},
			inputs: x, inits: map[string]*eval.Tensor{"c3": ints(6, 4)}, outputs: []string{"y"}, noChange: true},
		{name: "leading dims merged kept", opset: 18, nodes: []*pb.NodeProto{shape,
			node("Slice", []string{"s", "i2", "e3"}, []string{"t"}),
			node("Concat", []string{"m1", "t"}, []string{"c"}, graph.IntAttr("axis", 0)), reshape("c")},
			inputs: x, inits: k, outputs: []string{"y"}, tokens: true, noChange: true},
		{name: "axes reordered kept", opset: 18, nodes: []*pb.NodeProto{shape, head, tail,
			node("Concat", []string{"t", "h"}, []string{"c"}, graph.IntAttr("axis", 0)), reshape("c")},
			inputs: x, inits: k, outputs: []string{"y"}, tokens: true, noChange: true},
		{name: "shape of another tensor kept", opset: 18, nodes: []*pb.NodeProto{node("Shape", []string{"u"}, []string{"s"}), head, tail,
			node("Concat", []string{"h", "one", "t"}, []string{"c"}, graph.IntAttr("axis", 0)), reshape("c")},
			inputs: map[string]*eval.Tensor{"x": randF32(r, 2, 3, 4), "u": randF32(r, 2, 3, 4)}, inits: k, outputs: []string{"y"}, tokens: true, noChange: true},
	})
}

package canon

import (
	"testing"

	"github.com/mokopt/mokopt/graph"
	"github.com/mokopt/mokopt/graph/eval"
	pb "github.com/mokopt/mokopt/graph/onnxpb"
)

// TestRankInference checks the ranks Work.Rank follows back through
// producers when no shape is declared: x is declared [2, 3] and every
// other value is undeclared.
func TestRankInference(t *testing.T) {
	i64 := func(v ...int64) *eval.Tensor { return eval.NewInt64([]int{len(v)}, v) }
	cases := []struct {
		name  string
		nodes []*pb.NodeProto
		inits map[string]*eval.Tensor
		want  int // -1: unknown
	}{
		{"expand to a longer shape", []*pb.NodeProto{node("Expand", []string{"x", "s"}, []string{"v"})}, map[string]*eval.Tensor{"s": i64(4, 2, 3)}, 3},
		{"expand to a shorter shape", []*pb.NodeProto{node("Expand", []string{"x", "s"}, []string{"v"})}, map[string]*eval.Tensor{"s": i64(3)}, 2},
		{"expand to a computed shape of rank 4", []*pb.NodeProto{
			node("Reshape", []string{"x", "s"}, []string{"r"}), node("Shape", []string{"r"}, []string{"sh"}), node("Expand", []string{"x", "sh"}, []string{"v"})},
			map[string]*eval.Tensor{"s": i64(1, 2, 1, 3)}, 4},
		{"argmax keepdims", []*pb.NodeProto{node("ArgMax", []string{"x"}, []string{"v"}, graph.IntAttr("axis", -1))}, nil, 2},
		{"argmax without keepdims", []*pb.NodeProto{node("ArgMax", []string{"x"}, []string{"v"}, graph.IntAttr("keepdims", 0))}, nil, 1},
		{"scatter elements keeps the data's rank", []*pb.NodeProto{
			node("ArgMax", []string{"x"}, []string{"i"}, graph.IntAttr("axis", -1)),
			node("ScatterElements", []string{"x", "i", "u"}, []string{"v"}, graph.IntAttr("axis", -1))},
			map[string]*eval.Tensor{"u": eval.NewFloat32([]int{2, 1}, []float32{0, 0})}, 2},
		{"where broadcasts", []*pb.NodeProto{
			node("Greater", []string{"x", "z"}, []string{"c"}), node("Where", []string{"c", "z", "x"}, []string{"v"})},
			map[string]*eval.Tensor{"z": eval.NewFloat32(nil, []float32{0})}, 2},
		{"reduce all without keepdims", []*pb.NodeProto{node("ReduceMax", []string{"x"}, []string{"v"}, graph.IntAttr("keepdims", 0))}, nil, 0},
		{"reduce an axis attribute without keepdims", []*pb.NodeProto{node("ReduceMax", []string{"x"}, []string{"v"}, graph.IntAttr("keepdims", 0), graph.IntsAttr("axes", 1))}, nil, 1},
		{"reduce constant axes input without keepdims", []*pb.NodeProto{node("ReduceSum", []string{"x", "a"}, []string{"v"}, graph.IntAttr("keepdims", 0))}, map[string]*eval.Tensor{"a": i64(0)}, 1},
		{"reduce computed axes without keepdims unknown", []*pb.NodeProto{
			node("ArgMax", []string{"x"}, []string{"a"}, graph.IntAttr("keepdims", 0)), node("ReduceSum", []string{"x", "a"}, []string{"v"}, graph.IntAttr("keepdims", 0))}, nil, -1},
		{"reduce keepdims", []*pb.NodeProto{node("ReduceSum", []string{"x", "a"}, []string{"v"})}, map[string]*eval.Tensor{"a": i64(0)}, 2},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			rc := ruleCase{nodes: c.nodes, inputs: map[string]*eval.Tensor{"x": eval.NewFloat32([]int{2, 3}, make([]float32, 6))}, inits: c.inits, outputs: []string{"v"}}
			w := NewWork(rc.model(t), Options{})
			r, ok := w.Rank("v")
			if c.want < 0 {
				if ok {
					t.Fatalf("rank %d, want unknown", r)
				}
				return
			}
			if !ok || r != c.want {
				t.Fatalf("rank %d (known %v), want %d", r, ok, c.want)
			}
		})
	}
}

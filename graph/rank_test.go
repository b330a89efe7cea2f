package graph

import (
	"testing"

	pb "github.com/mokopt/mokopt/graph/onnxpb"
)

// mapRanks is a RankSource over a node list, declared ranks and integer
// constants.
type mapRanks struct {
	nodes  []*pb.NodeProto
	known  map[string]int
	consts map[string][]int64
}

func (m mapRanks) Producer(v string) *pb.NodeProto {
	for _, n := range m.nodes {
		for _, o := range n.Output {
			if o == v {
				return n
			}
		}
	}
	return nil
}

func (m mapRanks) KnownRank(v string) (int, bool) {
	if _, ok := m.consts[v]; ok {
		return 1, true
	}
	r, ok := m.known[v]
	return r, ok
}

func (m mapRanks) ConstInts(v string) ([]int64, bool) {
	c, ok := m.consts[v]
	return c, ok
}

// TestInferRank: x is declared of rank 3, idx of rank 2, s = [0, -1] and
// a = [1] are constants; every other value is worked out or unknown.
func TestInferRank(t *testing.T) {
	cases := []struct {
		name  string
		nodes []*pb.NodeProto
		want  int // -1: unknown
	}{
		{"declared", nil, 3},
		{"reshape to a constant shape", []*pb.NodeProto{NewNode("Reshape", "", "r", []string{"x", "s"}, []string{"v"})}, 2},
		{"reshape to a measured and concatenated shape", []*pb.NodeProto{
			NewNode("Shape", "", "sh", []string{"x"}, []string{"xs"}), NewNode("Concat", "", "c", []string{"xs", "a"}, []string{"s2"}),
			NewNode("Reshape", "", "r", []string{"idx", "s2"}, []string{"v"})}, 4},
		{"reshape to a concatenated slice of a shape", []*pb.NodeProto{
			NewNode("Shape", "", "sh", []string{"x"}, []string{"xs"}, IntAttr("start", 1)), NewNode("Concat", "", "c", []string{"xs", "a"}, []string{"s2"}),
			NewNode("Reshape", "", "r", []string{"idx", "s2"}, []string{"v"})}, 3},
		{"gather rows by a 2-D index", []*pb.NodeProto{NewNode("Gather", "", "g", []string{"x", "idx"}, []string{"v"})}, 4},
		{"matmul broadcasts", []*pb.NodeProto{NewNode("MatMul", "", "m", []string{"x", "idx"}, []string{"v"})}, 3},
		{"einsum with an ellipsis", []*pb.NodeProto{NewNode("Einsum", "", "e", []string{"x", "idx"}, []string{"v"}, StringAttr("equation", "...i,ij->...j"))}, 3},
		{"einsum, letters", []*pb.NodeProto{NewNode("Einsum", "", "e", []string{"x", "idx"}, []string{"v"}, StringAttr("equation", "bti,ij -> bj"))}, 2},
		{"einsum without an output term unknown", []*pb.NodeProto{NewNode("Einsum", "", "e", []string{"x", "idx"}, []string{"v"}, StringAttr("equation", "bti,ij"))}, -1},
		{"unsqueeze by constant axes", []*pb.NodeProto{NewNode("Unsqueeze", "", "u", []string{"x", "a"}, []string{"v"})}, 4},
		{"squeeze without axes unknown", []*pb.NodeProto{NewNode("Squeeze", "", "q", []string{"x"}, []string{"v"})}, -1},
		{"topk indices keep the rank", []*pb.NodeProto{NewNode("TopK", "", "k", []string{"x", "a"}, []string{"vals", "v"})}, 3},
		{"second output of another op unknown", []*pb.NodeProto{NewNode("LayerNormalization", "", "l", []string{"x"}, []string{"y", "v"})}, -1},
		{"contrib normalization keeps the rank", []*pb.NodeProto{NewNode("SimplifiedLayerNormalization", "com.microsoft", "l", []string{"x"}, []string{"v"})}, 3},
		{"other contrib op unknown", []*pb.NodeProto{NewNode("FusedMatMul", "com.microsoft", "f", []string{"x", "idx"}, []string{"v"})}, -1},
		{"reduce without keepdims", []*pb.NodeProto{NewNode("ReduceSum", "", "r", []string{"x", "a"}, []string{"v"}, IntAttr("keepdims", 0))}, 2},
		{"celu keeps the rank", []*pb.NodeProto{NewNode("Celu", "", "c", []string{"x"}, []string{"v"})}, 3},
		{"prelu broadcasts", []*pb.NodeProto{NewNode("PRelu", "", "p", []string{"idx", "x"}, []string{"v"})}, 3},
		{"cycle unknown", []*pb.NodeProto{NewNode("Relu", "", "a", []string{"w"}, []string{"v"}), NewNode("Relu", "", "b", []string{"v"}, []string{"w"})}, -1},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			src := mapRanks{nodes: c.nodes, known: map[string]int{"x": 3, "idx": 2}, consts: map[string][]int64{"s": {0, -1}, "a": {1}}}
			want := c.want
			v := "v"
			if c.nodes == nil {
				v = "x"
			}
			got, ok := InferRank(src, v, nil)
			if want < 0 {
				if ok {
					t.Fatalf("rank %d, want unknown", got)
				}
				return
			}
			if !ok || got != want {
				t.Fatalf("rank %d (known %v), want %d", got, ok, want)
			}
		})
	}
}

package passes

import (
	"testing"

	"github.com/mokopt/mokopt/graph"
	"github.com/mokopt/mokopt/graph/eval"
	pb "github.com/mokopt/mokopt/graph/onnxpb"
	"google.golang.org/protobuf/proto"
)

// TestRankInferReduce checks the ranks rankInfer works out for reductions
// of an undeclared value (x is declared [2, 3, 4]): keepdims keeps the
// rank, otherwise each reduced axis (an attribute or a constant input)
// drops one, no axes reduce all, and computed axes are unknown.
func TestRankInferReduce(t *testing.T) {
	axes, err := eval.ToProto(eval.NewInt64([]int{2}, []int64{0, 2}), "axes")
	if err != nil {
		t.Fatal(err)
	}
	cases := []struct {
		name string
		node *pb.NodeProto
		want int
	}{
		{"keepdims", graph.NewNode("ReduceSum", "", "r", []string{"x", "axes"}, []string{"v"}), 3},
		{"axes input, no keepdims", graph.NewNode("ReduceSum", "", "r", []string{"x", "axes"}, []string{"v"}, graph.IntAttr("keepdims", 0)), 1},
		{"axes attribute, no keepdims", graph.NewNode("ReduceMean", "", "r", []string{"x"}, []string{"v"}, graph.IntAttr("keepdims", 0), graph.IntsAttr("axes", -1)), 2},
		{"all axes, no keepdims", graph.NewNode("ReduceMax", "", "r", []string{"x"}, []string{"v"}, graph.IntAttr("keepdims", 0)), 0},
		{"no axes, noop", graph.NewNode("ReduceSum", "", "r", []string{"x"}, []string{"v"}, graph.IntAttr("keepdims", 0), graph.IntAttr("noop_with_empty_axes", 1)), 3},
		{"computed axes", graph.NewNode("ReduceSum", "", "r", []string{"x", "x_shape"}, []string{"v"}, graph.IntAttr("keepdims", 0)), -1},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			x := floatInfo("x", 2, 3, 4)
			mp := &pb.ModelProto{IrVersion: proto.Int64(8), OpsetImport: []*pb.OperatorSetIdProto{{Version: proto.Int64(18)}},
				Graph: &pb.GraphProto{
					Input:       []*pb.ValueInfoProto{x},
					Initializer: []*pb.TensorProto{axes},
					Node:        []*pb.NodeProto{graph.NewNode("Shape", "", "s", []string{"x"}, []string{"x_shape"}), c.node},
					Output:      []*pb.ValueInfoProto{{Name: proto.String("v")}},
				}}
			m := &graph.Model{Proto: mp}
			cx, err := newCtx(m, m.Graph())
			if err != nil {
				t.Fatal(err)
			}
			if got := cx.rankInfer("v"); got != c.want {
				t.Fatalf("rank %d, want %d", got, c.want)
			}
		})
	}
}

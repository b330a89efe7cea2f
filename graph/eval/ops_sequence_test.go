package eval

import (
	"context"
	"testing"

	"github.com/mokopt/mokopt/graph"
	pb "github.com/mokopt/mokopt/graph/onnxpb"
)

// TestSequenceOps runs small graphs of sequence ops (as an unoptimized
// dynamo export writes torch.split and torch.chunk) and compares their
// tensor outputs with values worked out by hand.
func TestSequenceOps(t *testing.T) {
	x := f32(sh(2, 5), 0, 1, 2, 3, 4, 10, 11, 12, 13, 14)
	type c struct {
		name  string
		nodes []*pb.NodeProto
		in    map[string]*Tensor // besides x
		want  *Tensor            // output y
		err   bool
	}
	nd := func(op string, in []string, out string, attrs ...*pb.AttributeProto) *pb.NodeProto {
		return graph.NewNode(op, "", out+"_n", in, []string{out}, attrs...)
	}
	cases := []c{
		{name: "chunks, last", nodes: []*pb.NodeProto{nd("SplitToSequence", []string{"x", "k"}, "s", graph.IntAttr("axis", 1)), nd("SequenceAt", []string{"s", "m1"}, "y")},
			in: map[string]*Tensor{"k": i64(nil, 2), "m1": i64(nil, -1)}, want: f32(sh(2, 1), 4, 14)},
		{name: "sizes, first", nodes: []*pb.NodeProto{nd("SplitToSequence", []string{"x", "sz"}, "s", graph.IntAttr("axis", -1)), nd("SequenceAt", []string{"s", "z"}, "y")},
			in: map[string]*Tensor{"sz": i64(sh(2), 3, 2), "z": i64(nil, 0)}, want: f32(sh(2, 3), 0, 1, 2, 10, 11, 12)},
		{name: "rows squeezed", nodes: []*pb.NodeProto{nd("SplitToSequence", []string{"x"}, "s", graph.IntAttr("keepdims", 0)), nd("SequenceAt", []string{"s", "o"}, "y")},
			in: map[string]*Tensor{"o": i64(nil, 1)}, want: f32(sh(5), 10, 11, 12, 13, 14)},
		{name: "length after insert and erase", nodes: []*pb.NodeProto{nd("SplitToSequence", []string{"x"}, "s"), nd("SequenceInsert", []string{"s", "x"}, "s2"),
			nd("SequenceErase", []string{"s2", "z"}, "s3"), nd("SequenceLength", []string{"s3"}, "y")},
			in: map[string]*Tensor{"z": i64(nil, 0)}, want: i64(nil, 2)},
		{name: "erase then at", nodes: []*pb.NodeProto{nd("SplitToSequence", []string{"x"}, "s", graph.IntAttr("keepdims", 0)), nd("SequenceErase", []string{"s", "z"}, "s2"), nd("SequenceAt", []string{"s2", "z"}, "y")},
			in: map[string]*Tensor{"z": i64(nil, 0)}, want: f32(sh(5), 10, 11, 12, 13, 14)},
		{name: "stacked", nodes: []*pb.NodeProto{nd("SequenceConstruct", []string{"x", "x"}, "s"), nd("ConcatFromSequence", []string{"s"}, "y", graph.IntAttr("axis", -1), graph.IntAttr("new_axis", 1))},
			want: f32(sh(2, 5, 2), 0, 0, 1, 1, 2, 2, 3, 3, 4, 4, 10, 10, 11, 11, 12, 12, 13, 13, 14, 14)},
		{name: "concatenated", nodes: []*pb.NodeProto{nd("SplitToSequence", []string{"x", "k"}, "s", graph.IntAttr("axis", 1)), nd("ConcatFromSequence", []string{"s"}, "y", graph.IntAttr("axis", 0))},
			in: map[string]*Tensor{"k": i64(nil, 5)}, want: x},
		{name: "inserted at the end", nodes: []*pb.NodeProto{nd("SequenceEmpty", nil, "e"), nd("SequenceInsert", []string{"e", "x"}, "s"), nd("SequenceAt", []string{"s", "z"}, "y")},
			in: map[string]*Tensor{"z": i64(nil, 0)}, want: x},
		{name: "position out of range", nodes: []*pb.NodeProto{nd("SplitToSequence", []string{"x"}, "s"), nd("SequenceAt", []string{"s", "p"}, "y")},
			in: map[string]*Tensor{"p": i64(nil, 2)}, err: true},
		{name: "a tensor is no sequence", nodes: []*pb.NodeProto{nd("SequenceAt", []string{"x", "z"}, "y")},
			in: map[string]*Tensor{"z": i64(nil, 0)}, err: true},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			names, ins := []string{"x"}, []*Tensor{x}
			feeds := map[string]*Tensor{"x": x}
			for k, v := range tc.in {
				names, ins = append(names, k), append(ins, v)
				feeds[k] = v
			}
			m := modelOf(18, tc.nodes, names, ins, []string{"y"})
			res, err := Run(context.Background(), m, feeds, Options{})
			if tc.err {
				if err == nil {
					t.Fatalf("want an error, got %v", res["y"])
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			expectTensor(t, res["y"], tc.want)
		})
	}
}

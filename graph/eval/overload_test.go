package eval

import (
	"context"
	"testing"

	"github.com/mokopt/mokopt/graph"
	pb "github.com/mokopt/mokopt/graph/onnxpb"
	"google.golang.org/protobuf/proto"
)

// TestFunctionOverloads checks that a node runs the function body of its
// own overload (IR 10), not another overload of the same name.
func TestFunctionOverloads(t *testing.T) {
	fn := func(overload, op string) *pb.FunctionProto {
		return &pb.FunctionProto{Name: proto.String("F"), Domain: proto.String("x"), Overload: proto.String(overload),
			Input: []string{"a"}, Output: []string{"b"},
			Node:        []*pb.NodeProto{graph.NewNode(op, "", "", []string{"a"}, []string{"b"})},
			OpsetImport: []*pb.OperatorSetIdProto{{Domain: proto.String(""), Version: proto.Int64(18)}}}
	}
	neg := graph.NewNode("F", "x", "n1", []string{"in"}, []string{"m"})
	neg.Overload = proto.String("neg")
	abs := graph.NewNode("F", "x", "n2", []string{"m"}, []string{"out"})
	abs.Overload = proto.String("abs")
	vi := func(n string) *pb.ValueInfoProto {
		return &pb.ValueInfoProto{Name: proto.String(n), Type: &pb.TypeProto{Value: &pb.TypeProto_TensorType{TensorType: &pb.TypeProto_Tensor{ElemType: proto.Int32(1)}}}}
	}
	m := &graph.Model{Proto: &pb.ModelProto{IrVersion: proto.Int64(10),
		OpsetImport: []*pb.OperatorSetIdProto{{Domain: proto.String(""), Version: proto.Int64(18)}, {Domain: proto.String("x"), Version: proto.Int64(1)}},
		Functions:   []*pb.FunctionProto{fn("neg", "Neg"), fn("abs", "Abs")},
		Graph: &pb.GraphProto{Name: proto.String("g"), Node: []*pb.NodeProto{neg, abs},
			Input: []*pb.ValueInfoProto{vi("in")}, Output: []*pb.ValueInfoProto{vi("out")}}}}
	out, err := Run(context.Background(), m, map[string]*Tensor{"in": NewFloat32([]int{2}, []float32{1, -2})}, Options{})
	if err != nil {
		t.Fatal(err)
	}
	// abs(neg(x)) = |x|; neg twice or abs twice would give -1 or 1 for the first.
	got := out["out"].F32
	if got[0] != 1 || got[1] != 2 {
		t.Fatalf("got %v, want [1 2]", got)
	}
	// Swap the overloads: neg(abs(x)) would differ, so the lookup must follow the node.
	neg.Overload, abs.Overload = proto.String("abs"), proto.String("neg")
	out, err = Run(context.Background(), m, map[string]*Tensor{"in": NewFloat32([]int{2}, []float32{1, -2})}, Options{})
	if err != nil {
		t.Fatal(err)
	}
	if got := out["out"].F32; got[0] != -1 || got[1] != -2 {
		t.Fatalf("got %v, want [-1 -2]", got)
	}
}

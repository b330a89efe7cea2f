package graph

import (
	"bytes"
	"path/filepath"
	"testing"

	pb "github.com/mokopt/mokopt/graph/onnxpb"
	"google.golang.org/protobuf/proto"
)

// TestWithGraphReadsSideFile: a model of one part of a model whose weights
// live in a side file reads those weights, without copying the rest.
func TestWithGraphReadsSideFile(t *testing.T) {
	dir := t.TempDir()
	w := &pb.TensorProto{Name: proto.String("w"), Dims: []int64{4}, DataType: proto.Int32(int32(pb.TensorProto_FLOAT)), RawData: []byte("0123456789abcdef")}
	src := &Model{Proto: &pb.ModelProto{IrVersion: proto.Int64(8), OpsetImport: []*pb.OperatorSetIdProto{{Version: proto.Int64(18)}},
		Graph: &pb.GraphProto{
			Input:       []*pb.ValueInfoProto{{Name: proto.String("x")}},
			Initializer: []*pb.TensorProto{w},
			Node:        []*pb.NodeProto{NewNode("Add", "", "a", []string{"x", "w"}, []string{"y"}), NewNode("Neg", "", "n", []string{"y"}, []string{"z"})},
			Output:      []*pb.ValueInfoProto{{Name: proto.String("z")}},
		}}}
	path := filepath.Join(dir, "m.onnx")
	if err := src.Save(path, SaveOptions{External: ExternalRepack, Threshold: 1}); err != nil {
		t.Fatal(err)
	}
	m, err := Load(path)
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	t0 := m.Proto.Graph.Initializer[0]
	if !IsExternal(t0) {
		t.Fatal("the weight was not written to the side file")
	}
	part := m.WithGraph(&pb.GraphProto{Node: m.Proto.Graph.Node[:1], Initializer: []*pb.TensorProto{t0}})
	if len(part.Proto.Graph.Node) != 1 || part.Opset("") != 18 {
		t.Fatalf("part has %d nodes, opset %d", len(part.Proto.Graph.Node), part.Opset(""))
	}
	b, err := part.TensorBytes(t0)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(b, w.RawData) {
		t.Fatalf("read %q, want %q", b, w.RawData)
	}
}

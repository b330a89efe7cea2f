package graph

import (
	"bytes"
	"io"
	"os"
	"path/filepath"
	"testing"

	pb "github.com/mokopt/mokopt/graph/onnxpb"
	"google.golang.org/protobuf/proto"
)

// TestCopyTensorRange copies ranges of external, inline and deferred
// tensors (into a buffer and into a file, where the kernel copy applies)
// and checks the bytes, the bytes-read count and the refusal of ranges past
// the tensor.
func TestCopyTensorRange(t *testing.T) {
	dir := t.TempDir()
	mp := &pb.ModelProto{IrVersion: proto.Int64(10), OpsetImport: []*pb.OperatorSetIdProto{{Domain: proto.String(""), Version: proto.Int64(18)}},
		Graph: &pb.GraphProto{Name: proto.String("g"), Node: []*pb.NodeProto{NewNode("Add", "", "add", []string{"a", "b"}, []string{"y"})},
			Output: []*pb.ValueInfoProto{vinfo("y")}}}
	for i, n := range []int{1 << 14, 1 << 12} {
		t0 := f32Init([]string{"a", "b"}[i], n)
		for j := range t0.RawData {
			t0.RawData[j] = byte(j*13 + i)
		}
		mp.Graph.Initializer = append(mp.Graph.Initializer, t0)
	}
	want := [][]byte{mp.Graph.Initializer[0].RawData, mp.Graph.Initializer[1].RawData}
	path := filepath.Join(dir, "m.onnx")
	if err := (&Model{Proto: proto.Clone(mp).(*pb.ModelProto), Dir: dir}).Save(path, SaveOptions{External: ExternalRepack}); err != nil {
		t.Fatal(err)
	}
	m, err := Load(path)
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	ext := m.Proto.Graph.Initializer[0]
	if !IsExternal(ext) {
		t.Fatal("a is not external")
	}
	var buf bytes.Buffer
	if err := m.CopyTensorRange(&buf, ext, 100, 1000); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(buf.Bytes(), want[0][100:1100]) {
		t.Error("external range differs")
	}
	if n := m.ExternalBytesRead(); n != 1000 {
		t.Errorf("read %d external bytes, want 1000", n)
	}
	f, err := os.Create(filepath.Join(dir, "copy"))
	if err != nil {
		t.Fatal(err)
	}
	if err := m.CopyTensorRange(f, ext, 4, int64(len(want[0]))-4); err != nil {
		t.Fatal(err)
	}
	f.Close()
	if got, _ := os.ReadFile(f.Name()); !bytes.Equal(got, want[0][4:]) {
		t.Error("external range copied into a file differs")
	}
	if err := m.CopyTensorRange(io.Discard, ext, 1, int64(len(want[0]))); err == nil {
		t.Error("a range past the tensor was accepted")
	}
	// Inline and deferred tensors.
	inl := m.Proto.Graph.Initializer[1]
	buf.Reset()
	if err := m.CopyTensorRange(&buf, inl, 8, 16); err != nil || !bytes.Equal(buf.Bytes(), want[1][8:24]) {
		t.Errorf("inline range: %v", err)
	}
	def := &pb.TensorProto{Name: proto.String("d"), Dims: []int64{4}, DataType: proto.Int32(int32(pb.TensorProto_FLOAT))}
	m.SetDeferred(def, DeferredData{Size: 16, Write: func(w io.Writer) error { _, err := w.Write(want[1][:16]); return err }})
	buf.Reset()
	if err := m.CopyTensorRange(&buf, def, 4, 8); err != nil || !bytes.Equal(buf.Bytes(), want[1][4:12]) {
		t.Errorf("deferred range: %v", err)
	}
}

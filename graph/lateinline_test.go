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

// TestDeferredInlineBytes: deferred tensors kept inside the model file
// (DeferredData.Inline under ExternalKeep, every mode of Encode, and
// ExternalInline) are written with their producers' bytes, small ones
// (read into memory) and large ones (placeholders the encoder fills)
// alike, side-file tensors inlined by ExternalInline with the side file's
// bytes; the model's tensors hold no data again afterwards.
func TestDeferredInlineBytes(t *testing.T) {
	dir := t.TempDir()
	pattern := func(n int, seed byte) []byte {
		b := make([]byte, n)
		for i := range b {
			b[i] = byte(i*7) + seed
		}
		return b
	}
	small, large := pattern(4*100, 1), pattern(4*(streamBig/4+1000), 2)
	sideBytes := pattern(4*(streamBig/4+10), 3)
	if err := os.WriteFile(filepath.Join(dir, "in.onnx.data"), sideBytes, 0o644); err != nil {
		t.Fatal(err)
	}
	f32 := proto.Int32(int32(pb.TensorProto_FLOAT))
	ts := []*pb.TensorProto{
		{Name: proto.String("small"), Dims: []int64{int64(len(small) / 4)}, DataType: f32},
		{Name: proto.String("large"), Dims: []int64{int64(len(large) / 4)}, DataType: f32},
		{Name: proto.String("side"), Dims: []int64{int64(len(sideBytes) / 4)}, DataType: f32, DataLocation: pb.TensorProto_EXTERNAL.Enum(),
			ExternalData: []*pb.StringStringEntryProto{{Key: proto.String("location"), Value: proto.String("in.onnx.data")}}},
	}
	var nodes []*pb.NodeProto
	var outs []*pb.ValueInfoProto
	for _, x := range ts {
		nodes = append(nodes, NewNode("Identity", "", "id_"+x.GetName(), []string{x.GetName()}, []string{"y_" + x.GetName()}))
		outs = append(outs, &pb.ValueInfoProto{Name: proto.String("y_" + x.GetName())})
	}
	mp := &pb.ModelProto{IrVersion: proto.Int64(10), OpsetImport: []*pb.OperatorSetIdProto{{Version: proto.Int64(18)}},
		Graph: &pb.GraphProto{Name: proto.String("g"), Initializer: ts, Node: nodes, Output: outs}}
	b, err := proto.Marshal(mp)
	if err != nil {
		t.Fatal(err)
	}
	in := filepath.Join(dir, "in.onnx")
	if err := os.WriteFile(in, b, 0o644); err != nil {
		t.Fatal(err)
	}
	m, err := Load(in)
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	want := map[string][]byte{"small": small, "large": large, "side": sideBytes}
	for _, x := range m.Proto.Graph.Initializer[:2] {
		data := want[x.GetName()]
		m.SetDeferred(x, DeferredData{Size: int64(len(data)), Inline: true, Write: func(w io.Writer) error {
			for p := data; len(p) > 0; p = p[min(len(p), 1000):] { // in pieces
				if _, err := w.Write(p[:min(len(p), 1000)]); err != nil {
					return err
				}
			}
			return nil
		}})
	}
	check := func(label string, b []byte, inlineSide bool) {
		t.Helper()
		got := &pb.ModelProto{}
		if err := proto.Unmarshal(b, got); err != nil {
			t.Fatalf("%s: %v", label, err)
		}
		if det, _ := (proto.MarshalOptions{Deterministic: true}).Marshal(got); !bytes.Equal(det, b) {
			t.Fatalf("%s: not the deterministic encoding", label)
		}
		for _, x := range got.Graph.Initializer {
			if x.GetName() == "side" && !inlineSide {
				if !IsExternal(x) {
					t.Fatalf("%s: the side-file tensor was inlined", label)
				}
				continue
			}
			if !bytes.Equal(x.RawData, want[x.GetName()]) {
				t.Fatalf("%s: tensor %s holds %d bytes, not its producer's %d", label, x.GetName(), len(x.RawData), len(want[x.GetName()]))
			}
		}
	}
	for _, mode := range []ExternalMode{ExternalKeep, ExternalInline} {
		out := filepath.Join(dir, "out.onnx")
		if err := m.Save(out, SaveOptions{External: mode, Threshold: 16}); err != nil {
			t.Fatal(err)
		}
		b, err := os.ReadFile(out)
		if err != nil {
			t.Fatal(err)
		}
		check(out, b, mode == ExternalInline)
	}
	var buf bytes.Buffer
	if err := m.Encode(&buf, SaveOptions{External: ExternalInline}); err != nil {
		t.Fatal(err)
	}
	check("Encode", buf.Bytes(), true)
	for _, x := range m.Proto.Graph.Initializer[:2] {
		if x.RawData != nil {
			t.Fatalf("tensor %s kept %d placeholder bytes after saving", x.GetName(), len(x.RawData))
		}
	}
}

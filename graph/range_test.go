package graph

import (
	"bytes"
	"errors"
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
	m := saveExternalAndLoad(t, proto.Clone(mp).(*pb.ModelProto), dir)
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

// TestCopyTensorRangeSmallAndLarge copies side-file ranges on both sides of
// smallRange (read into a buffer, or copied through the file position),
// into a buffer and into a file, and checks that a side file truncated
// after it was opened gives io.ErrUnexpectedEOF either way.
func TestCopyTensorRangeSmallAndLarge(t *testing.T) {
	dir := t.TempDir()
	a := f32Init("a", 3*smallRange/4) // 3 * smallRange bytes
	for j := range a.RawData {
		a.RawData[j] = byte(j*7 + j>>9)
	}
	want := a.RawData
	mp := &pb.ModelProto{IrVersion: proto.Int64(10), OpsetImport: []*pb.OperatorSetIdProto{{Domain: proto.String(""), Version: proto.Int64(18)}},
		Graph: &pb.GraphProto{Name: proto.String("g"), Node: []*pb.NodeProto{NewNode("Neg", "", "neg", []string{"a"}, []string{"y"})},
			Output: []*pb.ValueInfoProto{vinfo("y")}, Initializer: []*pb.TensorProto{a}}}
	m := saveExternalAndLoad(t, mp, dir)
	ext := m.Proto.Graph.Initializer[0]
	ranges := []struct {
		name   string
		off, n int64
	}{
		{"empty", 5, 0},
		{"small", 3, 1000},
		{"smallRange", 1, smallRange},
		{"just over", 0, smallRange + 1},
		{"whole", 0, int64(len(want))},
	}
	for _, r := range ranges {
		t.Run(r.name, func(t *testing.T) {
			var buf bytes.Buffer
			if err := m.CopyTensorRange(&buf, ext, r.off, r.n); err != nil || !bytes.Equal(buf.Bytes(), want[r.off:r.off+r.n]) {
				t.Errorf("into a buffer: %v", err)
			}
			f, err := os.Create(filepath.Join(t.TempDir(), "copy"))
			if err != nil {
				t.Fatal(err)
			}
			defer f.Close()
			if err := m.CopyTensorRange(f, ext, r.off, r.n); err != nil {
				t.Fatal(err)
			}
			if got, _ := os.ReadFile(f.Name()); !bytes.Equal(got, want[r.off:r.off+r.n]) {
				t.Error("into a file: bytes differ")
			}
		})
	}
	ref, err := External(ext)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.Truncate(filepath.Join(dir, ref.Location), ref.Offset+smallRange/2); err != nil {
		t.Fatal(err)
	}
	for _, r := range ranges[1:] {
		if r.off+r.n <= smallRange/2 {
			continue
		}
		if err := m.CopyTensorRange(io.Discard, ext, r.off, r.n); !errors.Is(err, io.ErrUnexpectedEOF) {
			t.Errorf("%s range of a truncated side file: %v, want io.ErrUnexpectedEOF", r.name, err)
		}
	}
}

// saveExternalAndLoad saves mp into dir/m.onnx with its initializers in a
// side file and loads it back; the model is closed when the test ends.
func saveExternalAndLoad(t *testing.T, mp *pb.ModelProto, dir string) *Model {
	t.Helper()
	path := filepath.Join(dir, "m.onnx")
	if err := (&Model{Proto: mp, Dir: dir}).Save(path, SaveOptions{External: ExternalRepack}); err != nil {
		t.Fatal(err)
	}
	m, err := Load(path)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { m.Close() })
	return m
}

// TestDeferredRange: a deferred producer that makes ranges serves
// CopyTensorRange and ReadTensorAt without Write running; one without is
// read by running Write (CopyTensorRange) or refused (ReadTensorAt). A
// fork shares the deferred tensors registered on its model after it was
// taken (ShareDeferred), and reads them with their producers.
func TestDeferredRange(t *testing.T) {
	data := make([]byte, 64)
	for i := range data {
		data[i] = byte(i*7 + 3)
	}
	var writes, ranges int
	m := &Model{Proto: &pb.ModelProto{Graph: &pb.GraphProto{}}}
	ranged := &pb.TensorProto{Name: proto.String("r"), Dims: []int64{16}, DataType: proto.Int32(int32(pb.TensorProto_FLOAT))}
	whole := &pb.TensorProto{Name: proto.String("w"), Dims: []int64{16}, DataType: proto.Int32(int32(pb.TensorProto_FLOAT))}
	write := func(w io.Writer) error { writes++; _, err := w.Write(data); return err }
	m.SetDeferred(ranged, DeferredData{Size: 64, Write: write, Range: func(w io.Writer, off, n int64) error {
		ranges++
		_, err := w.Write(data[off : off+n])
		return err
	}})
	m.SetDeferred(whole, DeferredData{Size: 64, Write: write})
	for _, c := range []struct {
		name           string
		t              *pb.TensorProto
		off, n         int64
		writes, ranges int
		readAtRefused  bool
	}{
		{"ranged", ranged, 8, 20, 0, 2, false},
		{"ranged to the end", ranged, 60, 4, 0, 2, false},
		{"whole only", whole, 8, 20, 1, 0, true},
	} {
		writes, ranges = 0, 0
		var buf bytes.Buffer
		if err := m.CopyTensorRange(&buf, c.t, c.off, c.n); err != nil || !bytes.Equal(buf.Bytes(), data[c.off:c.off+c.n]) {
			t.Errorf("%s: CopyTensorRange gave %v, %v", c.name, buf.Bytes(), err)
		}
		p := make([]byte, c.n)
		err := m.ReadTensorAt(c.t, p, c.off)
		switch {
		case c.readAtRefused && err == nil:
			t.Errorf("%s: ReadTensorAt of a producer without ranges was not refused", c.name)
		case !c.readAtRefused && (err != nil || !bytes.Equal(p, data[c.off:c.off+c.n])):
			t.Errorf("%s: ReadTensorAt gave %v, %v", c.name, p, err)
		}
		if writes != c.writes || ranges != c.ranges {
			t.Errorf("%s: Write ran %d times and Range %d, want %d and %d", c.name, writes, ranges, c.writes, c.ranges)
		}
	}
	if err := m.CopyTensorRange(io.Discard, ranged, 60, 8); err == nil {
		t.Error("a range past the deferred tensor was accepted")
	}
	f := &Model{Proto: &pb.ModelProto{Graph: &pb.GraphProto{}}}
	f.ShareDeferred(m)
	p := make([]byte, 4)
	if err := f.ReadTensorAt(ranged, p, 4); err != nil || !bytes.Equal(p, data[4:8]) {
		t.Errorf("the shared deferred tensor reads %v, %v", p, err)
	}
	if _, ok := f.Deferred(whole); !ok {
		t.Error("ShareDeferred left a tensor out")
	}
}

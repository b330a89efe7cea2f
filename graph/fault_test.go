package graph

import (
	"bytes"
	"context"
	"errors"
	"io"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"testing"

	pb "github.com/mokopt/mokopt/graph/onnxpb"
	"google.golang.org/protobuf/proto"
)

// failAfter is a writer that accepts n bytes in total, then fails as a full
// disk would.
type failAfter struct {
	w io.Writer
	n *int64
}

var errDiskFull = errors.New("no space left on device (injected)")

func (f failAfter) Write(p []byte) (int, error) {
	if *f.n <= 0 {
		return 0, errDiskFull
	}
	if int64(len(p)) > *f.n {
		k := int(*f.n)
		f.w.Write(p[:k])
		*f.n = 0
		return k, errDiskFull
	}
	*f.n -= int64(len(p))
	return f.w.Write(p)
}

func faultModel() *Model {
	mp := &pb.ModelProto{IrVersion: proto.Int64(10), OpsetImport: []*pb.OperatorSetIdProto{{Domain: proto.String(""), Version: proto.Int64(18)}},
		Graph: &pb.GraphProto{Name: proto.String("g"), Node: []*pb.NodeProto{NewNode("Add", "", "add", []string{"x", "big"}, []string{"y"})},
			Input: []*pb.ValueInfoProto{vinfo("x")}, Output: []*pb.ValueInfoProto{vinfo("y")}}}
	for i, n := range []int{1 << 16, 1 << 12, 3} {
		t0 := f32Init([]string{"big", "mid", "tiny"}[i], n)
		for j := range t0.RawData {
			t0.RawData[j] = byte(j*7 + i)
		}
		mp.Graph.Initializer = append(mp.Graph.Initializer, t0)
	}
	return &Model{Proto: mp, Dir: "."}
}

func snapshot(t *testing.T, dir string) map[string]string {
	t.Helper()
	es, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]string{}
	for _, e := range es {
		b, _ := os.ReadFile(filepath.Join(dir, e.Name()))
		out[e.Name()] = string(b)
	}
	return out
}

func names(m map[string]string) []string {
	var out []string
	for k := range m {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}

// TestSaveFailingWriterKeepsPrevious: a write that fails after N bytes, in
// the side file or in the model file, returns the error and leaves the
// previous model and side file byte for byte, with no temporary file.
func TestSaveFailingWriterKeepsPrevious(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "m.onnx")
	m := faultModel()
	if err := m.Save(path, SaveOptions{External: ExternalRepack}); err != nil {
		t.Fatal(err)
	}
	before := snapshot(t, dir)
	if got := names(before); strings.Join(got, ",") != "m.onnx,m.onnx.data" {
		t.Fatalf("first save wrote %v", got)
	}
	// Change the weights so a successful save would differ.
	m.Proto.Graph.Initializer[0].RawData[0] ^= 0xff
	m.Proto.Graph.Initializer[2].RawData[0] ^= 0xff
	side := int64(len(before["m.onnx.data"]))
	for _, n := range []int64{0, 1, 4096, side - 1, side, side + 10} {
		left := n
		writeHook = func(w io.Writer) io.Writer { return failAfter{w, &left} }
		err := m.Save(path, SaveOptions{External: ExternalRepack})
		writeHook = nil
		if !errors.Is(err, errDiskFull) {
			t.Fatalf("fail after %d bytes: Save returned %v, want the write error", n, err)
		}
		after := snapshot(t, dir)
		if strings.Join(names(after), ",") != "m.onnx,m.onnx.data" {
			t.Fatalf("fail after %d bytes: folder holds %v", n, names(after))
		}
		for k, v := range before {
			if after[k] != v {
				t.Fatalf("fail after %d bytes: %s changed", n, k)
			}
		}
	}
	// Without the fault the new bytes land.
	if err := m.Save(path, SaveOptions{External: ExternalRepack}); err != nil {
		t.Fatal(err)
	}
	if snapshot(t, dir)["m.onnx.data"] == before["m.onnx.data"] {
		t.Fatal("the faultless save did not write the new weights")
	}
}

// TestSaveTempInTargetFolder: Save and WriteFileAtomic write a hidden
// temporary file in the target folder (so the rename cannot cross file
// systems) and nothing at the target until the rename.
func TestSaveTempInTargetFolder(t *testing.T) {
	dir := t.TempDir()
	var seen []string
	writeHook = func(w io.Writer) io.Writer {
		f := w.(*os.File)
		seen = append(seen, f.Name())
		return w
	}
	defer func() { writeHook = nil }()
	target := filepath.Join(dir, "r.json")
	if err := WriteFileAtomic(target, []byte("{}")); err != nil {
		t.Fatal(err)
	}
	if err := faultModel().Save(filepath.Join(dir, "m.onnx"), SaveOptions{External: ExternalRepack}); err != nil {
		t.Fatal(err)
	}
	if len(seen) != 3 {
		t.Fatalf("%d files written through the hook, want 3: %v", len(seen), seen)
	}
	for _, p := range seen {
		if filepath.Dir(p) != dir || !strings.HasPrefix(filepath.Base(p), ".") || !strings.Contains(p, ".tmp-") {
			t.Errorf("temporary file %s is not a hidden .tmp- file in %s", p, dir)
		}
		if _, err := os.Stat(p); err == nil {
			t.Errorf("temporary file %s still exists", p)
		}
	}
	if b, _ := os.ReadFile(target); string(b) != "{}" {
		t.Fatalf("target holds %q", b)
	}
}

// TestSaveCancelled: a cancelled context stops the save with
// context.Canceled, before or during the write, and leaves nothing behind.
func TestSaveCancelled(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "m.onnx")
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	err := faultModel().Save(path, SaveOptions{External: ExternalRepack, Context: ctx})
	if !errors.Is(err, context.Canceled) {
		t.Fatalf("Save with a cancelled context: %v", err)
	}
	// Cancel in the middle of the side file.
	ctx, cancel = context.WithCancel(context.Background())
	writeHook = func(w io.Writer) io.Writer {
		return writerFunc(func(p []byte) (int, error) { cancel(); return w.Write(p) })
	}
	err = faultModel().Save(path, SaveOptions{External: ExternalRepack, Context: ctx})
	writeHook = nil
	if !errors.Is(err, context.Canceled) {
		t.Fatalf("Save cancelled mid-write: %v", err)
	}
	if s := snapshot(t, dir); len(s) != 0 {
		t.Fatalf("cancelled saves left %v", names(s))
	}
}

type writerFunc func([]byte) (int, error)

func (f writerFunc) Write(p []byte) (int, error) { return f(p) }

// TestSaveBackupRestored: when the model file cannot be renamed into place
// after the side file was, the side file that was there before comes back
// and no backup is left.
func TestSaveBackupRestored(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "m.onnx")
	if err := os.WriteFile(path+".data", []byte("previous side file"), 0o644); err != nil {
		t.Fatal(err)
	}
	// A non-empty folder at the model's path makes the final rename fail.
	os.MkdirAll(filepath.Join(path, "x"), 0o755)
	err := faultModel().Save(path, SaveOptions{External: ExternalRepack})
	if err == nil || !strings.Contains(err.Error(), path) {
		t.Fatalf("Save over a folder: %v, want an error naming %s", err, path)
	}
	s := snapshot(t, dir)
	if strings.Join(names(s), ",") != "m.onnx,m.onnx.data" || s["m.onnx.data"] != "previous side file" {
		t.Fatalf("after the failed save: %v, side file %q", names(s), s["m.onnx.data"])
	}
}

// TestSaveInPlaceExternal: saving a model over the file it was loaded from,
// with the same side file name, reads the old side file while writing the
// new one and yields a model that loads with the new weights.
func TestSaveInPlaceExternal(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "m.onnx")
	if err := faultModel().Save(path, SaveOptions{External: ExternalRepack}); err != nil {
		t.Fatal(err)
	}
	m, err := Load(path)
	if err != nil {
		t.Fatal(err)
	}
	want, err := m.TensorBytes(m.Proto.Graph.Initializer[0])
	if err != nil {
		t.Fatal(err)
	}
	m.Proto.Graph.Node[0].Name = proto.String("renamed")
	if err := m.Save(path, SaveOptions{}); err != nil {
		t.Fatal(err)
	}
	m.Close()
	back, err := Load(path)
	if err != nil {
		t.Fatal(err)
	}
	defer back.Close()
	if err := back.Check(); err != nil {
		t.Fatal(err)
	}
	got, err := back.TensorBytes(back.Proto.Graph.Initializer[0])
	if err != nil || !bytes.Equal(got, want) || back.Proto.Graph.Node[0].GetName() != "renamed" {
		t.Fatalf("in-place save: %v, weights equal %v", err, bytes.Equal(got, want))
	}
	if s := snapshot(t, dir); strings.Join(names(s), ",") != "m.onnx,m.onnx.data" {
		t.Fatalf("folder holds %v", names(s))
	}
}

// TestHugeTensorRefusedBeforeAllocation: a side file that really is 1 TiB
// (sparse) passes the size checks, but loading the tensor into memory is
// refused with a bad-input error instead of allocating 1 TiB.
func TestHugeTensorRefusedBeforeAllocation(t *testing.T) {
	dir := t.TempDir()
	f, err := os.Create(filepath.Join(dir, "huge.bin"))
	if err != nil {
		t.Fatal(err)
	}
	if err := f.Truncate(1 << 40); err != nil {
		f.Close()
		t.Skip("no sparse 1 TiB file here:", err)
	}
	f.Close()
	tp := &pb.TensorProto{Name: proto.String("huge"), Dims: []int64{1 << 38}, DataType: proto.Int32(int32(pb.TensorProto_FLOAT)),
		DataLocation: pb.TensorProto_EXTERNAL.Enum(), ExternalData: []*pb.StringStringEntryProto{{Key: proto.String("location"), Value: proto.String("huge.bin")}}}
	mp := &pb.ModelProto{IrVersion: proto.Int64(8), Graph: &pb.GraphProto{Initializer: []*pb.TensorProto{tp}}}
	m := &Model{Proto: mp, Path: filepath.Join(dir, "m.onnx"), Dir: dir, ext: newExternalStore(dir, "m.onnx")}
	defer m.Close()
	if err := m.Check(); err != nil {
		t.Fatalf("a consistent 1 TiB external tensor should pass Check: %v", err)
	}
	_, err = m.TensorBytes(tp)
	if !errors.Is(err, ErrBadInput) || !strings.Contains(err.Error(), `initializer "huge"`) || !strings.Contains(err.Error(), "1099511627776 bytes") {
		t.Fatalf("TensorBytes of 1 TiB: %v", err)
	}
	// Typed fields that claim 1 TiB are refused too, without allocating it.
	typed := &pb.TensorProto{Name: proto.String("t"), Dims: []int64{1 << 38}, DataType: proto.Int32(int32(pb.TensorProto_FLOAT)), FloatData: []float32{1}}
	if _, err := m.TensorBytes(typed); !errors.Is(err, ErrBadInput) || !strings.Contains(err.Error(), "typed data holds 4 bytes") {
		t.Fatalf("TensorBytes of typed 1 TiB: %v", err)
	}
}

// TestWritingBack: the writeback is started over consecutive ranges from
// the file's start, each of at least writebackEvery bytes, and every byte
// reaches the file.
func TestWritingBack(t *testing.T) {
	// An output file's writer passes a reader on to the file's ReadFrom,
	// where the kernel copies a side file's bytes (copy_file_range).
	f, err := os.Create(filepath.Join(t.TempDir(), "out"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if _, ok := hooked(f).(io.ReaderFrom); !ok {
		t.Fatal("the output file's writer has no ReadFrom: copies would pass through memory")
	}
	var buf bytes.Buffer
	var ranges [][2]int64
	w := &writingBack{w: &buf, start: func(off, n int64) { ranges = append(ranges, [2]int64{off, n}) }}
	total := 0
	for i := 0; total < 3*writebackEvery+100; i++ {
		b := bytes.Repeat([]byte{byte(i)}, 1+(i*7919)%(3<<20))
		if _, err := w.Write(b); err != nil {
			t.Fatal(err)
		}
		total += len(b)
	}
	// A reader copied in (as a side file's bytes are) counts the same.
	src := bytes.Repeat([]byte{7}, writebackEvery+5)
	k, err := w.ReadFrom(&io.LimitedReader{R: bytes.NewReader(src), N: int64(len(src))})
	if err != nil || k != int64(len(src)) {
		t.Fatalf("ReadFrom: %d bytes, %v", k, err)
	}
	total += len(src)
	if buf.Len() != total {
		t.Fatalf("%d bytes reached the file, want %d", buf.Len(), total)
	}
	if len(ranges) != 4 {
		t.Fatalf("writeback started %d times (%v), want 4", len(ranges), ranges)
	}
	var next int64
	for _, r := range ranges {
		if r[0] != next || r[1] < writebackEvery {
			t.Fatalf("writeback ranges %v: not consecutive from 0 in pieces of at least %d", ranges, writebackEvery)
		}
		next = r[0] + r[1]
	}
}

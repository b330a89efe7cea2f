package graph

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	pb "github.com/mokopt/mokopt/graph/onnxpb"
	"google.golang.org/protobuf/proto"
)

// TestWriterRefusesInvalidModel: a model that would fail the checker (a
// node reading a value nothing defines, a cycle in an If branch, a tensor
// whose data does not match its dims) is never written: Save and Encode
// return an error wrapping ErrInvalidOutput that names the problem, and no
// file, not even a temporary one, appears.
func TestWriterRefusesInvalidModel(t *testing.T) {
	cases := []struct {
		name   string
		break_ func(m *Model)
		want   string
	}{
		{"dangling reference", func(m *Model) { m.Proto.Graph.Node[0].Input[0] = "gone" }, `reads "gone"`},
		{"raw data of the wrong size", func(m *Model) { m.Proto.Graph.Initializer[2].RawData = m.Proto.Graph.Initializer[2].RawData[:5] }, "raw_data holds 5 bytes"},
		{"cycle in a branch", func(m *Model) {
			m.Proto.Graph.Node = append(m.Proto.Graph.Node, NewNode("If", "", "if", []string{"x"}, []string{"z"},
				&pb.AttributeProto{Name: proto.String("then_branch"), Type: pb.AttributeProto_GRAPH.Enum(), G: &pb.GraphProto{
					Node:   []*pb.NodeProto{NewNode("Neg", "", "a", []string{"q"}, []string{"p"}), NewNode("Neg", "", "b", []string{"p"}, []string{"q"})},
					Output: []*pb.ValueInfoProto{vinfo("q")}}}))
		}, `cycle through node`},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			dir := t.TempDir()
			m := faultModel()
			c.break_(m)
			for _, mode := range []ExternalMode{ExternalKeep, ExternalRepack} {
				err := m.Save(filepath.Join(dir, "out.onnx"), SaveOptions{External: mode})
				if !errors.Is(err, ErrInvalidOutput) || !strings.Contains(err.Error(), c.want) || !strings.Contains(err.Error(), "out.onnx") {
					t.Fatalf("Save: %v; want ErrInvalidOutput naming %q", err, c.want)
				}
			}
			var buf bytes.Buffer
			if err := m.Encode(&buf, SaveOptions{}); !errors.Is(err, ErrInvalidOutput) || buf.Len() != 0 {
				t.Fatalf("Encode: %v, %d bytes written", err, buf.Len())
			}
			if err := WriteFileAtomic(filepath.Join(dir, "ok.json"), []byte("{}")); err != nil {
				t.Fatal(err)
			}
			if s := snapshot(t, dir); strings.Join(names(s), ",") != "ok.json" {
				t.Fatalf("folder holds %v", names(s))
			}
		})
	}
}

// sideSaved saves faultModel with its big tensors in path's side file and
// loads and checks it back.
func sideSaved(t *testing.T, path string) *Model {
	t.Helper()
	if err := faultModel().Save(path, SaveOptions{External: ExternalRepack}); err != nil {
		t.Fatal(err)
	}
	m, err := Load(path)
	if err != nil {
		t.Fatal(err)
	}
	if err := m.Check(); err != nil {
		t.Fatal(err)
	}
	return m
}

// TestSideFileSwappedAfterCheck: once Check has opened a side file, the
// bytes saved are that file's, even when its name is meanwhile made a link
// to a file outside the folder (or another file is renamed over it).
func TestSideFileSwappedAfterCheck(t *testing.T) {
	dir := t.TempDir()
	outside := filepath.Join(t.TempDir(), "secret")
	if err := os.WriteFile(outside, bytes.Repeat([]byte("SECRET!!"), 1<<14), 0o644); err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(dir, "m.onnx")
	m := sideSaved(t, path)
	defer m.Close()
	want, err := os.ReadFile(path + ".data")
	if err != nil {
		t.Fatal(err)
	}
	os.Rename(path+".data", filepath.Join(dir, "moved-away"))
	if err := os.Symlink(outside, path+".data"); err != nil {
		t.Fatal(err)
	}
	outDir := t.TempDir()
	out := filepath.Join(outDir, "o.onnx")
	if err := m.Save(out, SaveOptions{}); err != nil {
		t.Fatal(err)
	}
	got, err := os.ReadFile(out + ".data")
	if err != nil {
		t.Fatal(err)
	}
	if bytes.Contains(got, []byte("SECRET")) || !bytes.Equal(got, want) {
		t.Fatalf("the output's side file holds other bytes than the checked side file (%d vs %d bytes)", len(got), len(want))
	}
}

// TestSaveRefusesOwnSideFile: Save never writes a model over a side file
// it reads, nor (except over its own source) its side file over one.
func TestSaveRefusesOwnSideFile(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "m.onnx")
	m := sideSaved(t, path)
	defer m.Close()
	before := snapshot(t, dir)
	var sf *SameFileError
	if err := m.Save(path+".data", SaveOptions{}); !errors.As(err, &sf) || sf.Input != path+".data" {
		t.Fatalf("model over its side file: %v", err)
	}
	other := filepath.Join(dir, "x.onnx")
	if err := m.Save(other, SaveOptions{DataName: "m.onnx.data"}); !errors.As(err, &sf) {
		t.Fatalf("side file over the input's: %v", err)
	}
	if after := snapshot(t, dir); strings.Join(names(after), ",") != strings.Join(names(before), ",") || after["m.onnx.data"] != before["m.onnx.data"] {
		t.Fatalf("folder changed: %v", names(after))
	}
}

// TestInPlaceSwitchAtomic stops an in-place save after each of its renames
// (as a crash there would) and checks that the model file always names a
// side file holding its own tensors, and that a completed save leaves
// exactly the model and MODEL.data.
func TestInPlaceSwitchAtomic(t *testing.T) {
	for _, stop := range []string{"side renamed", "model renamed", "side moved", ""} {
		t.Run("stop after "+stop, func(t *testing.T) {
			dir := t.TempDir()
			path := filepath.Join(dir, "m.onnx")
			m := sideSaved(t, path)
			// The new model: the big tensor's bytes change.
			big := m.Proto.Graph.Initializer[0]
			b, err := m.TensorBytes(big)
			if err != nil {
				t.Fatal(err)
			}
			nb := append([]byte(nil), b...)
			for i := range nb {
				nb[i] ^= 0x5a
			}
			big.DataLocation, big.ExternalData, big.RawData = nil, nil, nb
			saveStep = func(s string) error {
				if s == stop {
					return errors.New("crash")
				}
				return nil
			}
			err = m.Save(path, SaveOptions{External: ExternalRepack})
			saveStep = nil
			m.Close()
			if stop == "" && err != nil {
				t.Fatal(err)
			}
			back, err := Load(path)
			if err != nil {
				t.Fatal(err)
			}
			defer back.Close()
			if err := back.Check(); err != nil {
				t.Fatalf("after a stop at %q the model does not check: %v", stop, err)
			}
			got, err := back.TensorBytes(back.Proto.Graph.Initializer[0])
			if err != nil {
				t.Fatal(err)
			}
			isNew := bytes.Equal(got, nb)
			if !isNew && !bytes.Equal(got, b) {
				t.Fatalf("stop at %q: the model names a side file with neither the old nor the new bytes", stop)
			}
			if stop == "" || stop == "model renamed" || stop == "side moved" {
				if !isNew {
					t.Fatalf("stop at %q: the old model is still in place", stop)
				}
			}
			s := snapshot(t, dir)
			for n := range s {
				if strings.Contains(n, ".tmp-") {
					t.Errorf("temporary file left: %s", n)
				}
			}
			if stop == "" && strings.Join(names(s), ",") != "m.onnx,m.onnx.data" {
				t.Fatalf("folder holds %v", names(s))
			}
		})
	}
}

// TestStaleTempsCleaned: temporary files of a process that no longer runs
// (killed before it could remove them) are removed by the next save to the
// same target; those of a running process and other files are kept.
func TestStaleTempsCleaned(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "m.onnx")
	// A process that has exited: its pid is free (or reused; then kept).
	cmd := exec.Command("true")
	if err := cmd.Run(); err != nil {
		t.Skip("cannot run true:", err)
	}
	dead := strconv.Itoa(cmd.Process.Pid)
	alive := strconv.Itoa(os.Getppid())
	stale := []string{".m.onnx.tmp-" + dead + "-123", ".m.onnx.data.tmp-" + dead + "-456"}
	keep := []string{".m.onnx.tmp-" + alive + "-789", "notes.txt"}
	for _, n := range append(append([]string{}, stale...), keep...) {
		os.WriteFile(filepath.Join(dir, n), []byte("x"), 0o644)
	}
	if err := faultModel().Save(path, SaveOptions{External: ExternalRepack}); err != nil {
		t.Fatal(err)
	}
	s := snapshot(t, dir)
	for _, n := range stale {
		if _, ok := s[n]; ok && !processAlive(cmd.Process.Pid) {
			t.Errorf("stale %s not removed", n)
		}
	}
	for _, n := range keep {
		if _, ok := s[n]; !ok {
			t.Errorf("%s removed", n)
		}
	}
}

// TestConstantExternalSaved: a Constant value in a side file, in the main
// graph and in a model-local function, is checked (a location that leaves
// the folder is refused, naming the node and attribute) and, on save, its
// bytes move to the output's side file.
func TestConstantExternalSaved(t *testing.T) {
	dir := t.TempDir()
	os.WriteFile(filepath.Join(dir, "c.bin"), bytes.Repeat([]byte{1, 2, 3, 4}, 4), 0o644)
	ext := func(loc string) *pb.TensorProto {
		return &pb.TensorProto{Name: proto.String("v"), Dims: []int64{4}, DataType: proto.Int32(int32(pb.TensorProto_FLOAT)),
			DataLocation: pb.TensorProto_EXTERNAL.Enum(), ExternalData: []*pb.StringStringEntryProto{{Key: proto.String("location"), Value: proto.String(loc)}}}
	}
	build := func(loc string) *pb.ModelProto {
		m := faultModel()
		c := NewNode("Constant", "", "const", nil, []string{"k"}, &pb.AttributeProto{Name: proto.String("value"), Type: pb.AttributeProto_TENSOR.Enum(), T: ext(loc)})
		m.Proto.Graph.Node = append(m.Proto.Graph.Node, c)
		m.Proto.Functions = []*pb.FunctionProto{{Name: proto.String("f"), Domain: proto.String("d"), Output: []string{"o"},
			Node: []*pb.NodeProto{NewNode("Constant", "", "fc", nil, []string{"o"}, &pb.AttributeProto{Name: proto.String("value"), Type: pb.AttributeProto_TENSOR.Enum(), T: ext(loc)})}}}
		return m.Proto
	}
	for _, loc := range []string{"../c.bin", "/etc/passwd"} {
		b, _ := proto.Marshal(build(loc))
		os.WriteFile(filepath.Join(dir, "bad.onnx"), b, 0o644)
		m, err := Load(filepath.Join(dir, "bad.onnx"))
		if err != nil {
			t.Fatal(err)
		}
		err = m.Check()
		m.Close()
		if !errors.Is(err, ErrBadInput) || !strings.Contains(err.Error(), `node "const" attribute "value"`) || !strings.Contains(err.Error(), `function "f": node "fc"`) {
			t.Fatalf("%s: %v", loc, err)
		}
	}
	b, _ := proto.Marshal(build("c.bin"))
	in := filepath.Join(dir, "in.onnx")
	os.WriteFile(in, b, 0o644)
	m, err := Load(in)
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	if err := m.Check(); err != nil {
		t.Fatal(err)
	}
	out := filepath.Join(t.TempDir(), "o.onnx")
	if err := m.Save(out, SaveOptions{}); err != nil {
		t.Fatal(err)
	}
	back, err := Load(out)
	if err != nil {
		t.Fatal(err)
	}
	defer back.Close()
	if err := back.Check(); err != nil {
		t.Fatal(err)
	}
	for _, v := range []*pb.TensorProto{back.Proto.Graph.Node[1].Attribute[0].T, back.Proto.Functions[0].Node[0].Attribute[0].T} {
		ref, err := External(v)
		got, gerr := back.TensorBytes(v)
		if err != nil || ref.Location != "o.onnx.data" || gerr != nil || !bytes.Equal(got, bytes.Repeat([]byte{1, 2, 3, 4}, 4)) {
			t.Fatalf("value at %q: %v %v %v", ref.Location, got, err, gerr)
		}
	}
}

// TestReadLimits: a regular model file over the read limit is refused from
// its size; a stream over it is refused after limit bytes; a stream of
// zeros after its first bytes.
func TestReadLimits(t *testing.T) {
	old := MaxReadSize
	MaxReadSize = 1 << 10
	defer func() { MaxReadSize = old }()
	dir := t.TempDir()
	big := filepath.Join(dir, "big.onnx")
	os.WriteFile(big, bytes.Repeat([]byte{0x0a, 0x01, 'x'}, 1<<10), 0o644)
	if _, err := Load(big); !errors.Is(err, ErrTooBig) || !errors.Is(err, ErrBadInput) {
		t.Fatalf("big file: %v", err)
	}
	if _, err := ReadModelBytes(bytes.NewReader(bytes.Repeat([]byte{0x0a, 0x01, 'x'}, 1<<10)), "s"); !errors.Is(err, ErrTooBig) {
		t.Fatalf("big stream: %v", err)
	}
	if _, err := ReadModelBytes(bytes.NewReader(make([]byte, 64)), "z"); !errors.Is(err, ErrBadInput) || errors.Is(err, ErrTooBig) {
		t.Fatalf("zeros: %v", err)
	}
	if _, err := Load(dir); !errors.Is(err, ErrBadInput) || !strings.Contains(err.Error(), "directory") {
		t.Fatalf("directory: %v", err)
	}
}

// TestReadLimitedSizes reads regular files (whose buffer is sized from
// their length), from their start and from an offset, streams, and a
// regular file whose length says 0 (as /proc's do), each at, below and
// over the limit.
func TestReadLimitedSizes(t *testing.T) {
	const limit = 4 << 10
	dir := t.TempDir()
	open := func(n int, off int64) func() (io.Reader, []byte) {
		return func() (io.Reader, []byte) {
			data := filled(n, 3)
			p := filepath.Join(dir, "f"+strconv.Itoa(n))
			if err := os.WriteFile(p, data, 0o644); err != nil {
				t.Fatal(err)
			}
			f, err := os.Open(p)
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { f.Close() })
			if _, err := f.Seek(off, io.SeekStart); err != nil {
				t.Fatal(err)
			}
			return f, data[min(off, int64(n)):]
		}
	}
	stream := func(n int) func() (io.Reader, []byte) {
		return func() (io.Reader, []byte) {
			data := filled(n, 5)
			return io.MultiReader(bytes.NewReader(data)), data
		}
	}
	cases := []struct {
		name   string
		open   func() (io.Reader, []byte)
		tooBig bool
		sized  bool // the buffer is at most one byte longer than the data
	}{
		{"empty file", open(0, 0), false, true},
		{"one byte", open(1, 0), false, true},
		{"at the limit", open(limit, 0), false, true},
		{"over the limit", open(limit+1, 0), true, false},
		{"far over the limit", open(3*limit, 0), true, false},
		{"over the limit, read from an offset", open(limit+10, 10), false, true},
		{"offset past the end", open(10, 20), false, false},
		{"stream at the limit", stream(limit), false, false},
		{"stream over the limit", stream(limit + 1), true, false},
		{"regular file of length 0 with content", func() (io.Reader, []byte) {
			want, err := os.ReadFile("/proc/self/cmdline")
			if err != nil {
				t.Skip(err)
			}
			f, err := os.Open("/proc/self/cmdline")
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { f.Close() })
			return f, want
		}, false, false},
	}
	for _, c := range cases {
		r, want := c.open()
		got, err := ReadLimited(r, limit, "f", "the test's limit")
		switch {
		case c.tooBig && !errors.Is(err, ErrTooBig):
			t.Errorf("%s: %v, want ErrTooBig", c.name, err)
		case !c.tooBig && err != nil:
			t.Errorf("%s: %v", c.name, err)
		case !c.tooBig && !bytes.Equal(got, want):
			t.Errorf("%s: read %d bytes, want %d", c.name, len(got), len(want))
		case c.sized && cap(got) > len(got)+1:
			t.Errorf("%s: buffer of %d bytes for %d read: not sized from the file", c.name, cap(got), len(got))
		}
	}
}

// TestTwoWritersOneTarget forces two saves to one target to interleave:
// the first stops after renaming its side file while the second runs.
// Without the folder lock the second renamed its own pair in between and
// the first then renamed its model over it, naming the second's side file;
// with it the second waits, and the pair on disk is one writer's.
func TestTwoWritersOneTarget(t *testing.T) {
	src := t.TempDir()
	models := make([]*Model, 2)
	for i := range models {
		m := sideSaved(t, filepath.Join(src, fmt.Sprintf("m%d.onnx", i)))
		big := m.Proto.Graph.Initializer[0]
		b, err := m.TensorBytes(big)
		if err != nil {
			t.Fatal(err)
		}
		nb := bytes.Repeat([]byte{byte(0x11 * (i + 1))}, len(b))
		big.DataLocation, big.ExternalData, big.RawData = nil, nil, nb
		m.Proto.Graph.Name = proto.String(fmt.Sprintf("writer%d", i))
		defer m.Close()
		models[i] = m
	}
	out := filepath.Join(t.TempDir(), "t.onnx")
	first := make(chan struct{})
	var steps atomic.Int32
	saveStep = func(s string) error {
		if s == "side renamed" && steps.Add(1) == 1 {
			close(first)
			time.Sleep(300 * time.Millisecond) // the other writer runs now
		}
		return nil
	}
	defer func() { saveStep = nil }()
	errs := make(chan error, 2)
	go func() { errs <- models[0].Save(out, SaveOptions{External: ExternalRepack}) }()
	<-first
	go func() { errs <- models[1].Save(out, SaveOptions{External: ExternalRepack}) }()
	for range 2 {
		if err := <-errs; err != nil {
			t.Fatal(err)
		}
	}
	back, err := Load(out)
	if err != nil {
		t.Fatal(err)
	}
	defer back.Close()
	got, err := back.TensorBytes(back.Proto.Graph.Initializer[0])
	if err != nil {
		t.Fatal(err)
	}
	var want byte = 0x11
	if back.Proto.Graph.GetName() == "writer1" {
		want = 0x22
	}
	if len(got) == 0 || !bytes.Equal(got, bytes.Repeat([]byte{want}, len(got))) {
		t.Fatalf("the model of %s names a side file with bytes %#x…, not its own %#x", back.Proto.Graph.GetName(), got[:min(4, len(got))], want)
	}
}

package main

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"math"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/mokopt/mokopt/graph"
	pb "github.com/mokopt/mokopt/graph/onnxpb"
	"google.golang.org/protobuf/proto"
)

// sideModelDir writes DIR/in.onnx whose initializer w lives in
// DIR/in.onnx.data and returns DIR.
func sideModelDir(t *testing.T) string {
	t.Helper()
	dir := t.TempDir()
	mp := smallModel()
	external(mp, "in.onnx.data", "offset", "0", "length", "16")
	if err := os.WriteFile(filepath.Join(dir, "in.onnx"), marshal(t, mp), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "in.onnx.data"), bytes.Repeat([]byte{0, 0, 0x80, 0x3f}, 4), 0o644); err != nil {
		t.Fatal(err)
	}
	return dir
}

// hashDir maps every entry of dir to a hash of its content (or its kind).
func hashDir(t *testing.T, dir string) map[string]string {
	t.Helper()
	es, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]string{}
	for _, e := range es {
		p := filepath.Join(dir, e.Name())
		fi, err := os.Lstat(p)
		if err != nil {
			t.Fatal(err)
		}
		if !fi.Mode().IsRegular() {
			out[e.Name()] = fi.Mode().Type().String()
			continue
		}
		b, _ := os.ReadFile(p)
		out[e.Name()] = fmt.Sprintf("%x", sha256.Sum256(b))
	}
	return out
}

func sameMap(a, b map[string]string) bool {
	if len(a) != len(b) {
		return false
	}
	for k, v := range a {
		if b[k] != v {
			return false
		}
	}
	return true
}

// TestOutputIsInputRefused: every output a command writes (the model, its
// side file, --report, --plan, diff -o) is compared by identity with every
// file it reads, for every way of spelling the same file: "./", an absolute
// path, "..", a symbolic link and a hard link. Each is refused with exit 2
// naming both paths, and the folder is left byte for byte.
func TestOutputIsInputRefused(t *testing.T) {
	dir := sideModelDir(t)
	t.Chdir(dir)
	os.Mkdir("sub", 0o755)
	os.Symlink("in.onnx", "link.onnx")
	os.Symlink("in.onnx.data", "link.data")
	if err := os.Link("in.onnx", "hard.onnx"); err != nil {
		t.Fatal(err)
	}
	if err := os.Link("in.onnx.data", "hard.data"); err != nil {
		t.Fatal(err)
	}
	aliases := map[string][2]string{ // form: model alias, side-file alias
		"dot-slash": {"./in.onnx", "./in.onnx.data"},
		"absolute":  {filepath.Join(dir, "in.onnx"), filepath.Join(dir, "in.onnx.data")},
		"dotdot":    {"sub/../in.onnx", "sub/../in.onnx.data"},
		"symlink":   {"link.onnx", "link.data"},
		"hardlink":  {"hard.onnx", "hard.data"},
	}
	kinds := []struct {
		name string
		args func(x string) []string
		side bool // x is the side-file alias
	}{
		{"rewrite -o", func(x string) []string { return []string{"rewrite", "in.onnx", "-o", x, "--no-check"} }, false},
		{"rewrite -o side file", func(x string) []string { return []string{"rewrite", "in.onnx", "-o", x, "--no-check"} }, true},
		{"rewrite --report", func(x string) []string {
			return []string{"rewrite", "in.onnx", "-o", "out.onnx", "--report", x, "--no-check"}
		}, false},
		{"rewrite --report side file", func(x string) []string {
			return []string{"rewrite", "in.onnx", "-o", "out.onnx", "--report", x, "--no-check"}
		}, true},
		{"rewrite --split-ranks", func(x string) []string {
			return []string{"rewrite", "in.onnx", "-o", strings.TrimSuffix(x, ".onnx") + ".onnx", "--split-ranks", "1", "--no-check"}
		}, false},
		{"lower -o", func(x string) []string {
			return []string{"lower", "in.onnx", "-o", x, "--target", "gb300-nvl72", "--ep", "1"}
		}, false},
		{"lower --plan", func(x string) []string {
			return []string{"lower", "in.onnx", "-o", "out.onnx", "--plan", x, "--target", "gb300-nvl72", "--ep", "1"}
		}, true},
		{"lower --target ort -o", func(x string) []string { return []string{"lower", "in.onnx", "-o", x, "--target", "ort"} }, false},
		{"diff -o", func(x string) []string { return []string{"diff", "in.onnx", "in.onnx", "-o", x} }, false},
		{"diff -o side file", func(x string) []string { return []string{"diff", "in.onnx", "in.onnx", "-o", x} }, true},
	}
	for form, al := range aliases {
		for _, k := range kinds {
			x := al[0]
			if k.side {
				x = al[1]
			}
			if k.name == "rewrite --split-ranks" {
				// The rank file m.rank0.onnx is what must alias the input.
				os.Symlink("in.onnx", "alias.rank0.onnx")
				x = "alias.onnx"
			}
			t.Run(form+"/"+k.name, func(t *testing.T) {
				before := hashDir(t, dir)
				code, msg, _ := runCLI(context.Background(), k.args(x))
				if code != 2 || !strings.Contains(msg, "refusing to write") || !strings.Contains(msg, "same file as") {
					t.Fatalf("exit %d: %s; want 2 and a refusal naming both files", code, msg)
				}
				in := "in.onnx"
				if k.side {
					in = "in.onnx.data"
				}
				if !strings.Contains(msg, in) {
					t.Errorf("message does not name the input %s: %s", in, msg)
				}
				if after := hashDir(t, dir); !sameMap(before, after) {
					t.Errorf("folder changed: %v -> %v", before, after)
				}
			})
			os.Remove("alias.rank0.onnx")
		}
	}
}

// TestOutputSideFileIsInputsSideFile: a.onnx keeps its weights in
// b.onnx.data; writing b.onnx would replace that side file, so it is
// refused, and so is a report written over another output.
func TestOutputSideFileIsInputsSideFile(t *testing.T) {
	dir := t.TempDir()
	mp := smallModel()
	external(mp, "b.onnx.data")
	a := filepath.Join(dir, "a.onnx")
	os.WriteFile(a, marshal(t, mp), 0o644)
	os.WriteFile(filepath.Join(dir, "b.onnx.data"), make([]byte, 16), 0o644)
	before := hashDir(t, dir)
	code, msg, _ := runCLI(context.Background(), []string{"rewrite", a, "-o", filepath.Join(dir, "b.onnx"), "--no-check"})
	if code != 2 || !strings.Contains(msg, "b.onnx.data") || !strings.Contains(msg, "side file") {
		t.Fatalf("exit %d: %s", code, msg)
	}
	out := filepath.Join(dir, "o.onnx")
	code, msg, _ = runCLI(context.Background(), []string{"rewrite", a, "-o", out, "--report", out + ".data", "--no-check"})
	if code != 2 || !strings.Contains(msg, "same file as") {
		t.Fatalf("report over the output's side file: exit %d: %s", code, msg)
	}
	if after := hashDir(t, dir); !sameMap(before, after) {
		t.Errorf("folder changed: %v -> %v", before, after)
	}
}

// TestInPlaceThroughAlias: --in-place accepts the input under another
// spelling and keeps a single model and side file.
func TestInPlaceThroughAlias(t *testing.T) {
	dir := sideModelDir(t)
	t.Chdir(dir)
	if code, msg, _ := runCLI(context.Background(), []string{"rewrite", "--in-place", "./in.onnx", "--no-check", "--external-data", "repack"}); code != 0 {
		t.Fatalf("exit %d: %s", code, msg)
	}
	if l := listDir(t, dir); l != "in.onnx,in.onnx.data" {
		t.Fatalf("folder: %s", l)
	}
	m, err := graph.Load(filepath.Join(dir, "in.onnx"))
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	if err := m.Check(); err != nil {
		t.Fatal(err)
	}
}

// TestOutputToFIFO: a named pipe as -o or --report is written directly (a
// reader gets the bytes) and stays a named pipe: no rename replaces it.
func TestOutputToFIFO(t *testing.T) {
	dir := t.TempDir()
	for _, kind := range []string{"-o", "--report"} {
		fifo := filepath.Join(dir, "pipe"+kind)
		if err := syscall.Mkfifo(fifo, 0o644); err != nil {
			t.Skip("no mkfifo:", err)
		}
		got := make(chan []byte, 1)
		go func() {
			f, err := os.Open(fifo)
			if err != nil {
				got <- nil
				return
			}
			b, _ := io.ReadAll(f)
			f.Close()
			got <- b
		}()
		args := []string{"rewrite", exampleModel, "-o", fifo, "--no-check"}
		if kind == "--report" {
			args = []string{"rewrite", exampleModel, "-o", filepath.Join(dir, "out.onnx"), "--report", fifo, "--no-check"}
		}
		code, msg, _ := runCLI(context.Background(), args)
		if code != 0 {
			t.Fatalf("%s to a FIFO: exit %d: %s", kind, code, msg)
		}
		var b []byte
		select {
		case b = <-got:
		case <-time.After(30 * time.Second):
			t.Fatal("reader got nothing")
		}
		if kind == "-o" {
			if _, err := graph.Parse(b, "pipe"); err != nil {
				t.Fatalf("the pipe carried no model: %v", err)
			}
		} else if !bytes.Contains(b, []byte(`"schema_version"`)) {
			t.Fatalf("the pipe carried no report: %q", b)
		}
		if fi, err := os.Lstat(fifo); err != nil || fi.Mode()&os.ModeNamedPipe == 0 {
			t.Fatalf("%s is no longer a named pipe: %v %v", fifo, fi.Mode(), err)
		}
	}
	if l := listDir(t, dir); strings.Contains(l, ".tmp-") {
		t.Fatalf("temporary files left: %s", l)
	}
}

// TestOutputThroughSymlink: an output path that is a symbolic link (as
// /dev/stdout is, to the file stdout was redirected to) is written through:
// the file it leads to gets the model and the report, the links stay links,
// and the side file goes beside the file written.
func TestOutputThroughSymlink(t *testing.T) {
	dir := t.TempDir()
	real := filepath.Join(dir, "real")
	if err := os.Mkdir(real, 0o755); err != nil {
		t.Fatal(err)
	}
	for _, f := range []string{"out.onnx", "rep.json"} {
		if err := os.WriteFile(filepath.Join(real, f), []byte("old"), 0o644); err != nil {
			t.Fatal(err)
		}
		if err := os.Symlink(filepath.Join(real, f), filepath.Join(dir, "link-"+f)); err != nil {
			t.Fatal(err)
		}
	}
	code, msg, _ := runCLI(context.Background(), []string{"rewrite", exampleModel, "-o", filepath.Join(dir, "link-out.onnx"),
		"--report", filepath.Join(dir, "link-rep.json"), "--external-data", "repack", "--no-check"})
	if code != 0 {
		t.Fatalf("exit %d: %s", code, msg)
	}
	for _, f := range []string{"out.onnx", "rep.json"} {
		if fi, err := os.Lstat(filepath.Join(dir, "link-"+f)); err != nil || fi.Mode()&os.ModeSymlink == 0 {
			t.Fatalf("link-%s is no longer a link: %v", f, err)
		}
	}
	m, err := graph.Load(filepath.Join(real, "out.onnx"))
	if err != nil {
		t.Fatalf("the link's target holds no model: %v", err)
	}
	defer m.Close()
	if err := m.Check(); err != nil {
		t.Fatal(err)
	}
	if b, err := os.ReadFile(filepath.Join(real, "rep.json")); err != nil || !bytes.Contains(b, []byte(`"schema_version"`)) {
		t.Fatalf("the report's target holds no report: %q %v", b, err)
	}
	if _, err := os.Stat(filepath.Join(real, "out.onnx.data")); err != nil {
		t.Fatalf("no side file beside the model written: %v (%s)", err, listDir(t, real))
	}
}

// TestFlagAndFolderRefusals: negative counts, an overflowing
// --tokens-per-rank, gen sizes past the limits and outputs in missing
// folders are usage errors (exit 2) found before any work: nothing is
// written and the command returns at once.
func TestFlagAndFolderRefusals(t *testing.T) {
	dir := t.TempDir()
	cases := []struct {
		name string
		args []string
		want string
	}{
		{"lower --ep -8", []string{"lower", exampleModel, "-o", filepath.Join(dir, "l.onnx"), "--target", "gb300-nvl72", "--ep", "-8"}, "--ep -8 is negative"},
		{"rewrite --split-ranks -1", []string{"rewrite", exampleModel, "-o", filepath.Join(dir, "r.onnx"), "--split-ranks", "-1"}, "--split-ranks -1 is negative"},
		{"rewrite --ep-rank -5", []string{"rewrite", exampleModel, "-o", filepath.Join(dir, "r.onnx"), "--ep-rank", "-5"}, "--ep-rank -5 is negative"},
		{"gen --layers -3", []string{"gen", "-o", filepath.Join(dir, "g.onnx"), "--layers", "-3"}, "--layers -3 is negative"},
		{"lower --tokens-per-rank 2^62", []string{"lower", exampleModel, "-o", filepath.Join(dir, "l.onnx"), "--target", "gb300-nvl72", "--tokens-per-rank", "4611686018427387904"}, "int32 token indices"},
		{"gen --layers 1000000", []string{"gen", "-o", filepath.Join(dir, "g.onnx"), "--layers", "1000000"}, "more than protobuf's 2 GiB limit"},
		{"gen --inline of 6.4 GB", []string{"gen", "-o", filepath.Join(dir, "g.onnx"), "--inline", "--experts", "64", "--hidden", "2048", "--inter", "4096"}, "drop --inline"},
		{"gen overflowing dims", []string{"gen", "-o", filepath.Join(dir, "g.onnx"), "--experts", "1099511627776", "--hidden", "1099511627776", "--inter", "1099511627776"}, "overflow"},
		{"-o into a missing folder", []string{"rewrite", exampleModel, "-o", filepath.Join(dir, "nope", "r.onnx")}, "does not exist"},
		{"--report into a missing folder", []string{"rewrite", exampleModel, "-o", filepath.Join(dir, "r.onnx"), "--report", filepath.Join(dir, "nope", "r.json")}, "does not exist"},
		{"--plan into a file as folder", []string{"lower", exampleModel, "-o", filepath.Join(dir, "l.onnx"), "--target", "gb300-nvl72", "--plan", filepath.Join(exampleModel, "p.json")}, "is not a folder"},
		{"-o is a folder", []string{"gen", "-o", dir}, "it is a directory"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			start := time.Now()
			code, msg, _ := runCLI(context.Background(), c.args)
			if code != 2 || !strings.Contains(msg, c.want) {
				t.Fatalf("exit %d: %s; want 2 and %q", code, msg, c.want)
			}
			if d := time.Since(start); d > 10*time.Second {
				t.Errorf("took %v: the refusal came after the work", d)
			}
			if l := listDir(t, dir); l != "" {
				t.Errorf("files written: %s", l)
			}
		})
	}
	// /proc takes no new files, even from root.
	if fi, err := os.Stat("/proc"); err == nil && fi.IsDir() {
		code, msg, _ := runCLI(context.Background(), []string{"rewrite", exampleModel, "-o", "/proc/mokopt-out.onnx"})
		if code != 2 || !strings.Contains(msg, "not writable") {
			t.Fatalf("unwritable folder: exit %d: %s", code, msg)
		}
	}
	if os.Geteuid() != 0 {
		ro := filepath.Join(dir, "ro")
		os.Mkdir(ro, 0o555)
		defer os.Chmod(ro, 0o755)
		code, msg, _ := runCLI(context.Background(), []string{"rewrite", exampleModel, "-o", filepath.Join(ro, "r.onnx")})
		if code != 2 || !strings.Contains(msg, "not writable") {
			t.Fatalf("read-only folder: exit %d: %s", code, msg)
		}
	}
}

// TestSideFileNotRegular: a side file that is a named pipe or a folder is
// refused by every command that loads the model, naming it, with exit 2 and
// without blocking on the pipe.
func TestSideFileNotRegular(t *testing.T) {
	for _, kind := range []string{"fifo", "directory"} {
		dir := t.TempDir()
		mp := smallModel()
		external(mp, "w.bin")
		in := filepath.Join(dir, "in.onnx")
		os.WriteFile(in, marshal(t, mp), 0o644)
		side := filepath.Join(dir, "w.bin")
		if kind == "fifo" {
			if err := syscall.Mkfifo(side, 0o644); err != nil {
				t.Skip("no mkfifo:", err)
			}
		} else {
			os.Mkdir(side, 0o755)
		}
		for _, args := range [][]string{
			{"inspect", in},
			{"rewrite", in, "-o", filepath.Join(dir, "out.onnx")},
			{"diff", in, in},
			{"verify", in, in},
			{"run", in, "--data", dir},
			{"lower", in, "-o", filepath.Join(dir, "out.onnx"), "--target", "ort"},
		} {
			done := make(chan struct{})
			var code int
			var msg string
			go func() {
				code, msg, _ = runCLI(context.Background(), args)
				close(done)
			}()
			select {
			case <-done:
			case <-time.After(20 * time.Second):
				t.Fatalf("%s %s: hung on the side file", kind, args[0])
			}
			if code != 2 || !strings.Contains(msg, `"w.bin"`) || !strings.Contains(msg, "not a regular file") {
				t.Errorf("%s %s: exit %d: %s", kind, args[0], code, msg)
			}
		}
		if l := listDir(t, dir); l != "in.onnx,w.bin" {
			t.Errorf("%s: folder holds %s", kind, l)
		}
	}
}

// TestEndlessInputsBounded: /dev/zero as the model, on standard input, as
// a test-data tensor and as an --ep-ops table is refused quickly with
// exit 2 instead of being read without end.
func TestEndlessInputsBounded(t *testing.T) {
	if _, err := os.Stat("/dev/zero"); err != nil {
		t.Skip("no /dev/zero")
	}
	dir := t.TempDir()
	data := filepath.Join(dir, "test_data_set_0")
	os.Mkdir(data, 0o755)
	os.Symlink("/dev/zero", filepath.Join(data, "input_0.pb"))
	run := func(name string, args []string, stdin *os.File) {
		t.Run(name, func(t *testing.T) {
			if stdin != nil {
				old := os.Stdin
				os.Stdin = stdin
				defer func() { os.Stdin = old }()
			}
			start := time.Now()
			code, msg, _ := runCLI(context.Background(), args)
			if code != 2 {
				t.Fatalf("exit %d: %s", code, msg)
			}
			if d := time.Since(start); d > 10*time.Second {
				t.Errorf("took %v", d)
			}
		})
	}
	run("inspect /dev/zero", []string{"inspect", "/dev/zero"}, nil)
	zero, err := os.Open("/dev/zero")
	if err != nil {
		t.Fatal(err)
	}
	defer zero.Close()
	run("inspect - </dev/zero", []string{"inspect", "-"}, zero)
	run("run --data with an endless input_0.pb", []string{"run", exampleModel, "--data", data}, nil)
	run("--ep-ops /dev/zero", []string{"inspect", exampleModel, "--ep-ops", "/dev/zero"}, nil)

	// An endless stream of plausible bytes stops at the format's limit.
	old := graph.MaxReadSize
	graph.MaxReadSize = 1 << 20
	defer func() { graph.MaxReadSize = old }()
	r, w, _ := os.Pipe()
	go func() {
		buf := bytes.Repeat([]byte{0x0a, 0x01, 'x'}, 1<<12)
		for {
			if _, err := w.Write(buf); err != nil {
				return
			}
		}
	}()
	defer r.Close()
	defer w.Close()
	run("inspect - <endless fields", []string{"inspect", "-"}, r)
}

// TestControlCharsEscaped: a node name holding ESC, BEL and a newline
// reaches neither inspect's nor text diff's output raw.
func TestControlCharsEscaped(t *testing.T) {
	dir := t.TempDir()
	mp := smallModel()
	evil := "relu\x1b[2J\x07\nMoE blocks: 99"
	mp.Graph.Node[1].Name = proto.String(evil)
	mp.Graph.Node[1].Output[0] = "y"
	a := filepath.Join(dir, "a.onnx")
	os.WriteFile(a, marshal(t, mp), 0o644)
	mp.Graph.Node[1].OpType = proto.String("Sigmoid")
	mp.Graph.Input[0].Name = proto.String("x\nforged")
	mp.Graph.Node[0].Input[0] = "x\nforged"
	b := filepath.Join(dir, "b.onnx")
	os.WriteFile(b, marshal(t, mp), 0o644)
	for _, args := range [][]string{{"inspect", b}, {"diff", "--color", "never", a, b}} {
		out := captureStdout(t, func() { runCLI(context.Background(), args) })
		if strings.ContainsAny(out, "\x1b\x07") || strings.Contains(out, "\nforged") || strings.Contains(out, "\nMoE blocks: 99") {
			t.Errorf("%s printed raw control characters: %q", args[0], out)
		}
		if args[0] == "diff" && !strings.Contains(out, `\x1b`) {
			t.Errorf("diff does not show the escaped name: %q", out)
		}
	}
}

// captureStdout runs f with os.Stdout redirected and returns what it wrote.
func captureStdout(t *testing.T, f func()) string {
	t.Helper()
	r, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	old := os.Stdout
	os.Stdout = w
	done := make(chan []byte)
	go func() { b, _ := io.ReadAll(r); done <- b }()
	f()
	w.Close()
	os.Stdout = old
	return string(<-done)
}

// TestBodyChecked: a cycle and a duplicate producer inside an If branch are
// refused by inspect, rewrite and diff (exit 2) as they are in the main graph.
func TestBodyChecked(t *testing.T) {
	for _, c := range []struct{ name, want string }{{"cycle", "cycle through node"}, {"duplicate", "produced by more than one node"}} {
		dir := t.TempDir()
		mp := smallModel()
		var body []*pb.NodeProto
		if c.name == "cycle" {
			body = []*pb.NodeProto{
				graph.NewNode("Neg", "", "n1", []string{"b2"}, []string{"b1"}),
				graph.NewNode("Neg", "", "n2", []string{"b1"}, []string{"b2"}),
			}
		} else {
			body = []*pb.NodeProto{
				graph.NewNode("Neg", "", "n1", []string{"s"}, []string{"b2"}),
				graph.NewNode("Abs", "", "n2", []string{"s"}, []string{"b2"}),
			}
		}
		br := &pb.GraphProto{Name: proto.String("then"), Node: body, Output: []*pb.ValueInfoProto{vi("b2")}}
		els := &pb.GraphProto{Name: proto.String("else"), Node: []*pb.NodeProto{graph.NewNode("Identity", "", "e", []string{"s"}, []string{"e1"})}, Output: []*pb.ValueInfoProto{vi("e1")}}
		mp.Graph.Initializer = append(mp.Graph.Initializer, &pb.TensorProto{Name: proto.String("c"), DataType: proto.Int32(int32(pb.TensorProto_BOOL)), Int32Data: []int32{1}})
		mp.Graph.Node = append(mp.Graph.Node, graph.NewNode("If", "", "if", []string{"c"}, []string{"z"},
			&pb.AttributeProto{Name: proto.String("then_branch"), Type: pb.AttributeProto_GRAPH.Enum(), G: br},
			&pb.AttributeProto{Name: proto.String("else_branch"), Type: pb.AttributeProto_GRAPH.Enum(), G: els}))
		mp.Graph.Output = append(mp.Graph.Output, vi("z"))
		in := filepath.Join(dir, "in.onnx")
		os.WriteFile(in, marshal(t, mp), 0o644)
		for _, args := range [][]string{{"inspect", in}, {"rewrite", in, "-o", filepath.Join(dir, "o.onnx")}, {"diff", in, in}} {
			code, msg, err := runCLI(context.Background(), args)
			if code != 2 || !strings.Contains(msg, c.want) || !strings.Contains(msg, `body "then_branch" of node "if"`) || !errors.Is(err, graph.ErrBadInput) {
				t.Errorf("%s %s: exit %d: %s", c.name, args[0], code, msg)
			}
		}
		if l := listDir(t, dir); l != "in.onnx" {
			t.Errorf("folder: %s", l)
		}
	}
}

// TestConstantExternalChecked: a Constant node whose value lives in a side
// file is checked like an initializer (a location leaving the folder is
// refused, naming the node), and a valid one is copied into the output's
// own side file instead of pointing at the input's.
func TestConstantExternalChecked(t *testing.T) {
	constModel := func(loc string) *pb.ModelProto {
		mp := smallModel()
		val := &pb.TensorProto{Name: proto.String("cv"), Dims: []int64{4}, DataType: proto.Int32(int32(pb.TensorProto_FLOAT)),
			DataLocation: pb.TensorProto_EXTERNAL.Enum(), ExternalData: []*pb.StringStringEntryProto{
				{Key: proto.String("location"), Value: proto.String(loc)}, {Key: proto.String("length"), Value: proto.String("16")}}}
		mp.Graph.Node = append([]*pb.NodeProto{graph.NewNode("Constant", "", "const", nil, []string{"k"},
			&pb.AttributeProto{Name: proto.String("value"), Type: pb.AttributeProto_TENSOR.Enum(), T: val})}, mp.Graph.Node...)
		mp.Graph.Node[1].Input[1] = "k"
		mp.Graph.Initializer = nil
		return mp
	}
	dir := t.TempDir()
	bad := filepath.Join(dir, "bad.onnx")
	os.WriteFile(bad, marshal(t, constModel("../../etc/passwd")), 0o644)
	for _, args := range [][]string{{"inspect", bad}, {"rewrite", bad, "-o", filepath.Join(dir, "o.onnx")}, {"diff", bad, bad}} {
		code, msg, _ := runCLI(context.Background(), args)
		if code != 2 || !strings.Contains(msg, `node "const" attribute "value"`) || !strings.Contains(msg, "escapes the model's folder") {
			t.Errorf("%s: exit %d: %s", args[0], code, msg)
		}
	}
	src := filepath.Join(dir, "src")
	os.Mkdir(src, 0o755)
	good := filepath.Join(src, "good.onnx")
	os.WriteFile(good, marshal(t, constModel("k.bin")), 0o644)
	os.WriteFile(filepath.Join(src, "k.bin"), bytes.Repeat([]byte{0, 0, 0, 0x40}, 4), 0o644)
	outDir := filepath.Join(dir, "out")
	os.Mkdir(outDir, 0o755)
	out := filepath.Join(outDir, "o.onnx")
	if code, msg, _ := runCLI(context.Background(), []string{"rewrite", good, "-o", out, "--no-check", "--partial"}); code != 0 {
		t.Fatalf("exit %d: %s", code, msg)
	}
	m, err := graph.Load(out)
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	if err := m.Check(); err != nil {
		t.Fatalf("output does not check: %v", err)
	}
	v := m.Proto.Graph.Node[0].Attribute[0].T
	ref, err := graph.External(v)
	if err != nil || ref.Location != "o.onnx.data" {
		t.Fatalf("the Constant's value points at %q (%v), want the output's side file", ref.Location, err)
	}
	b, err := m.TensorBytes(v)
	if err != nil || !bytes.Equal(b, bytes.Repeat([]byte{0, 0, 0, 0x40}, 4)) {
		t.Fatalf("value %v %v", b, err)
	}
}

// TestFusedNodeContract: a hand-made fused node whose router weight does
// not match its experts ([2E, H], or 3-D) is refused the same way by every
// consumer of the fused node: lower (with --strict), lower --target ort and
// verify, each naming the input and the dims the contract needs.
func TestFusedNodeContract(t *testing.T) {
	dir := t.TempDir()
	fused := filepath.Join(dir, "f.onnx")
	if code, msg, _ := runCLI(context.Background(), []string{"rewrite", exampleModel, "-o", fused, "--no-check"}); code != 0 {
		t.Fatalf("rewrite: %s", msg)
	}
	for _, shape := range [][]int64{{16, 64}, {2, 8, 64}} {
		m, err := graph.Load(fused)
		if err != nil {
			t.Fatal(err)
		}
		var rw *pb.TensorProto
		for _, n := range m.Proto.Graph.Node {
			if n.GetDomain() == "ai.mok" {
				for _, init := range m.Proto.Graph.Initializer {
					if init.GetName() == n.Input[1] {
						rw = init
					}
				}
			}
		}
		if rw == nil {
			t.Fatal("no router weight")
		}
		n := int64(1)
		for _, d := range shape {
			n *= d
		}
		rw.Dims, rw.RawData, rw.FloatData = shape, make([]byte, 4*n), nil
		bad := filepath.Join(dir, fmt.Sprintf("bad%d.onnx", len(shape)))
		b, err := proto.Marshal(m.Proto)
		m.Close()
		if err != nil {
			t.Fatal(err)
		}
		os.WriteFile(bad, b, 0o644)
		for _, args := range [][]string{
			{"lower", bad, "-o", filepath.Join(dir, "l.onnx"), "--target", "gb300-nvl72", "--strict", "--ep", "1"},
			{"lower", bad, "-o", filepath.Join(dir, "l.onnx"), "--target", "gb300-nvl72", "--ep", "1"},
			{"lower", bad, "-o", filepath.Join(dir, "l.onnx"), "--target", "ort"},
			{"verify", bad, fused},
		} {
			code, msg, _ := runCLI(context.Background(), args)
			if code == 0 || !strings.Contains(msg, "router_weight") || !strings.Contains(msg, "[8 64]") {
				t.Errorf("%v %v: exit %d: %s", shape, args[:2], code, msg)
			}
		}
		if fileExists(filepath.Join(dir, "l.onnx")) {
			t.Fatalf("%v: a lowered model was written", shape)
		}
	}
}

// TestRecursiveFunctionRefused: a model whose local function calls itself,
// or two functions that call each other, is refused at once (exit 2, naming
// the cycle) by every command that reads a model, instead of inlining
// forever.
func TestRecursiveFunctionRefused(t *testing.T) {
	fn := func(name, callee string) *pb.FunctionProto {
		return &pb.FunctionProto{Name: proto.String(name), Domain: proto.String("local"), Input: []string{"a"}, Output: []string{"b"},
			Node:        []*pb.NodeProto{graph.NewNode(callee, "local", "call", []string{"a"}, []string{"b"})},
			OpsetImport: []*pb.OperatorSetIdProto{{Domain: proto.String(""), Version: proto.Int64(18)}, {Domain: proto.String("local"), Version: proto.Int64(1)}}}
	}
	for _, c := range []struct {
		name  string
		funcs []*pb.FunctionProto
		want  string
	}{
		{"self", []*pb.FunctionProto{fn("f", "f")}, "local::f -> local::f"},
		{"mutual", []*pb.FunctionProto{fn("f", "g"), fn("g", "f")}, "local::f -> local::g -> local::f"},
	} {
		dir := t.TempDir()
		mp := smallModel()
		mp.Functions = c.funcs
		mp.OpsetImport = append(mp.OpsetImport, &pb.OperatorSetIdProto{Domain: proto.String("local"), Version: proto.Int64(1)})
		mp.Graph.Node[1] = graph.NewNode("f", "local", "top", []string{"s"}, []string{"y"})
		in := filepath.Join(dir, "in.onnx")
		os.WriteFile(in, marshal(t, mp), 0o644)
		for _, args := range [][]string{
			{"inspect", in}, {"rewrite", in, "-o", filepath.Join(dir, "o.onnx")}, {"diff", in, in},
			{"verify", in, in}, {"lower", in, "-o", filepath.Join(dir, "o.onnx"), "--target", "ort"},
		} {
			ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
			code, msg, err := runCLI(ctx, args)
			cancel()
			if code != 2 || !strings.Contains(msg, c.want) || !errors.Is(err, graph.ErrBadInput) {
				t.Errorf("%s %s: exit %d: %s", c.name, args[0], code, msg)
			}
		}
		if l := listDir(t, dir); l != "in.onnx" {
			t.Errorf("folder: %s", l)
		}
	}
}

// TestMalformedFusedNodes: a fused node outside its contract (no outputs,
// too many, a missing required input, an attribute out of range, unknown,
// of the wrong type or not finite) is refused by verify and by lower to
// every target, naming the node and the problem, never with a panic and
// never with a lowered model written.
func TestMalformedFusedNodes(t *testing.T) {
	dir := t.TempDir()
	fused := filepath.Join(dir, "f.onnx")
	if code, msg, _ := runCLI(context.Background(), []string{"rewrite", exampleModel, "-o", fused, "--no-check"}); code != 0 {
		t.Fatalf("rewrite: %s", msg)
	}
	setInt := func(name string, v int64) func(n *pb.NodeProto) {
		return func(n *pb.NodeProto) {
			for _, a := range n.Attribute {
				if a.GetName() == name {
					a.I = proto.Int64(v)
					return
				}
			}
			n.Attribute = append(n.Attribute, graph.IntAttr(name, v))
		}
	}
	for _, c := range []struct {
		name string
		edit func(n *pb.NodeProto)
		want string
	}{
		{"no outputs", func(n *pb.NodeProto) { n.Output, n.Input[0] = nil, "moe_out_in" }, "has 0 outputs"},
		{"unnamed output", func(n *pb.NodeProto) { n.Output[0], n.Input[0] = "", "moe_out_in" }, "the first named"},
		{"no down input", func(n *pb.NodeProto) { n.Input = n.Input[:3] }, "input down is missing"},
		{"n_group 0", setInt("n_group", 0), "n_group 0"},
		{"n_group -1", setInt("n_group", -1), "n_group -1"},
		{"topk_group 0", setInt("topk_group", 0), "topk_group 0"},
		{"topk_group over n_group", func(n *pb.NodeProto) { setInt("n_group", 2)(n); setInt("topk_group", 3)(n) }, "topk_group 3"},
		{"normalize_topk 7", setInt("normalize_topk", 7), `"normalize_topk" is 7`},
		{"unknown attribute", setInt("capacity_factor", 2), `"capacity_factor" is not in the contract`},
		{"wrong type", func(n *pb.NodeProto) {
			for _, a := range n.Attribute {
				if a.GetName() == "top_k" {
					a.Type, a.I, a.F = pb.AttributeProto_FLOAT.Enum(), nil, proto.Float32(2)
				}
			}
		}, `"top_k" is FLOAT`},
		{"NaN scaling", func(n *pb.NodeProto) {
			for _, a := range n.Attribute {
				if a.GetName() == "routed_scaling_factor" {
					a.F = proto.Float32(float32(math.NaN()))
				}
			}
		}, "must be finite"},
	} {
		m, err := graph.Load(fused)
		if err != nil {
			t.Fatal(err)
		}
		for _, n := range m.Proto.Graph.Node {
			if n.GetDomain() == "ai.mok" {
				in := n.Input[0]
				c.edit(n)
				if in != n.Input[0] { // the graph's output comes from elsewhere now
					m.Proto.Graph.Node = append(m.Proto.Graph.Node, graph.NewNode("Identity", "", "id", []string{in}, []string{m.Proto.Graph.Output[0].GetName()}))
					n.Input[0] = in
				}
			}
		}
		bad := filepath.Join(dir, "bad.onnx")
		b, err := proto.Marshal(m.Proto)
		m.Close()
		if err != nil {
			t.Fatal(err)
		}
		os.WriteFile(bad, b, 0o644)
		out := filepath.Join(dir, "l.onnx")
		for _, args := range [][]string{
			{"lower", bad, "-o", out, "--target", "gb300-nvl72", "--ep", "1"},
			{"lower", bad, "-o", out, "--target", "gb200-nvl72", "--ep", "1", "--strict"},
			{"lower", bad, "-o", out, "--target", "ort"},
			{"verify", bad, fused},
			{"verify", fused, bad},
		} {
			code, msg, _ := runCLI(context.Background(), args)
			if code == 0 || !strings.Contains(msg, c.want) || strings.Contains(msg, "panic") || strings.Contains(msg, "goroutine ") {
				t.Errorf("%s: %v: exit %d: %s", c.name, args[:3], code, msg)
			}
			if fileExists(out) {
				t.Fatalf("%s: %v wrote a lowered model", c.name, args[:3])
			}
		}
	}
}

// TestFusedBodyChecked: a fused model whose ai.mok::MoE function body was
// replaced (by an Identity, or by the body of another top-k) or dropped is
// refused by verify (either side, and with --data) and by lower to every
// target, naming the node and the overload: the body is what every other
// runtime executes, while mokopt's engine runs the node's reference
// semantics.
func TestFusedBodyChecked(t *testing.T) {
	dir := t.TempDir()
	fused := filepath.Join(dir, "f.onnx")
	if code, msg, _ := runCLI(context.Background(), []string{"rewrite", exampleModel, "-o", fused, "--no-check"}); code != 0 {
		t.Fatalf("rewrite: %s", msg)
	}
	for _, c := range []struct {
		name string
		edit func(f *pb.FunctionProto) *pb.FunctionProto
		want string
	}{
		{"identity", func(f *pb.FunctionProto) *pb.FunctionProto {
			f.Node = []*pb.NodeProto{graph.NewNode("Identity", "", "", []string{f.Input[0]}, []string{f.Output[0]})}
			return f
		}, "does not compute what the node's attributes mean"},
		{"another k", func(f *pb.FunctionProto) *pb.FunctionProto {
			for _, n := range f.Node {
				if n.GetOpType() == "Constant" {
					for _, a := range n.Attribute {
						if a.T != nil && a.T.GetDataType() == int32(pb.TensorProto_INT64) && bytes.Equal(a.T.RawData, []byte{2, 0, 0, 0, 0, 0, 0, 0}) {
							a.T.RawData = []byte{1, 0, 0, 0, 0, 0, 0, 0}
						}
					}
				}
			}
			return f
		}, "does not compute what the node's attributes mean"},
		{"dropped", func(f *pb.FunctionProto) *pb.FunctionProto { return nil }, "has no function body"},
	} {
		m, err := graph.Load(fused)
		if err != nil {
			t.Fatal(err)
		}
		var kept []*pb.FunctionProto
		for _, f := range m.Proto.Functions {
			if f.GetDomain() == "ai.mok" {
				f = c.edit(f)
			}
			if f != nil {
				kept = append(kept, f)
			}
		}
		m.Proto.Functions = kept
		bad := filepath.Join(dir, "bad.onnx")
		b, err := proto.Marshal(m.Proto)
		m.Close()
		if err != nil {
			t.Fatal(err)
		}
		os.WriteFile(bad, b, 0o644)
		out := filepath.Join(dir, "l.onnx")
		for _, args := range [][]string{
			{"verify", exampleModel, bad}, {"verify", bad, exampleModel},
			{"run", bad, "--data", "../../testdata/example/mixtral_block_dynamo_batched_mm_data"},
			{"lower", bad, "-o", out, "--target", "gb300-nvl72", "--ep", "1"},
			{"lower", bad, "-o", out, "--target", "ort"},
		} {
			code, msg, _ := runCLI(context.Background(), args)
			if code != 2 || !strings.Contains(msg, c.want) || !strings.Contains(msg, "softmax_act_topk_norm_swiglu_e8_k2_h64") {
				t.Errorf("%s: %v: exit %d: %s", c.name, args[:3], code, msg)
			}
			if fileExists(out) {
				t.Fatalf("%s: %v wrote a lowered model", c.name, args[:3])
			}
		}
	}
	for _, args := range [][]string{{"verify", exampleModel, fused}, {"run", fused, "--data", "../../testdata/example/mixtral_block_dynamo_batched_mm_data"}} {
		if code, msg, _ := runCLI(context.Background(), args); code != 0 {
			t.Errorf("%v on the untouched fused model: exit %d: %s", args, code, msg)
		}
	}
}

// TestNoRawControlBytes feeds a fused model whose node, output and block
// names hold ESC, BEL, CR, NUL and a newline followed by a forged line to
// every command and output format, and checks that nothing printed holds a
// raw control byte other than newline and tab, and that no printed line
// starts with the forged text.
func TestNoRawControlBytes(t *testing.T) {
	dir := t.TempDir()
	evil := "x\x1b]0;pwned\x07\x1b[2J\r\x00\nok FORGED all good"
	m, err := graph.Load(exampleModel)
	if err != nil {
		t.Fatal(err)
	}
	out := m.Proto.Graph.Output[0].GetName()
	for _, n := range m.Proto.Graph.Node {
		n.Name = proto.String(evil + n.GetName())
		for i, o := range n.Output {
			if o == out {
				n.Output[i] = evil
			}
		}
	}
	m.Proto.Graph.Output[0].Name = proto.String(evil)
	in := filepath.Join(dir, "in.onnx")
	b, err := proto.Marshal(m.Proto)
	m.Close()
	if err != nil {
		t.Fatal(err)
	}
	os.WriteFile(in, b, 0o644)
	p := func(s string) string { return filepath.Join(dir, s) }
	// A side file name with control characters, for wrapped OS errors.
	ext := smallModel()
	external(ext, "w\x1b[2J\nok FORGED.bin")
	os.WriteFile(p("ext.onnx"), marshal(t, ext), 0o644)
	runs := [][]string{
		{"inspect", in},
		{"rewrite", in, "-o", p("f.onnx")},
		{"verify", in, p("f.onnx")},
		{"verify", p("f.onnx"), in, "--json"},
		{"lower", p("f.onnx"), "-o", p("l.onnx"), "--target", "gb300-nvl72", "--ep", "1"},
		{"lower", p("f.onnx"), "-o", p("l.onnx"), "--target", "gb300-nvl72", "--ep", "1", "--partial"},
		{"lower", p("f.onnx"), "-o", p("o.onnx"), "--target", "ort"},
		{"diff", in, p("f.onnx")},
		{"diff", in, p("f.onnx"), "--format", "markdown"},
		{"diff", in, p("f.onnx"), "--format", "dot"},
		{"inspect", p("ext.onnx")},
		{"rewrite", p("ext.onnx"), "-o", p("e.onnx")},
	}
	for _, args := range runs {
		var code int
		stderr := captureStderr(t, func() {
			stdout := captureStdout(t, func() { code = execute(args) })
			checkPrintable(t, args, "stdout", stdout)
		})
		checkPrintable(t, args, "stderr", stderr)
		if args[0] == "rewrite" && args[1] == in && code != 0 {
			t.Fatalf("%v: exit %d: %s", args, code, stderr)
		}
	}
}

func checkPrintable(t *testing.T, args []string, stream, s string) {
	t.Helper()
	for i := 0; i < len(s); i++ {
		if c := s[i]; c < 0x20 && c != '\n' && c != '\t' || c == 0x7f {
			t.Errorf("%v: %s holds raw byte %#x at %d: %q", args[:2], stream, c, i, s[max(0, i-40):min(len(s), i+40)])
			return
		}
	}
	for _, line := range strings.Split(s, "\n") {
		if stream == "stderr" && strings.HasPrefix(line, "ok FORGED") || stream == "stdout" && strings.HasPrefix(strings.TrimLeft(line, " |\"{"), "ok FORGED") {
			t.Errorf("%v: %s holds a forged line: %q", args[:2], stream, line)
			return
		}
	}
}

// captureStderr runs f with os.Stderr redirected and returns what it wrote.
func captureStderr(t *testing.T, f func()) string {
	t.Helper()
	r, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	old := os.Stderr
	os.Stderr = w
	done := make(chan []byte)
	go func() { b, _ := io.ReadAll(r); done <- b }()
	f()
	w.Close()
	os.Stderr = old
	return string(<-done)
}

// TestLongOutputNames: a legal output name of up to 255 bytes is written
// (the temporary names are shortened), with and without a side file; a
// rank file name over 255 bytes is refused before any work, exit 2.
func TestLongOutputNames(t *testing.T) {
	dir := t.TempDir()
	src := filepath.Join(dir, "g.onnx")
	if code := execute([]string{"gen", "--shape", "batched", "--experts", "8", "--hidden", "64", "--inter", "128", "-o", src}); code != 0 {
		t.Fatalf("gen: exit %d", code)
	}
	for _, n := range []int{230, 245} {
		out := filepath.Join(dir, strings.Repeat("a", n)+".onnx")
		if code, msg, _ := runCLI(context.Background(), []string{"rewrite", src, "-o", out}); code != 0 {
			t.Fatalf("%d-byte name: exit %d: %s", n+5, code, msg)
		}
		if !fileExists(out) || !fileExists(out+".data") {
			t.Fatalf("%d-byte name: output or side file missing: %s", n+5, listDir(t, dir))
		}
	}
	long := filepath.Join(dir, strings.Repeat("b", 245)+".onnx")
	code, msg, _ := runCLI(context.Background(), []string{"rewrite", src, "-o", long, "--split-ranks", "2"})
	if code != 2 || !strings.Contains(msg, "more than the 255 a file name may have") {
		t.Fatalf("rank files over 255 bytes: exit %d: %s", code, msg)
	}
	if strings.Contains(listDir(t, dir), "bbbb") {
		t.Fatalf("something was written: %s", listDir(t, dir))
	}
}

// TestNaNWeights: an expert weight full of NaN makes the original block
// compute NaN; the rewrite's check refuses the block rather than pass
// NaN == NaN (exit 1, nothing written), and verify of a fused copy says
// that the equal elements are NaN in both models.
func TestNaNWeights(t *testing.T) {
	dir := t.TempDir()
	m, err := graph.Load(exampleModel)
	if err != nil {
		t.Fatal(err)
	}
	for _, w := range m.Proto.Graph.Initializer {
		if len(w.GetDims()) == 3 {
			b, err := m.TensorBytes(w)
			if err != nil {
				t.Fatal(err)
			}
			nb := make([]byte, len(b))
			for i := 0; i < len(nb); i += 4 {
				binary.LittleEndian.PutUint32(nb[i:], math.Float32bits(float32(math.NaN())))
			}
			w.RawData, w.FloatData = nb, nil
			break
		}
	}
	in := filepath.Join(dir, "nan.onnx")
	os.WriteFile(in, marshal(t, m.Proto), 0o644)
	m.Close()
	out := filepath.Join(dir, "f.onnx")
	code, msg, _ := runCLI(context.Background(), []string{"rewrite", in, "-o", out})
	if code != 1 || !strings.Contains(msg, "computes NaN") || fileExists(out) {
		t.Fatalf("rewrite: exit %d: %s", code, msg)
	}
	if code, msg, _ := runCLI(context.Background(), []string{"rewrite", in, "-o", out, "--no-check"}); code != 0 {
		t.Fatalf("rewrite --no-check: exit %d: %s", code, msg)
	}
	var vcode int
	stdout := captureStdout(t, func() { vcode = execute([]string{"verify", in, out}) })
	if vcode != 0 || !strings.Contains(stdout, "1024 NaN or infinite in both models") {
		t.Fatalf("verify: exit %d: %s", vcode, stdout)
	}
}

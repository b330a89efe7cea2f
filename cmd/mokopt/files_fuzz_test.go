package main

import (
	"bytes"
	"context"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

// fuzzParts are the path components FuzzCLIFiles builds paths from: the
// input model and its side file under every spelling, new names, a named
// pipe, a folder, a symbolic and a hard link, and climbs that stay inside
// the test's folder.
var fuzzParts = []string{"in.onnx", "in.onnx.data", "out.onnx", "out.onnx.data", "r.json", "fifo", "sub", "..", ".", "link.onnx", "hard.onnx", "missing", "in.onnx.rank0.onnx", ""}

// fuzzPath turns bytes into a path below dir/a/b (at most two climbs, so
// that it stays inside dir), absolute when the first byte is odd.
func fuzzPath(dir string, sel []byte) string {
	var parts []string
	climbs := 0
	for _, c := range sel {
		p := fuzzParts[int(c)%len(fuzzParts)]
		if p == ".." {
			if climbs == 2 {
				continue
			}
			climbs++
		}
		parts = append(parts, p)
	}
	rel := filepath.Join(append([]string{"a", "b"}, parts...)...)
	if len(sel) > 0 && sel[0]%2 == 1 {
		return filepath.Join(dir, rel)
	}
	return rel
}

// FuzzCLIFiles runs mokopt's commands in-process on fuzzed output and input
// paths (every alias of the input, pipes, folders, missing folders) and
// fuzzed counts (--ep, --split-ranks, --tokens-per-rank, --layers, ...).
// Whatever the arguments: no panic, an exit code of 0, 1 or 2, the input
// model and its side file unchanged byte for byte (unless --in-place, or
// gen, which reads nothing), the
// named pipe still a named pipe, and no temporary file left behind.
func FuzzCLIFiles(f *testing.F) {
	f.Add(uint8(0), []byte{0}, []byte{2}, int64(4), int64(1))
	f.Add(uint8(0), []byte{0}, []byte{8, 0}, int64(-1), int64(0))
	f.Add(uint8(1), []byte{0}, []byte{9, 6, 8, 1}, int64(8), int64(1<<62))
	f.Add(uint8(2), []byte{10}, []byte{5}, int64(0), int64(3))
	f.Add(uint8(3), []byte{0}, []byte{4}, int64(2), int64(-7))
	f.Add(uint8(4), []byte{1}, []byte{3}, int64(1000000), int64(1))
	f.Add(uint8(5), []byte{0}, []byte{11, 2}, int64(1), int64(1))
	f.Fuzz(func(t *testing.T, cmd uint8, inSel, outSel []byte, n1, n2 int64) {
		if len(inSel) > 6 || len(outSel) > 6 {
			return
		}
		dir := t.TempDir()
		t.Chdir(dir) // relative paths are below dir too
		b := filepath.Join(dir, "a", "b")
		os.MkdirAll(filepath.Join(b, "sub"), 0o755)
		mp := smallModel()
		external(mp, "in.onnx.data", "offset", "0", "length", "16")
		model := marshal(t, mp)
		side := bytes.Repeat([]byte{0, 0, 0x80, 0x3f}, 4)
		os.WriteFile(filepath.Join(b, "in.onnx"), model, 0o644)
		os.WriteFile(filepath.Join(b, "in.onnx.data"), side, 0o644)
		os.Symlink("in.onnx", filepath.Join(b, "link.onnx"))
		os.Link(filepath.Join(b, "in.onnx"), filepath.Join(b, "hard.onnx"))
		fifo := filepath.Join(b, "fifo")
		if err := syscall.Mkfifo(fifo, 0o644); err != nil {
			t.Skip("no mkfifo")
		}
		// A reader that drains the pipe keeps writes to it from blocking,
		// however much a command writes. It is not a writer, so a command
		// reading the pipe sees its end at once; while no writer is
		// connected its reads end at once too, hence the short waits.
		rd, err := os.OpenFile(fifo, os.O_RDONLY|syscall.O_NONBLOCK, 0)
		if err != nil {
			t.Fatal(err)
		}
		stop, drained := make(chan struct{}), make(chan struct{})
		go func() {
			defer close(drained)
			buf := make([]byte, 1<<16)
			for {
				select {
				case <-stop:
					return
				default:
				}
				if _, err := rd.Read(buf); err == io.EOF {
					time.Sleep(time.Millisecond)
				} else if err != nil {
					return
				}
			}
		}()
		defer func() { close(stop); rd.Close(); <-drained }()
		in, out := fuzzPath(dir, inSel), fuzzPath(dir, outSel)
		if fi, err := os.Stat(filepath.Join(dir, strings.TrimPrefix(in, dir))); err == nil && fi.Mode()&os.ModeNamedPipe != 0 {
			// A model read from a named pipe waits for its writer, as cat
			// does; there is none here.
			return
		}
		s1, s2 := strconv.FormatInt(n1, 10), strconv.FormatInt(n2, 10)
		var args []string
		inPlace := false
		switch cmd % 7 {
		case 0:
			args = []string{"rewrite", in, "-o", out, "--no-check", "--partial", "--split-ranks", s1}
		case 1:
			args = []string{"rewrite", in, "-o", filepath.Join(b, "out.onnx"), "--report", out, "--no-check", "--partial", "--ep-rank", s1}
		case 2:
			args = []string{"lower", in, "-o", out, "--target", "gb300-nvl72", "--ep", s1, "--tokens-per-rank", s2, "--plan", filepath.Join(b, "r.json")}
		case 3:
			args = []string{"diff", in, filepath.Join(b, "in.onnx"), "-o", out}
		case 4:
			if n1 > 4 && n1 < 1<<31 || n2 > 64 && n2 < 1<<31 {
				return // a real build of that size: not a file-handling case
			}
			args = []string{"gen", "-o", out, "--layers", s1, "--experts", s2, "--hidden", "8", "--inter", "8", "--top-k", "1"}
			inPlace = true // gen reads nothing: replacing a file is its job
		case 5:
			args = []string{"rewrite", "--in-place", in, "--no-check", "--partial"}
			inPlace = true
		case 6:
			args = []string{"inspect", in, "--ep-ops", out}
		}
		code, msg, _ := runCLI(context.Background(), args)
		if code != 0 && code != 1 && code != 2 {
			t.Fatalf("%v: exit %d: %s", args, code, msg)
		}
		if strings.Contains(msg, "goroutine") || strings.Contains(msg, "panic") {
			t.Fatalf("%v: %s", args, msg)
		}
		if !inPlace {
			if got, _ := os.ReadFile(filepath.Join(b, "in.onnx")); !bytes.Equal(got, model) {
				t.Fatalf("%v (exit %d: %s): the input model changed", args, code, msg)
			}
			if got, _ := os.ReadFile(filepath.Join(b, "in.onnx.data")); !bytes.Equal(got, side) {
				t.Fatalf("%v (exit %d: %s): the input's side file changed", args, code, msg)
			}
		}
		if fi, err := os.Lstat(fifo); err != nil || fi.Mode()&os.ModeNamedPipe == 0 {
			t.Fatalf("%v: the named pipe was replaced", args)
		}
		filepath.WalkDir(dir, func(p string, d os.DirEntry, err error) error {
			if err == nil && strings.Contains(d.Name(), ".tmp-") {
				t.Fatalf("%v: temporary file left: %s", args, p)
			}
			return nil
		})
	})
}

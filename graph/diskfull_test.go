package graph

import (
	"errors"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
)

// enospcAfter accepts n bytes in total, then fails as the kernel does on a
// full disk.
type enospcAfter struct {
	w io.Writer
	n *int64
}

func (f enospcAfter) Write(p []byte) (int, error) {
	full := &os.PathError{Op: "write", Path: "out", Err: syscall.ENOSPC}
	if int64(len(p)) > *f.n {
		k, _ := f.w.Write(p[:*f.n])
		*f.n = 0
		return k, full
	}
	*f.n -= int64(len(p))
	return f.w.Write(p)
}

// TestSaveDiskFull: a save that runs out of space, in the side file or in
// the model file, returns a DiskFullError naming the folder and the output,
// with the bytes the save needed (at least the side file's and the model
// file's) and the system's error beneath, and leaves nothing behind.
func TestSaveDiskFull(t *testing.T) {
	ref := t.TempDir()
	m := faultModel()
	if err := m.Save(filepath.Join(ref, "m.onnx"), SaveOptions{External: ExternalRepack}); err != nil {
		t.Fatal(err)
	}
	var total int64
	for _, n := range []string{"m.onnx", "m.onnx.data"} {
		st, err := os.Stat(filepath.Join(ref, n))
		if err != nil {
			t.Fatal(err)
		}
		total += st.Size()
	}
	for _, n := range []int64{0, 4096, total - 10} {
		dir := t.TempDir()
		path := filepath.Join(dir, "m.onnx")
		left := n
		writeHook = func(w io.Writer) io.Writer { return enospcAfter{w, &left} }
		err := m.Save(path, SaveOptions{External: ExternalRepack})
		writeHook = nil
		var df *DiskFullError
		if !errors.As(err, &df) || !errors.Is(err, syscall.ENOSPC) {
			t.Fatalf("full after %d bytes: Save returned %v, want a DiskFullError over ENOSPC", n, err)
		}
		// Slack: the side file's alignment padding and the model file's
		// external-data entries, which the estimate leaves out.
		const slack = sideAlign + 1024
		if df.Path != path || df.Dir != dir || df.Need < total-slack || df.Need > total+slack {
			t.Errorf("full after %d bytes: %+v, want path %s, dir %s, need about %d", n, df, path, dir, total)
		}
		msg := err.Error()
		if !strings.Contains(msg, dir) || !strings.Contains(msg, "no space left") || !strings.Contains(msg, strconv.FormatInt(df.Need, 10)) {
			t.Errorf("message %q lacks the folder, the cause or the bytes needed", msg)
		}
		if es, _ := os.ReadDir(dir); len(es) != 0 {
			t.Errorf("full after %d bytes: left %d files behind", n, len(es))
		}
	}
	// Another write error stays what it was.
	left := int64(0)
	writeHook = func(w io.Writer) io.Writer { return failAfter{w, &left} }
	err := m.Save(filepath.Join(t.TempDir(), "m.onnx"), SaveOptions{External: ExternalRepack})
	writeHook = nil
	var df *DiskFullError
	if errors.As(err, &df) || !errors.Is(err, errDiskFull) {
		t.Fatalf("a write error other than ENOSPC became %v", err)
	}
}

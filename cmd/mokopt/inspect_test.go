package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestInspectWithoutSideFile: inspect reads no weight bytes, so a missing
// side file only warns; commands that read the weights still refuse it.
func TestInspectWithoutSideFile(t *testing.T) {
	dir := t.TempDir()
	src := filepath.Join(dir, "g.onnx")
	if code, _, stderr := run(t, nil, "gen", "-q", "--layers", "2", "-o", src); code != 0 {
		t.Fatalf("gen: exit %d: %s", code, stderr)
	}
	if err := os.Remove(src + ".data"); err != nil {
		t.Fatal(err)
	}
	code, out, stderr := run(t, nil, "inspect", src)
	if code != 0 || !strings.Contains(string(out), "MoE blocks: 2") || !strings.Contains(stderr, "g.onnx.data") || !strings.Contains(stderr, "warning") {
		t.Fatalf("inspect without its side file: exit %d, %q, %q", code, out, stderr)
	}
	// Several tensors in the missing file: one counted line, not one each.
	if strings.Count(stderr, "cannot open external data") != 1 || !strings.Contains(stderr, "more like it") {
		t.Errorf("problems not grouped: %q", stderr)
	}
	if code, _, stderr := run(t, nil, "rewrite", src, "-o", filepath.Join(dir, "f.onnx")); code != 2 || !strings.Contains(stderr, "g.onnx.data") {
		t.Errorf("rewrite without the side file: exit %d, %q; want 2 naming it", code, stderr)
	}
	// A side file present but too short is not "missing": inspect refuses it.
	if err := os.WriteFile(src+".data", []byte("short"), 0o644); err != nil {
		t.Fatal(err)
	}
	if code, _, stderr := run(t, nil, "inspect", src); code != 2 {
		t.Errorf("inspect with a truncated side file: exit %d, %q; want 2", code, stderr)
	}
}

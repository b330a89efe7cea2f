package main

import (
	"bytes"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"
)

// buildBinary compiles mokopt into a temporary folder.
func buildBinary(t *testing.T) string {
	t.Helper()
	if testing.Short() {
		t.Skip("builds the binary")
	}
	bin := filepath.Join(t.TempDir(), "mokopt")
	cmd := exec.Command("go", "build", "-o", bin, ".")
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	return bin
}

// TestSIGINTMidWrite starts `mokopt gen` on a model whose weights take a
// while to write, sends SIGINT once the temporary side file holds data, and
// checks that mokopt exits 130 saying so and leaves neither an output nor a
// temporary file.
func TestSIGINTMidWrite(t *testing.T) {
	bin := buildBinary(t)
	dir := t.TempDir()
	out := filepath.Join(dir, "big.onnx")
	// 8 layers of 32 experts x 3 x 512 x 1024 float32: 1.6 GB of weights.
	cmd := exec.Command(bin, "gen", "-o", out, "--layers", "8", "--experts", "32", "--hidden", "512", "--inter", "1024")
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	deadline := time.Now().Add(60 * time.Second)
	signalled := false
	for !signalled && time.Now().Before(deadline) {
		tmps, _ := filepath.Glob(filepath.Join(dir, ".big.onnx.data.tmp-*"))
		if len(tmps) == 1 {
			if st, err := os.Stat(tmps[0]); err == nil && st.Size() > 8<<20 {
				if err := cmd.Process.Signal(syscall.SIGINT); err != nil {
					t.Fatal(err)
				}
				signalled = true
				break
			}
		}
		select {
		case err := <-done:
			t.Fatalf("gen finished (%v) before it could be interrupted mid-write; stderr: %s", err, stderr.String())
		case <-time.After(2 * time.Millisecond):
		}
	}
	if !signalled {
		cmd.Process.Kill()
		t.Fatal("no temporary side file with data appeared within 60 s")
	}
	var err error
	select {
	case err = <-done:
	case <-time.After(60 * time.Second):
		cmd.Process.Kill()
		t.Fatal("mokopt did not stop within 60 s of SIGINT")
	}
	var ee *exec.ExitError
	if !errors.As(err, &ee) || ee.ExitCode() != exitInterrupted {
		t.Fatalf("exit: %v, want code %d; stderr: %s", err, exitInterrupted, stderr.String())
	}
	if !strings.Contains(stderr.String(), "interrupted; no output written") || strings.Contains(stderr.String(), "goroutine") {
		t.Fatalf("stderr: %q", stderr.String())
	}
	if l := listDir(t, dir); l != "" {
		t.Fatalf("files left after SIGINT: %s", l)
	}
}

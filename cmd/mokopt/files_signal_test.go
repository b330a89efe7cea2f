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

// startGenUntilTemp starts `mokopt gen` of 1.6 GB of weights into dir and
// waits until its temporary side file holds 8 MiB.
func startGenUntilTemp(t *testing.T, bin, dir string) (*exec.Cmd, chan error, *bytes.Buffer) {
	t.Helper()
	cmd := exec.Command(bin, "gen", "-o", filepath.Join(dir, "big.onnx"), "--layers", "8", "--experts", "32", "--hidden", "512", "--inter", "1024")
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	deadline := time.Now().Add(60 * time.Second)
	for time.Now().Before(deadline) {
		tmps, _ := filepath.Glob(filepath.Join(dir, ".big.onnx.data.tmp-*"))
		if len(tmps) == 1 {
			if st, err := os.Stat(tmps[0]); err == nil && st.Size() > 8<<20 {
				return cmd, done, &stderr
			}
		}
		select {
		case err := <-done:
			t.Fatalf("gen finished (%v) before it could be stopped mid-write; stderr: %s", err, stderr.String())
		case <-time.After(2 * time.Millisecond):
		}
	}
	cmd.Process.Kill()
	t.Fatal("no temporary side file with data appeared within 60 s")
	return nil, nil, nil
}

// TestHangupQuitMidWrite: SIGHUP and SIGQUIT mid-save stop mokopt as
// SIGINT does (exit 130, no goroutine dump, no output, no temporary file),
// and the temporary files of a run killed with SIGKILL are removed by the
// next run that writes the same output.
func TestHangupQuitMidWrite(t *testing.T) {
	bin := buildBinary(t)
	for _, sig := range []syscall.Signal{syscall.SIGHUP, syscall.SIGQUIT} {
		dir := t.TempDir()
		cmd, done, stderr := startGenUntilTemp(t, bin, dir)
		if err := cmd.Process.Signal(sig); err != nil {
			t.Fatal(err)
		}
		var err error
		select {
		case err = <-done:
		case <-time.After(60 * time.Second):
			cmd.Process.Kill()
			t.Fatalf("%v: mokopt did not stop within 60 s", sig)
		}
		var ee *exec.ExitError
		if !errors.As(err, &ee) || ee.ExitCode() != exitInterrupted {
			t.Fatalf("%v: exit %v, want %d; stderr: %s", sig, err, exitInterrupted, stderr.String())
		}
		if s := stderr.String(); !strings.Contains(s, "interrupted; no output written") || strings.Contains(s, "goroutine") {
			t.Fatalf("%v: stderr %q", sig, s)
		}
		if l := listDir(t, dir); l != "" {
			t.Fatalf("%v: files left: %s", sig, l)
		}
	}
	dir := t.TempDir()
	cmd, done, _ := startGenUntilTemp(t, bin, dir)
	cmd.Process.Kill()
	<-done
	if l := listDir(t, dir); !strings.Contains(l, ".tmp-") {
		t.Fatalf("SIGKILL left no temporary file to clean (%q)", l)
	}
	out := filepath.Join(dir, "big.onnx")
	if b, err := exec.Command(bin, "gen", "-o", out).CombinedOutput(); err != nil {
		t.Fatalf("gen: %v %s", err, b)
	}
	if l := listDir(t, dir); l != "big.onnx,big.onnx.data" {
		t.Fatalf("after the next run the folder holds %s", l)
	}
}

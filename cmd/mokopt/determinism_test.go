package main

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"testing"

	"github.com/mokopt/mokopt/graph"
)

// TestOutputsIdenticalAcrossGOMAXPROCS: rewrite (model and --report), gen
// and lower give the same bytes whatever the number of threads, run after
// run.
func TestOutputsIdenticalAcrossGOMAXPROCS(t *testing.T) {
	defer runtime.GOMAXPROCS(runtime.GOMAXPROCS(0))
	inputs := []string{exampleModel}
	for _, f := range []string{"deepseek_v3_block_dynamo_batched_mm.onnx", "hf4_qwen2_shared_block_dynamo.onnx", "gpt_oss_full_dynamo_batched_mm.onnx"} {
		if p := filepath.Join(fixtureDir, f); fileExists(p) {
			inputs = append(inputs, p)
		}
	}
	dir := t.TempDir()
	jobs := map[string]func(out string) []string{
		"gen": func(out string) []string {
			return []string{"gen", "-o", out, "--shape", "unrolled", "--layers", "2", "--shared-inter", "32", "--router", "sigmoid"}
		},
	}
	for i, in := range inputs {
		jobs[fmt.Sprintf("rewrite %d", i)] = func(out string) []string {
			return []string{"rewrite", in, "-o", out, "--report", out + ".report.json", "--external-data", "repack"}
		}
	}
	jobs["lower"] = func(out string) []string {
		fused := filepath.Join(dir, "lower_in.onnx")
		if !fileExists(fused) {
			if code, msg, _ := runCLI(context.Background(), []string{"rewrite", exampleModel, "-o", fused}); code != 0 {
				t.Fatalf("rewrite: %s", msg)
			}
		}
		return []string{"lower", fused, "-o", out, "--target", "gb300-nvl72", "--ep", "4", "--partial", "--plan", out + ".plan.json"}
	}
	for name, args := range jobs {
		var ref map[string][]byte
		for run, procs := range []int{1, 4, 1, 16} {
			runtime.GOMAXPROCS(procs)
			// Same paths every run (the report names them), emptied first.
			sub := filepath.Join(dir, name)
			os.RemoveAll(sub)
			os.MkdirAll(sub, 0o755)
			out := filepath.Join(sub, "out.onnx")
			if code, msg, _ := runCLI(context.Background(), args(out)); code != 0 {
				t.Fatalf("%s (GOMAXPROCS %d): exit %d: %s", name, procs, code, msg)
			}
			got := map[string][]byte{}
			es, _ := os.ReadDir(sub)
			for _, e := range es {
				b, _ := os.ReadFile(filepath.Join(sub, e.Name()))
				got[e.Name()] = b
			}
			if len(got["out.onnx"]) == 0 {
				t.Fatalf("%s wrote no model", name)
			}
			if ref == nil {
				ref = got
				continue
			}
			if len(got) != len(ref) {
				t.Fatalf("%s: GOMAXPROCS %d wrote %d files, the first run %d", name, procs, len(got), len(ref))
			}
			for k, b := range ref {
				if !bytes.Equal(got[k], b) {
					t.Fatalf("%s: %s differs between GOMAXPROCS 1 and %d (run %d)", name, k, procs, run)
				}
			}
		}
	}
}

func fileExists(p string) bool { _, err := os.Stat(p); return err == nil }

// TestRewriteInPlace: --in-place replaces the input (model and side file)
// only on success; a refused fusion leaves both byte for byte, and no backup
// or temporary file stays behind either way.
func TestRewriteInPlace(t *testing.T) {
	dir := t.TempDir()
	in := filepath.Join(dir, "m.onnx")
	if code, msg, _ := runCLI(context.Background(), []string{"gen", "-o", in, "--layers", "2"}); code != 0 {
		t.Fatalf("gen: %s", msg)
	}
	origModel, _ := os.ReadFile(in)
	if code, msg, _ := runCLI(context.Background(), []string{"rewrite", "--in-place", in}); code != 0 {
		t.Fatalf("rewrite --in-place: exit %d: %s", code, msg)
	}
	if l := listDir(t, dir); l != "m.onnx,m.onnx.data" {
		t.Fatalf("folder after --in-place: %s", l)
	}
	m, err := graph.Load(in)
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	if err := m.Check(); err != nil {
		t.Fatalf("rewritten model does not check: %v", err)
	}
	fused := 0
	for _, n := range m.Proto.Graph.Node {
		if n.GetDomain() == "ai.mok" {
			fused++
		}
	}
	if now, _ := os.ReadFile(in); fused != 2 || bytes.Equal(now, origModel) {
		t.Fatalf("%d fused nodes after --in-place, want 2 (model changed: %v)", fused, !bytes.Equal(now, origModel))
	}

	// A refused rewrite in place changes nothing.
	lost := filepath.Join(fixtureDir, "qwen2_moe_block_torchscript.onnx")
	if !fileExists(lost) {
		t.Fatalf("fixture %s missing", lost)
	}
	b, _ := os.ReadFile(lost)
	victim := filepath.Join(dir, "lost.onnx")
	os.WriteFile(victim, b, 0o644)
	if code, _, _ := runCLI(context.Background(), []string{"rewrite", "--in-place", victim}); code != 1 {
		t.Fatalf("refused in-place rewrite: exit %d, want 1", code)
	}
	if now, _ := os.ReadFile(victim); !bytes.Equal(now, b) {
		t.Fatal("a refused in-place rewrite changed the input")
	}
	if l := listDir(t, dir); l != "lost.onnx,m.onnx,m.onnx.data" {
		t.Fatalf("folder after the refused rewrite: %s", l)
	}
}

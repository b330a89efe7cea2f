package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/mokopt/mokopt/graph"
	"github.com/mokopt/mokopt/internal/fixtures"
)

var fixtureDir = fixtures.Dir()

func TestRewriteExitCodes(t *testing.T) {
	dir := t.TempDir()
	garbage := filepath.Join(dir, "garbage.onnx")
	os.WriteFile(garbage, []byte("\xff\xff\xffnot a model"), 0o644)
	lost := filepath.Join(fixtureDir, "qwen2_moe_block_torchscript.onnx")
	example := "../../testdata/example/mixtral_block_dynamo_batched_mm.onnx"
	cases := []struct {
		name    string
		args    []string
		code    int
		written bool
	}{
		{"example fuses", []string{"rewrite", example, "-o", filepath.Join(dir, "ok.onnx")}, 0, true},
		{"lost experts refused", []string{"rewrite", lost, "-o", filepath.Join(dir, "lost.onnx")}, 1, false},
		{"lost experts restored", []string{"rewrite", "--restore-traced-experts", "--check-data", strings.TrimSuffix(lost, ".onnx") + "_data", lost, "-o", filepath.Join(dir, "restored.onnx")}, 0, true},
		{"lost experts, check data missing", []string{"rewrite", "--restore-traced-experts", "--check-data", filepath.Join(dir, "nodata"), lost, "-o", filepath.Join(dir, "nodata.onnx")}, 2, false},
		{"garbage input", []string{"rewrite", garbage, "-o", filepath.Join(dir, "garbage_out.onnx")}, 2, false},
		{"missing input", []string{"rewrite", filepath.Join(dir, "nope.onnx"), "-o", filepath.Join(dir, "nope_out.onnx")}, 2, false},
		{"no output flag", []string{"rewrite", example}, 2, false},
		{"unknown flag", []string{"rewrite", "--bogus", example}, 2, false},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			if strings.HasPrefix(tc.name, "lost experts") {
				if _, err := os.Stat(lost); err != nil {
					t.Fatal(err)
				}
			}
			if code := execute(tc.args); code != tc.code {
				t.Fatalf("exit %d, want %d", code, tc.code)
			}
			out := ""
			for i, a := range tc.args {
				if a == "-o" {
					out = tc.args[i+1]
				}
			}
			if out == "" {
				return
			}
			_, err := os.Stat(out)
			if tc.written != (err == nil) {
				t.Fatalf("output written = %v, want %v", err == nil, tc.written)
			}
			if tc.written {
				m, err := graph.Load(out)
				if err != nil {
					t.Fatal(err)
				}
				fused := 0
				for _, n := range m.Proto.Graph.Node {
					if n.GetDomain() == "ai.mok" && n.GetOpType() == "MoE" {
						fused++
					}
				}
				if fused != 1 {
					t.Fatalf("%d fused nodes, want 1", fused)
				}
			}
			left, _ := filepath.Glob(filepath.Join(dir, ".*tmp*"))
			if len(left) > 0 {
				t.Fatalf("temporary files left behind: %v", left)
			}
		})
	}
}

func TestRewriteDeterministic(t *testing.T) {
	dir := t.TempDir()
	example := "../../testdata/example/mixtral_block_dynamo_batched_mm.onnx"
	a, b := filepath.Join(dir, "a.onnx"), filepath.Join(dir, "b.onnx")
	if execute([]string{"rewrite", example, "-o", a}) != 0 || execute([]string{"rewrite", example, "-o", b}) != 0 {
		t.Fatal("rewrite failed")
	}
	ba, _ := os.ReadFile(a)
	bb, _ := os.ReadFile(b)
	if len(ba) == 0 || string(ba) != string(bb) {
		t.Fatal("two rewrites of the same input differ")
	}
}

package main

import (
	"path/filepath"
	"testing"

	"github.com/mokopt/mokopt/graph"
)

// TestLowerORTExitCodes: mokopt lower --target ort writes com.microsoft::MoE
// (or QMoE) nodes, refuses a block the op cannot express with exit 1 and no
// output, and rejects bad flag combinations with exit 2.
func TestLowerORTExitCodes(t *testing.T) {
	dir := t.TempDir()
	fused := filepath.Join(dir, "mixtral.fused.onnx")
	if code := execute([]string{"rewrite", "../../testdata/example/mixtral_block_dynamo_batched_mm.onnx", "-o", fused}); code != 0 {
		t.Fatalf("rewrite exit %d", code)
	}
	llama := filepath.Join(fixtureDir, "llama4_block_dynamo.onnx")
	llamaFused := filepath.Join(dir, "llama4.fused.onnx")
	if code := execute([]string{"rewrite", llama, "-o", llamaFused}); code != 0 {
		t.Fatalf("rewrite %s: exit %d", llama, code)
	}
	cases := []struct {
		name string
		args []string
		code int
		op   string // the op the output must hold, "" when nothing is written
	}{
		{"float", []string{"lower", fused, "-o", filepath.Join(dir, "f.onnx"), "--target", "ort"}, 0, "MoE"},
		{"int4 blocks", []string{"lower", fused, "-o", filepath.Join(dir, "q.onnx"), "--target", "ort", "--quant", "int4", "--block-size", "32"}, 0, "QMoE"},
		{"bad quant", []string{"lower", fused, "-o", filepath.Join(dir, "b.onnx"), "--target", "ort", "--quant", "fp3"}, 2, ""},
		{"bad block size", []string{"lower", fused, "-o", filepath.Join(dir, "b2.onnx"), "--target", "ort", "--quant", "int8", "--block-size", "24"}, 2, ""},
		{"quant for the MoK target", []string{"lower", fused, "-o", filepath.Join(dir, "m.onnx"), "--target", "gb300-nvl72", "--ep", "8", "--quant", "int8"}, 2, ""},
		{"llama4 refused", []string{"lower", llamaFused, "-o", filepath.Join(dir, "l.onnx"), "--target", "ort"}, 1, ""},
		{"llama4 partial", []string{"lower", llamaFused, "-o", filepath.Join(dir, "lp.onnx"), "--target", "ort", "--partial"}, 0, "ai.mok"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			if code := execute(tc.args); code != tc.code {
				t.Fatalf("exit %d, want %d", code, tc.code)
			}
			out := tc.args[3]
			m, err := graph.Load(out)
			if tc.op == "" {
				if err == nil {
					t.Fatalf("%s written", out)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			found := false
			for _, n := range m.Proto.Graph.Node {
				if (n.GetDomain() == "com.microsoft" && n.GetOpType() == tc.op) || (tc.op == "ai.mok" && n.GetDomain() == "ai.mok") {
					found = true
				}
			}
			if !found {
				t.Fatalf("%s holds no %s node", out, tc.op)
			}
		})
	}
}

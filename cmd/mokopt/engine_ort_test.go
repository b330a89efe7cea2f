//go:build ort

package main

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/mokopt/mokopt/graph"
	"github.com/mokopt/mokopt/graph/eval"
)

// TestVerifyEngineORT runs `verify --engine ort` on the example's rewrite
// (pass) and on a copy with one expert weight perturbed by 1e-2 (fail).
func TestVerifyEngineORT(t *testing.T) {
	dir := t.TempDir()
	example := "../../testdata/example/mixtral_block_dynamo_batched_mm.onnx"
	fused := filepath.Join(dir, "fused.onnx")
	if code := execute([]string{"rewrite", example, "-o", fused}); code != 0 {
		t.Fatalf("rewrite: exit %d", code)
	}
	if code := execute([]string{"verify", "--engine", "ort", fused, example}); code != 0 {
		t.Fatalf("verify --engine ort of the true rewrite: exit %d, want 0", code)
	}
	m, err := graph.Load(fused)
	if err != nil {
		t.Fatal(err)
	}
	var gate string
	for _, n := range m.Proto.Graph.Node {
		if n.GetDomain() == "ai.mok" && n.GetOpType() == "MoE" {
			gate = n.Input[4]
		}
	}
	perturbed := false
	for i, ini := range m.Proto.Graph.Initializer {
		if ini.GetName() != gate {
			continue
		}
		w, err := eval.FromProto(ini, m.TensorBytes)
		if err != nil {
			t.Fatal(err)
		}
		for j := range w.F32 { // every expert's first weight, so any routing sees it
			if j%(w.Len()/w.Shape[0]) == 0 {
				w.F32[j] += 1e-2
			}
		}
		p, err := eval.ToProto(w, gate)
		if err != nil {
			t.Fatal(err)
		}
		m.Proto.Graph.Initializer[i] = p
		perturbed = true
	}
	if !perturbed {
		t.Fatalf("gate weight %q not found", gate)
	}
	broken := filepath.Join(dir, "broken.onnx")
	if err := m.Save(broken, graph.SaveOptions{}); err != nil {
		t.Fatal(err)
	}
	if code := execute([]string{"verify", "--engine", "ort", broken, example}); code != 1 {
		t.Fatalf("verify --engine ort of a broken rewrite: exit %d, want 1", code)
	}
	_ = os.Remove(broken)
}

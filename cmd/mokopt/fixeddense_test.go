package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/mokopt/mokopt/graph"
	"github.com/mokopt/mokopt/models"
)

// TestRewriteRefusesFixedDenseRouting: a dense block whose experts are all
// mixed by a fixed weight vector (the softmax of a constant, no TopK, no
// router of the hidden state) is refused by rewrite (exit 1, nothing
// written, the reason on standard error naming the stacked weights), listed
// by inspect as a near-miss, and left unfused by --partial (exit 0).
func TestRewriteRefusesFixedDenseRouting(t *testing.T) {
	m, err := models.Build(models.Config{Shape: models.ShapeDense, Layers: 1, Experts: 4, TopK: 2, Hidden: 16, Inter: 8, Normalize: true, Tokens: 6, Seed: 1})
	if err != nil {
		t.Fatal(err)
	}
	if err := models.FixRouting(m, models.MixSoftmax, 6); err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	in := filepath.Join(dir, "fixed_dense.onnx")
	if err := m.Save(in, graph.SaveOptions{}); err != nil {
		t.Fatal(err)
	}
	const say = "routing does not depend on the hidden state: 4 dense experts (stacked weights \"model.layers.0.mlp.w_"
	o := filepath.Join(dir, "out.onnx")
	code, out, errs := run(t, nil, "rewrite", "-q", in, "-o", o)
	if code != 1 || !strings.Contains(errs, say) || !strings.Contains(errs, "computed from constants alone") || !strings.Contains(errs, "no output written") {
		t.Fatalf("rewrite: exit %d\n%s%s", code, out, errs)
	}
	if _, err := os.Stat(o); err == nil {
		t.Fatal("rewrite wrote a model it refused")
	}
	code, out, errs = run(t, nil, "inspect", "-q", in)
	if code != 0 || !strings.Contains(string(out), "MoE blocks: 0") || !strings.Contains(string(out), "near-miss at") || !strings.Contains(string(out), say) {
		t.Fatalf("inspect: exit %d\n%s%s", code, out, errs)
	}
	code, out, errs = run(t, nil, "rewrite", "-q", "--partial", in, "-o", o)
	if code != 0 || !strings.Contains(string(out), "0 MoE block(s) fused") || !strings.Contains(string(out), say) {
		t.Fatalf("rewrite --partial: exit %d\n%s%s", code, out, errs)
	}
}

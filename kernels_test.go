package mokopt_test

import (
	"context"
	"path/filepath"
	"testing"

	"github.com/mokopt/mokopt"
	"github.com/mokopt/mokopt/graph/eval"
	"github.com/mokopt/mokopt/internal/verify"
	"github.com/mokopt/mokopt/models"
)

// TestKernelsAreExplicit: this test binary links every package with a Go
// kernel, yet none is registered process-wide, so a program that verifies
// through package verify alone gets the same numbers whatever it links
// (the function bodies), and the same numbers as mokopt.Verify (the CLI's
// path) when it passes mokopt.Kernels().
func TestKernelsAreExplicit(t *testing.T) {
	for _, op := range [][2]string{{"ai.mok", "MoE"}, {"ai.mok", "MoKDispatchFFNCombine"}, {"com.microsoft", "MoE"}, {"com.microsoft", "QMoE"}} {
		if eval.Supported(op[0], op[1]) {
			t.Errorf("%s::%s is registered on import", op[0], op[1])
		}
		if !mokopt.Kernels().Has(op[0], op[1]) {
			t.Errorf("mokopt.Kernels() lacks %s::%s", op[0], op[1])
		}
	}
	ctx := context.Background()
	dir := t.TempDir()
	src, fusedPath, lowPath := filepath.Join(dir, "src.onnx"), filepath.Join(dir, "fused.onnx"), filepath.Join(dir, "low.onnx")
	cfg := models.Config{Shape: models.ShapeBatched, Layers: 1, Experts: 8, TopK: 2, Hidden: 256, Inter: 256, SharedInter: 256, Router: "softmax", Normalize: true}
	if err := models.Write(cfg, src); err != nil {
		t.Fatal(err)
	}
	m := load(t, src)
	if _, err := mokopt.Rewrite(ctx, m, mokopt.RewriteOptions{}); err != nil {
		t.Fatal(err)
	}
	if err := mokopt.Save(ctx, m, fusedPath, mokopt.SaveOptions{}); err != nil {
		t.Fatal(err)
	}
	if rep, err := mokopt.Lower(ctx, m, mokopt.TargetGB300NVL72, mokopt.LowerOptions{EP: 8}); err != nil || rep.Lowered() != 1 {
		t.Fatalf("lower: %v", err)
	}
	if err := mokopt.Save(ctx, m, lowPath, mokopt.SaveOptions{}); err != nil {
		t.Fatal(err)
	}
	fused, low := load(t, fusedPath), load(t, lowPath)
	errOf := func(rep *verify.Report) float64 { return float64(rep.Cases[0].Outputs[0].MaxAbsErr) }
	opt := mokopt.DefaultVerifyOptions()
	opt.Tokens = []int{7}
	cli, err := mokopt.Verify(ctx, low, fused, opt)
	if err != nil {
		t.Fatal(err)
	}
	base := verify.Options{Tokens: []int{7}, Seed: opt.Seed, RTol: opt.RTol, ATol: opt.ATol}
	run := func(eo eval.Options) float64 {
		o := base
		o.Eval = eo
		rep, err := verify.Compare(ctx, low.Graph(), fused.Graph(), o)
		if err != nil {
			t.Fatal(err)
		}
		return errOf(rep)
	}
	withKernels := run(eval.Options{Kernels: mokopt.Kernels()})
	plain := run(eval.Options{})
	bodies := run(eval.Options{Kernels: mokopt.Kernels(), PreferFunctions: true})
	t.Logf("max |err| lowered vs fused: CLI %.6g, verify with mokopt.Kernels() %.6g, verify alone %.6g, function bodies %.6g", errOf(cli), withKernels, plain, bodies)
	if withKernels != errOf(cli) {
		t.Errorf("verify with mokopt.Kernels() gives %g, mokopt.Verify %g", withKernels, errOf(cli))
	}
	// Alone, verify runs the lowered node's function body: the numbers of
	// the function bodies, not of a kernel some linked package registered.
	if plain != bodies {
		t.Errorf("verify alone gives %g, the function bodies %g", plain, bodies)
	}
	if plain == withKernels {
		t.Log("the Go kernel and the function body agree to the bit on this model")
	}
}

//go:build ort

package ortrun

import (
	"context"
	"path/filepath"
	"testing"

	"github.com/mokopt/mokopt/graph"
	"github.com/mokopt/mokopt/graph/eval"
	"github.com/mokopt/mokopt/lowering"
	"github.com/mokopt/mokopt/models"
	"github.com/mokopt/mokopt/passes"
)

// TestGenORTRoundTrip: models written by mokopt gen --shape ort (float
// interleaved SwiGLU, QMoE int8 / int4) run in ONNX Runtime and agree with
// the interpreter; rewritten to ai.mok::MoE and lowered back with
// --target ort (same --quant), ONNX Runtime gives the same outputs again.
func TestGenORTRoundTrip(t *testing.T) {
	needORT(t)
	for _, tc := range []struct {
		name  string
		quant string
		block int
	}{
		{"float_swiglu", "", 0},
		{"int8", "int8", 0},
		{"int4_block32", "int4", 32},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg := models.Config{Shape: models.ShapeORT, Layers: 2, Experts: 8, TopK: 2, Hidden: 64, Inter: 64, Normalize: true, Seed: 4,
				ORTSwiGLU: true, Quant: tc.quant, QuantBlockSize: tc.block}
			m, err := models.Build(cfg)
			if err != nil {
				t.Fatal(err)
			}
			dir := t.TempDir()
			p := filepath.Join(dir, "gen.onnx")
			if err := m.Save(p, graph.SaveOptions{}); err != nil {
				t.Fatal(err)
			}
			const T = 10
			feeds := map[string]*eval.Tensor{models.InputName: eval.NewFloat32([]int{T, cfg.Hidden}, randVec(T*cfg.Hidden, 5))}
			ortOrig, err := Run(p, feeds)
			if err != nil {
				t.Fatal(err)
			}
			ref, err := eval.Run(context.Background(), m, feeds, eval.Options{})
			if err != nil {
				t.Fatal(err)
			}
			outs := []string{models.OutputName}
			w1 := compareAll(t, "ORT vs interpreter", outs, ortOrig, []*eval.Tensor{ref[models.OutputName]})
			if _, err := passes.Rewrite(m, passes.Options{Check: true}); err != nil {
				t.Fatal(err)
			}
			if _, err := lowering.LowerORT(m, lowering.ORTOptions{Quant: tc.quant, BlockSize: tc.block}); err != nil {
				t.Fatal(err)
			}
			p2 := filepath.Join(dir, "back.onnx")
			if err := m.Save(p2, graph.SaveOptions{}); err != nil {
				t.Fatal(err)
			}
			ortBack, err := Run(p2, feeds)
			if err != nil {
				t.Fatal(err)
			}
			w2 := compareAll(t, "ORT round trip", outs, ortBack, []*eval.Tensor{ortOrig[models.OutputName]})
			t.Logf("RESULT gen %s ort-vs-interpreter maxabs=%.3g round-trip maxabs=%.3g", tc.name, w1, w2)
		})
	}
}

func randVec(n int, seed uint64) []float32 {
	v := make([]float32, n)
	s := seed*0x9E3779B97F4A7C15 + 1
	for i := range v {
		s ^= s << 13
		s ^= s >> 7
		s ^= s << 17
		v[i] = float32(int64(s%4001)-2000) / 1000
	}
	return v
}

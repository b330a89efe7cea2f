package models

import (
	"context"
	"math/rand/v2"
	"strings"
	"testing"

	"github.com/mokopt/mokopt/graph/eval"
	"github.com/mokopt/mokopt/internal/ortmoe"
	"github.com/mokopt/mokopt/moe"
	"github.com/mokopt/mokopt/passes"
)

// TestQMoEShape: --shape ort --quant builds com.microsoft::QMoE nodes that
// compute with exactly the dequantized weights Weights returns (the
// interpreter's QMoE kernel against moe.Forward layer by layer), and that
// Rewrite fuses with a conclusive numerical check into an ai.mok::MoE whose
// outputs match the QMoE model's.
func TestQMoEShape(t *testing.T) {
	for _, tc := range []struct {
		name  string
		quant string
		block int
		ext   bool
	}{
		{"int8", "int8", 0, false},
		{"int4", "int4", 0, true},
		{"int4_block16", "int4", 16, false},
		{"int8_block32", "int8", 32, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg := Config{Shape: ShapeORT, Layers: 2, Experts: 8, TopK: 2, Hidden: 64, Inter: 32, Normalize: true, Seed: 9,
				Quant: tc.quant, QuantBlockSize: tc.block, External: tc.ext}
			m, err := Build(cfg)
			if err != nil {
				t.Fatal(err)
			}
			if n := len(m.Graph().NodesByOp(ortmoe.OpQMoE)); n != 2 {
				t.Fatalf("%d QMoE nodes, want 2", n)
			}
			const T = 7
			rng := rand.New(rand.NewPCG(1, 2))
			x := make([]float32, T*cfg.Hidden)
			for i := range x {
				x[i] = float32(rng.NormFloat64())
			}
			feeds := map[string]*eval.Tensor{InputName: eval.NewFloat32([]int{T, cfg.Hidden}, x)}
			orig, err := eval.Run(context.Background(), m, feeds, eval.Options{})
			if err != nil {
				t.Fatal(err)
			}
			spec, _ := Spec(cfg)
			h := append([]float32(nil), x...)
			for l := 0; l < cfg.Layers; l++ {
				w, err := Weights(cfg, l)
				if err != nil {
					t.Fatal(err)
				}
				y, err := moe.Forward(&spec, w, h, T)
				if err != nil {
					t.Fatal(err)
				}
				for i := range h {
					h[i] += y[i]
				}
			}
			d, _ := eval.Compare(orig[OutputName], eval.NewFloat32([]int{T, cfg.Hidden}, h), 1e-4, 1e-5)
			if !d.OK() {
				t.Fatalf("QMoE model vs moe.Forward on the dequantized weights: %+v", d)
			}
			rep, err := passes.Rewrite(m, passes.Options{Check: true})
			if err != nil {
				t.Fatal(err)
			}
			for _, w := range rep.Warnings {
				if strings.Contains(w, "inconclusive") {
					t.Fatal(w)
				}
			}
			if len(rep.Fused) != 2 {
				t.Fatalf("%d blocks fused, want 2", len(rep.Fused))
			}
			got, err := eval.Run(context.Background(), m, feeds, eval.Options{})
			if err != nil {
				t.Fatal(err)
			}
			d2, _ := eval.Compare(got[OutputName], orig[OutputName], 1e-4, 1e-5)
			if !d2.OK() {
				t.Fatalf("fused vs QMoE model: %+v", d2)
			}
			t.Logf("RESULT %s qmoe-vs-forward maxabs=%.3g fused-vs-qmoe maxabs=%.3g", tc.name, d.MaxAbs, d2.MaxAbs)
		})
	}
}

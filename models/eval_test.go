// This file runs the generated graphs in the graph/eval interpreter and
// compares them with the generator's own math.

package models

import (
	"context"
	"fmt"
	"path/filepath"
	"testing"

	"github.com/mokopt/mokopt/graph"
	"github.com/mokopt/mokopt/graph/eval"
	"github.com/mokopt/mokopt/moe"
)

// TestGraphsComputeGeneratorMath evaluates every generated shape (not ort,
// which the interpreter has no kernel for) on random input and compares the
// model output with the chained reference h = h + refBlock(h).
func TestGraphsComputeGeneratorMath(t *testing.T) {
	for _, shape := range []string{ShapeBatched, ShapeUnrolled, ShapeDense} {
		for _, tc := range detectCases {
			for _, external := range []bool{false, true} {
				cfg := tc.cfg
				cfg.Shape, cfg.External = shape, external
				t.Run(fmt.Sprintf("%s/%s/external=%v", shape, tc.name, external), func(t *testing.T) {
					m, err := Build(cfg)
					if err != nil {
						t.Fatal(err)
					}
					if external { // round-trip through the side file
						path := filepath.Join(t.TempDir(), "m.onnx")
						if err := m.Save(path, graph.SaveOptions{External: graph.ExternalKeep}); err != nil {
							t.Fatal(err)
						}
						if m, err = graph.Load(path); err != nil {
							t.Fatal(err)
						}
						defer m.Close()
					}
					T := cfg.Tokens
					if T == 0 {
						T = 13
					}
					x := randInput(42, T*cfg.Hidden)
					out, err := eval.Run(context.Background(), m, map[string]*eval.Tensor{InputName: eval.NewFloat32([]int{T, cfg.Hidden}, x)}, eval.Options{})
					if err != nil {
						t.Fatal(err)
					}
					h := append([]float32(nil), x...)
					var want []float64
					for l := 0; l < cfg.Layers; l++ {
						w, err := Weights(cfg, l)
						if err != nil {
							t.Fatal(err)
						}
						y := refBlock(cfg, w, h, T)
						want = make([]float64, len(h))
						for i := range h {
							want[i] = float64(h[i]) + y[i]
							h[i] = float32(want[i])
						}
					}
					// the MoE contribution is small next to the residual: compare it alone
					got := out[OutputName].F32
					gotD, wantD := make([]float32, len(got)), make([]float64, len(got))
					prev := prevResidual(t, cfg, x, T)
					for i := range got {
						gotD[i] = got[i] - prev[i]
						wantD[i] = want[i] - float64(prev[i])
					}
					if e := relErr(gotD, wantD); e > 1e-3 {
						t.Errorf("graph output differs from the generator's math: relative error %.3g of the last block's output", e)
					} else {
						t.Logf("relative error %.2g", e)
					}
				})
			}
		}
	}
}

// prevResidual is the reference input of the last block.
func prevResidual(t *testing.T, cfg Config, x []float32, T int) []float32 {
	h := append([]float32(nil), x...)
	for l := 0; l < cfg.Layers-1; l++ {
		w, err := Weights(cfg, l)
		if err != nil {
			t.Fatal(err)
		}
		y := refBlock(cfg, w, h, T)
		for i := range h {
			h[i] = float32(float64(h[i]) + y[i])
		}
	}
	return h
}

var _ = moe.Softmax

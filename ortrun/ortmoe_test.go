//go:build ort

package ortrun

import (
	"context"
	"math/rand/v2"
	"path/filepath"
	"testing"

	"github.com/mokopt/mokopt/graph"
	"github.com/mokopt/mokopt/graph/eval"
	"github.com/mokopt/mokopt/ortmoe"
)

func ortCases() []ortmoe.Case {
	sw := func(fusion int, alpha, beta, limit float32) ortmoe.Attrs {
		return ortmoe.Attrs{K: 2, Activation: ortmoe.SwiGLU, Fusion: fusion, Alpha: alpha, Beta: beta, Limit: limit, Normalize: true}
	}
	inf := float32(3.4028235e38)
	return []ortmoe.Case{
		{Name: "swiglu_interleaved_norm", Attrs: sw(1, 1, 0, inf), E: 8, H: 16, I: 24, Seed: 1},
		{Name: "swiglu_interleaved_nonorm", Attrs: ortmoe.Attrs{K: 2, Activation: ortmoe.SwiGLU, Fusion: 1, Alpha: 1, Beta: 0, Limit: inf}, E: 8, H: 16, I: 24, Seed: 2},
		{Name: "swiglu_oai_bias", Attrs: sw(1, 1.702, 1, 7), E: 8, H: 16, I: 24, Bias: true, WeightScale: 6, Seed: 3},
		{Name: "swiglu_concat", Attrs: sw(2, 1, 0, inf), E: 8, H: 16, I: 24, Seed: 4},
		{Name: "swiglu_fc3", Attrs: sw(0, 1, 0, inf), E: 8, H: 16, I: 24, FC3: true, Seed: 5},
		{Name: "silu_fc3", Attrs: ortmoe.Attrs{K: 2, Activation: ortmoe.Silu, Normalize: true}, E: 8, H: 16, I: 24, FC3: true, Seed: 6},
		{Name: "relu", Attrs: ortmoe.Attrs{K: 1, Activation: ortmoe.Relu}, E: 4, H: 16, I: 32, Seed: 7},
		{Name: "gelu_bias", Attrs: ortmoe.Attrs{K: 2, Activation: ortmoe.Gelu}, E: 4, H: 16, I: 32, Bias: true, Seed: 8},
		{Name: "silu_k3", Attrs: ortmoe.Attrs{K: 3, Activation: ortmoe.Silu, Normalize: true}, E: 6, H: 16, I: 32, Seed: 9},
		{Name: "identity", Attrs: ortmoe.Attrs{K: 2, Activation: ortmoe.Identity}, E: 4, H: 16, I: 32, Seed: 10},
		{Name: "swiglu_legacy", Attrs: sw(1, 1, 0, inf), E: 4, H: 16, I: 24, Legacy: true, Seed: 11},
		{Name: "sparse_mixer", Attrs: ortmoe.Attrs{K: 2, Activation: ortmoe.SwiGLU, Fusion: 1, Alpha: 1, Limit: inf, SparseMixer: true}, E: 8, H: 16, I: 24, Seed: 12},
		{Name: "q8_swiglu", Attrs: ortmoe.Attrs{Quantized: true, Bits: 8, K: 2, Activation: ortmoe.SwiGLU, Fusion: 1, Alpha: 1, Limit: inf, Normalize: true}, E: 8, H: 32, I: 32, Seed: 13},
		{Name: "q4_swiglu", Attrs: ortmoe.Attrs{Quantized: true, Bits: 4, K: 2, Activation: ortmoe.SwiGLU, Fusion: 1, Alpha: 1, Limit: inf, Normalize: true}, E: 8, H: 32, I: 32, Seed: 14},
		{Name: "q4_block_swiglu", Attrs: ortmoe.Attrs{Quantized: true, Bits: 4, BlockSize: 16, K: 2, Activation: ortmoe.SwiGLU, Fusion: 1, Alpha: 1, Limit: inf, Normalize: true}, E: 8, H: 32, I: 32, Seed: 15},
		{Name: "q8_relu", Attrs: ortmoe.Attrs{Quantized: true, Bits: 8, K: 2, Activation: ortmoe.Relu}, E: 4, H: 32, I: 32, Seed: 16},
	}
}

func TestORTMoEProbe(t *testing.T) {
	needORT(t)
	for _, c := range ortCases() {
		t.Run(c.Name, func(t *testing.T) {
			b, err := c.Model()
			if err != nil {
				t.Fatal(err)
			}
			p := filepath.Join(t.TempDir(), c.Name+".onnx")
			if err := b.Model.Save(p, graph.SaveOptions{}); err != nil {
				t.Fatal(err)
			}
			T := 9
			rng := rand.New(rand.NewPCG(uint64(len(c.Name)), 3))
			x := make([]float32, T*c.H)
			for i := range x {
				x[i] = float32(rng.NormFloat64())
			}
			feeds := map[string]*eval.Tensor{ortmoe.InputName: eval.NewFloat32([]int{T, c.H}, x)}
			got, err := Run(p, feeds)
			if err != nil {
				t.Logf("ORT: %v", err)
				return
			}
			ref, err := eval.Run(context.Background(), b.Model, feeds, eval.Options{})
			if err != nil {
				t.Fatalf("interpreter: %v", err)
			}
			d, _ := eval.Compare(ref[ortmoe.OutputName], got[ortmoe.OutputName], 1e-4, 1e-5)
			t.Logf("RESULT %s maxabs=%.3g %+v", c.Name, d.MaxAbs, d)
		})
	}
}

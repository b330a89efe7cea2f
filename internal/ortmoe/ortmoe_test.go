package ortmoe

import (
	"bytes"
	"context"
	"math"
	"strings"
	"testing"

	"github.com/mokopt/mokopt/graph"
	"github.com/mokopt/mokopt/graph/eval"
)

// TestQuantize: dequantized values are within half a step of the input,
// and quantizing them again gives the same bytes and scales.
func TestQuantize(t *testing.T) {
	for _, tc := range []struct{ bits, block int }{{8, 0}, {4, 0}, {8, 16}, {4, 32}} {
		E, N, K := 3, 5, 64
		w := make([]float32, E*N*K)
		for i := range w {
			w[i] = float32(math.Sin(float64(i)*0.37)) * float32(1+i%7)
		}
		q, s, err := Quantize(w, E, N, K, tc.bits, tc.block)
		if err != nil {
			t.Fatal(err)
		}
		d := Dequantized(q, s, E, N, K, tc.bits, tc.block)
		block := K
		if tc.block > 0 {
			block = tc.block
		}
		for i := range w {
			if err := math.Abs(float64(d[i] - w[i])); err > float64(s[i/block])/2+1e-6 {
				t.Fatalf("bits %d block %d: element %d off by %g, scale %g", tc.bits, tc.block, i, err, s[i/block])
			}
		}
		q2, s2, _ := Quantize(d, E, N, K, tc.bits, tc.block)
		if !bytes.Equal(q, q2) {
			t.Fatalf("bits %d block %d: requantizing changes the bytes", tc.bits, tc.block)
		}
		for i := range s {
			if math.Abs(float64(s[i]-s2[i])) > 1e-6*float64(s[i]) {
				t.Fatalf("bits %d block %d: scale %d %g -> %g", tc.bits, tc.block, i, s[i], s2[i])
			}
		}
	}
}

// TestLegacyLayout: the same weights stored in the legacy [E, in, out]
// layout compute the same output (H != I, and fused SwiGLU with H == I).
func TestLegacyLayout(t *testing.T) {
	for _, hi := range [][2]int{{16, 24}, {16, 16}} {
		outs := [2][]float32{}
		for j, legacy := range []bool{false, true} {
			c := Case{Name: "legacy", Attrs: Cases()[0].Attrs, E: 4, H: hi[0], I: hi[1], Legacy: legacy, Seed: 5}
			b, err := c.Model()
			if err != nil {
				t.Fatal(err)
			}
			x := make([]float32, 3*c.H)
			for i := range x {
				x[i] = float32(i%11) / 7
			}
			res, err := eval.Run(context.Background(), b.Model, map[string]*eval.Tensor{InputName: eval.NewFloat32([]int{3, c.H}, x)}, eval.Options{})
			if err != nil {
				t.Fatal(err)
			}
			outs[j] = res[OutputName].F32
		}
		for i := range outs[0] {
			if outs[0][i] != outs[1][i] {
				t.Fatalf("H=%d I=%d: legacy layout differs at %d: %g vs %g", hi[0], hi[1], i, outs[1][i], outs[0][i])
			}
		}
	}
}

// TestParseAttrsRefuses: attribute values the ops do not define are named.
func TestParseAttrsRefuses(t *testing.T) {
	for _, tc := range []struct {
		name, op string
		attrs    map[string]any
		want     string
	}{
		{"activation", OpMoE, map[string]any{"activation_type": "tanh"}, "activation_type"},
		{"fusion", OpMoE, map[string]any{"swiglu_fusion": int64(3)}, "swiglu_fusion"},
		{"sparse_k", OpMoE, map[string]any{"use_sparse_mixer": int64(1), "k": int64(3)}, "k = 2"},
		{"bits", OpQMoE, map[string]any{"expert_weight_bits": int64(2)}, "expert_weight_bits"},
		{"quant_type", OpQMoE, map[string]any{"quant_type": "fp4"}, "quant_type"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			n := graph.NewNode(tc.op, Domain, "n", nil, nil)
			for k, v := range tc.attrs {
				switch v := v.(type) {
				case string:
					n.Attribute = append(n.Attribute, graph.StringAttr(k, v))
				case int64:
					n.Attribute = append(n.Attribute, graph.IntAttr(k, v))
				}
			}
			if _, err := ParseAttrs(n); err == nil || !strings.Contains(err.Error(), tc.want) || !strings.Contains(err.Error(), `"n"`) {
				t.Fatalf("want an error naming node \"n\" and %q, got %v", tc.want, err)
			}
		})
	}
}

// TestActivations checks the one-input activations and SwiGLU against
// their formulas at hand-picked points.
func TestActivations(t *testing.T) {
	gelu := func(x float64) float64 { return 0.5 * x * (1 + math.Tanh(math.Sqrt(2/math.Pi)*(x+0.044715*x*x*x))) }
	for _, x := range []float32{-3, -0.5, 0, 0.7, 2.5} {
		if got := act(Gelu, x); math.Abs(float64(got)-gelu(float64(x))) > 1e-6 {
			t.Errorf("gelu(%g) = %g, want %g", x, got, gelu(float64(x)))
		}
		if got := act(Relu, x); got != max(x, 0) {
			t.Errorf("relu(%g) = %g", x, got)
		}
	}
	a := &Attrs{Alpha: 1.702, Beta: 1, Limit: 7}
	for _, gl := range [][2]float32{{9, -8}, {-2, 3}, {0.5, 0.25}} {
		G := math.Min(float64(gl[0]), 7)
		L := math.Max(math.Min(float64(gl[1]), 7), -7)
		want := G / (1 + math.Exp(-1.702*G)) * (L + 1)
		if got := a.swiglu(gl[0], gl[1]); math.Abs(float64(got)-want) > 1e-5*math.Max(1, math.Abs(want)) {
			t.Errorf("swiglu(%v) = %g, want %g", gl, got, want)
		}
	}
	// Sparse mixer: expert 1 weighted by the softmax over the logits within
	// 2% of its own (experts 1 and 2); then expert 2 among the others, alone
	// within 2% of it.
	ids, w := (&Attrs{K: 2, SparseMixer: true}).Route([]float32{1, 3, 2.99, -1})
	w0 := 1 / (1 + math.Exp(-0.01))
	if ids[0] != 1 || ids[1] != 2 || math.Abs(float64(w[0])-w0) > 1e-6 || w[1] != 1 {
		t.Errorf("sparse mixer: ids %v weights %v, want [1 2] [%g 1]", ids, w, w0)
	}
}

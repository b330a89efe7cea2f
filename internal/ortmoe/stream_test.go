package ortmoe

import (
	"context"
	"errors"
	"math/rand/v2"
	"path/filepath"
	"strings"
	"testing"

	"github.com/mokopt/mokopt/graph"
	"github.com/mokopt/mokopt/graph/eval"
)

// TestKernelStreamsExperts: with the weights in a side file, the MoE and
// QMoE kernels read fc1, fc2, fc3 (QMoE: the codes and the scales) one
// expert at a time and compute exactly what they compute on the weights
// loaded whole, under a memory limit below the weights' size; without the
// Streams declaration the same run loads them whole and hits the limit.
// The cases cover the fused layouts, fc3, biases, the legacy layout, the
// sparse mixer, int8 and int4 with per-row and block-wise scales, and zero
// points.
func TestKernelStreamsExperts(t *testing.T) {
	byName := map[string]Case{}
	for _, c := range Cases() {
		byName[c.Name] = c
	}
	names := []string{"swiglu_interleaved_norm", "swiglu_oai_bias", "swiglu_concat", "swiglu_fc3_bias", "silu_fc3", "relu_k1",
		"swiglu_legacy", "sparse_mixer", "qmoe_int8_swiglu", "qmoe_int4_block16_oai_bias", "qmoe_int8_relu"}
	const T = 7
	defer func(c int) { codeChunk = c }(codeChunk)
	for i, name := range names {
		// QMoE's codes a whole expert at a time, and a few rows at a time
		// (chunks that do not divide the rows)
		codeChunk = []int{1 << 20, 1000}[i%2]
		t.Run(name, func(t *testing.T) {
			c, ok := byName[name]
			if !ok {
				t.Fatalf("no case %s", name)
			}
			c.E, c.H, c.I = 32, 256, 384
			b, err := c.Model()
			if err != nil {
				t.Fatal(err)
			}
			if c.Attrs.Quantized && c.Attrs.Bits == 4 {
				c.AddZeroPoints(b.Model)
			}
			var weights int64 // the expert weights' bytes as stored
			for _, init := range b.Model.Proto.Graph.Initializer {
				if n := init.GetName(); strings.Contains(n, "experts_weights") || strings.HasSuffix(n, "_scales") {
					weights += int64(len(init.RawData))
				}
			}
			path := filepath.Join(t.TempDir(), "moe.onnx")
			if err := b.Model.Save(path, graph.SaveOptions{External: graph.ExternalRepack}); err != nil {
				t.Fatal(err)
			}
			rng := rand.New(rand.NewPCG(uint64(c.Seed), 7))
			x := make([]float32, T*c.H)
			for i := range x {
				x[i] = rng.Float32()*2 - 1
			}
			feeds := func() map[string]*eval.Tensor {
				return map[string]*eval.Tensor{InputName: eval.NewFloat32([]int{T, c.H}, append([]float32(nil), x...))}
			}
			whole := eval.NewKernels().Add(Domain, OpMoE, evalKernel).Add(Domain, OpQMoE, evalKernel)
			ref, err := eval.Run(context.Background(), b.Model, feeds(), eval.Options{Kernels: whole})
			if err != nil {
				t.Fatal(err)
			}
			want := ref[OutputName].F32
			m, err := graph.Load(path)
			if err != nil {
				t.Fatal(err)
			}
			defer m.Close()
			limit := weights / 2
			got, err := eval.Run(context.Background(), m, feeds(), eval.Options{Kernels: AddKernels(eval.NewKernels()), MemLimit: limit})
			if err != nil {
				t.Fatalf("streamed run under a %d-byte limit (weights %d bytes): %v", limit, weights, err)
			}
			y := got[OutputName].F32
			if len(y) != len(want) {
				t.Fatalf("%d outputs, want %d", len(y), len(want))
			}
			for i := range want {
				if y[i] != want[i] {
					t.Fatalf("output[%d] = %g streamed, %g from the weights in memory", i, y[i], want[i])
				}
			}
			if m.ExternalBytesRead() == 0 {
				t.Fatal("nothing was read from the side file")
			}
			_, err = eval.Run(context.Background(), m, feeds(), eval.Options{Kernels: whole, MemLimit: limit})
			if !errors.Is(err, eval.ErrMemLimit) {
				t.Errorf("unstreamed run under a %d-byte limit: %v, want the memory limit", limit, err)
			}
		})
	}
}

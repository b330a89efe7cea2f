package lowering

import (
	"context"
	"errors"
	"path/filepath"
	"testing"

	"github.com/mokopt/mokopt/graph"
	"github.com/mokopt/mokopt/graph/eval"
	"github.com/mokopt/mokopt/moe"
)

// TestLoweredKernelStreamsExperts: the MoK kernel reads a lowered block's
// MXFP8 weights expert by expert from the model's file (inline raw_data or
// a side file), and computes exactly what it computes on the weights held
// decoded in memory. The run's memory limit is below the routed weights
// widened to float32, so a run that loaded them whole fails.
func TestLoweredKernelStreamsExperts(t *testing.T) {
	cfg := blockCfg{E: 32, K: 4, H: 256, I: 256, Is: 256, Norm: true, Seed: 60}
	m, _, _ := buildFused(t, cfg)
	dir := t.TempDir()
	_, inline := lowerAndSave(t, m, defaultOpts(), dir, "inline")
	low, err := graph.Load(inline)
	if err != nil {
		t.Fatal(err)
	}
	defer low.Close()
	external := filepath.Join(dir, "external.onnx")
	if err := low.Save(external, graph.SaveOptions{External: graph.ExternalRepack}); err != nil {
		t.Fatal(err)
	}
	x := randInput(testTokens, cfg.H, 61)
	_, want := run(t, loadForEval(t, inline), x, testTokens, cfg.H, eval.Options{})
	routedF32 := int64(3 * 4 * cfg.E * cfg.I * cfg.H)
	limit := routedF32 / 3
	kernels := AddKernels(moe.AddKernels(eval.NewKernels()))
	feeds := func() map[string]*eval.Tensor {
		return map[string]*eval.Tensor{"hidden_states": eval.NewFloat32([]int{testTokens, cfg.H}, append([]float32(nil), x...))}
	}
	for _, path := range []string{inline, external} {
		mm, err := graph.Load(path)
		if err != nil {
			t.Fatal(err)
		}
		defer mm.Close()
		out, err := eval.Run(context.Background(), mm, feeds(), eval.Options{Kernels: kernels, MemLimit: limit})
		if err != nil {
			t.Fatalf("%s: streamed run under a %d-byte limit: %v", filepath.Base(path), limit, err)
		}
		got := out[mm.Proto.Graph.Output[0].GetName()].F32
		if len(got) != len(want) {
			t.Fatalf("%s: %d outputs, want %d", filepath.Base(path), len(got), len(want))
		}
		for i := range want {
			if got[i] != want[i] {
				t.Fatalf("%s: output[%d] = %g streamed, %g from decoded weights in memory", filepath.Base(path), i, got[i], want[i])
			}
		}
		// Without the declaration the same run loads the weights whole and
		// hits the limit: the limit is a real bound.
		_, err = eval.Run(context.Background(), mm, feeds(), eval.Options{Kernels: eval.NewKernels().Add(Domain, OpType, evalKernel), MemLimit: limit})
		if !errors.Is(err, eval.ErrMemLimit) {
			t.Errorf("%s: unstreamed run under a %d-byte limit: %v, want the memory limit", filepath.Base(path), limit, err)
		}
	}
}

//go:build ort

package ortrun

import (
	"context"
	"errors"
	"testing"

	"github.com/mokopt/mokopt/graph/eval"
	"github.com/mokopt/mokopt/internal/composite"
	"github.com/mokopt/mokopt/lowering"
	"github.com/mokopt/mokopt/passes"
)

// TestCompositeAgainstORT: each composite case (two MoE blocks on one
// input, an MoE block beside a dense MLP, router logits and auxiliary
// losses read beside a block; see internal/composite) is run in ONNX
// Runtime as exported, on random inputs, for the golden outputs. The
// rewritten model must give every golden output through the fused
// nodes' reference kernel, their function bodies, and ONNX Runtime
// running the function bodies; lowered with --target ort (router_logits
// from a Gemm beside com.microsoft::MoE) it must give them in ONNX
// Runtime too. Tolerance rtol 1e-4, atol 1e-5 of the output's scale.
func TestCompositeAgainstORT(t *testing.T) {
	needORT(t)
	for _, tc := range composite.Cases() {
		t.Run(tc.Name, func(t *testing.T) {
			if tc.Half {
				t.Skip("half-precision inputs: the harness feeds float32 and int64 only")
			}
			orig, err := tc.Build()
			if err != nil {
				t.Fatal(err)
			}
			feeds, err := passes.RandomFeeds(orig, 5, 16)
			if err != nil {
				t.Fatal(err)
			}
			golden, err := RunModel(context.Background(), orig, feeds)
			if err != nil {
				t.Fatal(err)
			}
			fused, err := tc.Build()
			if err != nil {
				t.Fatal(err)
			}
			rep, err := passes.Rewrite(fused, passes.Options{Check: true})
			if err != nil {
				t.Fatal(err)
			}
			if len(rep.Fused) != len(tc.Experts) {
				t.Fatalf("fused %d blocks, want %d", len(rep.Fused), len(tc.Experts))
			}
			for _, body := range []bool{false, true} {
				got, err := eval.Run(context.Background(), fused, feeds, eval.Options{PreferFunctions: body})
				if err != nil {
					t.Fatal(err)
				}
				sameOutputs(t, "fused, function body "+map[bool]string{false: "off", true: "on"}[body], got, golden)
			}
			got, err := RunModel(context.Background(), fused, feeds)
			if err != nil {
				t.Fatal(err)
			}
			sameOutputs(t, "fused in ONNX Runtime", got, golden)
			if _, err := lowering.LowerORT(fused, lowering.ORTOptions{}); err != nil {
				if errors.Is(err, lowering.ErrORTUnsupported) {
					t.Logf("lower --target ort refused: %v", err)
					return
				}
				t.Fatal(err)
			}
			got, err = RunModel(context.Background(), fused, feeds)
			if err != nil {
				t.Fatal(err)
			}
			sameOutputs(t, "lowered to ONNX Runtime", got, golden)
		})
	}
}

// sameOutputs requires every output of want in got, within rtol 1e-4 and
// atol 1e-5.
func sameOutputs(t *testing.T, what string, got, want map[string]*eval.Tensor) {
	t.Helper()
	for name, w := range want {
		d, err := eval.Compare(got[name], w, 1e-4, 1e-5)
		if err != nil || !d.OK() {
			t.Errorf("%s: output %q differs from ONNX Runtime on the original: %+v %v", what, name, d, err)
		}
	}
}

package passes

import (
	"context"
	"testing"

	"github.com/mokopt/mokopt/graph"
	"github.com/mokopt/mokopt/graph/eval"
	"github.com/mokopt/mokopt/models"
	"github.com/mokopt/mokopt/moe"
)

// TestCheckToleranceIsTheTypes: the numerical check of a block generated in
// float16 or bfloat16 compares at its type's tolerance (10 unit roundoffs
// of the block output's peak). The fused semantics with every routed down
// weight moved by a few ulps of the type pass; moved by more they are
// refused. Since a bfloat16 ulp is 8 float16 ulps, the bfloat16 pass (2
// ulps, about 1% of each weight) is a larger move than the float16
// refusal (32 ulps, about 2%).
func TestCheckToleranceIsTheTypes(t *testing.T) {
	for _, c := range []struct {
		dt        string
		few, more uint16
		round     func(float32, uint16) float32
	}{
		{models.DTypeBFloat16, 2, 16, func(v float32, n uint16) float32 {
			return graph.BFloat16ToFloat32(graph.Float32ToBFloat16(v) + n)
		}},
		{models.DTypeFloat16, 2, 32, func(v float32, n uint16) float32 {
			return graph.HalfToFloat32(graph.Float32ToHalf(v) + n)
		}},
	} {
		for _, ulps := range []uint16{0, c.few, c.more} {
			g, err := models.Build(models.Config{Shape: models.ShapeBatched, Layers: 1, Experts: 8, TopK: 2, Hidden: 64, Inter: 64,
				Router: "softmax", Normalize: true, Seed: 11, DType: c.dt})
			if err != nil {
				t.Fatal(err)
			}
			det, err := Detect(g)
			if err != nil || len(det.Blocks) != 1 {
				t.Fatalf("%s: detect: %v, %d blocks", c.dt, err, len(det.Blocks))
			}
			b := det.Blocks[0]
			w, err := b.W.Materialize(g, &b.Spec)
			if err != nil {
				t.Fatal(err)
			}
			for i, v := range w.Down {
				if v != 0 { // the magnitude of each stored value up by ulps
					w.Down[i] = c.round(v, ulps)
				}
			}
			errs, err := numericCheck(context.Background(), g, []*Block{b}, []*moe.Weights{w}, nil, 0)
			if err != nil {
				t.Fatal(err)
			}
			if fail := ulps == c.more; (errs[0] != nil) != fail {
				rel, _ := eval.HalfTolerance(b.Spec.IOElemType())
				t.Fatalf("%s, down weights moved by %d ulps: check error %v, want failure %v (rtol %g)", c.dt, ulps, errs[0], fail, rel)
			}
		}
	}
}

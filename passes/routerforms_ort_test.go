//go:build ort

package passes

import (
	"context"
	"testing"

	"github.com/mokopt/mokopt/graph/eval"
	"github.com/mokopt/mokopt/internal/ortrun"
	"github.com/mokopt/mokopt/internal/testtools"
	"github.com/mokopt/mokopt/models"
)

// TestRouterFormsAgainstORT runs every fused row of the router-form table
// through ONNX Runtime: the original graph in ONNX Runtime is the truth,
// and the rewritten model (the fused node as its function body) must give
// the same outputs in ONNX Runtime and in the interpreter.
//
//	bash .ci/fetch-ort.sh && go test -tags ort ./passes -run TestRouterFormsAgainstORT -v
func TestRouterFormsAgainstORT(t *testing.T) {
	if _, err := ortrun.FindLibrary(); err != nil {
		testtools.Missing(t, "the ONNX Runtime library", "bash .ci/fetch-ort.sh, or set ONNXRUNTIME_LIB", err)
	}
	if err := ortrun.Init(); err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	for _, f := range routerForms() {
		if f.refused != "" {
			continue
		}
		t.Run(f.name, func(t *testing.T) {
			orig := withRouterForm(t, f, models.ShapeBatched)
			m := withRouterForm(t, f, models.ShapeBatched)
			if _, err := Rewrite(m, Options{Check: true}); err != nil {
				t.Fatal(err)
			}
			for seed := uint64(1); seed <= 3; seed++ {
				feeds, err := RandomFeeds(orig, seed, 7)
				if err != nil {
					t.Fatal(err)
				}
				want, err := ortrun.RunModel(ctx, orig, feeds)
				if err != nil {
					t.Fatal(err)
				}
				gotORT, err := ortrun.RunModel(ctx, m, feeds)
				if err != nil {
					t.Fatal(err)
				}
				gotEval, err := eval.Run(ctx, m, feeds, eval.Options{})
				if err != nil {
					t.Fatal(err)
				}
				for name, w := range want {
					for which, got := range map[string]*eval.Tensor{"ONNX Runtime": gotORT[name], "interpreter": gotEval[name]} {
						d, err := eval.Compare(got, w, 1e-4, 1e-5)
						if err != nil || !d.OK() {
							t.Fatalf("seed %d, output %q: fused in %s vs original in ONNX Runtime %+v %v", seed, name, which, d, err)
						}
					}
				}
			}
		})
	}
}

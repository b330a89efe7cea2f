//go:build ort

package ortrun

import (
	"context"
	"errors"
	"math"
	"path/filepath"
	"strings"
	"testing"

	"github.com/mokopt/mokopt/graph"
	"github.com/mokopt/mokopt/graph/eval"
	"github.com/mokopt/mokopt/lowering"
	"github.com/mokopt/mokopt/models"
	"github.com/mokopt/mokopt/moe"
	"github.com/mokopt/mokopt/passes"
)

// ortOut saves m and runs it in ONNX Runtime, returning its only output.
func ortOut(t *testing.T, m *graph.Model, feeds map[string]*eval.Tensor, name string) []float32 {
	t.Helper()
	p := filepath.Join(t.TempDir(), name+".onnx")
	if err := m.Save(p, graph.SaveOptions{}); err != nil {
		t.Fatal(err)
	}
	res, err := Run(p, feeds)
	if err != nil {
		t.Fatalf("ONNX Runtime on the %s model: %v", name, err)
	}
	return res[m.Proto.Graph.Output[0].GetName()].F32
}

// finite reports whether every element of v is finite.
func finite(v []float32) bool {
	for _, x := range v {
		if math.IsNaN(float64(x)) || math.IsInf(float64(x), 0) {
			return false
		}
	}
	return true
}

// relDiff is max |a−b| / (1 + max |a|).
func relDiff(a, b []float32) float64 {
	if len(a) != len(b) {
		return math.Inf(1)
	}
	d, s := 0.0, 0.0
	for i := range a {
		d = max(d, math.Abs(float64(a[i])-float64(b[i])))
		s = max(s, math.Abs(float64(a[i])))
	}
	return d / (1 + s)
}

// TestActivationsAgainstORT: a dense synthetic block with every activation
// of the table in each of its spellings (models.ActivationCases) fuses
// with that activation; ONNX Runtime running the ORIGINAL graph is the
// truth, and the fused model reproduces it run by the reference semantics
// (moe.Forward, in the interpreter) and by its function body (in ONNX
// Runtime). lower --target ort maps the rows with an exact ONNX Runtime
// form (the lowered model reproduces the original in ONNX Runtime) and
// refuses the others with the row's reason.
func TestActivationsAgainstORT(t *testing.T) {
	needORT(t)
	for _, cs := range models.ActivationCases {
		def := moe.LookupActivation(cs.Act)
		for si, sp := range cs.Spellings {
			t.Run(cs.Act+"/"+sp.Name, func(t *testing.T) {
				m, err := models.Build(models.Config{Shape: models.ShapeDense, Layers: 1, Experts: 4, TopK: 2, Hidden: 16, Inter: 8, Normalize: true, Tokens: 6, Seed: int64(si + 11)})
				if err != nil {
					t.Fatal(err)
				}
				if err := models.Respell(m, sp, 8); err != nil {
					t.Fatal(err)
				}
				feeds, err := passes.RandomFeeds(m, 5, 6)
				if err != nil {
					t.Fatal(err)
				}
				for _, v := range feeds {
					for i := range v.F32 {
						v.F32[i] *= 8
					}
				}
				want := ortOut(t, m, feeds, "original")
				if !finite(want) { // a spelling that overflows float32 there: compare on the unscaled inputs
					if feeds, err = passes.RandomFeeds(m, 5, 6); err != nil {
						t.Fatal(err)
					}
					if want = ortOut(t, m, feeds, "original"); !finite(want) {
						t.Fatal("ONNX Runtime's output of the original is not finite")
					}
				}
				rep, err := passes.Rewrite(m, passes.Options{Check: true})
				if err != nil {
					t.Fatal(err)
				}
				if len(rep.Fused) != 1 || rep.Fused[0].Block.Spec.Activation != cs.Act {
					t.Fatalf("fused %d blocks, activation %v, want one %s", len(rep.Fused), rep.Fused, cs.Act)
				}
				res, err := eval.Run(context.Background(), m, feeds, eval.Options{})
				if err != nil {
					t.Fatal(err)
				}
				ref := res[m.Proto.Graph.Output[0].GetName()].F32
				body := ortOut(t, m, feeds, "fused")
				dRef, dBody := relDiff(want, ref), relDiff(want, body)
				if dRef > 1e-4 || dBody > 1e-4 {
					t.Fatalf("against ONNX Runtime on the original: reference %.3g, function body %.3g", dRef, dBody)
				}
				_, why := def.ORT(rep.Fused[0].Block.Spec.ActParams())
				_, err = lowering.LowerORT(m, lowering.ORTOptions{})
				switch {
				case why != "":
					if !errors.Is(err, lowering.ErrORTUnsupported) || !strings.Contains(err.Error(), why) {
						t.Fatalf("lower --target ort: want the refusal %q, got %v", why, err)
					}
					t.Logf("RESULT %s reference %.2g body %.2g; ort refused", cs.Act, dRef, dBody)
				case err != nil:
					t.Fatalf("lower --target ort: %v", err)
				default:
					dLow := relDiff(want, ortOut(t, m, feeds, "lowered"))
					if dLow > 1e-4 {
						t.Fatalf("lowered to com.microsoft::MoE: differs from the original by %.3g", dLow)
					}
					t.Logf("RESULT %s reference %.2g body %.2g lowered %.2g", cs.Act, dRef, dBody, dLow)
				}
			})
		}
	}
}

//go:build ort

package ortrun

import (
	"context"
	"path/filepath"
	"strings"
	"testing"

	"github.com/mokopt/mokopt/graph"
	"github.com/mokopt/mokopt/graph/eval"
	"github.com/mokopt/mokopt/internal/verify"
	"github.com/mokopt/mokopt/passes"
)

// TestVerifyEngineORTFixtures is `verify --engine ort`: every rewritten
// fixture, run in memory (RunModel) against the original on the golden
// inputs, passes; the same rewrite with every expert's first gate weight
// moved by 1e-2 fails, naming the output.
func TestVerifyEngineORTFixtures(t *testing.T) {
	needORT(t)
	for _, f := range fixtures(t) {
		name := strings.TrimSuffix(filepath.Base(f), ".onnx")
		if refused[name] {
			continue
		}
		t.Run(name, func(t *testing.T) {
			orig, err := graph.Load(f)
			if err != nil {
				t.Fatal(err)
			}
			fused, err := graph.Load(f)
			if err != nil {
				t.Fatal(err)
			}
			if _, err := passes.Rewrite(fused, passes.Options{}); err != nil {
				t.Fatal(err)
			}
			opt := verify.Options{RTol: rtol, ATol: atol, DataDir: strings.TrimSuffix(f, ".onnx") + "_data", Runner: RunModel, Engine: "ort"}
			r, err := verify.Compare(context.Background(), fused, orig, opt)
			if err != nil {
				t.Fatal(err)
			}
			if !r.Pass || r.Engine != "ort" {
				t.Fatalf("rewrite fails verify under ONNX Runtime:\n%s", r.Summary())
			}
			worst := 0.0
			for _, o := range r.Cases[0].Outputs {
				worst = max(worst, float64(o.MaxAbsErr))
			}
			t.Logf("RESULT %s verify-ort maxabs=%.3g", name, worst)

			n := 0
			for _, node := range fused.Proto.Graph.Node {
				if node.GetDomain() != "ai.mok" || node.GetOpType() != "MoE" {
					continue
				}
				for i, ini := range fused.Proto.Graph.Initializer {
					if ini.GetName() != node.Input[4] {
						continue
					}
					w, err := eval.FromProto(ini, fused.TensorBytes)
					if err != nil {
						t.Fatal(err)
					}
					per := w.Len() / w.Shape[0]
					for j := 0; j < len(w.F32); j += per {
						w.F32[j] += 1e-2
					}
					if fused.Proto.Graph.Initializer[i], err = eval.ToProto(w, ini.GetName()); err != nil {
						t.Fatal(err)
					}
					n++
				}
			}
			if n == 0 {
				t.Fatal("no fused gate weight to perturb")
			}
			r, err = verify.Compare(context.Background(), fused, orig, opt)
			if err != nil {
				t.Fatal(err)
			}
			out := orig.Proto.Graph.Output[0].GetName()
			if r.Pass || !strings.Contains(r.Cases[0].Message, `"`+out+`"`) {
				t.Fatalf("perturbed rewrite not caught by name (%q):\n%s", out, r.Summary())
			}
		})
	}
}

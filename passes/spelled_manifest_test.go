package passes

import (
	"encoding/json"
	"math"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/mokopt/mokopt/graph"
	"github.com/mokopt/mokopt/graph/eval"
	pb "github.com/mokopt/mokopt/graph/onnxpb"
)

// spelledOpen lists the cases of testdata/spelled whose expected verdict is
// not met yet, with the reason; they are skipped, not passed.
var spelledOpen = map[string]string{}

// TestSpelledManifest rewrites every exported case of testdata/spelled
// (manifest.json, ok=true) and holds it to its expected verdict: "fuse"
// fuses at least one block and the rewritten model reproduces every output
// of every test_data_set (ONNX Runtime's goldens on the original file);
// "refuse: CAUSE" fails with an error containing CAUSE; "none: WHY" (no
// router in the graph) rewrites to nothing fused, without error.
func TestSpelledManifest(t *testing.T) {
	dir := filepath.Join("..", "testdata", "spelled")
	raw, err := os.ReadFile(filepath.Join(dir, "manifest.json"))
	if err != nil {
		t.Fatal(err)
	}
	var man struct{ Cases []spelledCase }
	if err := json.Unmarshal(raw, &man); err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, c := range man.Cases {
		if !c.OK {
			continue
		}
		n++
		t.Run(c.Name, func(t *testing.T) {
			if why, ok := spelledOpen[c.Name]; ok {
				t.Skip("known open: " + why)
			}
			t.Parallel()
			checkSpelledCase(t, dir, c)
		})
	}
	if n == 0 {
		t.Fatal("no cases in the manifest")
	}
}

func checkSpelledCase(t *testing.T, dir string, c spelledCase) {
	m, err := graph.Load(filepath.Join(dir, c.Name+".onnx"))
	if err != nil {
		t.Fatal(err)
	}
	rep, err := Rewrite(m, Options{Check: true})
	verdict, cause, _ := strings.Cut(c.ExpectedVerdict, ": ")
	switch verdict {
	case "refuse":
		if err == nil || !strings.Contains(err.Error(), cause) {
			t.Fatalf("want a refusal containing %q, got %v (report %v)", cause, err, rep)
		}
		return
	case "none":
		if err != nil || len(rep.Fused) != 0 {
			t.Fatalf("want nothing fused without error (%s), got %d fused, err %v", cause, len(rep.Fused), err)
		}
		return
	case "fuse":
	default:
		t.Fatalf("unknown expected verdict %q", c.ExpectedVerdict)
	}
	if err != nil || rep == nil || len(rep.Fused) == 0 {
		t.Fatalf("want fused blocks, got report %v, err %v", rep, err)
	}
	checkGoldens(t, m, filepath.Join(dir, c.Name+"_data"))
}

// checkGoldens runs m on every test_data_set under data and compares each
// graph output with its golden (rtol 1e-4, atol 1e-5).
func checkGoldens(t *testing.T, m *graph.Model, data string) {
	t.Helper()
	sets, _ := filepath.Glob(filepath.Join(data, "test_data_set_*"))
	if len(sets) == 0 {
		t.Fatal("no goldens")
	}
	for _, s := range sets {
		ds, err := eval.ReadDataSet(s)
		if err != nil {
			t.Fatal(err)
		}
		feeds, err := eval.Feeds(m, ds.Inputs, ds.InputNames)
		if err != nil {
			t.Fatal(err)
		}
		out, err := eval.Run(t.Context(), m, feeds, eval.Options{})
		if err != nil {
			t.Fatalf("%s: %v", s, err)
		}
		if len(ds.Outputs) != len(m.Proto.Graph.Output) {
			t.Fatalf("%s: %d golden outputs for %d graph outputs", s, len(ds.Outputs), len(m.Proto.Graph.Output))
		}
		rtol, atolOf := goldenTolerance(m)
		for i, o := range m.Proto.Graph.Output {
			d, err := eval.Compare(out[o.GetName()], ds.Outputs[i], rtol, atolOf(ds.Outputs[i]))
			if err != nil || !d.OK() {
				t.Errorf("%s output %q: fused vs ONNX Runtime golden %+v %v", filepath.Base(s), o.GetName(), d, err)
			}
		}
	}
}

// goldenTolerance is how closely m must reproduce ONNX Runtime's goldens:
// rtol 1e-4 and atol 1e-5, or, where m holds float16 or bfloat16 weights
// (a half-precision model, whose goldens ONNX Runtime computed at that
// precision), the type's tolerance with atol that fraction of the
// golden's peak, as verify judges such a model.
func goldenTolerance(m *graph.Model) (float64, func(*eval.Tensor) float64) {
	half := pb.TensorProto_UNDEFINED
	for _, t := range m.Proto.GetGraph().GetInitializer() {
		half = graph.CoarserHalf(half, graph.DataType(t))
	}
	rel, ok := eval.HalfTolerance(half)
	if !ok {
		return 1e-4, func(*eval.Tensor) float64 { return 1e-5 }
	}
	return rel, func(g *eval.Tensor) float64 {
		peak := 0.0
		for i := range g.Len() {
			peak = max(peak, math.Abs(g.Float64At(i)))
		}
		return rel * peak
	}
}

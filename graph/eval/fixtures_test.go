package eval

import (
	"context"
	"math"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/mokopt/mokopt/graph"
	"github.com/mokopt/mokopt/internal/fixtures"
)

// fixtureDir holds the exported MoE fixtures (testdata/fixtures);
// MOKOPT_FIXTURES overrides it.
var fixtureDir = func() string {
	if d := os.Getenv("MOKOPT_FIXTURES"); d != "" {
		return d
	}
	return fixtures.Dir()
}()

func fixtureFiles(t *testing.T) []string {
	t.Helper()
	files, _ := filepath.Glob(filepath.Join(fixtureDir, "*.onnx"))
	if len(files) == 0 {
		t.Fatalf("no fixtures in %s", fixtureDir)
	}
	return files
}

// TestFixtureOpsSupported lists, per fixture, the ops the evaluator lacks.
func TestFixtureOpsSupported(t *testing.T) {
	for _, f := range fixtureFiles(t) {
		m, err := graph.Load(f)
		if err != nil {
			t.Fatal(err)
		}
		if u := UnsupportedOps(m); len(u) > 0 {
			t.Errorf("%s: unsupported ops %v", filepath.Base(f), u)
		}
	}
}

// TestFixtures runs every exported fixture on its test_data_set_0 inputs and
// compares with the ONNX Runtime outputs stored beside it.
func TestFixtures(t *testing.T) {
	const rtol, atol = 1e-4, 1e-5
	passed := 0
	files := fixtureFiles(t)
	for _, f := range files {
		name := strings.TrimSuffix(filepath.Base(f), ".onnx")
		t.Run(name, func(t *testing.T) {
			m, err := graph.Load(f)
			if err != nil {
				t.Fatal(err)
			}
			ds, err := ReadDataSet(filepath.Join(fixtureDir, name+"_data", "test_data_set_0"))
			if err != nil {
				t.Fatal(err)
			}
			feeds, err := Feeds(m, ds.Inputs, nil)
			if err != nil {
				t.Fatal(err)
			}
			start := time.Now()
			out, err := Run(context.Background(), m, feeds, Options{})
			if err != nil {
				t.Fatal(err)
			}
			el := time.Since(start)
			if strings.Contains(name, "_full_") {
				t.Logf("%s: %v", name, el)
			}
			outs := m.Proto.GetGraph().GetOutput()
			if len(outs) != len(ds.Outputs) {
				t.Fatalf("%d outputs, data set has %d", len(outs), len(ds.Outputs))
			}
			for i, v := range outs {
				d, err := Compare(out[v.GetName()], ds.Outputs[i], rtol, atol)
				if err != nil {
					t.Fatalf("output %q: %v", v.GetName(), err)
				}
				peak := 0.0
				for _, w := range ds.Outputs[i].Float64s() {
					peak = max(peak, math.Abs(w))
				}
				strict, _ := Compare(out[v.GetName()], ds.Outputs[i], 1e-3, 1e-4*peak)
				t.Logf("%s: max |ref| %.3g, max abs err %.3g (%.2g of max |ref|), max rel err %.3g; strict check (rtol 1e-3, atol 1e-4*max|ref|): %d mismatches",
					v.GetName(), peak, d.MaxAbs, d.MaxAbs/peak, d.MaxRel, strict.Mismatches)
				if strict.Mismatches > 0 {
					t.Errorf("%s fails the scale-relative check", v.GetName())
				}
				if !d.OK() {
					t.Errorf("output %q: %d mismatches, max abs %.3g, max rel %.3g at %d", v.GetName(), d.Mismatches, d.MaxAbs, d.MaxRel, d.Worst)
				}
			}
			if !t.Failed() {
				passed++
			}
		})
	}
	t.Logf("fixtures: %d/%d match ONNX Runtime (rtol %g, atol %g)", passed, len(files), rtol, atol)
}

package passes

import (
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"testing"

	"github.com/mokopt/mokopt/graph"
	"github.com/mokopt/mokopt/graph/eval"
	"github.com/mokopt/mokopt/internal/fixtures"
)

// spelledCase is the part of a testdata/spelled manifest entry the
// control-flow and manifest tests read.
type spelledCase struct {
	Name            string `json:"name"`
	Class           string `json:"class"`
	OK              bool   `json:"ok"`
	ExpectedVerdict string `json:"expected_verdict"`
	Sets            int    `json:"test_data_sets"`
	Expected        struct {
		Verdict string `json:"verdict"`
		Blocks  int    `json:"blocks"`
	} `json:"expected"`
}

// TestSpelledControlFlow: the real exports of testdata/spelled whose
// blocks live in control flow (torch.cond, If, Loop, an If in a Loop,
// Scan; TorchScript and dynamo; three families) fuse inside their
// subgraphs, and the rewritten model reproduces every ONNX Runtime golden
// of the original, through the fused node's kernel and through its
// function body.
func TestSpelledControlFlow(t *testing.T) {
	var man struct {
		Cases []spelledCase `json:"cases"`
	}
	dir := spelledManifest(t, &man)
	n := 0
	for _, c := range man.Cases {
		if c.Class != "ctrl" {
			continue
		}
		n++
		t.Run(c.Name, func(t *testing.T) {
			m, err := graph.Load(filepath.Join(dir, c.Name+".onnx"))
			if err != nil {
				t.Fatal(err)
			}
			defer m.Close()
			rep, err := Rewrite(m, Options{Check: true})
			if c.Expected.Verdict != "fuse" {
				if err == nil {
					t.Fatalf("fused %d, manifest says %s", len(rep.Fused), c.Expected.Verdict)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if len(rep.Fused) != c.Expected.Blocks || rep.Fused[0].Block.Scope == "" {
				t.Fatalf("fused %d (scope %q), manifest says %d", len(rep.Fused), rep.Fused[0].Block.Scope, c.Expected.Blocks)
			}
			spelledGoldens(t, dir, c, m)
		})
	}
	if n == 0 {
		t.Fatal("no control-flow case in the manifest")
	}
}

// spelledManifest reads testdata/spelled/manifest.json into man (skipping
// the test where there is none) and returns the directory.
func spelledManifest(t *testing.T, man any) string {
	t.Helper()
	dir := filepath.Join(fixtures.Testdata(), "spelled")
	b, err := os.ReadFile(filepath.Join(dir, "manifest.json"))
	if err != nil {
		t.Skip(err)
	}
	if err := json.Unmarshal(b, man); err != nil {
		t.Fatal(err)
	}
	return dir
}

// spelledGoldens checks that m, the rewrite of spelled case c of dir,
// reproduces every ONNX Runtime golden output of c's test data sets,
// through the fused nodes' kernel and through their function bodies.
func spelledGoldens(t *testing.T, dir string, c spelledCase, m *graph.Model) {
	t.Helper()
	sets, _ := filepath.Glob(filepath.Join(dir, c.Name+"_data", "test_data_set_*"))
	if len(sets) == 0 || len(sets) != c.Sets {
		t.Fatalf("%d golden sets, manifest says %d", len(sets), c.Sets)
	}
	for _, set := range sets {
		ds, err := eval.ReadDataSet(set)
		if err != nil {
			t.Fatal(err)
		}
		feeds, err := eval.Feeds(m, ds.Inputs, ds.InputNames)
		if err != nil {
			t.Fatal(err)
		}
		for _, body := range []bool{false, true} {
			out, err := eval.Run(context.Background(), m, feeds, eval.Options{Kernels: evalKernels(), PreferFunctions: body})
			if err != nil {
				t.Fatal(err)
			}
			for i, o := range m.Proto.Graph.Output {
				d, err := eval.Compare(out[o.GetName()], ds.Outputs[i], 1e-4, 1e-5)
				if err != nil {
					t.Fatal(err)
				}
				if !d.OK() {
					t.Errorf("%s, function body %v: %s differs from ONNX Runtime's golden: %+v", filepath.Base(set), body, o.GetName(), d)
				}
			}
		}
	}
}

package passes

import (
	"context"
	"path/filepath"
	"strings"
	"testing"

	"github.com/mokopt/mokopt/graph"
	"github.com/mokopt/mokopt/graph/eval"
	"github.com/mokopt/mokopt/moe"
)

// lostExperts are the fixtures whose traces baked in only some experts
// (see the fixtures' README): they must be refused.
var lostExperts = map[string]bool{"qwen2_moe_block_torchscript": true, "gpt_oss_full_torchscript": true}

// TestRewriteFixturesGolden rewrites every fixture and checks the rewritten
// model against ONNX Runtime's golden outputs, once through the fused
// node's reference kernel and once through its function body.
func TestRewriteFixturesGolden(t *testing.T) {
	files, _ := filepath.Glob(filepath.Join(fixtureDir, "*.onnx"))
	if len(files) == 0 {
		t.Fatalf("no fixtures in %s", fixtureDir)
	}
	for _, f := range files {
		name := strings.TrimSuffix(filepath.Base(f), ".onnx")
		t.Run(name, func(t *testing.T) {
			m, err := graph.Load(f)
			if err != nil {
				t.Fatal(err)
			}
			before := len(m.Proto.Graph.Node)
			rep, err := Rewrite(m, Options{Check: true})
			if lostExperts[name] {
				if err == nil {
					t.Fatalf("a trace that lost experts was fused")
				}
				if !strings.Contains(err.Error(), "expert") || !strings.Contains(err.Error(), "--restore-traced-experts") {
					t.Fatalf("refusal does not talk about experts and the way out: %v", err)
				}
				for _, nm := range rep.NearMiss {
					if !strings.Contains(nm.Reason, "unrolled its loop") {
						t.Errorf("near-miss beside the lost-expert one: %+v", nm)
					}
				}
				// The trace only runs on inputs like its export's: the
				// export's own data makes the restored block's check conclusive.
				ds, derr := eval.ReadDataSet(strings.TrimSuffix(f, ".onnx") + "_data/test_data_set_0")
				if derr != nil {
					t.Fatal(derr)
				}
				// Restored from the stacked weights, the block must give the
				// golden outputs on the trace's own input (which hits exactly
				// the experts the trace computes), checked below.
				if m, err = graph.Load(f); err != nil {
					t.Fatal(err)
				}
				feeds, ferr := eval.Feeds(m, ds.Inputs, ds.InputNames)
				if ferr != nil {
					t.Fatal(ferr)
				}
				rep, err = Rewrite(m, Options{Check: true, RestoreTracedExperts: true, CheckData: []map[string]*eval.Tensor{feeds}})
				if err != nil {
					t.Fatalf("restore: %v", err)
				}
				if w := strings.Join(rep.Warnings, "\n"); strings.Contains(w, "inconclusive") {
					t.Fatalf("the check on the export's data was inconclusive: %s", w)
				}
				restored := 0
				for _, fb := range rep.Fused {
					if fb.Block.TracedExperts > 0 && fb.Block.TracedExperts < fb.Block.Spec.NumExperts {
						restored++
					}
				}
				if restored == 0 || !strings.Contains(strings.Join(rep.Warnings, "\n"), "restored from a trace") {
					t.Fatalf("no block reported as restored: %+v", rep.Warnings)
				}
			}
			if err != nil {
				t.Fatal(err)
			}
			want := 1
			if strings.Contains(name, "_full_") {
				want = 2
			}
			if len(rep.Fused) != want {
				t.Fatalf("fused %d blocks, want %d", len(rep.Fused), want)
			}
			fusedNodes, topk := 0, 0
			for _, n := range m.Proto.Graph.Node {
				if n.GetDomain() == moe.Domain && n.GetOpType() == moe.OpType {
					fusedNodes++
				}
				if n.GetOpType() == "TopK" {
					topk++
				}
			}
			if fusedNodes != want || topk != 0 {
				t.Fatalf("%d fused nodes and %d TopK left (had %d nodes)", fusedNodes, topk, before)
			}
			ds, err := eval.ReadDataSet(strings.TrimSuffix(f, ".onnx") + "_data/test_data_set_0")
			if err != nil {
				t.Fatal(err)
			}
			feeds := map[string]*eval.Tensor{}
			for i, v := range m.Proto.Graph.Input {
				if i < len(ds.Inputs) {
					feeds[v.GetName()] = ds.Inputs[i]
				}
			}
			for _, body := range []bool{false, true} {
				out, err := eval.Run(context.Background(), m, feeds, eval.Options{PreferFunctions: body})
				if err != nil {
					t.Fatalf("function body %v: %v", body, err)
				}
				got := out[m.Proto.Graph.Output[0].GetName()]
				d, err := eval.Compare(got, ds.Outputs[0], 1e-4, 1e-5)
				if err != nil {
					t.Fatal(err)
				}
				if !d.OK() {
					t.Errorf("function body %v: rewritten model differs from golden: %+v", body, d)
				}
			}
		})
	}
}

//go:build ort

package ortrun

import (
	"context"
	"path/filepath"
	"testing"

	"github.com/mokopt/mokopt/graph"
	"github.com/mokopt/mokopt/graph/eval"
	fx "github.com/mokopt/mokopt/internal/fixtures"
	"github.com/mokopt/mokopt/lowering"
	"github.com/mokopt/mokopt/passes"
)

// TestSpelledOwnershipORT: the exports of testdata/spelled with two blocks
// on one input (summed, and as two outputs) and with null experts,
// rewritten, run in ONNX Runtime (through the fused nodes' function
// bodies) and lowered with --target ort (null experts as zero experts of
// com.microsoft::MoE), reproduce every golden output of the original.
func TestSpelledOwnershipORT(t *testing.T) {
	needORT(t)
	for _, name := range []string{"pair_two_moe_sum_dynamo", "pair_two_moe_outputs_dynamo", "router_null_experts_norm_mixtral_dynamo"} {
		t.Run(name, func(t *testing.T) {
			base := filepath.Join(fx.Testdata(), "spelled", name)
			m, err := graph.Load(base + ".onnx")
			if err != nil {
				t.Fatal(err)
			}
			defer m.Close()
			rep, err := passes.Rewrite(m, passes.Options{Check: true})
			if err != nil {
				t.Fatal(err)
			}
			sets, _ := filepath.Glob(base + "_data/test_data_set_*")
			if len(sets) == 0 {
				t.Fatal("no goldens")
			}
			var outs []string
			for _, o := range m.Proto.Graph.Output {
				outs = append(outs, o.GetName())
			}
			for _, lowered := range []bool{false, true} {
				if lowered {
					lr, err := lowering.LowerORT(m, lowering.ORTOptions{})
					if err != nil {
						t.Fatal(err)
					}
					if len(lr.Blocks) != len(rep.Fused) {
						t.Fatalf("lowered %d of %d fused nodes", len(lr.Blocks), len(rep.Fused))
					}
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
					got, err := RunModel(context.Background(), m, feeds)
					if err != nil {
						t.Fatalf("ONNX Runtime (lowered %v): %v", lowered, err)
					}
					compareAll(t, filepath.Base(set)+map[bool]string{false: ": rewritten", true: ": lowered to ORT"}[lowered]+" in ORT vs golden", outs, got, ds.Outputs)
				}
			}
		})
	}
}

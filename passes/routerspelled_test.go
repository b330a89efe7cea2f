package passes

import (
	"path/filepath"
	"strings"
	"testing"

	"github.com/mokopt/mokopt/graph"
	"github.com/mokopt/mokopt/graph/eval"
)

// TestSpelledRouters rewrites the real router exports of testdata/spelled
// (PyTorch TorchScript and dynamo, ONNX Runtime goldens) and requires the
// fused model to reproduce every golden, or the refusal to name its cause.
// The nllb L1-normalised, log-top-k-exp and routed-scaling exports, which
// the numerical check refuses, and the fixed-table router, which is not
// found as a candidate, are not listed: they are open.
func TestSpelledRouters(t *testing.T) {
	fused := []string{"router_extra_cols_slice_mixtral_dynamo", "router_gather_probs_mixtral_dynamo",
		"router_sigmoid_hand_cbias_deepseek_torchscript", "router_sigmoid_norm_eps_deepseek_dynamo",
		"router_softmax_after_topk_mixtral_dynamo", "router_softmax_explogsoftmax_mixtral_dynamo",
		"router_softmax_expmax_mixtral_dynamo", "router_softmax_expsum_mixtral_dynamo",
		"router_temperature_mixtral_dynamo", "router_topk_neg_mixtral_dynamo",
		"router_null_experts_norm_mixtral_dynamo"}
	refused := map[string]string{
		"router_extra_cols_softmax_then_slice_qwen2_dynamo": "columns that are not experts",
	}
	dir := filepath.Join("..", "testdata", "spelled")
	for _, name := range fused {
		t.Run(name, func(t *testing.T) {
			m, err := graph.Load(filepath.Join(dir, name+".onnx"))
			if err != nil {
				t.Fatal(err)
			}
			rep, err := Rewrite(m, Options{Check: true})
			if err != nil || len(rep.Fused) != 1 {
				t.Fatalf("fused %v, err %v", rep, err)
			}
			sets, _ := filepath.Glob(filepath.Join(dir, name+"_data", "test_data_set_*"))
			if len(sets) == 0 {
				t.Fatal("no goldens")
			}
			for _, s := range sets {
				ds, err := eval.ReadDataSet(s)
				if err != nil {
					t.Fatal(err)
				}
				d, err := runGolden(m, ds)
				if err != nil || !d.OK() {
					t.Fatalf("%s: fused vs golden %+v %v", s, d, err)
				}
			}
		})
	}
	for name, want := range refused {
		t.Run(name, func(t *testing.T) {
			m, err := graph.Load(filepath.Join(dir, name+".onnx"))
			if err != nil {
				t.Fatal(err)
			}
			_, err = Rewrite(m, Options{Check: true})
			if err == nil || !strings.Contains(err.Error(), want) {
				t.Fatalf("want a refusal containing %q, got %v", want, err)
			}
		})
	}
}

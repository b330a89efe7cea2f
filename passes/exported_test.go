package passes

import (
	"context"
	"path/filepath"
	"strings"
	"testing"

	"github.com/mokopt/mokopt/graph"
	"github.com/mokopt/mokopt/graph/eval"
)

// exportedDir holds more real exports (testdata/exported/README.md): MoE
// families that testdata/fixtures lacks, exported the same way.
const exportedDir = "../testdata/exported"

// TestExportedFamilies checks the detector on families it was not written
// against: each block either fuses with the ground-truth semantics of the
// family's transformers config and reproduces ONNX Runtime's golden output,
// or is refused for the stated reason.
func TestExportedFamilies(t *testing.T) {
	type want struct {
		variant string // the fused node's overload; "" when refused
		I, Is   int
		refuse  string // substring of the refusal
		restore bool   // refused, but --restore-traced-experts fuses it
	}
	cases := map[string]want{
		"qwen3_moe_block_dynamo_batched_mm":    {variant: "softmax_act_topk_norm_swiglu", I: 32},
		"qwen3_moe_block_torchscript":          {variant: "softmax_act_topk_norm_swiglu", I: 32},
		"olmoe_block_dynamo_batched_mm":        {variant: "softmax_act_topk_swiglu", I: 128},
		"olmoe_block_torchscript":              {variant: "softmax_act_topk_swiglu", I: 128},
		"granitemoe_block_dynamo_batched_mm":   {variant: "softmax_topk_act_swiglu", I: 128},
		"granitemoe_block_torchscript":         {variant: "softmax_topk_act_swiglu", I: 128},
		"glm4_moe_block_dynamo_batched_mm":     {variant: "sigmoid_act_topk_norm_cbias_swiglu_shared", I: 32, Is: 32},
		"glm4_moe_block_torchscript":           {variant: "sigmoid_act_topk_norm_cbias_swiglu_shared", I: 32, Is: 32},
		"ernie4_5_moe_block_dynamo_batched_mm": {variant: "softmax_act_topk_norm_cbias_swiglu_shared", I: 32, Is: 32},
		// The trace input hit only 2 of the 8 experts.
		"ernie4_5_moe_block_torchscript": {variant: "softmax_act_topk_norm_cbias_swiglu_shared", I: 32, Is: 32, refuse: "2 times but there are 8 experts", restore: true},
		// DeepSeek-V2 group_limited_greedy: a group scores its best expert.
		"deepseek_v2_block_dynamo_batched_mm":        {variant: "softmax_act_topk_scaled_g1of2_gmax_swiglu_shared", I: 32, Is: 64},
		"deepseek_v2_block_torchscript":              {variant: "softmax_act_topk_scaled_g1of2_gmax_swiglu_shared", I: 32, Is: 64},
		"deepseek_v2_greedy_block_dynamo_batched_mm": {variant: "softmax_act_topk_swiglu_shared", I: 32, Is: 32},
		"dots1_block_dynamo_batched_mm":              {variant: "sigmoid_act_topk_cbias_swiglu_shared", I: 32, Is: 32},
		"dots1_block_torchscript":                    {variant: "sigmoid_act_topk_cbias_swiglu_shared", I: 32, Is: 32},
		"hunyuan_v1_moe_block_dynamo_batched_mm":     {variant: "softmax_act_topk_norm_swiglu_shared", I: 128, Is: 128},
		"qwen3_next_block_dynamo_batched_mm":         {variant: "softmax_act_topk_norm_swiglu_shared_gated", I: 32, Is: 128},
		"qwen3_next_block_torchscript":               {variant: "softmax_act_topk_norm_swiglu_shared_gated", I: 32, Is: 128},
		"minimax_block_torchscript":                  {variant: "softmax_act_topk_norm_swiglu", I: 128},
		// LFM2: renormalised by sum + 1e-6.
		"lfm2_moe_block_dynamo_batched_mm": {variant: "sigmoid_act_topk_norm_cbias_swiglu", I: 32},
		"lfm2_moe_block_torchscript":       {variant: "sigmoid_act_topk_norm_cbias_swiglu", I: 32},
		// DBRX: renormalised by the L1 norm; per-expert w1/v1/w2 stacks.
		"dbrx_block_torchscript":      {variant: "softmax_act_topk_norm_swiglu", I: 128},
		"flex_olmo_block_torchscript": {variant: "softmax_act_topk_swiglu", I: 128},
		// LongCat-Flash routes to 8 experts and 2 zero-computation experts.
		"longcat_flash_block_torchscript": {refuse: "expert(s) 8, 9 missing"},
		// PhiMoE routes with sparsemixer (ArgMax and masked softmax), no TopK.
		"phimoe_block_dynamo_batched_mm": {variant: "sparsemixer_topk_act_swiglu", I: 128},
		"phimoe_block_torchscript":       {variant: "sparsemixer_topk_act_swiglu", I: 128},
	}
	forEachExpected(t, exportedDir, cases, func(t *testing.T, f string, w want) {
		name := strings.TrimSuffix(filepath.Base(f), ".onnx")
		m, err := graph.Load(f)
		if err != nil {
			t.Fatal(err)
		}
		rep, err := Rewrite(m, Options{Check: true})
		if w.refuse != "" {
			if err == nil || !strings.Contains(err.Error(), w.refuse) {
				t.Fatalf("want a refusal containing %q, got %v", w.refuse, err)
			}
			if len(m.Proto.Graph.Node) == 0 || rep == nil || len(rep.Fused) != 0 {
				t.Fatal("a refused rewrite edited the model")
			}
			if !w.restore {
				return
			}
			if m, err = graph.Load(f); err != nil {
				t.Fatal(err)
			}
			if rep, err = Rewrite(m, Options{Check: true, RestoreTracedExperts: true}); err != nil {
				t.Fatalf("restore: %v", err)
			}
		} else if err != nil {
			t.Fatal(err)
		}
		if len(rep.Fused) != 1 {
			t.Fatalf("fused %d blocks, want 1", len(rep.Fused))
		}
		fb := rep.Fused[0]
		if fb.Variant != w.variant || fb.Block.Spec.NumExperts != 8 || fb.Block.Spec.TopK != 2 || fb.Block.Spec.Inter != w.I || fb.Block.Spec.SharedInter != w.Is {
			t.Fatalf("fused %s E=%d k=%d I=%d Is=%d, want %s E=8 k=2 I=%d Is=%d", fb.Variant, fb.Block.Spec.NumExperts, fb.Block.Spec.TopK, fb.Block.Spec.Inter, fb.Block.Spec.SharedInter, w.variant, w.I, w.Is)
		}
		for _, n := range m.Proto.Graph.Node {
			if n.GetOpType() == "TopK" {
				t.Fatalf("TopK %q left after fusion", n.GetName())
			}
		}
		ds, err := eval.ReadDataSet(filepath.Join(exportedDir, name+"_data", "test_data_set_0"))
		if err != nil {
			t.Fatal(err)
		}
		feeds, err := eval.Feeds(m, ds.Inputs, ds.InputNames)
		if err != nil {
			t.Fatal(err)
		}
		for _, body := range []bool{false, true} {
			out, err := eval.Run(context.Background(), m, feeds, eval.Options{PreferFunctions: body})
			if err != nil {
				t.Fatal(err)
			}
			d, err := eval.Compare(out[m.Proto.Graph.Output[0].GetName()], ds.Outputs[0], 1e-4, 1e-5)
			if err != nil {
				t.Fatal(err)
			}
			if !d.OK() {
				t.Errorf("function body %v: differs from ONNX Runtime's golden output: %+v", body, d)
			}
		}
	})
}

// forEachExpected runs check, as a subtest named after the model, on each
// ONNX model in dir, whose expectation cases holds by that name; a model
// without one, or an expectation without a model, fails the test.
func forEachExpected[W any](t *testing.T, dir string, cases map[string]W, check func(t *testing.T, path string, w W)) {
	t.Helper()
	files, _ := filepath.Glob(filepath.Join(dir, "*.onnx"))
	if len(files) != len(cases) {
		t.Fatalf("%d models in %s, %d expectations", len(files), dir, len(cases))
	}
	for _, f := range files {
		name := strings.TrimSuffix(filepath.Base(f), ".onnx")
		w, ok := cases[name]
		if !ok {
			t.Fatalf("no expectation for %s", name)
		}
		t.Run(name, func(t *testing.T) { check(t, f, w) })
	}
}

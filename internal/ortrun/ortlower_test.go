//go:build ort

package ortrun

import (
	"context"
	"errors"
	"path/filepath"
	"strings"
	"testing"

	"github.com/mokopt/mokopt/graph"
	"github.com/mokopt/mokopt/graph/eval"
	fx "github.com/mokopt/mokopt/internal/fixtures"
	"github.com/mokopt/mokopt/lowering"
	"github.com/mokopt/mokopt/passes"
)

// ortRefusedFixtures are the fixtures whose fused nodes ONNX Runtime's MoE
// op cannot express, with the semantics the refusal must name.
var ortRefusedFixtures = map[string][]string{
	"deepseek_v3_block_dynamo_batched_mm": {"sigmoid routing", "group-limited", "score-correction bias"},
	"deepseek_v3_block_torchscript":       {"sigmoid routing", "group-limited", "score-correction bias"},
	"llama4_block_dynamo":                 {"sigmoid routing", "weights_on_input"},
	"llama4_block_torchscript":            {"sigmoid routing", "weights_on_input"},
}

// TestLowerORTGolden: mokopt lower --target ort on each fixture's rewrite
// runs in ONNX Runtime and reproduces the fixture's golden outputs (rtol
// 1e-4, atol 1e-5); the fixtures with semantics the op lacks are refused
// naming the node and the semantics.
func TestLowerORTGolden(t *testing.T) {
	needORT(t)
	for _, f := range fixtures(t) {
		name := strings.TrimSuffix(filepath.Base(f), ".onnx")
		t.Run(name, func(t *testing.T) {
			fx := loadFixture(t, f)
			if _, ok := rewriteAndSave(t, fx); !ok {
				return
			}
			rep, err := lowering.LowerORT(fx.m, lowering.ORTOptions{})
			if want, refused := ortRefusedFixtures[name]; refused {
				if err == nil || !errors.Is(err, lowering.ErrORTUnsupported) {
					t.Fatalf("want a refusal, got %v", err)
				}
				for _, w := range append(want, "node \"") {
					if !strings.Contains(err.Error(), w) {
						t.Errorf("refusal does not name %q: %v", w, err)
					}
				}
				t.Logf("RESULT %s lower-ort refused: %v", name, err)
				return
			}
			if err != nil {
				t.Fatalf("LowerORT: %v", err)
			}
			for _, n := range fx.m.Proto.Graph.Node {
				if n.GetDomain() == "ai.mok" {
					t.Fatalf("ai.mok::%s left after lowering", n.GetOpType())
				}
			}
			p := filepath.Join(t.TempDir(), name+".ort.onnx")
			if err := fx.m.Save(p, graph.SaveOptions{}); err != nil {
				t.Fatal(err)
			}
			got, err := Run(p, fx.feeds)
			if err != nil {
				t.Fatal(err)
			}
			ops := []string{}
			for _, b := range rep.Blocks {
				ops = append(ops, b.Op)
				if b.SharedExpert != "" {
					ops = append(ops, "shared:"+b.SharedExpert[:strings.Index(b.SharedExpert, " in")])
				}
			}
			t.Logf("RESULT %s lower-ort-vs-golden maxabs=%.3g %v", name, compareAll(t, "lowered", fx.outs, got, fx.ds.Outputs), ops)
		})
	}
}

// TestLowerORTQuantized: with --quant int8 / int4 each fixture's rewrite
// lowers to com.microsoft::QMoE, ONNX Runtime runs it, and it agrees with
// the interpreter running the same model (package ortmoe's QMoE kernel)
// within rtol 1e-4 / atol 1e-5; the error against the golden outputs
// (quantization error) is reported. Fixtures with unnormalised top-k
// weights are refused (1.30's CPU QMoE always renormalises).
func TestLowerORTQuantized(t *testing.T) {
	needORT(t)
	for _, q := range []string{"int8", "int4"} {
		for _, f := range fixtures(t) {
			name := strings.TrimSuffix(filepath.Base(f), ".onnx")
			if _, isRefused := ortRefusedFixtures[name]; isRefused || refused[name] {
				continue
			}
			t.Run(q+"/"+name, func(t *testing.T) {
				fx := loadFixture(t, f)
				if _, ok := rewriteAndSave(t, fx); !ok {
					return
				}
				_, err := lowering.LowerORT(fx.m, lowering.ORTOptions{Quant: q})
				if strings.HasPrefix(name, "qwen2_moe_") {
					if err == nil || !strings.Contains(err.Error(), "always renormalises") {
						t.Fatalf("want a refusal of unnormalised routing, got %v", err)
					}
					return
				}
				if err != nil {
					t.Fatal(err)
				}
				p := filepath.Join(t.TempDir(), name+"."+q+".onnx")
				if err := fx.m.Save(p, graph.SaveOptions{}); err != nil {
					t.Fatal(err)
				}
				got, err := Run(p, fx.feeds)
				if err != nil {
					t.Fatal(err)
				}
				ref, err := eval.Run(context.Background(), fx.m, fx.feeds, eval.Options{})
				if err != nil {
					t.Fatal(err)
				}
				want := make([]*eval.Tensor, len(fx.outs))
				for i, o := range fx.outs {
					want[i] = ref[o]
				}
				worst := compareAll(t, "ORT vs interpreter", fx.outs, got, want)
				var gold eval.Diff
				for i, o := range fx.outs {
					gold, _ = eval.Compare(got[o], fx.ds.Outputs[i], rtol, atol)
				}
				t.Logf("RESULT %s %s ort-vs-kernel maxabs=%.3g; vs golden (quantization) maxabs=%.3g", q, name, worst, gold.MaxAbs)
			})
		}
	}
}

// TestLowerORTGoldenMore runs the same check on the exports in
// testdata/exported: families the rewrite fuses are lowered and match their
// golden outputs, or are refused naming the semantics the op lacks.
func TestLowerORTGoldenMore(t *testing.T) {
	needORT(t)
	files, _ := filepath.Glob(fx.Path("exported", "*.onnx"))
	if len(files) == 0 {
		t.Fatalf("no exports in %s", fx.Path("exported"))
	}
	rewriteRefuses := map[string]bool{"ernie4_5_moe_block_torchscript": true, "longcat_flash_block_torchscript": true}
	ortRefuses := map[string][]string{
		"phimoe_block_dynamo_batched_mm":       {"sparsemixer routing"},
		"phimoe_block_torchscript":             {"sparsemixer routing"},
		"glm4_moe_block_dynamo_batched_mm":     {"sigmoid routing", "score-correction bias"},
		"glm4_moe_block_torchscript":           {"sigmoid routing", "score-correction bias"},
		"ernie4_5_moe_block_dynamo_batched_mm": {"score-correction bias"},
		"deepseek_v2_block_dynamo_batched_mm":  {"group-limited top-k"},
		"deepseek_v2_block_torchscript":        {"group-limited top-k"},
		"dots1_block_dynamo_batched_mm":        {"sigmoid routing", "score-correction bias"},
		"dots1_block_torchscript":              {"sigmoid routing", "score-correction bias"},
		"lfm2_moe_block_dynamo_batched_mm":     {"sigmoid routing", "score-correction bias"},
		"lfm2_moe_block_torchscript":           {"sigmoid routing", "score-correction bias"},
	}
	for _, f := range files {
		name := strings.TrimSuffix(filepath.Base(f), ".onnx")
		t.Run(name, func(t *testing.T) {
			fx := loadFixture(t, f)
			if _, err := passes.Rewrite(fx.m, passes.Options{Check: true}); err != nil {
				if !rewriteRefuses[name] {
					t.Fatalf("Rewrite: %v", err)
				}
				t.Logf("rewrite refuses (as pinned in passes/exported_test.go): %v", err)
				return
			}
			_, err := lowering.LowerORT(fx.m, lowering.ORTOptions{})
			if want, refused := ortRefuses[name]; refused {
				if err == nil || !errors.Is(err, lowering.ErrORTUnsupported) {
					t.Fatalf("want a refusal, got %v", err)
				}
				for _, w := range want {
					if !strings.Contains(err.Error(), w) {
						t.Errorf("refusal does not name %q: %v", w, err)
					}
				}
				t.Logf("RESULT %s lower-ort refused: %v", name, err)
				return
			}
			if err != nil {
				t.Fatalf("LowerORT: %v", err)
			}
			p := filepath.Join(t.TempDir(), name+".ort.onnx")
			if err := fx.m.Save(p, graph.SaveOptions{}); err != nil {
				t.Fatal(err)
			}
			got, err := Run(p, fx.feeds)
			if err != nil {
				t.Fatal(err)
			}
			t.Logf("RESULT %s lower-ort-vs-golden maxabs=%.3g", name, compareAll(t, "lowered", fx.outs, got, fx.ds.Outputs))
		})
	}
}

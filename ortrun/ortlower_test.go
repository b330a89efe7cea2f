//go:build ort

package ortrun

import (
	"errors"
	"path/filepath"
	"strings"
	"testing"

	"github.com/mokopt/mokopt/graph"
	"github.com/mokopt/mokopt/lowering"
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

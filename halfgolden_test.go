package mokopt_test

import (
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/mokopt/mokopt"
	"github.com/mokopt/mokopt/graph"
	pb "github.com/mokopt/mokopt/graph/onnxpb"
	"github.com/mokopt/mokopt/moe"
)

// TestHalfGoldens: every float16 and bfloat16 export of
// testdata/exported_half_golden (five families, both exporters) fuses into
// one block whose model reproduces the export's golden outputs (ONNX
// Runtime's for float16, PyTorch's for bfloat16) and the original graph at
// the type's precision, leaving out only tokens whose routing is a near
// tie, and at least one data set needs that (so the rule is exercised).
func TestHalfGoldens(t *testing.T) {
	const dir = "testdata/exported_half_golden"
	var man struct {
		Cases []struct {
			Case  string `json:"case"`
			Error string `json:"error"`
		} `json:"cases"`
	}
	b, err := os.ReadFile(filepath.Join(dir, "manifest.json"))
	if err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal(b, &man); err != nil {
		t.Fatal(err)
	}
	if len(man.Cases) < 20 {
		t.Fatalf("manifest lists %d cases, want 20", len(man.Cases))
	}
	ctx := context.Background()
	ties := 0
	for _, c := range man.Cases {
		if c.Error != "" {
			t.Errorf("%s: export failed: %s", c.Case, c.Error)
			continue
		}
		t.Run(c.Case, func(t *testing.T) {
			path, data := filepath.Join(dir, c.Case+".onnx"), filepath.Join(dir, c.Case+"_data")
			fused := load(t, path)
			rep, err := mokopt.Rewrite(ctx, fused, mokopt.RewriteOptions{})
			if err != nil || len(rep.Fused) != 1 {
				t.Fatalf("rewrite: %v (%d fused)", err, len(rep.Fused))
			}
			half := "float16"
			if strings.HasSuffix(c.Case, "bfloat16") {
				half = "bfloat16"
			}
			run, err := mokopt.Run(ctx, fused, data, mokopt.DefaultVerifyOptions())
			if err != nil || !run.Pass {
				t.Fatalf("the fused model against the golden outputs: %v", err)
			}
			if !strings.Contains(strings.Join(run.Notes, "\n"), half+" precision") {
				t.Errorf("no note of the %s precision: %q", half, run.Notes)
			}
			ver, err := mokopt.Verify(ctx, fused, load(t, path), mokopt.VerifyOptions{DataDir: data})
			if err != nil || !ver.Pass {
				t.Fatalf("the fused model against the export on its data: %v", err)
			}
			for _, r := range []*mokopt.VerifyReport{run, ver} {
				for _, cs := range r.Cases {
					for _, o := range cs.Outputs {
						if o.NearTieTokens > 0 {
							ties++
							if !strings.Contains(cs.Message, "near tie") {
								t.Errorf("%s: %d tokens left out without saying why", cs.Name, o.NearTieTokens)
							}
						}
					}
				}
			}
		})
	}
	if ties == 0 {
		t.Error("no data set needed its near-tie tokens left out: the rule is not exercised here")
	}
}

// TestHalfGoldensCatchWrongExperts: leaving out near-tie tokens does not
// hide a wrong block: with one fused expert weight negated, the fused
// model of an export whose data holds near ties fails against its goldens
// and against the export.
func TestHalfGoldensCatchWrongExperts(t *testing.T) {
	const name = "testdata/exported_half_golden/qwen2_moe_block_dynamo_bfloat16"
	ctx := context.Background()
	fused := load(t, name+".onnx")
	if _, err := mokopt.Rewrite(ctx, fused, mokopt.RewriteOptions{}); err != nil {
		t.Fatal(err)
	}
	g := fused.Graph().Proto.GetGraph()
	var down string
	for _, n := range g.GetNode() {
		if n.GetDomain() == moe.Domain && n.GetOpType() == moe.OpType {
			down = n.GetInput()[moe.InDown]
		}
	}
	negated := false
	for _, init := range g.GetInitializer() {
		if init.GetName() != down || len(init.GetRawData()) == 0 {
			continue
		}
		width := 4
		if dt := graph.DataType(init); dt == pb.TensorProto_FLOAT16 || dt == pb.TensorProto_BFLOAT16 {
			width = 2
		}
		raw := init.GetRawData()
		for i := width - 1; i < len(raw); i += width {
			raw[i] ^= 0x80 // the sign bit, little-endian
		}
		negated = true
	}
	if !negated {
		t.Fatalf("no raw fused down weight %q to corrupt", down)
	}
	if rep, err := mokopt.Run(ctx, fused, name+"_data", mokopt.DefaultVerifyOptions()); err == nil && rep.Pass {
		t.Error("a fused model with a negated expert weight passed against the goldens")
	}
	if rep, err := mokopt.Verify(ctx, fused, load(t, name+".onnx"), mokopt.VerifyOptions{DataDir: name + "_data"}); err == nil && rep.Pass {
		t.Error("a fused model with a negated expert weight passed against the export")
	}
}

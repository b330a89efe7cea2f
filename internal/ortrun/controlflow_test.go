//go:build ort

package ortrun

import (
	"context"
	"path/filepath"
	"strings"
	"testing"

	"github.com/mokopt/mokopt/graph"
	"github.com/mokopt/mokopt/graph/eval"
	fx "github.com/mokopt/mokopt/internal/fixtures"
	"github.com/mokopt/mokopt/models"
	"github.com/mokopt/mokopt/passes"
)

// TestControlFlowAgainstORT: exported blocks wrapped in an If branch (then
// and else), a Loop body, an If in a Loop body, a Scan body and a
// function called from an If branch (models.WrapControlFlow). ONNX Runtime
// runs the original; the rewritten model, whose fused node lives in the
// subgraph and reads its weights from the main graph, and whose function
// body ONNX Runtime runs from inside the subgraph, gives ONNX Runtime's
// outputs in ONNX Runtime and in the interpreter, on both branches.
func TestControlFlowAgainstORT(t *testing.T) {
	needORT(t)
	for _, block := range []string{
		"example/mixtral_block_dynamo_batched_mm.onnx",
		"exported/deepseek_v2_block_dynamo_batched_mm.onnx",
		"exported/olmoe_block_torchscript.onnx",
	} {
		for _, how := range models.WrapKinds {
			t.Run(filepath.Base(block)+"/"+how, func(t *testing.T) {
				b, err := graph.Load(filepath.Join(fx.Testdata(), block))
				if err != nil {
					t.Fatal(err)
				}
				defer b.Close()
				orig, err := models.WrapControlFlow(b, how)
				if err != nil {
					t.Fatal(err)
				}
				m, _ := models.WrapControlFlow(b, how)
				rep, err := passes.Rewrite(m, passes.Options{Check: true})
				if err != nil {
					t.Fatal(err)
				}
				blocks := 1
				if how == models.WrapIfBoth {
					blocks = 2
				}
				if len(rep.Fused) != blocks || rep.Fused[0].Block.Scope == "" {
					t.Fatalf("fused %d (report %+v)", len(rep.Fused), rep)
				}
				dir := t.TempDir()
				po, pr := filepath.Join(dir, "orig.onnx"), filepath.Join(dir, "fused.onnx")
				if err := orig.Save(po, graph.SaveOptions{}); err != nil {
					t.Fatal(err)
				}
				if err := m.Save(pr, graph.SaveOptions{}); err != nil {
					t.Fatal(err)
				}
				for _, cond := range []bool{true, false} {
					feeds, want := ortFeeds(t, orig, po, cond)
					got, err := Run(pr, feeds)
					if err != nil {
						t.Fatalf("ONNX Runtime on the rewritten model: %v", err)
					}
					outs := []string{models.WrappedOutput}
					compareAll(t, "rewritten in ORT vs original in ORT", outs, got, []*eval.Tensor{want[models.WrappedOutput]})
					ref, err := eval.Run(context.Background(), m, feeds, eval.Options{})
					if err != nil {
						t.Fatal(err)
					}
					compareAll(t, "rewritten in the interpreter vs original in ORT", outs, ref, []*eval.Tensor{want[models.WrappedOutput]})
				}
			})
		}
	}
}

// ortFeeds returns random inputs the original (saved at path) runs on in
// ONNX Runtime, with the If condition cond, and ONNX Runtime's outputs. A
// TorchScript trace only runs on inputs that route as its trace input
// did: seeds are tried until one runs.
func ortFeeds(t *testing.T, m *graph.Model, path string, cond bool) (map[string]*eval.Tensor, map[string]*eval.Tensor) {
	t.Helper()
	var err error
	for seed := uint64(1); seed <= 30; seed++ {
		feeds, ferr := passes.RandomFeeds(m, seed, 8)
		if ferr != nil {
			t.Fatal(ferr)
		}
		if _, ok := feeds[models.CondInput]; ok {
			feeds[models.CondInput] = eval.NewBool([]int{1}, []bool{cond})
		}
		if _, err = eval.Run(context.Background(), m, feeds, eval.Options{}); err != nil {
			continue
		}
		want, rerr := Run(path, feeds)
		if rerr != nil {
			t.Fatalf("ONNX Runtime on the original: %v", rerr)
		}
		return feeds, want
	}
	t.Fatalf("the original runs on none of the inputs: %v", err)
	return nil, nil
}

// TestSpelledControlFlowORT: the control-flow exports of testdata/spelled,
// rewritten (the fused node inside the If, Loop or Scan body), run in ONNX
// Runtime and reproduce every golden output of the original.
func TestSpelledControlFlowORT(t *testing.T) {
	needORT(t)
	files, _ := filepath.Glob(filepath.Join(fx.Testdata(), "spelled", "ctrl_*.onnx"))
	if len(files) == 0 {
		t.Skip("no testdata/spelled control-flow exports")
	}
	for _, f := range files {
		t.Run(filepath.Base(f), func(t *testing.T) {
			m, err := graph.Load(f)
			if err != nil {
				t.Fatal(err)
			}
			defer m.Close()
			rep, err := passes.Rewrite(m, passes.Options{Check: true})
			if err != nil {
				t.Fatal(err)
			}
			if len(rep.Fused) == 0 || rep.Fused[0].Block.Scope == "" {
				t.Fatalf("fused %d", len(rep.Fused))
			}
			p := filepath.Join(t.TempDir(), "fused.onnx")
			if err := m.Save(p, graph.SaveOptions{}); err != nil {
				t.Fatal(err)
			}
			sets, _ := filepath.Glob(strings.TrimSuffix(f, ".onnx") + "_data/test_data_set_*")
			for _, set := range sets {
				ds, err := eval.ReadDataSet(set)
				if err != nil {
					t.Fatal(err)
				}
				feeds, err := eval.Feeds(m, ds.Inputs, ds.InputNames)
				if err != nil {
					t.Fatal(err)
				}
				got, err := Run(p, feeds)
				if err != nil {
					t.Fatalf("ONNX Runtime on the rewritten model: %v", err)
				}
				var outs []string
				for _, o := range m.Proto.Graph.Output {
					outs = append(outs, o.GetName())
				}
				compareAll(t, filepath.Base(set)+": rewritten in ORT vs golden", outs, got, ds.Outputs)
			}
		})
	}
}

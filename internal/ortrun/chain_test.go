//go:build ort

package ortrun

import (
	"context"
	"testing"

	"github.com/mokopt/mokopt/graph"
	"github.com/mokopt/mokopt/graph/eval"
	"github.com/mokopt/mokopt/internal/chain"
	fx "github.com/mokopt/mokopt/internal/fixtures"
	"github.com/mokopt/mokopt/passes"
	"google.golang.org/protobuf/proto"
)

// TestDirectChainsAgainstORT chains 20 copies of real exported blocks
// directly (each copy's output is the next copy's input, each copy with
// weights of its own), runs the original chain in ONNX Runtime on random
// inputs, and requires the rewritten chain (20 fused nodes) to give ONNX
// Runtime's outputs through both the reference kernel and the fused
// node's function body.
func TestDirectChainsAgainstORT(t *testing.T) {
	needORT(t)
	const n = 20
	for _, name := range []string{"phimoe_block_dynamo_batched_mm", "qwen3_next_block_dynamo_batched_mm", "deepseek_v2_block_dynamo_batched_mm"} {
		t.Run(name, func(t *testing.T) {
			load := func() *graph.Model {
				m, err := graph.Load(fx.Path("exported", name+".onnx"))
				if err != nil {
					t.Fatal(err)
				}
				mp, err := chain.Compose(m, n, chain.Options{Perturb: true})
				if err != nil {
					t.Fatal(err)
				}
				b, err := proto.Marshal(mp)
				if err != nil {
					t.Fatal(err)
				}
				cm, err := graph.Parse(b, name+" chain")
				if err != nil {
					t.Fatal(err)
				}
				return cm
			}
			orig, fused := load(), load()
			rep, err := passes.Rewrite(fused, passes.Options{Check: true})
			if err != nil {
				t.Fatal(err)
			}
			if len(rep.Fused) != n || len(fused.Proto.Graph.Node) != n {
				t.Fatalf("fused %d blocks into %d nodes, want %d", len(rep.Fused), len(fused.Proto.Graph.Node), n)
			}
			out := orig.Proto.Graph.Output[0].GetName()
			for seed := uint64(1); seed <= 2; seed++ {
				feeds, err := passes.RandomFeeds(orig, seed, 7)
				if err != nil {
					t.Fatal(err)
				}
				golden, err := RunModel(context.Background(), orig, feeds)
				if err != nil {
					t.Fatal(err)
				}
				for _, body := range []bool{false, true} {
					got, err := eval.Run(context.Background(), fused, feeds, eval.Options{PreferFunctions: body})
					if err != nil {
						t.Fatal(err)
					}
					d, err := eval.Compare(got[out], golden[out], 1e-4, 1e-5)
					if err != nil || !d.OK() {
						t.Fatalf("seed %d, function body %v: fused chain vs ONNX Runtime on the original chain: %+v %v", seed, body, d, err)
					}
				}
			}
		})
	}
}

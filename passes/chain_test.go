package passes

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/mokopt/mokopt/graph"
	"github.com/mokopt/mokopt/graph/eval"
	"github.com/mokopt/mokopt/internal/chain"
	fx "github.com/mokopt/mokopt/internal/fixtures"
	"github.com/mokopt/mokopt/moe"
	"google.golang.org/protobuf/proto"
)

// chainOf loads a real exported block and composes n directly chained
// copies of it (copy i+1 reads copy i's output; no residual between).
func chainOf(t testing.TB, file string, n int, perturb bool) *graph.Model {
	t.Helper()
	m, err := graph.Load(file)
	if err != nil {
		t.Fatal(err)
	}
	mp, err := chain.Compose(m, n, chain.Options{Perturb: perturb})
	if err != nil {
		t.Fatal(err)
	}
	b, err := proto.Marshal(mp)
	if err != nil {
		t.Fatal(err)
	}
	cm, err := graph.Parse(b, fmt.Sprintf("%s x%d", filepath.Base(file), n))
	if err != nil {
		t.Fatal(err)
	}
	return cm
}

// chainBlocks are real exports of different block shapes: a sparsemixer
// router, a gated shared expert, group-limited routing with a shared
// expert (dynamo exports, stacked experts), and a TorchScript trace that
// unrolls the loop over experts.
var chainBlocks = []struct {
	name string
	// traced: a TorchScript trace whose loop over the experts hit at
	// trace time is unrolled: the original graph only runs on inputs that
	// hit every expert, which a chain's later copies do not, so its
	// numbers are compared on the first two copies only.
	traced bool
}{
	{"phimoe_block_dynamo_batched_mm", false},
	{"qwen3_next_block_dynamo_batched_mm", false},
	{"deepseek_v2_block_dynamo_batched_mm", false},
	{"olmoe_block_torchscript", true},
}

// TestDirectChains composes 20 directly chained copies of different real
// blocks (each copy with weights of its own): every copy fuses, the
// rewritten chain is 20 fused nodes, it computes what the original chain
// computes on random inputs (for a trace that only runs on inputs like its
// own, the first two copies), and with identical copies the first fused
// node reproduces ONNX Runtime's golden output of the block.
func TestDirectChains(t *testing.T) {
	const n = 20
	for _, cb := range chainBlocks {
		name := cb.name
		t.Run(name, func(t *testing.T) {
			file := filepath.Join(exportedDir, name+".onnx")
			orig := chainOf(t, file, n, true)
			m := chainOf(t, file, n, true)
			rep, err := Rewrite(m, Options{Check: true})
			if err != nil {
				t.Fatal(err)
			}
			if len(rep.Fused) != n || len(rep.NearMiss) != 0 {
				t.Fatalf("fused %d of %d blocks; near-misses %v", len(rep.Fused), n, rep.NearMiss)
			}
			ops := map[string]int{}
			for _, nd := range m.Proto.Graph.Node {
				ops[nd.GetDomain()+"::"+nd.GetOpType()]++
			}
			if ops["ai.mok::MoE"] != n || len(m.Proto.Graph.Node) != n {
				t.Errorf("rewritten chain holds %d nodes %v, want %d fused nodes", len(m.Proto.Graph.Node), ops, n)
			}
			if cb.traced {
				orig = chainOf(t, file, 2, true)
				m = chainOf(t, file, 2, true)
				if rep, err := Rewrite(m, Options{Check: true}); err != nil || len(rep.Fused) != 2 {
					t.Fatalf("two copies: %v", err)
				}
			}
			sameOnRandomInputs(t, orig, m, 3)

			// ONNX Runtime's golden output for one block: the first fused
			// node of a chain of identical copies computes it.
			ds, err := eval.ReadDataSet(filepath.Join(exportedDir, name+"_data", "test_data_set_0"))
			if err != nil {
				t.Fatal(err)
			}
			same := chainOf(t, file, n, false)
			if _, err := Rewrite(same, Options{Check: true}); err != nil {
				t.Fatal(err)
			}
			first := ""
			for _, nd := range same.Proto.Graph.Node {
				if nd.GetOpType() == "MoE" && nd.Input[0] != "" && eval.GraphInputs(same)[0] == throughNames(same, nd.Input[0]) {
					first = nd.Output[0]
				}
			}
			if first == "" {
				t.Fatal("no fused node reads the chain's input")
			}
			feeds, err := eval.Feeds(same, ds.Inputs, nil)
			if err != nil {
				t.Fatal(err)
			}
			out, err := eval.Run(context.Background(), same, feeds, eval.Options{Capture: func(v string) bool { return v == first }})
			if err != nil {
				t.Fatal(err)
			}
			got := out[first]
			if got == nil || len(got.F32) != len(ds.Outputs[0].F32) {
				t.Fatalf("first block's output %v, golden shape %v", got, ds.Outputs[0].Shape)
			}
			flat := *got
			flat.Shape = ds.Outputs[0].Shape
			d, err := eval.Compare(&flat, ds.Outputs[0], 1e-4, 1e-5)
			if err != nil || !d.OK() {
				t.Fatalf("first fused block vs ONNX Runtime's golden output: %+v %v", d, err)
			}
		})
	}
}

// throughNames follows v back through the shape-only nodes left in m (the
// fused node may read a reshaped input) to the value they start from.
func throughNames(m *graph.Model, v string) string {
	g := m.Graph()
	for {
		p := g.Producer(v)
		if p == nil || !noiseOps[p.GetOpType()] {
			return v
		}
		v = p.Input[0]
	}
}

// sameOnRandomInputs runs a and b on the same random inputs (seeds
// 1..sets) and requires the same outputs to float32 rounding.
func sameOnRandomInputs(t *testing.T, a, b *graph.Model, sets int) {
	t.Helper()
	for seed := range uint64(sets) {
		feeds, err := RandomFeeds(a, seed+1, 7)
		if err != nil {
			t.Fatal(err)
		}
		wa, err := eval.Run(context.Background(), a, feeds, eval.Options{})
		if err != nil {
			t.Fatal(err)
		}
		fb := map[string]*eval.Tensor{}
		for i, name := range eval.GraphInputs(b) {
			fb[name] = feeds[eval.GraphInputs(a)[i]]
		}
		wb, err := eval.Run(context.Background(), b, fb, eval.Options{})
		if err != nil {
			t.Fatal(err)
		}
		for i, o := range a.Proto.Graph.Output {
			d, err := eval.Compare(wb[b.Proto.Graph.Output[i].GetName()], wa[o.GetName()], 1e-4, 1e-5)
			if err != nil || !d.OK() {
				t.Fatalf("random inputs %d, output %q: rewritten vs original %+v %v", seed+1, o.GetName(), d, err)
			}
		}
	}
}

// TestChainedRewriteWritesValidModels rewrites 2, 3 and 10 directly chained
// blocks with and without Partial: the result passes graph validation (no
// value read that nothing defines) and the model check, fuses every block,
// holds as many fused nodes as the report says, and computes what the
// original chain computes (for the TorchScript trace, whose original only
// runs on inputs like its own, on two copies).
func TestChainedRewriteWritesValidModels(t *testing.T) {
	for _, name := range []string{"phimoe_block_dynamo_batched_mm", "qwen3_moe_block_dynamo_batched_mm", "olmoe_block_torchscript"} {
		for _, n := range []int{2, 3, 10} {
			for _, partial := range []bool{false, true} {
				t.Run(fmt.Sprintf("%s/%d/partial=%v", name, n, partial), func(t *testing.T) {
					file := filepath.Join(exportedDir, name+".onnx")
					orig := chainOf(t, file, n, true)
					m := chainOf(t, file, n, true)
					rep, err := Rewrite(m, Options{Check: true, Partial: partial})
					if err != nil {
						t.Fatal(err)
					}
					if len(rep.Fused) != n {
						t.Fatalf("fused %d of %d: %v %v", len(rep.Fused), n, rep.NearMiss, rep.Refused)
					}
					if errs := graph.NewGraph(m.Proto.Graph).Validate(); len(errs) > 0 {
						t.Fatalf("rewritten chain invalid: %v", errs)
					}
					if err := m.Check(); err != nil {
						t.Fatalf("rewritten chain fails the model check: %v", err)
					}
					held := 0
					for _, nd := range m.Proto.Graph.Node {
						if nd.GetOpType() == "MoE" && strings.HasPrefix(nd.GetDomain(), "ai.mok") {
							held++
						}
					}
					if held != len(rep.Fused) {
						t.Fatalf("report says %d fused, the model holds %d fused nodes", len(rep.Fused), held)
					}
					if strings.HasSuffix(name, "_torchscript") && n > 2 {
						return // the trace's original runs only on inputs like its own (see chainBlocks)
					}
					sameOnRandomInputs(t, orig, m, 2)
				})
			}
		}
	}
}

// TestFailingChainIsLinear detects chains of 50 and 200 copies of a real
// block that every candidate fails on (LongCat-Flash routes to experts
// without compute): each TopK is reported, and detection's work grows
// linearly with the chain (a candidate's failure walks its own block, not
// the rest of the model). Work is counted as heap allocations, which do
// not depend on how busy the machine is: four times the copies may not
// allocate more than eight times as often (quadratic work would be
// sixteen). Timings are logged.
func TestFailingChainIsLinear(t *testing.T) {
	file := filepath.Join(exportedDir, "longcat_flash_block_torchscript.onnx")
	detectWork := func(n int) (uint64, time.Duration) {
		m := chainOf(t, file, n, false)
		m.Graph() // the index, built once per model, is not detection's work
		var before, after runtime.MemStats
		runtime.ReadMemStats(&before)
		start := time.Now()
		det, err := Detect(m)
		took := time.Since(start)
		runtime.ReadMemStats(&after)
		if err != nil {
			t.Fatal(err)
		}
		if len(det.Blocks) != 0 || len(det.NearMiss) != n {
			t.Fatalf("%d copies: %d blocks, %d near-misses, want 0 and %d", n, len(det.Blocks), len(det.NearMiss), n)
		}
		for _, nm := range det.NearMiss {
			if !strings.Contains(nm.Reason, "missing from the graph") {
				t.Fatalf("near-miss %q: %s", nm.Node, nm.Reason)
			}
		}
		return after.Mallocs - before.Mallocs, took
	}
	small, st := detectWork(50)
	large, lt := detectWork(200)
	t.Logf("detection of 50 failing copies: %d allocations, %v; of 200: %d, %v", small, st, large, lt)
	if large > 8*small {
		t.Fatalf("detection of 200 failing copies allocated %d times, of 50 %d times: not linear", large, small)
	}
}

// TestChainCheckSeesVanishedBlocks: in a direct chain without residual
// connections the activations vanish after a few copies; the check's run
// then restarts from random values of unit scale at such a block's input,
// so one weight of the fifth copy moved by 1e-2 is still caught there, and
// nowhere else, during the one run.
func TestChainCheckSeesVanishedBlocks(t *testing.T) {
	m := chainOf(t, fx.Path("exported", "qwen3_moe_block_dynamo_batched_mm.onnx"), 6, true)
	defer m.Close()
	det, err := Detect(m)
	if err != nil || len(det.Blocks) != 6 {
		t.Fatalf("detect: %d blocks, %v", len(det.Blocks), err)
	}
	const moved = 4
	for _, perturb := range []bool{false, true} {
		ws := make([]*moe.Weights, len(det.Blocks))
		for i, b := range det.Blocks {
			if ws[i], err = b.W.Materialize(m, &b.Spec); err != nil {
				t.Fatal(err)
			}
		}
		if perturb {
			ws[moved].Down[0] += 1e-2
		}
		errs, err := numericCheck(context.Background(), m, det.Blocks, ws, nil, 0)
		if err != nil {
			t.Fatal(err)
		}
		for i, e := range errs {
			if want := perturb && i == moved; (e != nil) != want {
				t.Errorf("perturbed %v: block %d check error %v, want an error %v", perturb, i, e, want)
			}
		}
		if perturb && errs[moved] != nil && !strings.Contains(errs[moved].Error(), "restarted from random values") {
			t.Errorf("block %d was not checked on a restarted input: %v", moved, errs[moved])
		}
	}
}

// BenchmarkCheckChain times the numerical check alone on directly chained
// copies of a real dynamo export (MOKOPT_BENCH_COPIES, default 100): many
// small blocks, whose matrix products are far below a millisecond each.
func BenchmarkCheckChain(b *testing.B) {
	n := 100
	if v, err := strconv.Atoi(os.Getenv("MOKOPT_BENCH_COPIES")); err == nil && v > 0 {
		n = v
	}
	m := chainOf(b, filepath.Join(exportedDir, "qwen3_moe_block_dynamo_batched_mm.onnx"), n, false)
	wc, _, _ := canonicalView(context.Background(), m)
	if wc == nil {
		wc = m
	}
	det, err := detectIn(wc, wc.Graph(), DetectOptions{})
	if err != nil || len(det.Blocks) != n {
		b.Fatalf("%v: %d blocks, want %d", err, len(det.Blocks), n)
	}
	wc.KeepIndex(wc.Graph())
	for b.Loop() {
		errs, err := numericCheck(context.Background(), wc, det.Blocks, make([]*moe.Weights, n), nil, 0)
		if err != nil {
			b.Fatal(err)
		}
		for _, e := range errs {
			if e != nil {
				b.Fatal(e)
			}
		}
	}
}

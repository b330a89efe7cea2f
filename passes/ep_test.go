package passes

import (
	"context"
	"fmt"
	"math"
	"math/rand/v2"
	"path/filepath"
	"strings"
	"testing"

	"github.com/mokopt/mokopt/graph"
	"github.com/mokopt/mokopt/graph/eval"
	"github.com/mokopt/mokopt/internal/ep"
	"github.com/mokopt/mokopt/models"
	"google.golang.org/protobuf/proto"
)

// epFeeds splits x [G·T, H] into G per-rank feeds.
func epFeeds(x []float32, G, T, H int, replicated bool) []map[string]*eval.Tensor {
	f := make([]map[string]*eval.Tensor, G)
	for r := range f {
		if replicated {
			f[r] = map[string]*eval.Tensor{models.InputName: eval.NewFloat32([]int{G * T, H}, append([]float32(nil), x...))}
			continue
		}
		f[r] = map[string]*eval.Tensor{models.InputName: eval.NewFloat32([]int{T, H}, append([]float32(nil), x[r*T*H:(r+1)*T*H]...))}
	}
	return f
}

func runGroup(t *testing.T, ms []*graph.Model, x []float32, T, H int, replicated bool) []float32 {
	t.Helper()
	outs, err := ep.RunRanks(context.Background(), nil, ms, epFeeds(x, len(ms), T, H, replicated), eval.Options{})
	if err != nil {
		t.Fatal(err)
	}
	var y []float32
	for r, o := range outs {
		if replicated && r > 0 {
			if d := maxAbsDiff(o[models.OutputName].F32, outs[0][models.OutputName].F32); d != 0 {
				t.Fatalf("rank %d's output differs from rank 0's by %g", r, d)
			}
			continue
		}
		y = append(y, o[models.OutputName].F32...)
	}
	return y
}

func maxAbsDiff(a, b []float32) float64 {
	if len(a) != len(b) {
		return math.Inf(1)
	}
	w := 0.0
	for i := range a {
		w = max(w, math.Abs(float64(a[i])-float64(b[i])))
	}
	return w
}

func epCases() []models.EPConfig {
	var cs []models.EPConfig
	for _, form := range []string{models.FormORTAllToAll, models.FormORTAllGather, models.FormDeepEP} {
		for _, pl := range []string{models.BeforeCombine, models.AfterCombine} {
			for _, g := range []int{4, 8} {
				cs = append(cs, models.EPConfig{Config: models.Config{Layers: 2, Experts: 16, TopK: 3, Hidden: 16, Inter: 24, SharedInter: 8 * (g / 8), Normalize: g == 4, Seed: int64(g)},
					Form: form, EP: g, Placement: pl})
			}
		}
	}
	for _, g := range []int{4, 8} {
		cs = append(cs, models.EPConfig{Config: models.Config{Layers: 2, Experts: 16, TopK: 3, Hidden: 16, Inter: 24, Normalize: g == 4, Seed: int64(g)},
			Form: models.FormORTSharded, EP: g, Placement: models.AfterCombine})
	}
	return cs
}

func TestEPRewriteShards(t *testing.T) {
	const T = 3
	for _, c := range epCases() {
		t.Run(fmt.Sprintf("%s/%s/ep%d", c.Form, c.Placement, c.EP), func(t *testing.T) {
			orig := make([]*graph.Model, c.EP)
			fused := make([]*graph.Model, c.EP)
			for r := range orig {
				var err error
				if orig[r], err = models.BuildRank(c, r); err != nil {
					t.Fatal(err)
				}
				if fused[r], err = models.BuildRank(c, r); err != nil {
					t.Fatal(err)
				}
				rep, err := Rewrite(fused[r], Options{Check: true})
				if err != nil {
					t.Fatal(err)
				}
				if len(rep.Fused) != c.Layers {
					t.Fatalf("rank %d: %d fused blocks, want %d", r, len(rep.Fused), c.Layers)
				}
				for _, f := range rep.Fused {
					s := f.Block.Spec
					if s.NumExperts != c.Experts || s.TopK != c.TopK || s.EPSize != c.EP || s.LocalExperts != c.Experts/c.EP || s.ExpertOffset != r*c.Experts/c.EP || s.NormalizeTopK != c.Normalize || s.SharedInter != c.SharedInter {
						t.Fatalf("rank %d: spec %+v", r, s)
					}
					if f.Block.Placement != c.Placement {
						t.Fatalf("placement %s, want %s", f.Block.Placement, c.Placement)
					}
				}
				if n := countOps(fused[r]); n["ai.mok::MoE"] != c.Layers || len(n) != 2 {
					t.Fatalf("rank %d after rewrite: %v", r, n)
				}
			}
			rng := rand.New(rand.NewPCG(7, uint64(c.EP)))
			x := make([]float32, c.EP*T*c.Hidden)
			for i := range x {
				x[i] = float32(rng.NormFloat64())
			}
			want := runGroup(t, orig, x, T, c.Hidden, c.Replicated())
			// A shard computes the block on whatever tokens its rank holds:
			// with ShardedMoE every rank holds all of them.
			got := runGroup(t, fused, x, T, c.Hidden, c.Replicated())
			if d := maxAbsDiff(got, want); d > 1e-5 {
				t.Fatalf("fused shards differ from the original ranks by %g", d)
			}
		})
	}
}

func countOps(m *graph.Model) map[string]int {
	n := map[string]int{}
	for _, nd := range m.Proto.Graph.Node {
		k := nd.GetOpType()
		if nd.GetDomain() != "" {
			k = nd.GetDomain() + "::" + k
		}
		n[k]++
	}
	return n
}

// verifyAgainst runs a and b on the same random tokens and returns the
// largest absolute difference of their outputs.
func verifyAgainst(t *testing.T, a, b *graph.Model, tokens int) float64 {
	t.Helper()
	feeds, err := RandomFeeds(a, 11, tokens)
	if err != nil {
		t.Fatal(err)
	}
	ya, err := eval.Run(context.Background(), a, feeds, eval.Options{})
	if err != nil {
		t.Fatal(err)
	}
	yb, err := eval.Run(context.Background(), b, feeds, eval.Options{})
	if err != nil {
		t.Fatal(err)
	}
	return maxAbsDiff(ya[models.OutputName].F32, yb[models.OutputName].F32)
}

func buildRanks(t *testing.T, c models.EPConfig) []*graph.Model {
	t.Helper()
	ms := make([]*graph.Model, c.EP)
	for r := range ms {
		var err error
		if ms[r], err = models.BuildRank(c, r); err != nil {
			t.Fatal(err)
		}
	}
	return ms
}

func TestEPMergeMatchesReference(t *testing.T) {
	for _, c := range epCases() {
		t.Run(fmt.Sprintf("%s/%s/ep%d", c.Form, c.Placement, c.EP), func(t *testing.T) {
			ranks := buildRanks(t, c)
			merged, mrep, _, err := RewriteRanks(ranks, Options{Check: true}, 3)
			if err != nil {
				t.Fatal(err)
			}
			if !mrep.Checked || mrep.MaxAbsErr > 1e-5 {
				t.Fatalf("group check: %+v", mrep)
			}
			n := countOps(merged)
			if n["ai.mok::MoE"] != c.Layers || n["TopK"] != 0 || len(n) != 2 {
				t.Fatalf("merged model ops %v, want %d ai.mok::MoE and the residual Adds", n, c.Layers)
			}
			_, ss, err := fusedNodes(merged)
			if err != nil {
				t.Fatal(err)
			}
			for _, s := range ss {
				if s.Shard() || s.EPSize != c.EP || s.ExpertOffset != 0 || s.NumExperts != c.Experts {
					t.Fatalf("merged spec %+v", s)
				}
			}
			ref, err := models.Build(c.Reference())
			if err != nil {
				t.Fatal(err)
			}
			if d := verifyAgainst(t, merged, ref, 9); d > 1e-5 {
				t.Fatalf("merged model differs from the single-rank reference by %g", d)
			}
			// The function body computes the same as the reference kernel.
			feeds, _ := RandomFeeds(merged, 3, 6)
			y1, err := eval.Run(context.Background(), merged, feeds, eval.Options{})
			if err != nil {
				t.Fatal(err)
			}
			y2, err := eval.Run(context.Background(), merged, feeds, eval.Options{PreferFunctions: true})
			if err != nil {
				t.Fatal(err)
			}
			if d := maxAbsDiff(y1[models.OutputName].F32, y2[models.OutputName].F32); d > 1e-5 {
				t.Fatalf("function body differs from the kernel by %g", d)
			}
			// Split and merge back.
			parts, err := SplitRanks(merged, c.EP)
			if err != nil {
				t.Fatal(err)
			}
			back, _, err := MergeRanks(parts)
			if err != nil {
				t.Fatal(err)
			}
			if d := verifyAgainst(t, back, merged, 5); d != 0 {
				t.Fatalf("split+merge changed the model by %g", d)
			}
			if d, err := CheckGroup(context.Background(), nil, parts, merged, 2, 4, false); err != nil || d > 1e-5 {
				t.Fatalf("split shards in lockstep vs merged: %g, %v", d, err)
			}
		})
	}
}

func TestEPMergeRefusals(t *testing.T) {
	c := models.EPConfig{Config: models.Config{Layers: 1, Experts: 8, TopK: 2, Hidden: 8, Inter: 8, Normalize: true, Seed: 3}, Form: models.FormDeepEP, EP: 4, Placement: models.BeforeCombine}
	fused := func() []*graph.Model {
		ms := buildRanks(t, c)
		for _, m := range ms {
			if _, err := Rewrite(m, Options{}); err != nil {
				t.Fatal(err)
			}
		}
		return ms
	}
	for _, tc := range []struct {
		name, want string
		edit       func([]*graph.Model) []*graph.Model
	}{
		{"missing rank", "not a shard of an EP group of 3", func(ms []*graph.Model) []*graph.Model { return ms[:3] }},
		{"duplicate rank", "both hold experts", func(ms []*graph.Model) []*graph.Model { ms[2] = ms[1]; return ms }},
		{"router differs", "differs between", func(ms []*graph.Model) []*graph.Model {
			other := c
			other.Seed = 4
			m, _ := models.BuildRank(other, 1)
			if _, err := Rewrite(m, Options{}); err != nil {
				t.Fatal(err)
			}
			ms[1] = m
			return ms
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, _, err := MergeRanks(tc.edit(fused()))
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("err %v, want %q", err, tc.want)
			}
		})
	}
}

func TestEPDetectNeedsRank(t *testing.T) {
	c := models.EPConfig{Config: models.Config{Layers: 1, Experts: 8, TopK: 2, Hidden: 8, Inter: 8, Seed: 3}, Form: models.FormORTAllToAll, EP: 4}
	m, err := models.BuildRank(c, 2)
	if err != nil {
		t.Fatal(err)
	}
	dropMetadata(m, MetaEPRank)
	det, err := Detect(m)
	if err != nil {
		t.Fatal(err)
	}
	if len(det.Blocks) != 0 || len(det.NearMiss) != 1 || !strings.Contains(det.NearMiss[0].Reason, MetaEPRank) {
		t.Fatalf("detection without a rank: %+v", det)
	}
}

func TestEPShardingAnnotations(t *testing.T) {
	for _, g := range []int{4, 8, 64} {
		c := models.EPConfig{Config: models.Config{Layers: 2, Experts: 64, TopK: 4, Hidden: 8, Inter: 8, Normalize: true, Seed: 9}, Form: models.FormSharding, EP: g}
		m, err := models.BuildSharded(c)
		if err != nil {
			t.Fatal(err)
		}
		rep, err := Rewrite(m, Options{Check: true})
		if err != nil {
			t.Fatal(err)
		}
		if len(rep.Fused) != 2 {
			t.Fatalf("ep %d: %d fused", g, len(rep.Fused))
		}
		for _, f := range rep.Fused {
			if s := f.Block.Spec; s.EPSize != g || s.ExpertOffset != 0 || s.Shard() {
				t.Fatalf("ep %d: spec %+v", g, s)
			}
		}
		ref, _ := models.Build(c.Reference())
		if d := verifyAgainst(t, m, ref, 5); d > 1e-5 {
			t.Fatalf("ep %d: fused annotated model vs reference: %g", g, d)
		}
	}
}

// TestEP64 runs a whole rack-sized group (EP 64, one or two experts per
// rank) of every per-rank form and placement through RewriteRanks and
// checks the merged model against the single-rank reference.
func TestEP64(t *testing.T) {
	if testing.Short() {
		t.Skip("64 simulated ranks")
	}
	for _, form := range []string{models.FormORTAllToAll, models.FormORTAllGather, models.FormDeepEP, models.FormORTSharded} {
		for i, pl := range []string{models.BeforeCombine, models.AfterCombine} {
			if form == models.FormORTSharded && pl == models.BeforeCombine {
				continue
			}
			c := models.EPConfig{Config: models.Config{Layers: 1, Experts: 64 * (i + 1), TopK: 4, Hidden: 8, Inter: 8, Normalize: true, Seed: 64},
				Form: form, EP: 64, Placement: pl}
			t.Run(fmt.Sprintf("%s/%s/E%d", form, pl, c.Experts), func(t *testing.T) {
				merged, mrep, _, err := RewriteRanks(buildRanks(t, c), Options{Check: true}, 2)
				if err != nil {
					t.Fatal(err)
				}
				if len(mrep.Nodes) != 1 || mrep.Nodes[0].LocalExperts != c.Experts/64 || mrep.MaxAbsErr > 1e-5 {
					t.Fatalf("merge report %+v", mrep)
				}
				ref, _ := models.Build(c.Reference())
				if d := verifyAgainst(t, merged, ref, 8); d > 1e-5 {
					t.Fatalf("merged vs reference: %g", d)
				}
			})
		}
	}
}

// TestEPCustomOpTable renames the deepep form's dispatch/combine into a
// custom domain: without a table entry the blocks are not recognised as
// EP; with one they fuse and merge as before.
func TestEPCustomOpTable(t *testing.T) {
	c := models.EPConfig{Config: models.Config{Layers: 2, Experts: 8, TopK: 2, Hidden: 8, Inter: 16, Normalize: true, Seed: 21}, Form: models.FormDeepEP, EP: 4, Placement: models.AfterCombine}
	rename := func() []*graph.Model {
		ms := buildRanks(t, c)
		for _, m := range ms {
			for _, n := range m.Proto.Graph.Node {
				if n.GetDomain() != models.DeepEPDomain {
					continue
				}
				n.Domain = proto.String("acme.ep")
				n.OpType = proto.String(map[string]string{"dispatch": "send_tokens", "combine": "recv_tokens"}[n.GetOpType()])
				for _, a := range n.Attribute {
					a.Name = proto.String(map[string]string{"num_ranks": "world", "num_experts": "experts"}[a.GetName()])
				}
			}
			m.SetOpset("acme.ep", 1)
		}
		return ms
	}
	det, err := Detect(rename()[0])
	if err != nil {
		t.Fatal(err)
	}
	if len(det.NearMiss) != c.Layers || !strings.Contains(det.NearMiss[0].Reason, "--ep-ops") {
		t.Fatalf("without a table entry: near-misses %+v", det.NearMiss)
	}
	if len(det.Blocks) != 0 {
		t.Fatalf("without a table entry the custom ops were taken for EP: %+v", det.Blocks[0].Spec)
	}
	tbl := ep.DefaultTable()
	tbl.Ops = append(tbl.Ops,
		ep.Op{Domain: "acme.ep", Name: "send_tokens", Kind: ep.Dispatch, GroupAttr: "world", ExpertsAttr: "experts"},
		ep.Op{Domain: "acme.ep", Name: "recv_tokens", Kind: ep.Combine, GroupAttr: "world"})
	merged, mrep, _, err := RewriteRanks(rename(), Options{Check: true, EPTable: tbl}, 3)
	if err != nil {
		t.Fatal(err)
	}
	ref, _ := models.Build(c.Reference())
	if d := verifyAgainst(t, merged, ref, 6); d > 1e-5 || mrep.MaxAbsErr > 1e-5 {
		t.Fatalf("custom-table merge: vs reference %g, group %g", d, mrep.MaxAbsErr)
	}
}

// TestEPGroupVsReference runs the unfused rank models of every per-rank
// form in lockstep against the single-rank reference model (no fusion in
// between) and logs the largest error (go test -v -run TestEPGroupVsReference).
func TestEPGroupVsReference(t *testing.T) {
	for _, form := range []string{models.FormORTAllToAll, models.FormORTAllGather, models.FormDeepEP, models.FormORTSharded} {
		for _, g := range []int{4, 8} {
			for _, pl := range []string{models.BeforeCombine, models.AfterCombine} {
				c := models.EPConfig{Config: models.Config{Layers: 2, Experts: 16, TopK: 4, Hidden: 32, Inter: 64, SharedInter: 64, Normalize: true, Seed: 7},
					Form: form, EP: g, Placement: pl}
				if form == models.FormORTSharded {
					if pl == models.BeforeCombine {
						continue
					}
					c.SharedInter = 0
				}
				ref, err := models.Build(c.Reference())
				if err != nil {
					t.Fatal(err)
				}
				worst := 0.0
				for seed := uint64(1); seed <= 2; seed++ {
					d, err := CheckGroup(context.Background(), nil, buildRanks(t, c), ref, 8, seed, c.Replicated())
					if err != nil {
						t.Fatalf("%s ep%d %s: %v", form, g, pl, err)
					}
					worst = max(worst, d)
				}
				t.Logf("%-14s EP=%d %-14s unfused ranks in lockstep vs single-rank reference: max |error| %.3g", form, g, pl, worst)
			}
		}
	}
}

// TestEPTorchExport fuses and merges per-rank models that PyTorch 2.11's
// ONNX exporter wrote for DeepEP-style code (custom ops deep_ep::dispatch /
// combine with register_custom_op_symbolic; testdata/ep_export/export_deepep.py)
// and compares the merged model with PyTorch's dense reference outputs.
func TestEPTorchExport(t *testing.T) {
	dir := "../testdata/ep_export"
	for _, tc := range []struct {
		name      string
		ep        int
		placement string
	}{
		{"deepep_ep4_before", 4, PlacementBeforeCombine},
		{"deepep_ep4_after", 4, PlacementAfterCombine},
		{"deepep_ep8_before", 8, PlacementBeforeCombine},
		{"deepep_ep8_after", 8, PlacementAfterCombine},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ranks := make([]*graph.Model, tc.ep)
			for r := range ranks {
				m, err := graph.Load(filepath.Join(dir, fmt.Sprintf("%s.rank%d.onnx", tc.name, r)))
				if err != nil {
					t.Fatal(err)
				}
				ranks[r] = m
			}
			det, err := Detect(ranks[1])
			if err != nil {
				t.Fatal(err)
			}
			if len(det.Blocks) != 1 {
				t.Fatalf("rank 1: %d blocks, near-misses %+v", len(det.Blocks), det.NearMiss)
			}
			b := det.Blocks[0]
			if s := b.Spec; s.NumExperts != 16 || s.TopK != 2 || s.EPSize != tc.ep || s.LocalExperts != 16/tc.ep || s.ExpertOffset != 16/tc.ep || !s.NormalizeTopK || b.Placement != tc.placement {
				t.Fatalf("rank 1 spec %+v placement %s", s, b.Placement)
			}
			merged, mrep, _, err := RewriteRanks(ranks, Options{Check: true}, 3)
			if err != nil {
				t.Fatal(err)
			}
			if n := countOps(merged); n["ai.mok::MoE"] != 1 || len(merged.Proto.Graph.Node) != 2 {
				t.Fatalf("merged ops %v", n)
			}
			ds, err := eval.ReadDataSet(filepath.Join(dir, tc.name+"_data", "test_data_set_0"))
			if err != nil {
				t.Fatal(err)
			}
			out, err := eval.Run(context.Background(), merged, map[string]*eval.Tensor{"x": ds.Inputs[0]}, eval.Options{})
			if err != nil {
				t.Fatal(err)
			}
			d := maxAbsDiff(out["y"].F32, ds.Outputs[0].F32)
			if d > 2e-6 {
				t.Fatalf("merged model vs PyTorch reference: %g", d)
			}
			t.Logf("%s: group check %.3g, merged vs PyTorch %.3g", tc.name, mrep.MaxAbsErr, d)
		})
	}
}

// TestEPStaticTokens merges rank files with a static token count: the
// merged model takes the G·T tokens of the group.
func TestEPStaticTokens(t *testing.T) {
	c := models.EPConfig{Config: models.Config{Layers: 2, Experts: 8, TopK: 2, Hidden: 8, Inter: 8, Normalize: true, Seed: 5, Tokens: 3}, Form: models.FormDeepEP, EP: 4, Placement: models.AfterCombine}
	merged, mrep, _, err := RewriteRanks(buildRanks(t, c), Options{Check: true}, 3)
	if err != nil {
		t.Fatal(err)
	}
	if len(mrep.Notes) != 2 || merged.Proto.Graph.Input[0].GetType().GetTensorType().GetShape().Dim[0].GetDimValue() != 12 {
		t.Fatalf("notes %v, input %v", mrep.Notes, merged.Proto.Graph.Input[0])
	}
	rc := c.Reference()
	rc.Tokens = 12
	ref, _ := models.Build(rc)
	if d := verifyAgainst(t, merged, ref, 12); d > 1e-5 {
		t.Fatalf("merged vs reference: %g", d)
	}
	parts, err := SplitRanks(merged, 4)
	if err != nil {
		t.Fatal(err)
	}
	if d := parts[0].Proto.Graph.Input[0].GetType().GetTensorType().GetShape().Dim[0].GetDimValue(); d != 3 {
		t.Fatalf("split rank input token dim %d, want 3", d)
	}
	if d, err := CheckGroup(context.Background(), nil, parts, merged, 3, 1, false); err != nil || d > 1e-5 {
		t.Fatalf("split shards vs merged: %g, %v", d, err)
	}
}

package passes

import (
	"context"
	"fmt"
	"math"
	"math/rand/v2"
	"testing"

	"github.com/mokopt/mokopt/ep"
	"github.com/mokopt/mokopt/graph"
	"github.com/mokopt/mokopt/graph/eval"
	"github.com/mokopt/mokopt/models"
)

// epFeeds splits x [G·T, H] into G per-rank feeds.
func epFeeds(x []float32, G, T, H int) []map[string]*eval.Tensor {
	f := make([]map[string]*eval.Tensor, G)
	for r := range f {
		f[r] = map[string]*eval.Tensor{models.InputName: eval.NewFloat32([]int{T, H}, append([]float32(nil), x[r*T*H:(r+1)*T*H]...))}
	}
	return f
}

func runGroup(t *testing.T, ms []*graph.Model, x []float32, T, H int) []float32 {
	t.Helper()
	outs, err := ep.RunRanks(context.Background(), nil, ms, epFeeds(x, len(ms), T, H), eval.Options{})
	if err != nil {
		t.Fatal(err)
	}
	var y []float32
	for _, o := range outs {
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
	for _, form := range []string{models.FormORTAllToAll, models.FormDeepEP} {
		for _, pl := range []string{models.BeforeCombine, models.AfterCombine} {
			for _, g := range []int{4, 8} {
				cs = append(cs, models.EPConfig{Config: models.Config{Layers: 2, Experts: 16, TopK: 3, Hidden: 16, Inter: 24, SharedInter: 8 * (g / 8), Normalize: g == 4, Seed: int64(g)},
					Form: form, EP: g, Placement: pl})
			}
		}
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
				if n := countOps(fused[r]); n["ai.mok::MoE"] != c.Layers || n["TopK"] != 0 || n["com.microsoft::AllToAll"] != 0 || n["deep_ep::dispatch"] != 0 {
					t.Fatalf("rank %d after rewrite: %v", r, n)
				}
			}
			rng := rand.New(rand.NewPCG(7, uint64(c.EP)))
			x := make([]float32, c.EP*T*c.Hidden)
			for i := range x {
				x[i] = float32(rng.NormFloat64())
			}
			want := runGroup(t, orig, x, T, c.Hidden)
			got := runGroup(t, fused, x, T, c.Hidden)
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

package lowering

import (
	"slices"
	"testing"

	"github.com/mokopt/mokopt/graph"
	"github.com/mokopt/mokopt/kernel"
	"github.com/mokopt/mokopt/models"
	"github.com/mokopt/mokopt/passes"
)

// TestLowerEPModels lowers an EP group's merged global model (ep_size
// taken from the model), refuses a mismatching --ep and a rank's shard.
func TestLowerEPModels(t *testing.T) {
	c := models.EPConfig{Config: models.Config{Layers: 1, Experts: 8, TopK: 2, Hidden: 256, Inter: 256, SharedInter: 256, Normalize: true, Seed: 1},
		Form: models.FormDeepEP, EP: 4, Placement: models.AfterCombine}
	ranks := make([]*graph.Model, c.EP)
	for r := range ranks {
		var err error
		if ranks[r], err = models.BuildRank(c, r); err != nil {
			t.Fatal(err)
		}
	}
	shard := func() *graph.Model {
		m, err := models.BuildRank(c, 1)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := passes.Rewrite(m, passes.Options{}); err != nil {
			t.Fatal(err)
		}
		return m
	}()
	merged, _, _, err := passes.RewriteRanks(ranks, passes.Options{}, 2)
	if err != nil {
		t.Fatal(err)
	}
	if ep, err := EPFromModel(merged); err != nil || ep != c.EP {
		t.Fatalf("EPFromModel = %d, %v; want %d", ep, err, c.EP)
	}
	codes := func(rep *Report) []string {
		var out []string
		for _, b := range rep.Blocks {
			for _, v := range b.Violations {
				if v.Severity == kernel.SeverityError {
					out = append(out, v.Code)
				}
			}
		}
		return out
	}
	for _, tc := range []struct {
		name    string
		m       *graph.Model
		ep      int
		lowered bool
		codes   []string
	}{
		{"merged at its EP", merged, 4, true, nil},
		{"merged at another EP", cloneModel(t, merged), 8, false, []string{CodeEPAttr}},
		{"a rank's shard", shard, 4, false, []string{CodeEPShard}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			m := tc.m
			if tc.lowered {
				m = cloneModel(t, m)
			}
			rep, _ := Lower(m, Options{Target: kernel.GB300NVL72, EP: tc.ep})
			if rep == nil || len(rep.Blocks) != 1 {
				t.Fatalf("report %+v", rep)
			}
			if rep.Blocks[0].Lowered != tc.lowered || !slices.Equal(codes(rep), tc.codes) {
				t.Fatalf("lowered %v, error codes %v; want %v, %v (%s)", rep.Blocks[0].Lowered, codes(rep), tc.lowered, tc.codes, rep.Blocks[0].Reason)
			}
		})
	}
}

func TestPickEP(t *testing.T) {
	fused := func(E, ep int) *graph.Model {
		t.Helper()
		m, err := models.Build(models.Config{Shape: models.ShapeBatched, Layers: 1, Experts: E, TopK: 2, Hidden: 8, Inter: 8, Seed: 1})
		if err != nil {
			t.Fatal(err)
		}
		if _, err := passes.Rewrite(m, passes.Options{}); err != nil {
			t.Fatal(err)
		}
		if ep > 1 {
			parts, err := passes.SplitRanks(m, ep)
			if err != nil {
				t.Fatal(err)
			}
			if m, _, err = passes.MergeRanks(parts); err != nil {
				t.Fatal(err)
			}
		}
		return m
	}
	for _, tc := range []struct {
		name   string
		m      *graph.Model
		target kernel.Target
		want   int
	}{
		{"exported ep_size", fused(64, 8), kernel.GB300NVL72, 8},
		{"largest dividing E", fused(96, 1), kernel.GB300NVL72, 32},
		{"E=256 on a rack", fused(256, 1), kernel.GB200NVL72, 64},
		{"E=8", fused(8, 1), kernel.GB300NVL72, 8},
		{"E=6 only EP 1", fused(6, 1), kernel.GB300NVL72, 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, why, err := PickEP(tc.m, tc.target)
			if err != nil || got != tc.want || why == "" {
				t.Fatalf("PickEP = %d (%q), %v; want %d", got, why, err, tc.want)
			}
		})
	}
}

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

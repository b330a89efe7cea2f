package mokopt

import (
	"context"
	"testing"

	"github.com/mokopt/mokopt/models"
)

func TestRewriteRanksFacade(t *testing.T) {
	c := models.EPConfig{Config: models.Config{Layers: 1, Experts: 16, TopK: 2, Hidden: 8, Inter: 8, Normalize: true, Seed: 2}, Form: models.FormORTAllGather, EP: 4}
	ranks := make([]*Model, c.EP)
	for r := range ranks {
		g, err := models.BuildRank(c, r)
		if err != nil {
			t.Fatal(err)
		}
		ranks[r] = Wrap(g)
	}
	merged, mrep, reps, err := RewriteRanks(context.Background(), ranks, RewriteOptions{}, 2)
	if err != nil {
		t.Fatal(err)
	}
	if !mrep.Checked || len(mrep.Nodes) != 1 || len(reps) != 4 || mrep.Nodes[0].LocalExperts != 4 {
		t.Fatalf("merge report %+v", mrep)
	}
	if ep, why, err := PickEP(merged, TargetGB300NVL72); err != nil || ep != 4 || why == "" {
		t.Fatalf("PickEP = %d %q %v", ep, why, err)
	}
	parts, err := SplitRanks(merged, 2)
	if err == nil || parts != nil {
		t.Fatalf("a node exported for EP 4 split 2 ways: %v", err)
	}
	if parts, err = SplitRanks(merged, 4); err != nil || len(parts) != 4 {
		t.Fatalf("split: %d parts, %v", len(parts), err)
	}
	in, err := InspectWith(context.Background(), ranks[0], InspectOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if len(in.MoE.Blocks) != 0 { // ranks[0] was rewritten in place: now fused
		t.Fatalf("rewritten rank still has %d blocks", len(in.MoE.Blocks))
	}
}

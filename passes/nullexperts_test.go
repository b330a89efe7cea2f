package passes

import (
	"path/filepath"
	"strings"
	"testing"

	"github.com/mokopt/mokopt/graph"
	"github.com/mokopt/mokopt/internal/fixtures"
)

// TestNullExpertsIdentified tells null experts (router outputs whose
// selections reach nothing) from experts without compute whose
// selections do reach the output (LongCat-Flash's zero-computation
// experts pass their tokens through, times the routing weight): the first
// are fused with zero experts, the second refused naming the experts
// without compute.
func TestNullExpertsIdentified(t *testing.T) {
	for _, tc := range []struct {
		path   string
		null   int // null experts of the one block; -1: refused
		reason string
	}{
		{filepath.Join(fixtures.Testdata(), "spelled", "router_null_experts_norm_mixtral_dynamo.onnx"), 2, ""},
		{filepath.Join(exportedDir, "longcat_flash_block_torchscript.onnx"), -1, "expert(s) 8, 9 missing from the graph"},
	} {
		t.Run(filepath.Base(tc.path), func(t *testing.T) {
			m, err := graph.Load(tc.path)
			if err != nil {
				t.Fatal(err)
			}
			defer m.Close()
			det, err := Detect(m)
			if err != nil {
				t.Fatal(err)
			}
			if tc.null < 0 {
				if len(det.Blocks) != 0 || len(det.NearMiss) != 1 || !strings.Contains(det.NearMiss[0].Reason, tc.reason) {
					t.Fatalf("%d blocks, near-misses %v; want one refused with %q", len(det.Blocks), det.NearMiss, tc.reason)
				}
				return
			}
			if len(det.Blocks) != 1 || det.Blocks[0].NullExperts != tc.null {
				t.Fatalf("blocks %v, near-misses %v; want one with %d null experts", det.Blocks, det.NearMiss, tc.null)
			}
		})
	}
}

package passes

import (
	"encoding/json"
	"path/filepath"
	"slices"
	"sort"
	"testing"

	"github.com/mokopt/mokopt/graph"
)

// TestSpelledOwnership: the real exports of testdata/spelled whose blocks
// share their input with another block (two unrolled dynamo blocks, E=4
// and E=6, reading one flatten of the hidden state, summed and as two
// outputs) fuse as the manifest says, each block with its own expert count,
// and the rewritten model reproduces every ONNX Runtime golden of the
// original, through the fused nodes' kernel and through their function
// bodies.
func TestSpelledOwnership(t *testing.T) {
	var man struct {
		Cases []struct {
			spelledCase
			Expected struct {
				Verdict string          `json:"verdict"`
				Blocks  int             `json:"blocks"`
				E       json.RawMessage `json:"E"`
			} `json:"expected"`
		} `json:"cases"`
	}
	dir := spelledManifest(t, &man)
	names := []string{"pair_two_moe_sum_dynamo", "pair_two_moe_outputs_dynamo"}
	found := 0
	for _, c := range man.Cases {
		if !slices.Contains(names, c.Name) {
			continue
		}
		found++
		t.Run(c.Name, func(t *testing.T) {
			var want []int
			if err := json.Unmarshal(c.Expected.E, &want); err != nil {
				var one int
				if json.Unmarshal(c.Expected.E, &one) != nil {
					t.Fatalf("manifest E %s: %v", c.Expected.E, err)
				}
				want = []int{one}
			}
			sort.Ints(want)
			m, err := graph.Load(filepath.Join(dir, c.Name+".onnx"))
			if err != nil {
				t.Fatal(err)
			}
			defer m.Close()
			rep, err := Rewrite(m, Options{Check: true})
			if c.Expected.Verdict != "fuse" {
				t.Fatalf("manifest says %s", c.Expected.Verdict)
			}
			if err != nil {
				t.Fatal(err)
			}
			var es []int
			for _, f := range rep.Fused {
				es = append(es, f.Block.Spec.NumExperts)
			}
			sort.Ints(es)
			if len(rep.Fused) != c.Expected.Blocks || !slices.Equal(es, want) {
				t.Fatalf("fused %d blocks of E %v, manifest says %d of E %v", len(rep.Fused), es, c.Expected.Blocks, want)
			}
			spelledGoldens(t, dir, c.spelledCase, m)
		})
	}
	if found != len(names) {
		t.Fatalf("%d of the cases %v in the manifest", found, names)
	}
}

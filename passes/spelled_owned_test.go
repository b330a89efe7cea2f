package passes

import (
	"encoding/json"
	"path/filepath"
	"slices"
	"sort"
	"testing"

	"github.com/mokopt/mokopt/graph"
	"github.com/mokopt/mokopt/graph/eval"
	"github.com/mokopt/mokopt/moe"
)

// TestSpelledOwnership: the real exports of testdata/spelled whose blocks
// share their input with another block (two unrolled dynamo blocks, E=4
// and E=6, reading one flatten of the hidden state, summed and as two
// outputs), and the block whose router scores E+2 columns of which the
// last 2 are null experts, fuse as the manifest says, each block with its
// own expert count (null experts counted, as the zero experts the fused
// node holds), and the rewritten model reproduces every ONNX Runtime
// golden of the original, through the fused nodes' kernel and through
// their function bodies. The goldens' inputs route tokens to the null
// experts, so that the comparison sees their contribution.
func TestSpelledOwnership(t *testing.T) {
	var man struct {
		Cases []struct {
			spelledCase
			Expected struct {
				Verdict string          `json:"verdict"`
				Blocks  int             `json:"blocks"`
				E       json.RawMessage `json:"E"`
				Null    int             `json:"null_experts"`
			} `json:"expected"`
		} `json:"cases"`
	}
	dir := spelledManifest(t, &man)
	names := []string{"pair_two_moe_sum_dynamo", "pair_two_moe_outputs_dynamo", "router_null_experts_norm_mixtral_dynamo"}
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
				want = []int{one + c.Expected.Null}
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
				if f.Block.NullExperts != c.Expected.Null {
					t.Errorf("block %s: %d null experts, manifest says %d", f.Block.Name, f.Block.NullExperts, c.Expected.Null)
				}
			}
			if c.Expected.Null > 0 {
				nullRouted(t, filepath.Join(dir, c.Name+".onnx"), filepath.Join(dir, c.Name+"_data", "test_data_set_0"))
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

// nullRouted fails unless the block of the model at path routes some
// token of the data set's first input to a null expert.
func nullRouted(t *testing.T, path, set string) {
	t.Helper()
	m, err := graph.Load(path)
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	det, err := Detect(m)
	if err != nil || len(det.Blocks) != 1 {
		t.Fatalf("detect: %v %v", err, det)
	}
	b := det.Blocks[0]
	w, err := b.W.Materialize(m, &b.Spec)
	if err != nil {
		t.Fatal(err)
	}
	ds, err := eval.ReadDataSet(set)
	if err != nil {
		t.Fatal(err)
	}
	x := ds.Inputs[0].F32
	ids, _ := moe.Route(&b.Spec, w, x, len(x)/b.Spec.Hidden)
	real := b.Spec.NumExperts - b.NullExperts
	n := 0
	for _, tok := range ids {
		for _, e := range tok {
			if e >= real {
				n++
			}
		}
	}
	if n == 0 {
		t.Fatalf("no token of %s is routed to a null expert: the goldens do not test them", set)
	}
	t.Logf("%d of %d token slots routed to null experts", n, len(ids)*b.Spec.TopK)
}

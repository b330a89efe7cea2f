package diff

import (
	"fmt"
	"testing"
)

// TestChain checks the synthetic benchmark graph: one Add turned into a Sub
// in the middle of a long chain is one removed and one added node.
func TestChain(t *testing.T) {
	cases := []struct {
		name           string
		n, change      int
		removed, added int
	}{
		{"same", 1000, -1, 0, 0},
		{"middle", 1000, 501, 1, 1},
		{"first add", 1000, 1, 1, 1},
		{"last add", 1000, 999, 1, 1},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			r, err := Compare(chain(t, tc.n, -1), chain(t, tc.n, tc.change))
			if err != nil {
				t.Fatal(err)
			}
			if len(r.Nodes.Removed) != tc.removed || len(r.Nodes.Added) != tc.added || r.Summary.OtherChanges != tc.removed+tc.added {
				t.Errorf("%s", r.Summary.Line)
			}
			if r.Summary.NodesMatched != tc.n-tc.removed {
				t.Errorf("matched %d of %d", r.Summary.NodesMatched, tc.n)
			}
		})
	}
}

// BenchmarkCompare diffs a chain of MatMul/Add nodes (each with its own
// weight) against a copy with one node changed in the middle, at two
// sizes; ns/op should grow linearly with the size.
func BenchmarkCompare(b *testing.B) {
	for _, n := range []int{10_000, 100_000} {
		x, y := chain(b, n, -1), chain(b, n, n/2+1)
		b.Run(fmt.Sprintf("nodes=%d", n), func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				r, err := Compare(x, y)
				if err != nil {
					b.Fatal(err)
				}
				if len(r.Nodes.Removed) != 1 {
					b.Fatal(r.Summary.Line)
				}
			}
		})
	}
}

package eval

import (
	"math"
	"math/rand"
	"testing"
)

// TestGemvMultiSameBits: several vectors by one matrix, in row blocks, give
// the bits of one gemvF32 pass per vector, for row counts that do and do
// not fill the blocks and rows short and long.
func TestGemvMultiSameBits(t *testing.T) {
	r := rand.New(rand.NewSource(3))
	for _, s := range [][3]int{{1, 32, 3}, {7, 64, 2}, {65, 64, 5}, {300, 100, 4}, {9, 1000, 3}} {
		rows, K, nv := s[0], s[1], s[2]
		a := randF32(r, rows, K).F32
		bs, got, want := make([][]float32, nv), make([][]float32, nv), make([][]float32, nv)
		for v := range bs {
			bs[v] = randF32(r, K).F32
			got[v], want[v] = make([]float32, rows), make([]float32, rows)
			gemvF32(a, bs[v], want[v], K)
		}
		gemvMultiF32(a, bs, got, K)
		for v := range got {
			for i := range got[v] {
				if math.Float32bits(got[v][i]) != math.Float32bits(want[v][i]) {
					t.Fatalf("%dx%d by %d: vector %d, row %d: %v, want %v", rows, K, nv, v, i, got[v][i], want[v][i])
				}
			}
		}
	}
}

package f32

import (
	"fmt"
	"math"
	"math/rand/v2"
	"testing"
)

func randVec(r *rand.Rand, n int, scale float64) []float32 {
	v := make([]float32, n)
	for i := range v {
		v[i] = float32(r.NormFloat64() * scale * math.Pow(2, float64(r.IntN(20)-10)))
	}
	return v
}

// dotGeneric is Dot without the vector instructions.
func dotGeneric(a, b []float32) float32 {
	n32 := len(a) &^ 31
	var s float32
	if n32 > 0 {
		var lanes [8]float32
		dot32Generic(a[:n32], b[:n32], &lanes)
		s = reduce(&lanes)
	}
	for i := n32; i < len(a); i++ {
		s += float32(a[i] * b[i])
	}
	return s
}

// TestDotSameOnEveryMachine: Dot gives the bits of the documented order
// computed in Go, at every length (so the vector instructions, where they
// run, round exactly as Go does), and is close to the exact sum.
func TestDotSameOnEveryMachine(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	for n := range 300 {
		for range 5 {
			a, b := randVec(r, n, 1), randVec(r, n+3, 1) // b may be longer
			got, want := Dot(a, b), dotGeneric(a, b[:n])
			if math.Float32bits(got) != math.Float32bits(want) {
				t.Fatalf("n=%d: Dot %v, the documented order %v (AVX %v)", n, got, want, useAVX)
			}
			var exact, mag float64
			for i := range a {
				exact += float64(a[i]) * float64(b[i])
				mag += math.Abs(float64(a[i]) * float64(b[i]))
			}
			if d := math.Abs(float64(got) - exact); d > 1e-5*mag+1e-30 {
				t.Fatalf("n=%d: Dot %v, exact %v (|terms| %v)", n, got, exact, mag)
			}
		}
	}
}

// TestDotOrder pins the order itself: 2^24 in vector 0 and ones in vectors
// 2 and 3 of lane 0 give 2^24 + 2 when the ones meet first, as documented
// (one after another, each 1 would be rounded away), and the tail's -2^24
// comes last.
func TestDotOrder(t *testing.T) {
	a := make([]float32, 33)
	b := make([]float32, 33)
	for i := range b {
		b[i] = 1
	}
	a[0], a[16], a[24], a[32] = 1<<24, 1, 1, -(1 << 24)
	if got := Dot(a, b); got != 2 {
		t.Fatalf("Dot = %v, want 2 from the documented order", got)
	}
}

func BenchmarkDot(b *testing.B) {
	r := rand.New(rand.NewPCG(3, 4))
	x, y := randVec(r, 256, 1), randVec(r, 256, 1)
	b.Run("dispatch", func(b *testing.B) {
		for b.Loop() {
			Dot(x, y)
		}
	})
	b.Run("generic", func(b *testing.B) {
		for b.Loop() {
			dotGeneric(x, y)
		}
	})
}

// TestDotRows: every row's sum has the bits of the documented order
// computed in Go, added to what out held, for row lengths with and without
// a tail and below one vector loop, and row counts on both sides of the
// kernel's groups of eight rows: a kernel that mixed rows, or summed a row
// in another order, would fail.
func TestDotRows(t *testing.T) {
	r := rand.New(rand.NewPCG(5, 6))
	for _, k := range []int{1, 8, 31, 32, 33, 64, 65, 96, 100, 128, 200} {
		for _, rows := range []int{1, 2, 3, 7, 8, 9, 15, 16, 17, 255, 256, 257, 300, 600} {
			a, b := randVec(r, rows*k+5, 1), randVec(r, k+3, 1) // both may be longer
			out, base := randVec(r, rows, 1), make([]float32, rows)
			copy(base, out)
			DotRows(a, k, b, out)
			for i := range rows {
				want := base[i] + dotGeneric(a[i*k:i*k+k], b[:k])
				if math.Float32bits(out[i]) != math.Float32bits(want) {
					t.Fatalf("k=%d rows=%d row %d: %v, want %v (AVX %v)", k, rows, i, out[i], want, useAVX)
				}
			}
		}
	}
}

// TestDotRowsOrder pins each row's order and place among the rows: row i
// holds TestDotOrder's pattern in lane i mod 8 (2^24 in vector 0, ones in
// vectors 2 and 3: 2^24 + 2 only when the ones meet first) and 2i in the
// next lane (exact beside 2^24 + 2); a row with a tail ends in -2^24, and
// out[i] starts at 1, so that row i ends at 3 + 2i exactly (out added
// before the tail would round 2^24 + 3 + 2i); without a tail out[i]
// starts at -2^24 and row i ends at 2 + 2i.
func TestDotRowsOrder(t *testing.T) {
	for _, k := range []int{32, 33, 64, 96, 97} {
		for _, rows := range []int{1, 7, 8, 19} {
			a, b, out := make([]float32, rows*k), make([]float32, k), make([]float32, rows)
			for i := range b {
				b[i] = 1
			}
			for i := range rows {
				row, l := a[i*k:i*k+k], i%8
				row[l], row[16+l], row[24+l] = 1<<24, 1, 1
				row[(l+1)%8+8] = float32(2 * i)
				out[i] = -(1 << 24)
				if k%32 != 0 {
					row[k-1], out[i] = -(1 << 24), 1
				}
			}
			DotRows(a, k, b, out)
			for i, got := range out {
				want := float32(2 + 2*i)
				if k%32 != 0 {
					want++
				}
				if got != want {
					t.Fatalf("k=%d rows=%d: row %d is %v, want %v", k, rows, i, got, want)
				}
			}
		}
	}
}

// TestDotRowsGeneric: the Go twin of the kernel, which machines without
// AVX run, gives the documented order's bits too, writing or adding.
func TestDotRowsGeneric(t *testing.T) {
	r := rand.New(rand.NewPCG(9, 10))
	for _, k := range []int{32, 33, 64, 100} {
		for _, add := range []bool{false, true} {
			const rows = 9
			a, b := randVec(r, rows*k, 1), randVec(r, k, 1)
			out, base := randVec(r, rows, 1), make([]float32, rows)
			copy(base, out)
			dotRowsGeneric(&a[0], &b[0], k, k, rows, &out[0], add)
			for i := range rows {
				want := dotGeneric(a[i*k:i*k+k], b)
				if add {
					want = base[i] + want
				}
				if math.Float32bits(out[i]) != math.Float32bits(want) {
					t.Fatalf("k=%d add=%v row %d: %v, want %v", k, add, i, out[i], want)
				}
			}
		}
	}
}

func BenchmarkDotRows(b *testing.B) {
	r := rand.New(rand.NewPCG(7, 8))
	const k, rows = 64, 256
	a, x, out := randVec(r, rows*k, 1), randVec(r, k, 1), make([]float32, rows)
	b.Run("rows", func(b *testing.B) {
		for b.Loop() {
			DotRows(a, k, x, out)
		}
	})
	b.Run("dot each", func(b *testing.B) {
		for b.Loop() {
			for i := range rows {
				out[i] += Dot(a[i*k:i*k+k], x)
			}
		}
	})
}

// BenchmarkDotRowsShapes times DotRows on the shapes it serves: the
// reference experts' gate/up (k=64) and down (k=128) rows, a row length
// with a tail, and more rows than one call of the old buffer.
func BenchmarkDotRowsShapes(b *testing.B) {
	for _, tc := range []struct{ k, rows int }{{64, 256}, {128, 64}, {64, 128}, {128, 512}, {100, 256}, {32, 7}} {
		r := rand.New(rand.NewPCG(7, 8))
		a, x, out := randVec(r, tc.rows*tc.k, 1), randVec(r, tc.k, 1), make([]float32, tc.rows)
		b.Run(fmt.Sprintf("k=%d/rows=%d", tc.k, tc.rows), func(b *testing.B) {
			for b.Loop() {
				DotRows(a, tc.k, x, out)
			}
		})
	}
}

// BenchmarkDotRowsCold is BenchmarkDotRowsShapes with the rows out of
// cache: each call takes the next of 64 MiB of matrices, as the reference
// experts walk a stack's weights.
func BenchmarkDotRowsCold(b *testing.B) {
	for _, tc := range []struct{ k, rows int }{{64, 128}, {128, 64}} {
		r := rand.New(rand.NewPCG(7, 8))
		n := 64 << 20 / 4 / (tc.k * tc.rows)
		a, x, out := randVec(r, n*tc.rows*tc.k, 1), randVec(r, tc.k, 1), make([]float32, tc.rows)
		b.Run(fmt.Sprintf("k=%d/rows=%d", tc.k, tc.rows), func(b *testing.B) {
			e := 0
			for b.Loop() {
				DotRows(a[e*tc.rows*tc.k:(e+1)*tc.rows*tc.k], tc.k, x, out)
				e = (e + 1) % n
			}
		})
	}
}

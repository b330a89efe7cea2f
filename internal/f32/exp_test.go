package f32

import (
	"math"
	"math/rand/v2"
	"testing"
)

// ulps returns how many float32 values lie between got and want (0 when
// equal), treating both as finite.
func ulps(got, want float32) int64 {
	ord := func(f float32) int64 {
		b := int64(math.Float32bits(f))
		if b&(1<<31) != 0 {
			return -(b &^ (1 << 31))
		}
		return b
	}
	d := ord(got) - ord(want)
	if d < 0 {
		return -d
	}
	return d
}

// TestExp compares Exp with math.Exp rounded to float32 on every 251st
// float32 value of the range where the result is neither 0 nor +Inf, and
// on the edges: at most 2 ulps apart, and exact special values.
func TestExp(t *testing.T) {
	var worst int64
	var at float32
	check := func(x float32) {
		want := float32(math.Exp(float64(x)))
		got := Exp(x)
		if d := ulps(got, want); d > worst {
			worst, at = d, x
		}
	}
	// Every float32 bit pattern, stepping by a prime, both signs.
	for b := uint32(0); b < 0x7f800000; b += 251 {
		check(math.Float32frombits(b))
		check(-math.Float32frombits(b))
	}
	for _, x := range []float32{0, 1, -1, 88.72283, 88.7228, -87.33654, -87.3366, -100, -103.9, -103.97207, 1e-8, -1e-8} {
		check(x)
	}
	if worst > 2 {
		t.Fatalf("Exp(%g) = %g is %d ulps from %g", at, Exp(at), worst, float32(math.Exp(float64(at))))
	}
	t.Logf("largest error: %d ulps, at %g", worst, at)
	for _, tc := range []struct{ x, want float32 }{
		{float32(math.Inf(1)), float32(math.Inf(1))},
		{float32(math.Inf(-1)), 0},
		{89, float32(math.Inf(1))},
		{-104, 0},
		{0, 1},
	} {
		if got := Exp(tc.x); got != tc.want {
			t.Errorf("Exp(%g) = %g, want %g", tc.x, got, tc.want)
		}
	}
	if nan := Exp(float32(math.NaN())); nan == nan {
		t.Errorf("Exp(NaN) = %g", nan)
	}
}

// TestSigmoid compares Sigmoid with the float64 logistic rounded to
// float32: at most 2 ulps apart, and 0, 1/2 and 1 at the ends and middle.
func TestSigmoid(t *testing.T) {
	var worst int64
	for b := uint32(0); b < 0x7f800000; b += 251 {
		for _, x := range []float32{math.Float32frombits(b), -math.Float32frombits(b)} {
			want := float32(1 / (1 + math.Exp(-float64(x))))
			if d := ulps(Sigmoid(x), want); d > worst {
				worst = d
				if d > 2 {
					t.Fatalf("Sigmoid(%g) = %g, want %g (%d ulps)", x, Sigmoid(x), want, d)
				}
			}
		}
	}
	for _, tc := range []struct{ x, want float32 }{{0, 0.5}, {200, 1}, {-200, 0}, {float32(math.Inf(1)), 1}, {float32(math.Inf(-1)), 0}} {
		if got := Sigmoid(tc.x); got != tc.want {
			t.Errorf("Sigmoid(%g) = %g, want %g", tc.x, got, tc.want)
		}
	}
}

func BenchmarkExp(b *testing.B) {
	xs := make([]float32, 1024)
	for i := range xs {
		xs[i] = float32(i)/64 - 8
	}
	var s float32
	b.Run("f32.Exp", func(b *testing.B) {
		for range b.N {
			for _, x := range xs {
				s += Exp(x)
			}
		}
	})
	b.Run("math.Exp", func(b *testing.B) {
		for range b.N {
			for _, x := range xs {
				s += float32(math.Exp(float64(x)))
			}
		}
	})
	_ = s
}

// TestSigmoidSlice: SigmoidSlice (eight at a time in AVX2 where the CPU has
// it) equals Sigmoid element by element, bit for bit, on inputs that mix
// ordinary values with the special cases the vector loop hands back (large
// magnitudes, infinities, NaN, zeros of both signs), at lengths around the
// vector width.
func TestSigmoidSlice(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	specials := []float32{0, float32(math.Copysign(0, -1)), 87, -87, 87.5, -87.5, 100, -100, 1e30, -1e30,
		float32(math.Inf(1)), float32(math.Inf(-1)), float32(math.NaN()), math.SmallestNonzeroFloat32, 1e-30}
	for _, n := range []int{0, 1, 7, 8, 9, 15, 16, 17, 64, 1000, 4099} {
		for _, withSpecials := range []bool{false, true} {
			src := make([]float32, n)
			for i := range src {
				src[i] = float32(rng.NormFloat64() * 8)
				if withSpecials && rng.IntN(13) == 0 {
					src[i] = specials[rng.IntN(len(specials))]
				}
			}
			dst := make([]float32, n)
			SigmoidSlice(dst, src)
			for i, x := range src {
				if want := Sigmoid(x); math.Float32bits(dst[i]) != math.Float32bits(want) {
					t.Fatalf("n %d: SigmoidSlice at %d (x = %g) gave %g, Sigmoid gives %g", n, i, x, dst[i], want)
				}
			}
		}
	}
	// Every float32 of magnitude up to 90 in steps, through the vector loop.
	var src []float32
	for b := uint32(0); b < 0x42b40000; b += 997 {
		src = append(src, math.Float32frombits(b), -math.Float32frombits(b))
	}
	dst := make([]float32, len(src))
	SigmoidSlice(dst, src)
	for i, x := range src {
		if want := Sigmoid(x); math.Float32bits(dst[i]) != math.Float32bits(want) {
			t.Fatalf("SigmoidSlice(%g) = %g, Sigmoid gives %g", x, dst[i], want)
		}
	}
}

func BenchmarkSigmoid(b *testing.B) {
	src := make([]float32, 4096)
	for i := range src {
		src[i] = float32(i)/256 - 8
	}
	dst := make([]float32, len(src))
	b.Run("SigmoidSlice", func(b *testing.B) {
		for range b.N {
			SigmoidSlice(dst, src)
		}
	})
	b.Run("Sigmoid", func(b *testing.B) {
		for range b.N {
			for i, x := range src {
				dst[i] = Sigmoid(x)
			}
		}
	})
	b.Run("math.Exp", func(b *testing.B) {
		for range b.N {
			for i, x := range src {
				dst[i] = float32(1 / (1 + math.Exp(-float64(x))))
			}
		}
	})
}

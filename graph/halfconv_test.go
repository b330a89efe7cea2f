package graph

import (
	"math"
	"math/rand/v2"
	"sort"
	"testing"
)

// The conversions are checked against values built from the IEEE 754
// definitions in float64 (exact for every binary16, bfloat16 and float32
// value), independently of the bit manipulations under test.

// halfValue is the value of binary16 bits from the definition: subnormals
// man·2⁻²⁴, normals (1024+man)·2^(exp−25).
func halfValue(h uint16) float64 {
	sign := 1.0
	if h&0x8000 != 0 {
		sign = -1
	}
	exp, man := int(h>>10)&0x1f, int(h&0x3ff)
	switch {
	case exp == 0x1f && man == 0:
		return math.Inf(int(sign))
	case exp == 0x1f:
		return math.NaN()
	case exp == 0:
		return sign * math.Ldexp(float64(man), -24)
	}
	return sign * math.Ldexp(float64(1024+man), exp-25)
}

// bf16Value is the value of bfloat16 bits: the float32 with those bits
// on top, from the definition (sign, 8-bit exponent, 7-bit mantissa).
func bf16Value(b uint16) float64 {
	sign := 1.0
	if b&0x8000 != 0 {
		sign = -1
	}
	exp, man := int(b>>7)&0xff, int(b&0x7f)
	switch {
	case exp == 0xff && man == 0:
		return math.Inf(int(sign))
	case exp == 0xff:
		return math.NaN()
	case exp == 0:
		return sign * math.Ldexp(float64(man), -133)
	}
	return sign * math.Ldexp(float64(128+man), exp-134)
}

// nearestEven rounds x (finite, >= 0) to the table of non-negative finite
// values vals (ascending, bits[i] the encoding of vals[i], even bits = even
// mantissa), nearest with ties to the even encoding; beyond the largest
// value it rounds against next, the first value past the range (2^16 for
// binary16), and returns inf when that is nearer or a tie (its encoding is
// even).
func nearestEven(x float64, vals []float64, bits []uint16, next float64, inf uint16) uint16 {
	i := sort.SearchFloat64s(vals, x)
	if i < len(vals) && vals[i] == x {
		return bits[i]
	}
	if i == len(vals) {
		lo := vals[len(vals)-1]
		if x-lo < next-x {
			return bits[len(vals)-1]
		}
		return inf
	}
	lo, hi := vals[i-1], vals[i]
	switch dl, dh := x-lo, hi-x; {
	case dl < dh:
		return bits[i-1]
	case dh < dl:
		return bits[i]
	case bits[i-1]&1 == 0:
		return bits[i-1]
	}
	return bits[i]
}

// table lists the non-negative finite values of a 16-bit format, ascending.
func table(value func(uint16) float64, maxFinite uint16) ([]float64, []uint16) {
	var vals []float64
	var bits []uint16
	for b := uint16(0); b <= maxFinite; b++ {
		vals, bits = append(vals, value(b)), append(bits, b)
	}
	return vals, bits
}

// probes returns float32 values around every value of a 16-bit format: the
// value, the exact midpoint to the next (a tie), and the float32 neighbours
// of both, with both signs; plus random float32 bit patterns.
func probes(vals []float64, n int) []float32 {
	var out []float32
	add := func(f float32) {
		out = append(out, f, -f, math.Nextafter32(f, float32(math.Inf(1))), math.Nextafter32(f, 0))
	}
	for i, v := range vals {
		add(float32(v))
		if i+1 < len(vals) {
			add(float32((v + vals[i+1]) / 2)) // exact in float32: 12 or 9 significant bits
		}
	}
	r := rand.New(rand.NewPCG(1, 2))
	for range n {
		out = append(out, math.Float32frombits(r.Uint32()))
	}
	return append(out, 0, float32(math.Copysign(0, -1)), float32(math.Inf(1)), float32(math.Inf(-1)),
		math.MaxFloat32, math.SmallestNonzeroFloat32, 65504, 65519.996, 65520, 65536, 1e10)
}

func TestHalfToFloat32(t *testing.T) {
	for h := 0; h < 1<<16; h++ {
		got, want := float64(HalfToFloat32(uint16(h))), halfValue(uint16(h))
		if math.IsNaN(want) {
			if !math.IsNaN(got) {
				t.Fatalf("%#04x: %v, want NaN", h, got)
			}
			continue
		}
		if got != want || math.Signbit(got) != math.Signbit(want) {
			t.Fatalf("%#04x: %v, want %v", h, got, want)
		}
	}
}

func TestFloat32ToHalf(t *testing.T) {
	vals, bits := table(halfValue, 0x7bff)
	for _, f := range probes(vals, 1<<20) {
		got := Float32ToHalf(f)
		x := float64(f)
		if math.IsNaN(x) {
			if got&0x7c00 != 0x7c00 || got&0x3ff == 0 {
				t.Fatalf("%v (%#08x): %#04x, want a NaN", f, math.Float32bits(f), got)
			}
			continue
		}
		want := uint16(0x7c00)
		if !math.IsInf(x, 0) {
			want = nearestEven(math.Abs(x), vals, bits, 65536, 0x7c00)
		}
		if math.Signbit(x) {
			want |= 0x8000
		}
		if got != want {
			t.Fatalf("%v (%#08x): %#04x (%v), want %#04x (%v)", f, math.Float32bits(f), got, halfValue(got), want, halfValue(want))
		}
	}
}

func TestBFloat16ToFloat32(t *testing.T) {
	for b := 0; b < 1<<16; b++ {
		got, want := float64(BFloat16ToFloat32(uint16(b))), bf16Value(uint16(b))
		if math.IsNaN(want) != math.IsNaN(got) || !math.IsNaN(want) && (got != want || math.Signbit(got) != math.Signbit(want)) {
			t.Fatalf("%#04x: %v, want %v", b, got, want)
		}
	}
}

func TestFloat32ToBFloat16(t *testing.T) {
	vals, bits := table(bf16Value, 0x7f7f)
	for _, f := range probes(vals, 1<<20) {
		got := Float32ToBFloat16(f)
		x := float64(f)
		if math.IsNaN(x) {
			if got&0x7f80 != 0x7f80 || got&0x7f == 0 {
				t.Fatalf("%#08x: %#04x, want a NaN", math.Float32bits(f), got)
			}
			continue
		}
		want := uint16(0x7f80)
		if !math.IsInf(x, 0) {
			want = nearestEven(math.Abs(x), vals, bits, math.Ldexp(1, 128), 0x7f80)
		}
		if math.Signbit(x) {
			want |= 0x8000
		}
		if got != want {
			t.Fatalf("%v (%#08x): %#04x (%v), want %#04x (%v)", f, math.Float32bits(f), got, bf16Value(got), want, bf16Value(want))
		}
	}
}

// TestHalfRoundTrip: every one of the 65,536 binary16 and bfloat16 bit
// patterns goes to float32 and back unchanged, except NaNs, which stay
// NaN with their sign (the payload is not kept); float32 NaNs of every
// payload class (quiet, signalling, payload only in the low bits that a
// truncation would drop) become NaN, never Inf.
func TestHalfRoundTrip(t *testing.T) {
	isNaN16 := func(b uint16, expMask, manMask uint16) bool { return b&expMask == expMask && b&manMask != 0 }
	for _, tc := range []struct {
		name             string
		to               func(uint16) float32
		from             func(float32) uint16
		expMask, manMask uint16
	}{
		{"float16", HalfToFloat32, Float32ToHalf, 0x7c00, 0x3ff},
		{"bfloat16", BFloat16ToFloat32, Float32ToBFloat16, 0x7f80, 0x7f},
	} {
		for b := 0; b < 1<<16; b++ {
			h := uint16(b)
			got := tc.from(tc.to(h))
			if isNaN16(h, tc.expMask, tc.manMask) {
				if !isNaN16(got, tc.expMask, tc.manMask) || got&0x8000 != h&0x8000 {
					t.Fatalf("%s NaN %#04x -> %#04x", tc.name, h, got)
				}
				continue
			}
			if got != h {
				t.Fatalf("%s %#04x -> %v -> %#04x", tc.name, h, tc.to(h), got)
			}
		}
		for _, u := range []uint32{0x7fc00000, 0x7f800001, 0x7f800fff, 0x7fa00000, 0xffc00001, 0xff800001, 0x7fffffff} {
			if got := tc.from(math.Float32frombits(u)); !isNaN16(got, tc.expMask, tc.manMask) || (got&0x8000 != 0) != (u>>31 == 1) {
				t.Errorf("%s of the NaN %#08x: %#04x", tc.name, u, got)
			}
		}
	}
}

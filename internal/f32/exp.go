package f32

import "math"

// Exp returns e^x in float32, within 2 units in the last place of the
// correctly rounded result over the whole float32 range (subnormal results
// included), in about a fifth of the time of math.Exp: the argument is
// reduced to x = n ln 2 + r with |r| <= ln 2 / 2 (ln 2 split in two parts so
// that n ln 2 is exact), e^r is a degree-7 polynomial (Cephes' expf), and
// the result is scaled by 2^n. Every operation rounds to float32 on its
// own (no fused multiply-add), so the result is the same on every machine.
// Exp(NaN) is NaN, Exp(+Inf) is +Inf, Exp(-Inf) is 0.
func Exp(x float32) float32 {
	switch {
	case x != x:
		return x
	case x > expOverflow:
		return float32(math.Inf(1))
	case x < expUnderflow:
		return 0
	}
	t := float32(x*log2E) + 0.5
	k := int32(t) // toward zero: one less for negative non-integers
	if float32(k) > t {
		k--
	}
	n := float32(k)
	r := x - float32(n*ln2Hi)
	r -= float32(n * ln2Lo)
	p := float32(expP0*r) + expP1
	p = float32(p*r) + expP2
	p = float32(p*r) + expP3
	p = float32(p*r) + expP4
	p = float32(p*r) + expP5
	y := float32(float32(p*float32(r*r))+r) + 1
	switch {
	case k > 127: // y * 2^128 without an infinite power of two
		return y * 2 * pow2(127)
	case k < -126: // a subnormal result: scale in two steps
		return y * pow2(k+64) * pow2(-64)
	}
	return y * pow2(k)
}

// Sigmoid returns 1 / (1 + e^-x) in float32, computed from Exp without
// overflow for either sign of x.
func Sigmoid(x float32) float32 {
	if x >= 0 {
		return 1 / (1 + Exp(-x))
	}
	e := Exp(x)
	return e / (1 + e)
}

// pow2 returns 2^k for -126 <= k <= 127.
func pow2(k int32) float32 { return math.Float32frombits(uint32(k+127) << 23) }

const (
	expOverflow  = 88.72283905206835 // above: e^x exceeds the largest float32
	expUnderflow = -103.97207708     // below: e^x rounds to 0
	log2E        = 1.44269504088896341
	ln2Hi        = 0.693359375 // ln 2 = ln2Hi + ln2Lo; n*ln2Hi is exact
	ln2Lo        = -2.12194440e-4
	expP0        = 1.9875691500e-4
	expP1        = 1.3981999507e-3
	expP2        = 8.3334519073e-3
	expP3        = 4.1665795894e-2
	expP4        = 1.6666665459e-1
	expP5        = 5.0000001201e-1
)

// SigmoidSlice sets dst[i] = Sigmoid(src[i]) for every i < len(src) (dst
// must be as long), bit for bit, eight elements at a time where the CPU has
// AVX2.
func SigmoidSlice(dst, src []float32) {
	dst = dst[:len(src)]
	for i := 0; i < len(src); {
		i += sigmoidVec(dst[i:], src[i:])
		// an element the vector loop leaves, or the tail: eight (or what
		// is left) one at a time
		for end := min(i+8, len(src)); i < end; i++ {
			dst[i] = Sigmoid(src[i])
		}
	}
}

// asmChunk is the most floats one call of the assembly kernels works
// through (tens of microseconds), so that the goroutine running them can be
// preempted between calls.
const asmChunk = 1 << 14

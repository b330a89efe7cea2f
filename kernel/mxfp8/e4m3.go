package mxfp8

import "math"

// MaxE4M3 is the largest finite magnitude of FP8 E4M3 (float8_e4m3fn): 1.75·2^8.
const MaxE4M3 float32 = 448

// E4M3NaN is the code Encode gives for a NaN input. float8_e4m3fn has no
// infinities; codes 0x7F and 0xFF are its only NaNs.
const E4M3NaN uint8 = 0x7F

// e4m3MaxCode is the code of +448 (exponent 15, mantissa 6).
const e4m3MaxCode = 0x7E

var decodeTable = buildDecodeTable()

func buildDecodeTable() [256]float32 {
	var t [256]float32
	for c := 0; c < 256; c++ {
		exp := (c >> 3) & 0xF
		man := c & 7
		var v float64
		switch {
		case c&0x7F == 0x7F:
			t[c] = float32(math.NaN())
			continue
		case exp == 0:
			v = math.Ldexp(float64(man), -9)
		default:
			v = math.Ldexp(float64(8+man), exp-10)
		}
		if c&0x80 != 0 {
			v = -v
		}
		t[c] = float32(v)
	}
	return t
}

// DecodeE4M3 returns the float32 value of the E4M3 code c. Every finite code is
// exact in float32; 0x7F and 0xFF decode to NaN; 0x80 decodes to −0.
func DecodeE4M3(c uint8) float32 { return decodeTable[c] }

// DecodeTable returns the 256-entry E4M3 decode table (a copy).
func DecodeTable() [256]float32 { return decodeTable }

// EncodeE4M3 rounds x to the nearest E4M3 value, ties to even, and saturates
// magnitudes above 448 (including ±Inf) to ±448. NaN encodes as E4M3NaN (0x7F)
// whatever its sign. The sign of zero is kept (−0 and negative values that round
// to zero encode as 0x80), as in PyTorch's float8_e4m3fn cast. The arithmetic is
// done on the float32 bit pattern, so it does not depend on the FPU's rounding.
func EncodeE4M3(x float32) uint8 {
	b := math.Float32bits(x)
	sign := uint8(b>>24) & 0x80
	a := b & 0x7FFFFFFF
	switch {
	case a > 0x7F800000: // NaN
		return E4M3NaN
	case a >= 0x43E00000: // |x| >= 448, Inf included: saturate
		return sign | e4m3MaxCode
	case a >= 0x3C800000: // |x| >= 2^-6: E4M3 normal range
		// Rebias the exponent (127 -> 7) and round 23 mantissa bits to 3, ties to
		// even; a carry out of the mantissa correctly bumps the exponent.
		r := a - 120<<23
		r += 0x7FFFF + (r>>20)&1
		r >>= 20
		if r > e4m3MaxCode {
			r = e4m3MaxCode
		}
		return sign | uint8(r)
	default: // E4M3 subnormal range: multiples of 2^-9
		exp := a >> 23
		if exp < 117 { // |x| < 2^-10: rounds to zero (float32 subnormals included)
			return sign
		}
		m := a&0x7FFFFF | 0x800000
		shift := 141 - exp // value in units of 2^-9 is m / 2^shift; 21 <= shift <= 24
		q := m >> shift
		rem := m & (1<<shift - 1)
		half := uint32(1) << (shift - 1)
		if rem > half || (rem == half && q&1 == 1) {
			q++ // q may reach 8, which is exactly the code of 2^-6
		}
		return sign | uint8(q)
	}
}

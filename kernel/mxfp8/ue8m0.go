package mxfp8

import "math"

// BlockSize is the number of consecutive elements along the contraction (K) axis
// that share one UE8M0 scale.
const BlockSize = 32

// ScaleBias is the UE8M0 exponent bias: a scale byte b means 2^(b−127).
const ScaleBias = 127

// ScaleNaN is the UE8M0 byte reserved for NaN.
const ScaleNaN uint8 = 0xFF

// ScaleFloor is the lower bound applied to amax/448 before rounding up to a power
// of two (the doc's max(amax/448, 1e-12)); it makes the smallest scale 2^−39.
const ScaleFloor float32 = 1e-12

// MinScaleExponent is the clamp of the rule: e = max(e, −127), so byte 0 means 2^−127.
const MinScaleExponent = -127

var scaleTable, reciprocalTable = buildScaleTables()

// pow2f32 returns 2^k as float32 for −149 ≤ k ≤ 127 (exact, subnormals included).
func pow2f32(k int) float32 {
	if k >= -126 {
		return math.Float32frombits(uint32(k+127) << 23)
	}
	return math.Float32frombits(uint32(1) << uint(k+149))
}

func buildScaleTables() (s, r [256]float32) {
	for b := 0; b < 255; b++ {
		s[b] = pow2f32(b - ScaleBias)
		r[b] = pow2f32(ScaleBias - b)
	}
	s[255] = float32(math.NaN())
	r[255] = float32(math.NaN())
	return s, r
}

// ScaleExponent returns the block exponent e for a block whose largest magnitude
// is amax (its sign is ignored): s = max(|amax|/448, 1e-12) in float32, rounded up
// to a power of two with the bit rule "exponent field, plus one if any mantissa bit
// is set", then clamped to ≥ −127. amax must be finite; see ScaleByte for NaN/Inf.
func ScaleExponent(amax float32) int {
	s := math.Float32frombits(math.Float32bits(amax)&0x7FFFFFFF) / MaxE4M3
	if s < ScaleFloor {
		s = ScaleFloor
	}
	b := math.Float32bits(s)
	e := int(b>>23&0xFF) - 127
	if b&0x7FFFFF != 0 {
		e++
	}
	if e < MinScaleExponent {
		e = MinScaleExponent
	}
	return e
}

// ScaleByte returns the UE8M0 scale byte e+127 for a block with largest magnitude
// amax. A NaN or infinite amax gives ScaleNaN (0xFF).
func ScaleByte(amax float32) uint8 {
	if a := math.Float32bits(amax) & 0x7FFFFFFF; a >= 0x7F800000 {
		return ScaleNaN
	}
	return uint8(ScaleExponent(amax) + ScaleBias)
}

// ScaleValue returns the scale a UE8M0 byte stands for, 2^(b−127), exactly as
// float32 (byte 0 is the subnormal 2^−127); byte 0xFF gives NaN.
func ScaleValue(b uint8) float32 { return scaleTable[b] }

// ScaleReciprocal returns the exact reciprocal of a UE8M0 scale, 2^(127−b), as
// float32 (byte 254 is the subnormal 2^−127); byte 0xFF gives NaN.
func ScaleReciprocal(b uint8) float32 { return reciprocalTable[b] }

// ReciprocalTable returns the 256-entry table of ScaleReciprocal (a copy).
func ReciprocalTable() [256]float32 { return reciprocalTable }

// ScaleTable returns the 256-entry table of ScaleValue (a copy).
func ScaleTable() [256]float32 { return scaleTable }

package mxfp8

import "math"

// QuantizeBlock quantizes src (normally BlockSize elements) with one shared scale:
// it writes the E4M3 codes to dst and returns the UE8M0 scale byte. dst must be at
// least as long as src. QuantizeBlock does not refuse NaN or Inf, which the tensor
// functions refuse before getting here: NaN elements are ignored by amax and encode
// as 0x7F; an infinite element makes the scale ScaleNaN (0xFF) and every code 0x7F.
func QuantizeBlock(dst []uint8, src []float32) uint8 {
	dst = dst[:len(src)]
	var maxBits uint32
	for _, v := range src {
		a := math.Float32bits(v) & 0x7FFFFFFF
		if a > maxBits && a <= 0x7F800000 {
			maxBits = a
		}
	}
	if maxBits == 0x7F800000 {
		for i := range dst {
			dst[i] = E4M3NaN
		}
		return ScaleNaN
	}
	b := uint8(ScaleExponent(math.Float32frombits(maxBits)) + ScaleBias)
	encodeScaled(dst, src, int(b)-ScaleBias)
	return b
}

// encodeScaled writes EncodeE4M3(src[i]·2^-e) to dst[i] for finite src, where e is
// a block exponent as ScaleExponent gives it (−39 ≤ e ≤ 120, thanks to the 1e-12
// floor), so that |src[i]|·2^-e ≤ 448 up to float32 rounding.
//
// It is EncodeE4M3 specialised for that case and written without branches, so
// that the compiler can use conditional moves: y = x·2^-e is exact in float32
// (a power-of-two scaling; where it underflows, y is below 2^-126 and encodes as a
// signed zero either way); the normal-range code is formed by rebiasing y's bits
// and rounding the mantissa to nearest even in integer arithmetic, the
// subnormal-range code by adding 2^14 (whose float32 ulp is 2^-9, the E4M3
// subnormal step) so that the FPU's own round-to-nearest-even does the work;
// then one of the two is selected and clamped to the saturation code 0x7E.
func encodeScaled(dst []uint8, src []float32, e int) {
	dst = dst[:len(src)]
	recip := reciprocalTable[uint8(e+ScaleBias)]
	const magic = float32(1 << 14)
	magicBits := math.Float32bits(magic)
	for i, v := range src {
		y := float32(v * recip) // explicit conversion: no fusion with the add below
		b := math.Float32bits(y)
		a := b & 0x7FFFFFFF
		rn := a - 120<<23
		rn += 0x7FFFF + (rn>>20)&1
		rn >>= 20
		rs := math.Float32bits(math.Float32frombits(a)+magic) - magicBits
		r := rn
		if a < 0x3C800000 { // |y| < 2^-6: E4M3 subnormal range
			r = rs
		}
		if r > e4m3MaxCode {
			r = e4m3MaxCode
		}
		dst[i] = uint8(b>>24)&0x80 | uint8(r)
	}
}

// DequantizeBlock writes DecodeE4M3(src[i])·2^(scale−127) to dst[i]. The product
// is exact in float32 except that it can overflow to ±Inf for blocks quantized
// from values within a rounding step of the float32 maximum.
func DequantizeBlock(dst []float32, src []uint8, scale uint8) {
	dst = dst[:len(src)]
	s := scaleTable[scale]
	for i, c := range src {
		dst[i] = decodeTable[c] * s
	}
}

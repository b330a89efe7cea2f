// Package mxfp8 is the MXFP8 codec of the Mixture-of-Kittens (MoK) MoE megakernel:
// FP8 E4M3 elements, UE8M0 block scales over 1×32 blocks along the contraction
// axis, and the Blackwell tcgen05 "scale factor 1x" layout the kernel reads.
//
// The numerics follow MoK's MXFP8 rule (docs/kernel.md in the repository, "MXFP8
// as MoK does it"; the element and scale formats are those of the OCP Microscaling
// Formats (MX) specification v1.0):
//
//	amax = max |x|                         over a 1×32 block along K (float32)
//	s    = max(amax / 448, 1e-12)          float32 division, float32 floor
//	e    = ceil(log2 s), clamped to ≥ −127 float32 bit rule: exponent field of s,
//	                                       plus one when its mantissa bits are non-zero
//	byte = e + 127                         (0xFF is reserved for NaN)
//	q    = RNE(x · 2^−e), saturated to ±448 as E4M3 (float8_e4m3fn)
//
// Consequences worth knowing: because of the 1e-12 floor, e is never below −39, so
// an all-zero block gets scale byte 88 (2^−39), not byte 0; and for finite input e
// is at most 120 (float32 max / 448 ≈ 2^119.2), so bytes 88..247 are the only ones
// Quantize writes. The −127 clamp of the rule is therefore never active with the
// floor in place; it is implemented anyway. Computing s as amax·float32(1/448)
// instead of amax/448 gives the same e for every finite float32 amax (checked
// exhaustively over all 2^31 non-negative finite float32 values while writing this
// package), so the choice between the two is immaterial.
//
// The golden vectors in testdata/golden.json come from an independent
// implementation (PyTorch's float8_e4m3fn cast, see testdata/gen_golden.py) and are
// compared bit for bit by the tests.
package mxfp8

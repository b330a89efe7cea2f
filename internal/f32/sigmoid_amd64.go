package f32

import "golang.org/x/sys/cpu"

// useAVX2 says whether the CPU and the operating system support AVX2.
var useAVX2 = cpu.X86.HasAVX2

// sigmoidVec writes Sigmoid(src[i]) to dst[i] for a leading run of src in
// AVX2 instructions where the CPU has them, and returns its length (a
// multiple of 8, 0 without AVX2): it stops before the first eight elements
// holding one that Exp's special cases handle (|x| > 87, NaN).
func sigmoidVec(dst, src []float32) int {
	if !useAVX2 || len(src) < 8 {
		return 0
	}
	return sigmoidAsm(&dst[0], &src[0], len(src))
}

//go:noescape
func sigmoidAsm(dst, src *float32, n int) int

package f32

import "golang.org/x/sys/cpu"

// useAVX says whether the CPU and the operating system support AVX.
var useAVX = cpu.X86.HasAVX

// dot32AVX is dot32Generic in AVX instructions (multiply, then add: no
// fused multiply-add, so that each product is rounded as in Go); n is a
// positive multiple of 32.
//
//go:noescape
func dot32AVX(a, b *float32, n int, lanes *[8]float32)

// dotRowsAVX writes to sums[r], for rows rows of a stride floats apart,
// the reduced sum of dot32AVX over the row's first n floats with b (n a
// positive multiple of 32, rows > 0), reduced as reduce does.
//
//go:noescape
func dotRowsAVX(a, b *float32, n, stride, rows int, sums *float32)

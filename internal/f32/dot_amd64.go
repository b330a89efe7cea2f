package f32

import "golang.org/x/sys/cpu"

// useAVX says whether the CPU and the operating system support AVX.
var useAVX = cpu.X86.HasAVX

// dotRows writes to sums[r], for rows rows of a stride floats apart,
// the sum of dot32Generic over the row's first n floats with b (n a
// positive multiple of 32, rows > 0), reduced as reduce does: in AVX
// instructions where the CPU has them (multiply, then add: no fused
// multiply-add, so that each product is rounded as in Go).
func dotRows(a, b *float32, n, stride, rows int, sums *float32) {
	if !useAVX {
		dotRowsGeneric(a, b, n, stride, rows, sums)
		return
	}
	dotRowsAsm(a, b, n, stride, rows, sums)
}

//go:noescape
func dotRowsAsm(a, b *float32, n, stride, rows int, sums *float32)

package f32

import (
	"unsafe"

	"golang.org/x/sys/cpu"
)

// useAVX says whether the CPU and the operating system support AVX.
var useAVX = cpu.X86.HasAVX

// dotRows writes to sums[r] (adds to it, sums[r] + s, when add is set),
// for rows rows of a stride floats apart, the dot product s of the row's
// first n floats with b (n >= 32, rows > 0) in the documented order: the
// sum of dot32Generic over the leading multiple of 32, reduced as reduce
// does, then the rest one element after another. In AVX instructions where
// the CPU has them (multiply, then add: no fused multiply-add, so that
// each product is rounded as in Go).
//
// The assembly runs over about asmChunk floats of a per call (whole rows):
// the runtime cannot preempt a goroutine inside it (see sigmoidVec).
func dotRows(a, b *float32, n, stride, rows int, sums *float32, add bool) {
	if !useAVX {
		dotRowsGeneric(a, b, n, stride, rows, sums, add)
		return
	}
	per := max(1, asmChunk/stride)
	av, sv := unsafe.Slice(a, (rows-1)*stride+n), unsafe.Slice(sums, rows)
	for r := 0; r < rows; r += per {
		k := min(per, rows-r)
		dotRowsChunk(&av[r*stride], b, n, stride, k, &sv[r], add)
	}
}

// dotRowsChunk calls dotRowsAsm from a function of its own, where a
// goroutine asked to stop stops (see sigmoidChunk).
//
//go:noinline
func dotRowsChunk(a, b *float32, n, stride, rows int, sums *float32, add bool) {
	dotRowsAsm(a, b, n, stride, rows, sums, add)
}

//go:noescape
func dotRowsAsm(a, b *float32, n, stride, rows int, sums *float32, add bool)

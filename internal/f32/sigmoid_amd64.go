package f32

import "golang.org/x/sys/cpu"

// useAVX2 says whether the CPU and the operating system support AVX2.
var useAVX2 = cpu.X86.HasAVX2

// sigmoidVec writes Sigmoid(src[i]) to dst[i] for a leading run of src in
// AVX2 instructions where the CPU has them, and returns its length (a
// multiple of 8, 0 without AVX2): it stops before the first eight elements
// holding one that Exp's special cases handle (|x| > 87, NaN).
//
// The assembly runs over at most asmChunk elements per call: the runtime
// cannot preempt a goroutine inside it, and a collection waiting to stop a
// goroutine in a long call resends it signals until the call returns
// (hundreds of milliseconds of system time on a large check).
func sigmoidVec(dst, src []float32) int {
	if !useAVX2 || len(src) < 8 {
		return 0
	}
	done := 0
	for done < len(src) {
		n := min(len(src)-done, asmChunk)
		k := sigmoidChunk(&dst[done], &src[done], n)
		done += k
		if k < n&^7 || n < asmChunk {
			return done // stopped at a special case, or reached the end
		}
	}
	return done
}

// sigmoidChunk calls sigmoidAsm from a function of its own, whose entry
// is where a goroutine asked to stop (for a collection) stops: the
// assembly has no such point.
//
//go:noinline
func sigmoidChunk(dst, src *float32, n int) int { return sigmoidAsm(dst, src, n) }

//go:noescape
func sigmoidAsm(dst, src *float32, n int) int

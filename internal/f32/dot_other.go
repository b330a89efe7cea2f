//go:build !amd64

package f32

import "unsafe"

const useAVX = false

func dot32AVX(a, b *float32, n int, lanes *[8]float32) {
	dot32Generic(unsafe.Slice(a, n), unsafe.Slice(b, n), lanes)
}

func dotRowsAVX(a, b *float32, n, stride, rows int, sums *float32) {
	out := unsafe.Slice(sums, rows)
	for r := range rows {
		var lanes [8]float32
		dot32AVX((*float32)(unsafe.Add(unsafe.Pointer(a), 4*r*stride)), b, n, &lanes)
		out[r] = reduce(&lanes)
	}
}

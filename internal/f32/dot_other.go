//go:build !amd64

package f32

import "unsafe"

const useAVX = false

func dot32AVX(a, b *float32, n int, lanes *[8]float32) {
	dot32Generic(unsafe.Slice(a, n), unsafe.Slice(b, n), lanes)
}

//go:build !amd64

package f32

const useAVX = false

func dotRows(a, b *float32, n, stride, rows int, sums *float32, add bool) {
	dotRowsGeneric(a, b, n, stride, rows, sums, add)
}

package mxfp8

import (
	"fmt"
	"math"
)

// Tile geometry of the Blackwell tcgen05 "scale factor 1x" layout: a TileRows ×
// TileCols data tile owns TileRows × (TileCols/BlockSize) = 128 × 4 scale bytes,
// stored as one [32, 16] byte tile of ScaleTileBytes bytes.
const (
	TileRows       = 128
	TileCols       = 128
	ScaleTileBytes = 32 * 16
)

// ScaleIndex returns the byte offset, in a scale tensor laid out as uint8
// [rows/128, k/128, 32, 16], of the scale of row `row` (0 ≤ row < rows, rows
// counted over all experts: row = expert·N + n) and K-block `kblock`
// (0 ≤ kblock < k/32), for a matrix whose contiguous (contraction) length is k:
//
//	tile   = (row/128)·(k/128) + kblock/4
//	offset = tile·512 + (r%32)·16 + (r/32)·4 + kblock%4,   r = row % 128
//
// k must be a multiple of 128; ScaleIndex does not check its arguments.
func ScaleIndex(row, kblock, k int) int {
	r := row % TileRows
	tile := (row/TileRows)*(k/TileCols) + kblock/4
	return tile*ScaleTileBytes + (r%32)*16 + (r/32)*4 + kblock%4
}

// ScaleShape returns the shape of the scale tensor of an [e, n, k] MXFP8 tensor:
// [e·n/128, k/128, 32, 16].
func ScaleShape(e, n, k int) [4]int {
	return [4]int{e * n / TileRows, k / TileCols, 32, 16}
}

// ScaleLen returns the number of scale bytes of an [e, n, k] MXFP8 tensor,
// e·n·k/32 (one per block; the layout has no padding).
func ScaleLen(e, n, k int) int { return e * n * k / BlockSize }

// CheckShape reports whether [e, n, k] can be quantized with the tcgen05 layout:
// all positive, n % 128 == 0 and k % 128 == 0 (MoK's mxfp8_quantize needs both
// trailing dimensions to be multiples of 128), and e·n·k representable as int.
func CheckShape(e, n, k int) error {
	if e <= 0 || n <= 0 || k <= 0 {
		return fmt.Errorf("shape [E=%d, N=%d, K=%d] must be positive", e, n, k)
	}
	if n%TileRows != 0 {
		return fmt.Errorf("rows N=%d of each [N, K] matrix: not a multiple of %d, the tcgen05 scale-tile height", n, TileRows)
	}
	if k%TileCols != 0 {
		return fmt.Errorf("contraction axis K=%d: not a multiple of %d, the tcgen05 scale-tile width", k, TileCols)
	}
	if e > math.MaxInt/n || e*n > math.MaxInt/k {
		return fmt.Errorf("shape [E=%d, N=%d, K=%d] has too many elements", e, n, k)
	}
	return nil
}

package mxfp8

import (
	"math/rand"
	"testing"
)

// layoutOffset restates the layout of docs/kernel.md independently of ScaleIndex:
// the [rows/128, K/128, 32, 16] tile of (row tile R/128, K tile kb/4), and inside
// it byte (r%32)·16 + (r/32)·4 + kb%4 for r = R%128.
func layoutOffset(row, kblock, k int) int {
	tileRow, r := row/128, row%128
	tileCol, kb := kblock/4, kblock%4
	inner := (r%32)*16 + (r/32)*4 + kb
	return ((tileRow*(k/128))+tileCol)*(32*16) + inner
}

func TestScaleIndexIsBijection(t *testing.T) {
	for _, s := range []struct{ e, n, k int }{{1, 128, 128}, {2, 256, 384}, {3, 128, 1024}} {
		rows, kb := s.e*s.n, s.k/BlockSize
		seen := make([]bool, ScaleLen(s.e, s.n, s.k))
		for row := 0; row < rows; row++ {
			for b := 0; b < kb; b++ {
				o := ScaleIndex(row, b, s.k)
				if o != layoutOffset(row, b, s.k) {
					t.Fatalf("%v: ScaleIndex(%d, %d) = %d, formula %d", s, row, b, o, layoutOffset(row, b, s.k))
				}
				if o < 0 || o >= len(seen) || seen[o] {
					t.Fatalf("%v: offset %d out of range or used twice", s, o)
				}
				seen[o] = true
			}
		}
		sh := ScaleShape(s.e, s.n, s.k)
		if sh != [4]int{s.e * s.n / 128, s.k / 128, 32, 16} || sh[0]*sh[1]*sh[2]*sh[3] != len(seen) {
			t.Errorf("%v: ScaleShape = %v", s, sh)
		}
	}
}

func TestScaleLayoutRandomTensor(t *testing.T) {
	const e, n, k = 2, 256, 384
	x := randomTensor(rand.New(rand.NewSource(7)), e*n*k)
	qt, err := Quantize("w", x, e, n, k)
	if err != nil {
		t.Fatal(err)
	}
	codes := make([]uint8, BlockSize)
	for ex := 0; ex < e; ex++ {
		for r := 0; r < n; r++ {
			row := ex*n + r
			for b := 0; b < k/BlockSize; b++ {
				o := row*k + b*BlockSize
				want := QuantizeBlock(codes, x[o:o+BlockSize])
				if got := qt.Scales[layoutOffset(row, b, k)]; got != want {
					t.Fatalf("expert %d row %d block %d: scale %d at layout offset, block says %d", ex, r, b, got, want)
				}
				if got := qt.BlockScale(ex, r, b); got != want {
					t.Fatalf("BlockScale(%d, %d, %d) = %d, want %d", ex, r, b, got, want)
				}
				for i := range codes {
					if qt.Data[o+i] != codes[i] {
						t.Fatalf("expert %d row %d element %d: code 0x%02x, block says 0x%02x", ex, r, b*BlockSize+i, qt.Data[o+i], codes[i])
					}
				}
			}
		}
	}
}

package passes

import (
	"slices"
	"testing"
)

// TestPartLen checks partLen against the rows partRange lists, and those
// rows against their definition, for every part and small row counts.
func TestPartLen(t *testing.T) {
	tests := []struct {
		part int
		in   func(i, r int) bool
	}{
		{PartWhole, func(i, r int) bool { return true }},
		{PartFirstHalf, func(i, r int) bool { return i < r/2 }},
		{PartSecondHalf, func(i, r int) bool { return i >= r/2 }},
		{PartEven, func(i, r int) bool { return i%2 == 0 }},
		{PartOdd, func(i, r int) bool { return i%2 == 1 }},
	}
	for _, tc := range tests {
		for r := 0; r < 10; r++ {
			var want []int
			for i := 0; i < r; i++ {
				if tc.in(i, r) {
					want = append(want, i)
				}
			}
			start, step, k := partRange(tc.part, r)
			var got []int
			for i := 0; i < k; i++ {
				got = append(got, start+i*step)
			}
			if !slices.Equal(got, want) || partLen(tc.part, r) != len(want) {
				t.Fatalf("part %d, %d rows: partRange %v, partLen %d, want %v", tc.part, r, got, partLen(tc.part, r), want)
			}
		}
	}
}

// TestAtMost checks the element-count bound constBytes uses to skip big
// tensors without reading them.
func TestAtMost(t *testing.T) {
	tests := []struct {
		dims []int64
		max  int64
		want bool
	}{
		{nil, 1, true},
		{[]int64{1}, 1, true},
		{[]int64{1, 1, 1}, 1, true},
		{[]int64{2}, 1, false},
		{[]int64{1 << 40, 1 << 40}, 1, false},
		{[]int64{1 << 40, 0}, 1, true},
		{[]int64{-1}, 1, false},
		{[]int64{3, 4}, 12, true},
		{[]int64{3, 4}, 11, false},
	}
	for _, tc := range tests {
		if got := atMost(tc.dims, tc.max); got != tc.want {
			t.Errorf("atMost(%v, %d) = %v, want %v", tc.dims, tc.max, got, tc.want)
		}
	}
}

// TestAppendRows checks appendRows against its definition (transpose an
// [in, out] matrix, then keep part's rows) for every part, both layouts and
// shapes on both sides of the transpose tile, appending after existing
// values.
func TestAppendRows(t *testing.T) {
	for _, shape := range [][2]int{{1, 1}, {3, 5}, {8, 2}, {33, 70}, {64, 31}} {
		r, cc := shape[0], shape[1]
		src := make([]float32, r*cc)
		for i := range src {
			src[i] = float32(i)
		}
		for _, inOut := range []bool{false, true} {
			for _, part := range []int{PartWhole, PartFirstHalf, PartSecondHalf, PartEven, PartOdd} {
				// Definition: element (o, i) of the [out, in] matrix.
				outs, ins := r, cc
				at := func(o, i int) float32 { return src[o*cc+i] }
				if inOut {
					outs, ins = cc, r
					at = func(o, i int) float32 { return src[i*cc+o] }
				}
				want := []float32{-1, -2}
				for o := 0; o < outs; o++ {
					keep := map[int]bool{PartWhole: true, PartFirstHalf: o < outs/2, PartSecondHalf: o >= outs/2, PartEven: o%2 == 0, PartOdd: o%2 == 1}[part]
					for i := 0; keep && i < ins; i++ {
						want = append(want, at(o, i))
					}
				}
				got := appendRows([]float32{-1, -2}, src, r, cc, inOut, part)
				if !slices.Equal(got, want) {
					t.Fatalf("[%d, %d] inOut=%v part %d: got %v, want %v", r, cc, inOut, part, got, want)
				}
			}
		}
	}
}

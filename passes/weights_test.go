package passes

import "testing"

// TestPartLen checks partLen against the rows partRows lists, and those
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
			got := partRows(tc.part, r)
			if len(got) != len(want) || partLen(tc.part, r) != len(want) {
				t.Fatalf("part %d, %d rows: partRows %v, partLen %d, want %v", tc.part, r, got, partLen(tc.part, r), want)
			}
			for k := range got {
				if got[k] != want[k] {
					t.Fatalf("part %d, %d rows: partRows %v, want %v", tc.part, r, got, want)
				}
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

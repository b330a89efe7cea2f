package eval

import (
	"slices"
	"testing"

	pb "github.com/mokopt/mokopt/graph/onnxpb"
)

// TestExpandToMatchesIndex checks expandTo's block copies against the
// index-array broadcast (take of bcastIndex) for broadcasts over leading,
// inner and trailing dims, rank growth, scalars and every storage class.
func TestExpandToMatchesIndex(t *testing.T) {
	tests := []struct{ in, out []int }{
		{[]int{3}, []int{3}},
		{nil, []int{2, 3}},
		{[]int{1}, []int{4}},
		{[]int{3}, []int{2, 3}},
		{[]int{2, 1}, []int{2, 5}},
		{[]int{1, 3}, []int{4, 3}},
		{[]int{2, 1, 3}, []int{2, 4, 3}},
		{[]int{1, 2, 1, 3}, []int{5, 2, 4, 3}},
		{[]int{4, 1, 1}, []int{2, 4, 3, 2}},
		{[]int{2, 3}, []int{0, 2, 3}},
	}
	for _, tc := range tests {
		n := numel(tc.in)
		f := make([]float32, n)
		d := make([]float64, n)
		i := make([]int64, n)
		b := make([]bool, n)
		s := make([]string, n)
		for j := range n {
			f[j], d[j], i[j], b[j], s[j] = float32(j), float64(j)/3, int64(j)*7, j%3 == 1, string(rune('a'+j%26))
		}
		for _, x := range []*Tensor{NewFloat32(tc.in, f), NewFloat64(tc.in, d), NewInt64(tc.in, i), NewBool(tc.in, b), {DType: pb.TensorProto_STRING, Shape: tc.in, Str: s}} {
			got := expandTo(x, tc.out)
			want := take(x, bcastIndex(x.Shape, tc.out), tc.out)
			if !slices.Equal(got.Shape, want.Shape) || !slices.Equal(got.F32, want.F32) || !slices.Equal(got.F64, want.F64) ||
				!slices.Equal(got.I64, want.I64) || !slices.Equal(got.Bool, want.Bool) || !slices.Equal(got.Str, want.Str) {
				t.Errorf("%s %v -> %v: got %v, want %v", x.DType, tc.in, tc.out, got, want)
			}
		}
	}
}

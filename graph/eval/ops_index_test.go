package eval

import (
	"math"
	"math/rand/v2"
	"sort"
	"testing"
)

func TestGatherScatterOps(t *testing.T) {
	x := seqF32(3, 2)
	runCases(t, []opCase{
		{name: "gather axis0 negative", op: "Gather", in: ins(x, i64(sh(2), 2, -3)), want: outs(f32(sh(2, 2), 4, 5, 0, 1))},
		{name: "gather axis1 scalar", op: "Gather", attrs: attrs(ia("axis", 1)), in: ins(x, i64(nil, 1)), want: outs(f32(sh(3), 1, 3, 5))},
		{name: "gather out of range", op: "Gather", in: ins(x, i64(sh(1), 3)), wantErr: true},
		{name: "gatherelements", op: "GatherElements", attrs: attrs(ia("axis", 1)), in: ins(f32(sh(2, 2), 1, 2, 3, 4), i64(sh(2, 2), 0, 0, 1, 0)), want: outs(f32(sh(2, 2), 1, 1, 4, 3))},
		{name: "gatherelements axis0", op: "GatherElements", in: ins(seqF32(3, 3), i64(sh(2, 3), 1, 2, 0, 2, 0, -1)), want: outs(f32(sh(2, 3), 3, 7, 2, 6, 1, 8))},
		{name: "gathernd", op: "GatherND", in: ins(f32(sh(2, 2), 0, 1, 2, 3), i64(sh(2, 2), 0, 0, 1, 1)), want: outs(f32(sh(2), 0, 3))},
		{name: "gathernd slices", op: "GatherND", in: ins(f32(sh(2, 2), 0, 1, 2, 3), i64(sh(2, 1), 1, 0)), want: outs(f32(sh(2, 2), 2, 3, 0, 1))},
		{name: "gathernd batch_dims", op: "GatherND", attrs: attrs(ia("batch_dims", 1)), in: ins(seqF32(2, 2, 2), i64(sh(2, 1), 1, 0)), want: outs(f32(sh(2, 2), 2, 3, 4, 5))},
		{name: "scatternd", op: "ScatterND", in: ins(seqF32(4), i64(sh(2, 1), 1, 3), f32(sh(2), 10, 30)), want: outs(f32(sh(4), 0, 10, 2, 30))},
		{name: "scatternd add dup", op: "ScatterND", attrs: attrs(sa("reduction", "add")), in: ins(seqF32(4), i64(sh(2, 1), 1, 1), f32(sh(2), 10, 30)), want: outs(f32(sh(4), 0, 41, 2, 3))},
		{name: "scatternd mul", op: "ScatterND", attrs: attrs(sa("reduction", "mul")), in: ins(seqF32(2, 2), i64(sh(1, 1), 1), f32(sh(1, 2), 2, 3)), want: outs(f32(sh(2, 2), 0, 1, 4, 9))},
		{name: "scatterelements", op: "ScatterElements", attrs: attrs(ia("axis", 1)), in: ins(f32(sh(1, 5), 1, 2, 3, 4, 5), i64(sh(1, 2), 1, 3), f32(sh(1, 2), 1.1, 2.1)),
			want: outs(f32(sh(1, 5), 1, 1.1, 3, 2.1, 5))},
		{name: "scatterelements add", op: "ScatterElements", attrs: attrs(sa("reduction", "add")), in: ins(f32(sh(3), 1, 2, 3), i64(sh(2), 0, 0), f32(sh(2), 10, 20)), want: outs(f32(sh(3), 31, 2, 3))},
		{name: "scatterelements max", op: "ScatterElements", attrs: attrs(sa("reduction", "max")), in: ins(f32(sh(3), 1, 2, 3), i64(sh(2), 0, 2), f32(sh(2), 0, 5)), want: outs(f32(sh(3), 1, 2, 5))},
		{name: "scatterelements min", op: "ScatterElements", attrs: attrs(sa("reduction", "min")), in: ins(f32(sh(3), 1, 2, 3), i64(sh(2), 0, 2), f32(sh(2), 0, 5)), want: outs(f32(sh(3), 0, 2, 3))},
		{name: "scatterelements bad reduction", op: "ScatterElements", attrs: attrs(sa("reduction", "avg")), in: ins(f32(sh(3), 1, 2, 3), i64(sh(1), 0), f32(sh(1), 0)), wantErr: true},
		{name: "nonzero", op: "NonZero", in: ins(f32(sh(2, 2), 1, 0, 0, 3)), want: outs(i64(sh(2, 2), 0, 1, 0, 1))},
		{name: "nonzero none", op: "NonZero", in: ins(bl(sh(2), false, false)), want: outs(i64(sh(1, 0)))},
		{name: "onehot", op: "OneHot", in: ins(i64(sh(2), 1, -1), i64(nil, 3), f32(sh(2), 0, 1)), want: outs(f32(sh(2, 3), 0, 1, 0, 0, 0, 1))},
		{name: "onehot axis0", op: "OneHot", attrs: attrs(ia("axis", 0)), in: ins(i64(sh(2), 0, 2), f32(nil, 3), i64(sh(2), 5, 7)), want: outs(i64(sh(3, 2), 7, 5, 5, 5, 5, 7))},
	})
}

func TestTopKArgCumSum(t *testing.T) {
	runCases(t, []opCase{
		{name: "topk ties lower index first", op: "TopK", in: ins(f32(sh(5), 1, 3, 3, 2, 3), i64(sh(1), 3)), want: outs(f32(sh(3), 3, 3, 3), i64(sh(3), 1, 2, 4))},
		{name: "topk smallest", op: "TopK", attrs: attrs(ia("largest", 0)), in: ins(f32(sh(4), 4, 1, 3, 1), i64(sh(1), 2)), want: outs(f32(sh(2), 1, 1), i64(sh(2), 1, 3))},
		{name: "topk axis0", op: "TopK", attrs: attrs(ia("axis", 0)), in: ins(f32(sh(3, 2), 1, 6, 5, 2, 3, 4), i64(sh(1), 1)), want: outs(f32(sh(1, 2), 5, 6), i64(sh(1, 2), 1, 0))},
		{name: "topk int", op: "TopK", in: ins(i64(sh(2, 3), 1, 9, 5, 7, 7, 0), i64(sh(1), 2)), want: outs(i64(sh(2, 2), 9, 5, 7, 7), i64(sh(2, 2), 1, 2, 0, 1))},
		{name: "topk k attr opset 1", op: "TopK", opset: 1, attrs: attrs(ia("k", 1)), in: ins(f32(sh(3), 1, 3, 2)), want: outs(f32(sh(1), 3), i64(sh(1), 1))},
		{name: "topk k too big", op: "TopK", in: ins(f32(sh(2), 1, 2), i64(sh(1), 3)), want: outs(nil, nil), wantErr: true},
		{name: "argmax", op: "ArgMax", attrs: attrs(ia("axis", 1)), in: ins(f32(sh(2, 3), 1, 3, 3, 5, 4, 0)), want: outs(i64(sh(2, 1), 1, 0))},
		{name: "argmax last index", op: "ArgMax", attrs: attrs(ia("axis", 1), ia("keepdims", 0), ia("select_last_index", 1)), in: ins(f32(sh(2, 3), 1, 3, 3, 5, 4, 0)), want: outs(i64(sh(2), 2, 0))},
		{name: "argmin", op: "ArgMin", attrs: attrs(ia("keepdims", 0)), in: ins(f32(sh(2, 2), 1, 3, 0, 5)), want: outs(i64(sh(2), 1, 0))},
		{name: "cumsum", op: "CumSum", in: ins(f32(sh(4), 1, 2, 3, 4), i64(nil, 0)), want: outs(f32(sh(4), 1, 3, 6, 10))},
		{name: "cumsum exclusive reverse", op: "CumSum", attrs: attrs(ia("exclusive", 1), ia("reverse", 1)), in: ins(i64(sh(4), 1, 2, 3, 4), i64(nil, 0)), want: outs(i64(sh(4), 9, 7, 4, 0))},
		{name: "cumsum axis1", op: "CumSum", in: ins(f32(sh(2, 2), 1, 2, 3, 4), i64(nil, -1)), want: outs(f32(sh(2, 2), 1, 3, 3, 7))},
	})
}

// TestTopKSelection checks TopK (the insertion selection for small k, the
// sort for large k) against a stable sort of each row by value (NaN
// largest), lower index first on ties: random rows with many ties and
// NaNs, both directions, every k, on the last axis and an inner one.
func TestTopKSelection(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	for _, dim := range []int{1, 5, 40, 70} {
		rows := 3
		x := make([]float32, rows*dim)
		for i := range x {
			x[i] = float32(rng.IntN(7)) // many ties
			if rng.IntN(11) == 0 {
				x[i] = float32(math.NaN())
			}
		}
		for _, largest := range []int64{1, 0} {
			for _, k := range []int{0, 1, 2, dim / 2, dim} {
				if k > dim {
					continue
				}
				for _, axis := range []int64{1, 0} {
					// Along axis 0 the rows are x's columns: shape [dim, rows].
					shape, at := sh(rows, dim), func(r, i int) float32 { return x[r*dim+i] }
					in := x
					if axis == 0 {
						in = make([]float32, len(x))
						for r := 0; r < rows; r++ {
							for i := 0; i < dim; i++ {
								in[i*rows+r] = x[r*dim+i]
							}
						}
						shape = sh(dim, rows)
					}
					got, err := runOp(t, 18, "TopK", attrs(ia("axis", axis), ia("largest", largest)), 2, NewFloat32(shape, in), i64(sh(1), int64(k)))
					if err != nil {
						t.Fatal(err)
					}
					for r := 0; r < rows; r++ {
						pos := make([]int, dim)
						for i := range pos {
							pos[i] = i
						}
						sort.SliceStable(pos, func(a, b int) bool {
							va, vb := at(r, pos[a]), at(r, pos[b])
							na, nb := va != va, vb != vb
							switch {
							case na && nb:
								return false
							case na:
								return largest == 1
							case nb:
								return largest != 1
							case va != vb:
								return (va > vb) == (largest == 1)
							}
							return false
						})
						for j := 0; j < k; j++ {
							gi := r*k + j
							if axis == 0 {
								gi = j*rows + r
							}
							if got[1].I64[gi] != int64(pos[j]) {
								t.Fatalf("dim %d k %d largest %d axis %d row %d: indices %v, want first %d of %v", dim, k, largest, axis, r, got[1].I64, k, pos)
							}
						}
					}
				}
			}
		}
	}
}

package eval

import (
	"math"
	"math/rand/v2"
	"slices"
	"testing"
)

func TestReduceOps(t *testing.T) {
	x := seqF32(2, 3) // 0 1 2 / 3 4 5
	runCases(t, []opCase{
		{name: "sum all", op: "ReduceSum", in: ins(x), want: outs(f32(sh(1, 1), 15))},
		{name: "sum axes input", op: "ReduceSum", in: ins(x, i64(sh(1), 1)), want: outs(f32(sh(2, 1), 3, 12))},
		{name: "sum no keepdims", op: "ReduceSum", attrs: attrs(ia("keepdims", 0)), in: ins(x, i64(sh(1), 0)), want: outs(f32(sh(3), 3, 5, 7))},
		{name: "sum noop empty axes", op: "ReduceSum", attrs: attrs(ia("noop_with_empty_axes", 1)), in: ins(x, i64(sh(0))), want: outs(x)},
		{name: "sum axes attr opset 11", op: "ReduceSum", opset: 11, attrs: attrs(isa("axes", -1), ia("keepdims", 0)), in: ins(x), want: outs(f32(sh(2), 3, 12))},
		{name: "sum int", op: "ReduceSum", attrs: attrs(ia("keepdims", 0)), in: ins(i64(sh(2, 2), 1, 2, 3, 4), i64(sh(1), 0)), want: outs(i64(sh(2), 4, 6))},
		{name: "mean attr opset 17", op: "ReduceMean", opset: 17, attrs: attrs(isa("axes", 1), ia("keepdims", 0)), in: ins(x), want: outs(f32(sh(2), 1, 4))},
		{name: "mean axes input opset 18", op: "ReduceMean", in: ins(x, i64(sh(1), -1)), want: outs(f32(sh(2, 1), 1, 4))},
		{name: "max", op: "ReduceMax", attrs: attrs(ia("keepdims", 0)), in: ins(x, i64(sh(1), 0)), want: outs(f32(sh(3), 3, 4, 5))},
		{name: "min", op: "ReduceMin", attrs: attrs(ia("keepdims", 0)), in: ins(x), want: outs(f32(nil, 0))},
		{name: "prod", op: "ReduceProd", attrs: attrs(ia("keepdims", 0)), in: ins(f32(sh(3), 2, 3, 4)), want: outs(f32(nil, 24))},
		{name: "l2", op: "ReduceL2", attrs: attrs(ia("keepdims", 0)), in: ins(f32(sh(2), 3, 4)), want: outs(f32(nil, 5))},
		{name: "logsumexp", op: "ReduceLogSumExp", attrs: attrs(ia("keepdims", 0)), in: ins(f32(sh(2), 0, 0)), want: outs(f32(nil, float32(math.Log(2))))},
		{name: "bad axis", op: "ReduceSum", in: ins(x, i64(sh(1), 2)), wantErr: true},
	})
}

func TestSoftmaxAndNorms(t *testing.T) {
	e1 := float32(1 / (1 + math.E))
	e2 := float32(math.E / (1 + math.E))
	runCases(t, []opCase{
		{name: "softmax last axis", op: "Softmax", in: ins(f32(sh(2, 2), 0, 1, 1, 0)), want: outs(f32(sh(2, 2), e1, e2, e2, e1))},
		{name: "softmax axis0", op: "Softmax", attrs: attrs(ia("axis", 0)), in: ins(f32(sh(2, 2), 0, 1, 1, 0)), want: outs(f32(sh(2, 2), e1, e2, e2, e1))},
		{name: "softmax large values", op: "Softmax", in: ins(f32(sh(2), 1000, 1000)), want: outs(f32(sh(2), 0.5, 0.5))},
		{name: "softmax opset 11 coerces to 2d", op: "Softmax", opset: 11, in: ins(f32(sh(1, 2, 2), 0, 0, 0, 0)), want: outs(f32(sh(1, 2, 2), 0.25, 0.25, 0.25, 0.25))},
		{name: "logsoftmax", op: "LogSoftmax", in: ins(f32(sh(2), 0, 0)), want: outs(f32(sh(2), float32(-math.Log(2)), float32(-math.Log(2))))},
		{name: "lp1 last axis", op: "LpNormalization", attrs: attrs(ia("p", 1)), in: ins(f32(sh(2, 2), 1, -3, 0, 0)), want: outs(f32(sh(2, 2), 0.25, -0.75, 0, 0))},
		{name: "lp2 axis 0", op: "LpNormalization", attrs: attrs(ia("axis", 0)), in: ins(f32(sh(2, 2), 3, 0, 4, 2)), want: outs(f32(sh(2, 2), 0.6, 0, 0.8, 1))},
		{name: "lp3 refused", op: "LpNormalization", attrs: attrs(ia("p", 3)), in: ins(f32(sh(2), 1, 2)), wantErr: true},
		{name: "hardmax", op: "Hardmax", in: ins(f32(sh(2, 3), 1, 3, 3, 5, 4, 0)), want: outs(f32(sh(2, 3), 0, 1, 0, 1, 0, 0))},
		{name: "layernorm", op: "LayerNormalization", attrs: attrs(fa("epsilon", 0)), in: ins(f32(sh(1, 2), 1, 3), f32(sh(2), 2, 1), f32(sh(2), 0, 1)),
			want: outs(f32(sh(1, 2), -2, 2), f32(sh(1, 1), 2), f32(sh(1, 1), 1))},
		{name: "simplified layernorm", op: "SimplifiedLayerNormalization", attrs: attrs(fa("epsilon", 0)), in: ins(f32(sh(1, 2), 3, 4), f32(sh(2), 1, 2)),
			want: outs(f32(sh(1, 2), float32(3/math.Sqrt(12.5)), float32(8/math.Sqrt(12.5))))},
		{name: "batchnorm", op: "BatchNormalization", attrs: attrs(fa("epsilon", 0)), in: ins(f32(sh(1, 2, 1), 1, 2), f32(sh(2), 1, 2), f32(sh(2), 0, 1), f32(sh(2), 0, 1), f32(sh(2), 1, 4)),
			want: outs(f32(sh(1, 2, 1), 1, 2))},
	})
}

func TestMatMulOps(t *testing.T) {
	a := f32(sh(2, 3), 1, 2, 3, 4, 5, 6)
	b := f32(sh(3, 2), 1, 0, 0, 1, 1, 1)
	ab := f32(sh(2, 2), 4, 5, 10, 11)
	runCases(t, []opCase{
		{name: "matmul 2d", op: "MatMul", in: ins(a, b), want: outs(ab)},
		{name: "matmul batched broadcast", op: "MatMul", in: ins(f32(sh(2, 1, 3), 1, 2, 3, 4, 5, 6), b), want: outs(f32(sh(2, 1, 2), 4, 5, 10, 11))},
		{name: "matmul broadcast batch dims", op: "MatMul", in: ins(f32(sh(1, 2, 1, 3), 1, 2, 3, 4, 5, 6), f32(sh(3, 1, 3, 1), 1, 1, 1, 0, 0, 0, 1, 0, 0)),
			want: outs(f32(sh(3, 2, 1, 1), 6, 15, 0, 0, 1, 4))},
		{name: "matmul 1d x 2d", op: "MatMul", in: ins(f32(sh(3), 1, 2, 3), b), want: outs(f32(sh(2), 4, 5))},
		{name: "matmul 2d x 1d", op: "MatMul", in: ins(a, f32(sh(3), 1, 1, 1)), want: outs(f32(sh(2), 6, 15))},
		{name: "matmul 1d x 1d", op: "MatMul", in: ins(f32(sh(3), 1, 2, 3), f32(sh(3), 1, 1, 1)), want: outs(f32(nil, 6))},
		{name: "matmul int", op: "MatMul", in: ins(i64(sh(1, 2), 2, 3), i64(sh(2, 1), 4, 5)), want: outs(i64(sh(1, 1), 23))},
		{name: "matmul mismatch", op: "MatMul", in: ins(a, a), wantErr: true},
		{name: "gemm", op: "Gemm", in: ins(a, b), want: outs(ab)},
		{name: "gemm trans alpha beta", op: "Gemm", attrs: attrs(ia("transA", 1), ia("transB", 1), fa("alpha", 2), fa("beta", 0.5)),
			in: ins(f32(sh(3, 2), 1, 4, 2, 5, 3, 6), f32(sh(2, 3), 1, 0, 1, 0, 1, 1), f32(sh(2), 10, 20)), want: outs(f32(sh(2, 2), 13, 20, 25, 32))},
		{name: "gemm bias row", op: "Gemm", in: ins(a, b, f32(sh(2, 1), 1, 2)), want: outs(f32(sh(2, 2), 5, 6, 12, 13))},
		{name: "einsum matmul", op: "Einsum", attrs: attrs(sa("equation", "ij,jk->ik")), in: ins(a, b), want: outs(ab)},
		{name: "einsum implicit transpose", op: "Einsum", attrs: attrs(sa("equation", "ji")), in: ins(a), want: outs(f32(sh(3, 2), 1, 4, 2, 5, 3, 6))},
		{name: "einsum batched ellipsis", op: "Einsum", attrs: attrs(sa("equation", "...ij,...jk->...ik")), in: ins(f32(sh(1, 2, 3), 1, 2, 3, 4, 5, 6), b), want: outs(f32(sh(1, 2, 2), 4, 5, 10, 11))},
		{name: "einsum trace", op: "Einsum", attrs: attrs(sa("equation", "ii->")), in: ins(f32(sh(2, 2), 1, 2, 3, 4)), want: outs(f32(nil, 5))},
	})
}

// TestMatMulLarge checks the blocked, threaded kernel against a naive loop.
func TestMatMulLarge(t *testing.T) {
	for _, s := range [][4]int{{3, 70, 300, 530}, {1, 257, 513, 17}, {4, 33, 1, 9}, {1, 1, 2048, 1024}, {1, 3, 1024, 700}} {
		B, M, K, N := s[0], s[1], s[2], s[3]
		a, b := New(1, sh(B, M, K)), New(1, sh(K, N))
		for i := range a.F32 {
			a.F32[i] = float32(i%7) - 3
		}
		for i := range b.F32 {
			b.F32[i] = float32(i%5) - 2
		}
		got, err := matmul(nil, a, b)
		if err != nil {
			t.Fatal(err)
		}
		for bi := 0; bi < B; bi++ {
			for i := 0; i < M; i++ {
				for j := 0; j < N; j++ {
					var w float32
					for k := 0; k < K; k++ {
						w += a.F32[(bi*M+i)*K+k] * b.F32[k*N+j]
					}
					if g := got.F32[(bi*M+i)*N+j]; g != w {
						t.Fatalf("%v: [%d,%d,%d] = %v, want %v", s, bi, i, j, g, w)
					}
				}
			}
		}
	}
}

// TestReduceBlocksMatchIndex checks the block-by-block float32 reduction
// (consecutive reduced dims) bit for bit against the element loop over the
// index array, for every float reducer, leading, inner, trailing and all
// dims, with and without keepdims.
func TestReduceBlocksMatchIndex(t *testing.T) {
	rng := rand.New(rand.NewPCG(3, 4))
	shape := []int{3, 4, 5, 2}
	x := make([]float32, numel(shape))
	for i := range x {
		x[i] = float32(rng.NormFloat64())
	}
	for _, op := range []string{"ReduceSum", "ReduceMean", "ReduceMax", "ReduceMin", "ReduceProd", "ReduceL1", "ReduceL2", "ReduceSumSquare", "ReduceLogSumExp", "ReduceLogSum"} {
		for _, axes := range [][]int64{{0}, {1}, {3}, {1, 2}, {0, 1, 2, 3}, {2, 3}, {0, 1}} {
			for _, keep := range []int64{1, 0} {
				xs := x
				if op == "ReduceLogSum" {
					xs = make([]float32, len(x))
					for i, v := range x {
						xs[i] = v * v // a positive sum
					}
				}
				got, err := runOp(t, 18, op, attrs(ia("keepdims", keep)), 1, NewFloat32(shape, xs), NewInt64([]int{len(axes)}, axes))
				if err != nil {
					t.Fatal(err)
				}
				ax := make([]int, len(axes))
				for i, a := range axes {
					ax[i] = int(a)
				}
				p := planReduce(shape, ax, keep == 1)
				init, fold, fin := floatReducer(op, p.count)
				acc := make([]float64, numel(p.outShape))
				for i := range acc {
					acc[i] = init
				}
				for i, v := range xs {
					acc[p.outIdx[i]] = fold(acc[p.outIdx[i]], float64(v))
				}
				want := make([]float32, len(acc))
				for i, v := range acc {
					want[i] = float32(fin(v))
				}
				if !slices.Equal(got[0].Shape, p.finalDims) || !slices.EqualFunc(got[0].F32, want, func(a, b float32) bool { return a == b || a != a && b != b }) {
					t.Errorf("%s axes %v keepdims %d: got %v %v, want %v %v", op, axes, keep, got[0].Shape, got[0].F32, p.finalDims, want)
				}
			}
		}
	}
}

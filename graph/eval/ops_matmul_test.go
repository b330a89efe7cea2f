package eval

import (
	"testing"
)

// TestFusedMatMul: com.microsoft::FusedMatMul is alpha · op(A) · op(B),
// checked against products worked out by hand.
func TestFusedMatMul(t *testing.T) {
	a := f32(sh(2, 3), 1, 2, 3, 4, 5, 6) // A; Aᵀ is [[1 4] [2 5] [3 6]]
	b := f32(sh(3, 2), 1, 0, 0, 1, 1, 1) // B
	runCases(t, []opCase{
		{name: "plain", op: "com.microsoft::FusedMatMul", in: ins(a, b), want: outs(f32(sh(2, 2), 4, 5, 10, 11))},
		{name: "alpha", op: "com.microsoft::FusedMatMul", attrs: attrs(fa("alpha", 0.5)), in: ins(a, b), want: outs(f32(sh(2, 2), 2, 2.5, 5, 5.5))},
		{name: "transA transB", op: "com.microsoft::FusedMatMul", attrs: attrs(ia("transA", 1), ia("transB", 1)),
			in: ins(f32(sh(3, 2), 1, 4, 2, 5, 3, 6), f32(sh(2, 3), 1, 0, 1, 0, 1, 1)), want: outs(f32(sh(2, 2), 4, 5, 10, 11))},
		{name: "batch transposes refused", op: "com.microsoft::FusedMatMul", attrs: attrs(ia("transBatchA", 1)), in: ins(a, b), wantErr: true},
	})
}

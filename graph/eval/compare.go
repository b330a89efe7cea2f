package eval

import (
	"fmt"
	"math"
	"slices"

	pb "github.com/mokopt/mokopt/graph/onnxpb"
)

// Diff summarises the elementwise difference between a computed tensor and
// a reference, under the check |got-want| <= atol + rtol*|want|.
type Diff struct {
	// MaxAbs is the largest |got-want| over all elements.
	MaxAbs float64
	// MaxRel is the largest |got-want|/|want| over elements with want != 0.
	MaxRel float64
	// Worst is the flat index of the element furthest past its tolerance
	// (when all pass: the one closest to it); -1 when the tensors are empty.
	Worst int
	// Mismatches counts the elements failing the check.
	Mismatches int
	// NonFinite counts the elements that are NaN in both tensors, or the
	// same infinity: they pass, but their equality says nothing about the
	// computation.
	NonFinite int
}

// OK reports whether every element passed.
func (d Diff) OK() bool { return d.Mismatches == 0 }

// Compare checks got against want elementwise. Shapes and storage classes
// must agree (an error otherwise). NaN equals NaN and infinities equal
// themselves; strings and bools compare exactly.
func Compare(got, want *Tensor, rtol, atol float64) (Diff, error) {
	d := Diff{Worst: -1}
	if !slices.Equal(got.Shape, want.Shape) {
		return d, fmt.Errorf("shape %v, want %v", got.Shape, want.Shape)
	}
	if got.kind() != want.kind() {
		return d, fmt.Errorf("type %s, want %s", got.DType, want.DType)
	}
	n := want.Len()
	if got.Len() != n {
		return d, fmt.Errorf("%d elements, want %d", got.Len(), n)
	}
	if want.kind() == kStr {
		for i := range want.Str {
			if got.Str[i] != want.Str[i] {
				d.Mismatches++
				if d.Worst < 0 {
					d.Worst = i
				}
			}
		}
		if n > 0 && d.Worst < 0 {
			d.Worst = 0
		}
		return d, nil
	}
	worstMargin := math.Inf(-1)
	for i := 0; i < n; i++ {
		g, w := got.Float64At(i), want.Float64At(i)
		var diff, margin float64
		switch {
		case math.IsNaN(g) && math.IsNaN(w), g == w:
			diff = 0
			margin = -atol - rtol*math.Abs(w)
			if math.IsNaN(w) || math.IsInf(w, 0) {
				d.NonFinite++
			}
		case math.IsNaN(g) || math.IsNaN(w) || math.IsInf(g, 0) || math.IsInf(w, 0):
			diff = math.Inf(1)
			margin = math.Inf(1)
		default:
			diff = math.Abs(g - w)
			margin = diff - (atol + rtol*math.Abs(w))
		}
		if diff > d.MaxAbs {
			d.MaxAbs = diff
		}
		if w != 0 && !math.IsNaN(w) {
			if rel := diff / math.Abs(w); rel > d.MaxRel {
				d.MaxRel = rel
			}
		}
		if margin > 0 {
			d.Mismatches++
		}
		if margin > worstMargin {
			worstMargin = margin
			d.Worst = i
		}
	}
	return d, nil
}

// HalfTolerance is the relative tolerance a comparison gives float16 (1e-2)
// and bfloat16 (4e-2) values: the precision their 11 and 8 significant bits
// carry, so that a graph that computes in float32 where another rounds every
// step to the half type still compares equal. Callers also scale an
// absolute tolerance by it (that fraction of the values' magnitude). ok is
// false for other types.
func HalfTolerance(dt pb.TensorProto_DataType) (rel float64, ok bool) {
	switch dt {
	case pb.TensorProto_FLOAT16:
		return 1e-2, true
	case pb.TensorProto_BFLOAT16:
		return 4e-2, true
	}
	return 0, false
}

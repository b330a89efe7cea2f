package eval

import (
	"fmt"
	"math"
	"slices"
	"strings"

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

// UnitRoundoff is the largest relative error of one rounding to type dt,
// nearest even: 2^-11 for float16 (11 significant bits), 2^-8 for bfloat16
// (8), 2^-24 for float32; 0 for other types.
func UnitRoundoff(dt pb.TensorProto_DataType) float64 {
	switch dt {
	case pb.TensorProto_FLOAT16:
		return 0x1p-11
	case pb.TensorProto_BFLOAT16:
		return 0x1p-8
	case pb.TensorProto_FLOAT:
		return 0x1p-24
	}
	return 0
}

// HalfULPs is how many unit roundoffs of its type a half-precision
// comparison allows: an MoE block's output passes through about ten
// roundings in series (router linear, gate/up product, sigmoid, two
// products, down product, weighting, sum, casts), each off by up to one
// unit roundoff of the values it rounds, so a graph that computes in
// float32 where another rounds every op to the half type differs by that
// many, relative to the output's magnitude.
const HalfULPs = 10

// HalfTolerance is the relative tolerance a comparison gives float16 and
// bfloat16 values: HalfULPs unit roundoffs of the type, 10 x 2^-11 =
// 0.0049 for float16 and 10 x 2^-8 = 0.039 for bfloat16. Callers also
// scale an absolute tolerance by it (that fraction of the values'
// magnitude). ok is false for other types.
func HalfTolerance(dt pb.TensorProto_DataType) (rel float64, ok bool) {
	switch dt {
	case pb.TensorProto_FLOAT16, pb.TensorProto_BFLOAT16:
		return HalfULPs * UnitRoundoff(dt), true
	}
	return 0, false
}

// HalfToleranceText says how HalfTolerance(dt) is made, for reports:
// "rtol 0.039 = 10 x 2^-8, bfloat16's unit roundoff"; "" for other types.
func HalfToleranceText(dt pb.TensorProto_DataType) string {
	rel, ok := HalfTolerance(dt)
	if !ok {
		return ""
	}
	return fmt.Sprintf("rtol %.2g = %d x 2^%d, %s's unit roundoff", rel, HalfULPs, math.Ilogb(UnitRoundoff(dt)), strings.ToLower(dt.String()))
}

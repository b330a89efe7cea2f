package eval

import (
	"math"
	"sort"

	pb "github.com/mokopt/mokopt/graph/onnxpb"
)

// f8format describes one of ONNX's 8-bit float types.
type f8format struct {
	man  uint  // mantissa bits
	bias int   // exponent bias
	uz   bool  // "FNUZ": no negative zero, NaN is 0x80, no infinities
	ieee bool  // E5M2: IEEE-style infinities and NaNs at the top exponent
	nan  uint8 // canonical NaN bits
	tbl  []f8entry
}

// f8entry is a non-negative finite value and its bits.
type f8entry struct {
	v    float64
	bits uint8
}

var f8formats = map[pb.TensorProto_DataType]*f8format{
	pb.TensorProto_FLOAT8E4M3FN:   {man: 3, bias: 7, nan: 0x7f},
	pb.TensorProto_FLOAT8E4M3FNUZ: {man: 3, bias: 8, uz: true, nan: 0x80},
	pb.TensorProto_FLOAT8E5M2:     {man: 2, bias: 15, ieee: true, nan: 0x7f},
	pb.TensorProto_FLOAT8E5M2FNUZ: {man: 2, bias: 16, uz: true, nan: 0x80},
}

func init() {
	for _, f := range f8formats {
		for b := 0; b < 0x80; b++ {
			v := f.decode(uint8(b))
			if !math.IsNaN(v) && !math.IsInf(v, 0) {
				f.tbl = append(f.tbl, f8entry{v, uint8(b)})
			}
		}
		sort.Slice(f.tbl, func(i, j int) bool { return f.tbl[i].v < f.tbl[j].v })
	}
}

// decode converts 8-bit float bits to float64.
func (f *f8format) decode(b uint8) float64 {
	if f.uz && b == 0x80 {
		return math.NaN()
	}
	sign := 1.0
	if b&0x80 != 0 {
		sign = -1
	}
	ebits := 7 - f.man
	exp := int(b>>f.man) & (1<<ebits - 1)
	man := int(b) & (1<<f.man - 1)
	top := 1<<ebits - 1
	switch {
	case f.ieee && exp == top && man == 0:
		return sign * math.Inf(1)
	case f.ieee && exp == top:
		return math.NaN()
	case !f.ieee && !f.uz && exp == top && man == 1<<f.man-1:
		return math.NaN()
	}
	if exp == 0 {
		return sign * math.Ldexp(float64(man), 1-f.bias-int(f.man))
	}
	return sign * math.Ldexp(float64(man|1<<f.man), exp-f.bias-int(f.man))
}

// maxFinite is the largest finite value.
func (f *f8format) maxFinite() float64 { return f.tbl[len(f.tbl)-1].v }

// encode rounds v to the nearest representable value (ties to even bits).
// Out-of-range values and infinities become infinity (E5M2) or NaN.
func (f *f8format) encode(v float64) uint8 {
	if math.IsNaN(v) {
		return f.nan
	}
	neg := math.Signbit(v)
	a := math.Abs(v)
	var bits uint8
	mx := f.tbl[len(f.tbl)-1]
	switch {
	case math.IsInf(a, 0) || a > mx.v:
		// beyond the largest finite value: values within half an ulp still
		// round down to it.
		prev := f.tbl[len(f.tbl)-2].v
		if !math.IsInf(a, 0) && a < mx.v+(mx.v-prev)/2 {
			bits = mx.bits
			break
		}
		if f.ieee {
			bits = 0x7c
		} else {
			return f.nan
		}
	default:
		i := sort.Search(len(f.tbl), func(i int) bool { return f.tbl[i].v >= a })
		e := f.tbl[i]
		if i > 0 && e.v != a {
			lo := f.tbl[i-1]
			switch d1, d2 := a-lo.v, e.v-a; {
			case d1 < d2:
				e = lo
			case d1 == d2 && lo.bits&1 == 0:
				e = lo
			}
		}
		bits = e.bits
	}
	if neg && !(f.uz && bits == 0) {
		bits |= 0x80
	}
	return bits
}

// round returns v rounded to the format.
func (f *f8format) round(v float32) float32 { return float32(f.decode(f.encode(float64(v)))) }

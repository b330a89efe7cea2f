package eval

import (
	"fmt"
	"math"
	"strings"

	pb "github.com/mokopt/mokopt/graph/onnxpb"
)

// Tensor is a dense, row-major tensor held in a plain Go slice.
//
// Exactly one of the data slices is in use, chosen by the storage class of
// DType:
//   - F32: FLOAT, FLOAT16, BFLOAT16 and the four FLOAT8 types (narrow floats
//     are widened to float32; results of ops on them are rounded back to
//     their precision);
//   - F64: DOUBLE;
//   - I64: every integer type (INT8..INT64, UINT8..UINT64; UINT64 values above
//     2^63-1 keep their bit pattern); narrow integer results wrap like the
//     C types do;
//   - Bool: BOOL;
//   - Str: STRING.
//
// A scalar has an empty Shape and one element.
type Tensor struct {
	// DType is the ONNX element type.
	DType pb.TensorProto_DataType
	// Shape is the row-major shape; nil or empty for a scalar.
	Shape []int
	// F32 holds FLOAT, FLOAT16, BFLOAT16 and FLOAT8* data.
	F32 []float32
	// F64 holds DOUBLE data.
	F64 []float64
	// I64 holds the data of every integer type.
	I64 []int64
	// Bool holds BOOL data.
	Bool []bool
	// Str holds STRING data.
	Str []string
	// Seq, when not nil, makes the value a sequence (ONNX seq(tensor)) of
	// these tensors; DType and Shape are then unset.
	Seq []*Tensor
	// lazy, when set, holds the data as slabs of another tensor (F32 is
	// then nil); only lazy-aware kernels see such tensors.
	lazy *gathered
	// src, when set, is where a streamed weight's data is read from (F32
	// is then nil); only kernels that declared the input see such tensors.
	src *streamed
}

// kind is the storage class of a data type.
type kind int

const (
	kNone kind = iota
	kF32
	kF64
	kI64
	kBool
	kStr
)

// kindOf returns the storage class of dt, or kNone if dt is not supported.
func kindOf(dt pb.TensorProto_DataType) kind {
	switch dt {
	case pb.TensorProto_FLOAT, pb.TensorProto_FLOAT16, pb.TensorProto_BFLOAT16,
		pb.TensorProto_FLOAT8E4M3FN, pb.TensorProto_FLOAT8E4M3FNUZ, pb.TensorProto_FLOAT8E5M2, pb.TensorProto_FLOAT8E5M2FNUZ:
		return kF32
	case pb.TensorProto_DOUBLE:
		return kF64
	case pb.TensorProto_INT8, pb.TensorProto_INT16, pb.TensorProto_INT32, pb.TensorProto_INT64,
		pb.TensorProto_UINT8, pb.TensorProto_UINT16, pb.TensorProto_UINT32, pb.TensorProto_UINT64:
		return kI64
	case pb.TensorProto_BOOL:
		return kBool
	case pb.TensorProto_STRING:
		return kStr
	}
	return kNone
}

// SupportedDType reports whether tensors of type dt can be evaluated.
func SupportedDType(dt pb.TensorProto_DataType) bool { return kindOf(dt) != kNone }

// StoredAsFloat32 reports whether the interpreter holds values of dt as
// float32 (FLOAT, FLOAT16, BFLOAT16 and the float8 types): the types
// NewFloatAs takes.
func StoredAsFloat32(dt pb.TensorProto_DataType) bool { return kindOf(dt) == kF32 }

// isFloat reports whether dt is a floating-point type.
func isFloat(dt pb.TensorProto_DataType) bool {
	k := kindOf(dt)
	return k == kF32 || k == kF64
}

// numel returns the product of shape.
func numel(shape []int) int {
	n := 1
	for _, d := range shape {
		n *= d
	}
	return n
}

// checkedNumel returns the product of shape, or an error for negative dims
// or overflow.
func checkedNumel(shape []int) (int, error) {
	n := 1
	for _, d := range shape {
		if d < 0 {
			return 0, fmt.Errorf("negative dimension in shape %v", shape)
		}
		if d != 0 && n > math.MaxInt32*int(1<<20)/d {
			return 0, fmt.Errorf("shape %v is too large", shape)
		}
		n *= d
	}
	return n, nil
}

// New returns a zero-filled tensor of type dt and the given shape. It panics
// if dt is not supported; use SupportedDType first when dt comes from a file.
func New(dt pb.TensorProto_DataType, shape []int) *Tensor {
	t := &Tensor{DType: dt, Shape: append([]int{}, shape...)}
	n := numel(shape)
	switch kindOf(dt) {
	case kF32:
		t.F32 = make([]float32, n)
	case kF64:
		t.F64 = make([]float64, n)
	case kI64:
		t.I64 = make([]int64, n)
	case kBool:
		t.Bool = make([]bool, n)
	case kStr:
		t.Str = make([]string, n)
	default:
		panic(fmt.Sprintf("eval.New: unsupported data type %s", dt))
	}
	return t
}

// NewFloat32 wraps data (not copied) as a FLOAT tensor of the given shape.
func NewFloat32(shape []int, data []float32) *Tensor {
	return &Tensor{DType: pb.TensorProto_FLOAT, Shape: append([]int{}, shape...), F32: data}
}

// NewFloatAs wraps data (not copied, rounded in place) as a tensor of the
// float type dt stored as float32 values (FLOAT, FLOAT16, BFLOAT16 or a
// float8 type): each value is rounded to dt's precision, as the interpreter
// rounds results of that type. It panics if dt is not such a type.
func NewFloatAs(dt pb.TensorProto_DataType, shape []int, data []float32) *Tensor {
	if kindOf(dt) != kF32 {
		panic(fmt.Sprintf("eval.NewFloatAs: %s is not stored as float32", dt))
	}
	t := &Tensor{DType: dt, Shape: append([]int{}, shape...), F32: data}
	t.normalize()
	return t
}

// NewFloat64 wraps data (not copied) as a DOUBLE tensor of the given shape.
func NewFloat64(shape []int, data []float64) *Tensor {
	return &Tensor{DType: pb.TensorProto_DOUBLE, Shape: append([]int{}, shape...), F64: data}
}

// NewInt64 wraps data (not copied) as an INT64 tensor of the given shape.
func NewInt64(shape []int, data []int64) *Tensor {
	return &Tensor{DType: pb.TensorProto_INT64, Shape: append([]int{}, shape...), I64: data}
}

// NewBool wraps data (not copied) as a BOOL tensor of the given shape.
func NewBool(shape []int, data []bool) *Tensor {
	return &Tensor{DType: pb.TensorProto_BOOL, Shape: append([]int{}, shape...), Bool: data}
}

// ScalarInt64 returns a rank-0 INT64 tensor.
func ScalarInt64(v int64) *Tensor { return NewInt64(nil, []int64{v}) }

// ScalarFloat32 returns a rank-0 FLOAT tensor.
func ScalarFloat32(v float32) *Tensor { return NewFloat32(nil, []float32{v}) }

func (t *Tensor) kind() kind { return kindOf(t.DType) }

// Len returns the number of elements.
func (t *Tensor) Len() int {
	if t.lazy != nil {
		return len(t.lazy.offs) * t.lazy.slab
	}
	switch t.kind() {
	case kF32:
		return len(t.F32)
	case kF64:
		return len(t.F64)
	case kI64:
		return len(t.I64)
	case kBool:
		return len(t.Bool)
	case kStr:
		return len(t.Str)
	}
	return 0
}

// Rank returns the number of dimensions.
func (t *Tensor) Rank() int { return len(t.Shape) }

// ByteSize estimates the memory the tensor's data occupies in this
// interpreter (not its ONNX storage size).
func (t *Tensor) ByteSize() int64 {
	if t.Seq != nil {
		var b int64
		for _, e := range t.Seq {
			b += e.ByteSize()
		}
		return b
	}
	if t.lazy != nil { // the offsets, and the source it keeps alive
		return 8*int64(len(t.lazy.offs)) + t.lazy.src.ByteSize()
	}
	switch t.kind() {
	case kF32:
		return 4 * int64(len(t.F32))
	case kF64, kI64:
		return 8 * int64(t.Len())
	case kBool:
		return int64(len(t.Bool))
	case kStr:
		n := int64(16 * len(t.Str))
		for _, s := range t.Str {
			n += int64(len(s))
		}
		return n
	}
	return 0
}

// Clone returns a deep copy.
func (t *Tensor) Clone() *Tensor {
	c := &Tensor{DType: t.DType, Shape: append([]int{}, t.Shape...)}
	if t.F32 != nil {
		c.F32 = append([]float32{}, t.F32...)
	}
	if t.F64 != nil {
		c.F64 = append([]float64{}, t.F64...)
	}
	if t.I64 != nil {
		c.I64 = append([]int64{}, t.I64...)
	}
	if t.Bool != nil {
		c.Bool = append([]bool{}, t.Bool...)
	}
	if t.Str != nil {
		c.Str = append([]string{}, t.Str...)
	}
	return c
}

// view returns a tensor sharing t's data with another shape (same size).
func (t *Tensor) view(shape []int) *Tensor {
	c := *t
	c.Shape = append([]int{}, shape...)
	return &c
}

// Float64At returns element i converted to float64 (bool: 0/1; string: NaN).
func (t *Tensor) Float64At(i int) float64 {
	switch t.kind() {
	case kF32:
		return float64(t.F32[i])
	case kF64:
		return t.F64[i]
	case kI64:
		if t.DType == pb.TensorProto_UINT64 {
			return float64(uint64(t.I64[i]))
		}
		return float64(t.I64[i])
	case kBool:
		if t.Bool[i] {
			return 1
		}
		return 0
	}
	return math.NaN()
}

// Float64s returns all elements converted to float64.
func (t *Tensor) Float64s() []float64 {
	out := make([]float64, t.Len())
	for i := range out {
		out[i] = t.Float64At(i)
	}
	return out
}

// Int64s returns all elements converted to int64 (floats truncate).
func (t *Tensor) Int64s() []int64 {
	switch t.kind() {
	case kI64:
		return t.I64
	}
	out := make([]int64, t.Len())
	for i := range out {
		out[i] = int64(t.Float64At(i))
	}
	return out
}

// Strides returns the row-major strides of shape.
func Strides(shape []int) []int {
	s := make([]int, len(shape))
	acc := 1
	for i := len(shape) - 1; i >= 0; i-- {
		s[i] = acc
		acc *= shape[i]
	}
	return s
}

// Unravel converts a flat row-major index into a multi-index of shape.
func Unravel(flat int, shape []int) []int {
	idx := make([]int, len(shape))
	for i := len(shape) - 1; i >= 0; i-- {
		if shape[i] > 0 {
			idx[i] = flat % shape[i]
			flat /= shape[i]
		}
	}
	return idx
}

// String summarises the tensor: type, shape and up to 8 values.
func (t *Tensor) String() string {
	var b strings.Builder
	fmt.Fprintf(&b, "%s%v[", t.DType, t.Shape)
	n := t.Len()
	for i := 0; i < n && i < 8; i++ {
		if i > 0 {
			b.WriteString(" ")
		}
		if t.kind() == kStr {
			fmt.Fprintf(&b, "%q", t.Str[i])
		} else {
			fmt.Fprintf(&b, "%g", t.Float64At(i))
		}
	}
	if n > 8 {
		b.WriteString(" ...")
	}
	b.WriteString("]")
	return b.String()
}

// normalize rounds narrow float results to their precision and wraps narrow
// integer results to their range, in place.
func (t *Tensor) normalize() {
	switch t.DType {
	case pb.TensorProto_FLOAT16:
		for i, v := range t.F32 {
			t.F32[i] = roundHalf(v)
		}
	case pb.TensorProto_BFLOAT16:
		for i, v := range t.F32 {
			t.F32[i] = roundBF16(v)
		}
	case pb.TensorProto_FLOAT8E4M3FN, pb.TensorProto_FLOAT8E4M3FNUZ, pb.TensorProto_FLOAT8E5M2, pb.TensorProto_FLOAT8E5M2FNUZ:
		f := f8formats[t.DType]
		for i, v := range t.F32 {
			t.F32[i] = f.round(v)
		}
	case pb.TensorProto_INT8:
		for i, v := range t.I64 {
			t.I64[i] = int64(int8(v))
		}
	case pb.TensorProto_INT16:
		for i, v := range t.I64 {
			t.I64[i] = int64(int16(v))
		}
	case pb.TensorProto_INT32:
		for i, v := range t.I64 {
			t.I64[i] = int64(int32(v))
		}
	case pb.TensorProto_UINT8:
		for i, v := range t.I64 {
			t.I64[i] = int64(uint8(v))
		}
	case pb.TensorProto_UINT16:
		for i, v := range t.I64 {
			t.I64[i] = int64(uint16(v))
		}
	case pb.TensorProto_UINT32:
		for i, v := range t.I64 {
			t.I64[i] = int64(uint32(v))
		}
	}
}

func isNarrow(dt pb.TensorProto_DataType) bool {
	switch dt {
	case pb.TensorProto_FLOAT16, pb.TensorProto_BFLOAT16, pb.TensorProto_INT8, pb.TensorProto_INT16,
		pb.TensorProto_INT32, pb.TensorProto_UINT8, pb.TensorProto_UINT16, pb.TensorProto_UINT32,
		pb.TensorProto_FLOAT8E4M3FN, pb.TensorProto_FLOAT8E4M3FNUZ, pb.TensorProto_FLOAT8E5M2, pb.TensorProto_FLOAT8E5M2FNUZ:
		return true
	}
	return false
}

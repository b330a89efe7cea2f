package eval

import (
	"math"

	pb "github.com/mokopt/mokopt/graph/onnxpb"
)

// intRange is the range QuantizeLinear saturates to, by integer type.
var intRange = map[pb.TensorProto_DataType][2]int64{
	pb.TensorProto_INT8:   {math.MinInt8, math.MaxInt8},
	pb.TensorProto_UINT8:  {0, math.MaxUint8},
	pb.TensorProto_INT16:  {math.MinInt16, math.MaxInt16},
	pb.TensorProto_UINT16: {0, math.MaxUint16},
	pb.TensorProto_INT32:  {math.MinInt32, math.MaxInt32},
}

// quantParams checks the scale and zero point of a QuantizeLinear or
// DequantizeLinear of x: per tensor (a scalar or a one-element 1-D
// scale) or per axis (a 1-D scale as long as x's axis); blocked
// quantization (block_size) is not supported. It returns the function
// giving element i's index into them.
func quantParams(n *pb.NodeProto, x, scale, zp *Tensor) (func(i int) int, error) {
	if attrInt(n, "block_size", 0) != 0 {
		return nil, errf("blocked quantization (block_size %d) is not supported", attrInt(n, "block_size", 0))
	}
	if zp != nil && numel(zp.Shape) != numel(scale.Shape) {
		return nil, errf("zero point shape %v differs from scale shape %v", zp.Shape, scale.Shape)
	}
	if len(scale.Shape) == 0 || numel(scale.Shape) == 1 && len(scale.Shape) == 1 {
		return func(int) int { return 0 }, nil
	}
	if len(scale.Shape) != 1 {
		return nil, errf("scale of shape %v: want a scalar or a 1-D per-axis scale", scale.Shape)
	}
	axis, err := normAxis(attrInt(n, "axis", 1), len(x.Shape))
	if err != nil {
		return nil, err
	}
	if x.Shape[axis] != scale.Shape[0] {
		return nil, errf("scale of %d values for axis %d of length %d", scale.Shape[0], axis, x.Shape[axis])
	}
	stride := numel(x.Shape[axis+1:])
	dim := x.Shape[axis]
	return func(i int) int { return i / stride % dim }, nil
}

// zeroAt returns zero point j (0 without one).
func zeroAt(zp *Tensor, j int) float64 {
	if zp == nil {
		return 0
	}
	return zp.Float64At(j)
}

// kDequantizeLinear is y = (x - zero_point) · scale, in the scale's type.
func kDequantizeLinear(c *OpContext, n *pb.NodeProto, in []*Tensor) ([]*Tensor, error) {
	x, scale, err := need2(in)
	if err != nil {
		return nil, err
	}
	zp := opt(in, 2)
	if !isFloat(scale.DType) {
		return nil, errf("scale of type %s: want a float type", scale.DType)
	}
	if x.Str != nil || x.Bool != nil {
		return nil, errf("cannot dequantize %s", x.DType)
	}
	at, err := quantParams(n, x, scale, zp)
	if err != nil {
		return nil, err
	}
	if err := c.checkAlloc(scale.DType, x.Shape); err != nil {
		return nil, err
	}
	out := New(scale.DType, x.Shape)
	for i := range numel(x.Shape) {
		j := at(i)
		v := (x.Float64At(i) - zeroAt(zp, j)) * scale.Float64At(j)
		if out.F64 != nil {
			out.F64[i] = v
		} else {
			out.F32[i] = float32(v)
		}
	}
	out.normalize()
	return []*Tensor{out}, nil
}

// kQuantizeLinear is y = saturate(round_half_even(x / scale) + zero_point)
// in the zero point's integer type (output_dtype, or uint8, without one).
func kQuantizeLinear(c *OpContext, n *pb.NodeProto, in []*Tensor) ([]*Tensor, error) {
	x, scale, err := need2(in)
	if err != nil {
		return nil, err
	}
	zp := opt(in, 2)
	if !isFloat(x.DType) || !isFloat(scale.DType) {
		return nil, errf("QuantizeLinear of %s by a %s scale: want float types", x.DType, scale.DType)
	}
	dt := pb.TensorProto_DataType(attrInt(n, "output_dtype", int64(pb.TensorProto_UINT8)))
	if zp != nil {
		dt = zp.DType
	}
	r, ok := intRange[dt]
	if !ok {
		return nil, errf("quantizing to %s is not supported (integer types of 8 to 32 bits are)", dt)
	}
	at, err := quantParams(n, x, scale, zp)
	if err != nil {
		return nil, err
	}
	if err := c.checkAlloc(dt, x.Shape); err != nil {
		return nil, err
	}
	out := New(dt, x.Shape)
	for i := range numel(x.Shape) {
		j := at(i)
		v := x.Float64At(i) / scale.Float64At(j)
		if x.F64 == nil { // the quotient in the input's precision, as the reference computes it
			v = float64(float32(x.Float64At(i)) / float32(scale.Float64At(j)))
		}
		q := math.RoundToEven(v) + zeroAt(zp, j)
		out.I64[i] = int64(math.Max(float64(r[0]), math.Min(float64(r[1]), q)))
	}
	return []*Tensor{out}, nil
}

func init() {
	builtin("", kDequantizeLinear, "DequantizeLinear")
	builtin("", kQuantizeLinear, "QuantizeLinear")
}

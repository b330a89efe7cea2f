package graph

import (
	"encoding/binary"
	"fmt"
	"math"
	"unsafe"

	pb "github.com/mokopt/mokopt/graph/onnxpb"
)

// ElemBits returns the storage size in bits of one element of the ONNX data
// type dt, or 0 for types without a fixed size (STRING, UNDEFINED).
func ElemBits(dt pb.TensorProto_DataType) int {
	switch dt {
	case pb.TensorProto_FLOAT, pb.TensorProto_INT32, pb.TensorProto_UINT32:
		return 32
	case pb.TensorProto_DOUBLE, pb.TensorProto_INT64, pb.TensorProto_UINT64, pb.TensorProto_COMPLEX64:
		return 64
	case pb.TensorProto_COMPLEX128:
		return 128
	case pb.TensorProto_FLOAT16, pb.TensorProto_BFLOAT16, pb.TensorProto_INT16, pb.TensorProto_UINT16:
		return 16
	case pb.TensorProto_INT8, pb.TensorProto_UINT8, pb.TensorProto_BOOL,
		pb.TensorProto_FLOAT8E4M3FN, pb.TensorProto_FLOAT8E4M3FNUZ, pb.TensorProto_FLOAT8E5M2,
		pb.TensorProto_FLOAT8E5M2FNUZ, pb.TensorProto_FLOAT8E8M0:
		return 8
	case pb.TensorProto_INT4, pb.TensorProto_UINT4, pb.TensorProto_FLOAT4E2M1:
		return 4
	case pb.TensorProto_INT2, pb.TensorProto_UINT2:
		return 2
	}
	return 0
}

// NumElements returns the product of dims, or an error if a dim is negative
// or the product overflows int64.
func NumElements(dims []int64) (int64, error) {
	n := int64(1)
	for _, d := range dims {
		if d < 0 {
			return 0, fmt.Errorf("negative dimension %d in %v", d, dims)
		}
		if d != 0 && n > math.MaxInt64/d {
			return 0, fmt.Errorf("dimensions %v overflow int64", dims)
		}
		n *= d
	}
	return n, nil
}

// ByteSize returns the number of bytes the raw data of a tensor with type dt
// and the given dims occupies (sub-byte types are packed, rounded up).
func ByteSize(dt pb.TensorProto_DataType, dims []int64) (int64, error) {
	n, err := NumElements(dims)
	if err != nil {
		return 0, err
	}
	bits := int64(ElemBits(dt))
	if bits == 0 {
		return 0, fmt.Errorf("data type %s has no fixed element size", dt)
	}
	if n > (math.MaxInt64-7)/bits {
		return 0, fmt.Errorf("dimensions %v overflow int64 bytes", dims)
	}
	return (n*bits + 7) / 8, nil
}

// HalfToFloat32 converts IEEE 754 binary16 bits to float32.
func HalfToFloat32(h uint16) float32 {
	sign := uint32(h>>15) << 31
	exp := uint32(h>>10) & 0x1f
	man := uint32(h) & 0x3ff
	switch {
	case exp == 0 && man == 0:
		return math.Float32frombits(sign)
	case exp == 0: // subnormal
		f := float32(man) / 1024 / 16384
		if sign != 0 {
			return -f
		}
		return f
	case exp == 0x1f:
		return math.Float32frombits(sign | 0x7f800000 | man<<13)
	}
	return math.Float32frombits(sign | (exp+112)<<23 | man<<13)
}

// BFloat16ToFloat32 converts bfloat16 bits to float32 (exact).
func BFloat16ToFloat32(b uint16) float32 { return math.Float32frombits(uint32(b) << 16) }

// Float32ToBFloat16 rounds a float32 to bfloat16 bits, nearest-even; NaN stays NaN.
func Float32ToBFloat16(f float32) uint16 {
	u := math.Float32bits(f)
	if u&0x7fffffff > 0x7f800000 {
		return uint16(u>>16) | 0x40
	}
	u += 0x7fff + (u>>16)&1
	return uint16(u >> 16)
}

// Float32ToHalf rounds a float32 to IEEE binary16 bits, nearest-even.
func Float32ToHalf(f float32) uint16 {
	u := math.Float32bits(f)
	sign := uint16(u>>16) & 0x8000
	a := u & 0x7fffffff
	switch {
	case a > 0x7f800000:
		return sign | 0x7e00
	case a >= 0x477ff000: // rounds to >= 65520 -> inf
		return sign | 0x7c00
	case a < 0x38800000: // subnormal or zero in half
		x := math.Float32frombits(a)
		m := float64(x) * (1 << 24)
		r := math.RoundToEven(m)
		return sign | uint16(r)
	}
	r := a + 0xfff + (a>>13)&1
	return sign | uint16((r-0x38000000)>>13)
}

// DecodeFloat32 converts little-endian raw bytes of a tensor of type dt to
// float32 values, for the numeric types the interpreter and lowering use.
func DecodeFloat32(dt pb.TensorProto_DataType, raw []byte) ([]float32, error) {
	size := ElemBits(dt) / 8
	switch dt {
	case pb.TensorProto_FLOAT, pb.TensorProto_DOUBLE, pb.TensorProto_FLOAT16, pb.TensorProto_BFLOAT16:
	default:
		return nil, fmt.Errorf("cannot decode %s as float32", dt)
	}
	out := make([]float32, len(raw)/size)
	if err := DecodeFloat32Into(dt, raw[:len(out)*size], out); err != nil {
		return nil, err
	}
	return out, nil
}

// DecodeFloat32Into is DecodeFloat32 into dst, which must hold exactly the
// values raw encodes: a caller that decodes one slice of a tensor after
// another reuses dst instead of allocating.
func DecodeFloat32Into(dt pb.TensorProto_DataType, raw []byte, dst []float32) error {
	var size int
	switch dt {
	case pb.TensorProto_FLOAT, pb.TensorProto_DOUBLE, pb.TensorProto_FLOAT16, pb.TensorProto_BFLOAT16:
		size = ElemBits(dt) / 8
	default:
		return fmt.Errorf("cannot decode %s as float32", dt)
	}
	if len(raw) != size*len(dst) {
		return fmt.Errorf("%d bytes of %s do not hold %d values", len(raw), dt, len(dst))
	}
	switch dt {
	case pb.TensorProto_FLOAT:
		if hostLittleEndian && len(dst) > 0 { // the same bytes: one copy
			copy(unsafe.Slice((*byte)(unsafe.Pointer(&dst[0])), 4*len(dst)), raw)
			return nil
		}
		for i := range dst {
			dst[i] = math.Float32frombits(binary.LittleEndian.Uint32(raw[4*i:]))
		}
	case pb.TensorProto_DOUBLE:
		for i := range dst {
			dst[i] = float32(math.Float64frombits(binary.LittleEndian.Uint64(raw[8*i:])))
		}
	case pb.TensorProto_FLOAT16:
		for i := range dst {
			dst[i] = HalfToFloat32(binary.LittleEndian.Uint16(raw[2*i:]))
		}
	case pb.TensorProto_BFLOAT16:
		for i := range dst {
			dst[i] = BFloat16ToFloat32(binary.LittleEndian.Uint16(raw[2*i:]))
		}
	}
	return nil
}

// EncodeFloat32Into writes v into dst as little-endian values of type dt
// (FLOAT, FLOAT16 or BFLOAT16; the half types rounded to nearest even,
// exactly v when its values came from dt): DecodeFloat32Into's inverse.
// dst must hold len(v) values of dt.
func EncodeFloat32Into(dt pb.TensorProto_DataType, dst []byte, v []float32) error {
	var enc func(float32) uint16
	switch dt {
	case pb.TensorProto_FLOAT:
		if len(dst) != 4*len(v) {
			return fmt.Errorf("%d bytes cannot hold %d values of %s", len(dst), len(v), dt)
		}
		if hostLittleEndian && len(v) > 0 {
			copy(dst, unsafe.Slice((*byte)(unsafe.Pointer(&v[0])), 4*len(v)))
			return nil
		}
		for i, x := range v {
			binary.LittleEndian.PutUint32(dst[4*i:], math.Float32bits(x))
		}
		return nil
	case pb.TensorProto_FLOAT16:
		enc = Float32ToHalf
	case pb.TensorProto_BFLOAT16:
		enc = Float32ToBFloat16
	default:
		return fmt.Errorf("cannot encode float32 as %s", dt)
	}
	if len(dst) != 2*len(v) {
		return fmt.Errorf("%d bytes cannot hold %d values of %s", len(dst), len(v), dt)
	}
	for i, x := range v {
		binary.LittleEndian.PutUint16(dst[2*i:], enc(x))
	}
	return nil
}

// DataType returns t's element type as the enum (TensorProto stores it as int32).
func DataType(t *pb.TensorProto) pb.TensorProto_DataType {
	return pb.TensorProto_DataType(t.GetDataType())
}

// hostLittleEndian reports whether this machine stores numbers as ONNX's
// raw data does (little-endian).
var hostLittleEndian = func() bool {
	v := uint16(1)
	return *(*byte)(unsafe.Pointer(&v)) == 1
}()

// CoarserHalf returns the coarser of the 16-bit float types among have and
// dt: BFLOAT16 (8 significand bits) over FLOAT16 (11) over anything else,
// which gives UNDEFINED. Folded over a block's weights, it names the least
// precise half type they are stored in.
func CoarserHalf(have, dt pb.TensorProto_DataType) pb.TensorProto_DataType {
	switch {
	case have == pb.TensorProto_BFLOAT16 || dt == pb.TensorProto_BFLOAT16:
		return pb.TensorProto_BFLOAT16
	case have == pb.TensorProto_FLOAT16 || dt == pb.TensorProto_FLOAT16:
		return pb.TensorProto_FLOAT16
	}
	return pb.TensorProto_UNDEFINED
}

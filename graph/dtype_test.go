package graph

import (
	"math"
	"testing"

	pb "github.com/mokopt/mokopt/graph/onnxpb"
)

// TestCoarserHalf: bfloat16 wins over float16, which wins over any other
// type; two others give UNDEFINED, whatever the order.
func TestCoarserHalf(t *testing.T) {
	const (
		bf  = pb.TensorProto_BFLOAT16
		f16 = pb.TensorProto_FLOAT16
		f32 = pb.TensorProto_FLOAT
		und = pb.TensorProto_UNDEFINED
	)
	for _, c := range []struct{ a, b, want pb.TensorProto_DataType }{
		{und, bf, bf}, {und, f16, f16}, {und, f32, und}, {f16, bf, bf}, {bf, f16, bf},
		{f16, f32, f16}, {f32, f16, f16}, {bf, f32, bf}, {f32, f32, und}, {und, und, und},
	} {
		if got := CoarserHalf(c.a, c.b); got != c.want {
			t.Errorf("CoarserHalf(%v, %v) = %v, want %v", c.a, c.b, got, c.want)
		}
	}
}

// TestDecodeFloat32Into: decoding into a given slice gives DecodeFloat32's
// values bit for bit for every float type, and a slice of another length or
// a type without a float32 decoding is refused.
func TestDecodeFloat32Into(t *testing.T) {
	raw := make([]byte, 48)
	for i := range raw {
		raw[i] = byte(37*i + 11)
	}
	for _, dt := range []pb.TensorProto_DataType{pb.TensorProto_FLOAT, pb.TensorProto_DOUBLE, pb.TensorProto_FLOAT16, pb.TensorProto_BFLOAT16} {
		want, err := DecodeFloat32(dt, raw)
		if err != nil {
			t.Fatal(err)
		}
		if len(want) != 48/(ElemBits(dt)/8) {
			t.Fatalf("%v: DecodeFloat32 gave %d values", dt, len(want))
		}
		got := make([]float32, len(want))
		if err := DecodeFloat32Into(dt, raw, got); err != nil {
			t.Fatal(err)
		}
		for i := range want {
			if math.Float32bits(got[i]) != math.Float32bits(want[i]) {
				t.Fatalf("%v: value %d is %g, DecodeFloat32 gives %g", dt, i, got[i], want[i])
			}
		}
		if err := DecodeFloat32Into(dt, raw, got[1:]); err == nil {
			t.Errorf("%v: a slice one value short was accepted", dt)
		}
	}
	if err := DecodeFloat32Into(pb.TensorProto_INT64, raw, make([]float32, 6)); err == nil {
		t.Error("int64 decoded as float32")
	}
}

// TestEncodeFloat32IntoRoundTrips: encoding values of each float type and
// decoding them gives the same values, bit for bit; the wrong size and an
// unsupported type are errors.
func TestEncodeFloat32IntoRoundTrips(t *testing.T) {
	v := []float32{0, -0.5, 1.25, 3.5e4, -65504, 1e-3, float32(math.Inf(1))}
	for _, dt := range []pb.TensorProto_DataType{pb.TensorProto_FLOAT, pb.TensorProto_FLOAT16, pb.TensorProto_BFLOAT16} {
		want := make([]float32, len(v))
		for i, x := range v { // the values dt holds
			switch dt {
			case pb.TensorProto_FLOAT16:
				want[i] = HalfToFloat32(Float32ToHalf(x))
			case pb.TensorProto_BFLOAT16:
				want[i] = BFloat16ToFloat32(Float32ToBFloat16(x))
			default:
				want[i] = x
			}
		}
		raw := make([]byte, ElemBits(dt)/8*len(want))
		if err := EncodeFloat32Into(dt, raw, want); err != nil {
			t.Fatal(err)
		}
		got, err := DecodeFloat32(dt, raw)
		if err != nil {
			t.Fatal(err)
		}
		for i := range want {
			if math.Float32bits(got[i]) != math.Float32bits(want[i]) {
				t.Errorf("%s: value %d round-trips to %g, want %g", dt, i, got[i], want[i])
			}
		}
		if EncodeFloat32Into(dt, raw[1:], want) == nil {
			t.Errorf("%s: a short buffer encoded", dt)
		}
	}
	if EncodeFloat32Into(pb.TensorProto_INT8, make([]byte, 1), []float32{1}) == nil {
		t.Error("INT8 encoded")
	}
}

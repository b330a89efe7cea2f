package graph

import (
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

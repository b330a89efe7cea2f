package eval

import (
	"testing"

	pb "github.com/mokopt/mokopt/graph/onnxpb"
)

// TestNewFloatAs: values are rounded to the type's precision (round to
// nearest even), the type and shape are kept, and float32 is left exact.
func TestNewFloatAs(t *testing.T) {
	tests := []struct {
		dt       pb.TensorProto_DataType
		in, want float32
	}{
		{pb.TensorProto_FLOAT, 1.0001, 1.0001},
		{pb.TensorProto_FLOAT16, 1.0001, 1},                 // spacing 2^-10 at 1
		{pb.TensorProto_FLOAT16, 1 + 3.0/2048, 1 + 1.0/512}, // 1.5 units: to even
		{pb.TensorProto_BFLOAT16, 1.001, 1},                 // spacing 2^-7 at 1
		{pb.TensorProto_BFLOAT16, 1 + 3.0/256, 1 + 1.0/64},
	}
	for _, tc := range tests {
		x := NewFloatAs(tc.dt, []int{1}, []float32{tc.in})
		if x.DType != tc.dt || len(x.Shape) != 1 || x.F32[0] != tc.want {
			t.Errorf("NewFloatAs(%s, %v) = %s %v %v, want %v", tc.dt, tc.in, x.DType, x.Shape, x.F32, tc.want)
		}
	}
}

package eval

import (
	"slices"
	"strings"
	"testing"

	"github.com/mokopt/mokopt/graph"
	pb "github.com/mokopt/mokopt/graph/onnxpb"
)

func ints(dt pb.TensorProto_DataType, shape []int, v ...int64) *Tensor {
	t := New(dt, shape)
	copy(t.I64, v)
	return t
}

// TestQuantizeDequantize checks QuantizeLinear and DequantizeLinear against
// values worked out by hand from the ONNX definitions: round half to even,
// saturation to the zero point's type, per-axis scales, the scale's type
// for the dequantized output.
func TestQuantizeDequantize(t *testing.T) {
	f := func(shape []int, v ...float32) *Tensor { return NewFloat32(shape, v) }
	cases := []struct {
		name  string
		op    string
		attrs []*pb.AttributeProto
		in    []*Tensor
		want  *Tensor
		err   string
	}{
		{"quantize uint8 by default, half to even, saturating", "QuantizeLinear", nil,
			[]*Tensor{f([]int{6}, 0, 1, 3, 5, 600, -7), f(nil, 2)},
			ints(pb.TensorProto_UINT8, []int{6}, 0, 0, 2, 2, 255, 0), ""},
		{"quantize int8 with a zero point", "QuantizeLinear", nil,
			[]*Tensor{f([]int{4}, 0, 1, -300, 2.5), f(nil, 0.5), ints(pb.TensorProto_INT8, nil, 3)},
			ints(pb.TensorProto_INT8, []int{4}, 3, 5, -128, 8), ""},
		{"quantize per axis 0", "QuantizeLinear", []*pb.AttributeProto{graph.IntAttr("axis", 0)},
			[]*Tensor{f([]int{2, 2}, 4, 8, 4, 8), f([]int{2}, 1, 4), ints(pb.TensorProto_UINT8, []int{2}, 0, 10)},
			ints(pb.TensorProto_UINT8, []int{2, 2}, 4, 8, 11, 12), ""},
		{"dequantize int8 per axis 1", "DequantizeLinear", nil,
			[]*Tensor{ints(pb.TensorProto_INT8, []int{2, 2}, -2, 4, 6, -8), f([]int{2}, 0.5, 2), ints(pb.TensorProto_INT8, []int{2}, 0, 1)},
			f([]int{2, 2}, -1, 6, 3, -18), ""},
		{"dequantize to the scale's float16", "DequantizeLinear", nil,
			[]*Tensor{ints(pb.TensorProto_UINT8, []int{1}, 255), &Tensor{DType: pb.TensorProto_FLOAT16, F32: []float32{0.1}}},
			&Tensor{DType: pb.TensorProto_FLOAT16, Shape: []int{1}, F32: []float32{roundHalf(float32(255 * float64(float32(0.1))))}}, ""},
		{"blocked quantization refused", "DequantizeLinear", []*pb.AttributeProto{graph.IntAttr("block_size", 2)},
			[]*Tensor{ints(pb.TensorProto_INT8, []int{2, 2}, 1, 2, 3, 4), f([]int{2, 1}, 1, 1)}, nil, "block_size"},
		{"scale not matching the axis", "DequantizeLinear", nil,
			[]*Tensor{ints(pb.TensorProto_INT8, []int{2, 2}, 1, 2, 3, 4), f([]int{3}, 1, 1, 1)}, nil, "axis"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			out, err := runOp(t, 19, c.op, c.attrs, 1, c.in...)
			if c.err != "" {
				if err == nil || !strings.Contains(err.Error(), c.err) {
					t.Fatalf("error %v, want one naming %q", err, c.err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			got := out[0]
			if got.DType != c.want.DType || !slices.Equal(got.Shape, c.want.Shape) || !slices.Equal(got.I64, c.want.I64) || !slices.Equal(got.F32, c.want.F32) {
				t.Fatalf("got %s %v %v %v, want %s %v %v %v", got.DType, got.Shape, got.I64, got.F32, c.want.DType, c.want.Shape, c.want.I64, c.want.F32)
			}
		})
	}
}

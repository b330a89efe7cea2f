package eval

import (
	"testing"

	"github.com/mokopt/mokopt/graph"
	pb "github.com/mokopt/mokopt/graph/onnxpb"
	"google.golang.org/protobuf/proto"
)

func seqF32(shape ...int) *Tensor {
	t := New(pb.TensorProto_FLOAT, shape)
	for i := range t.F32 {
		t.F32[i] = float32(i)
	}
	return t
}

func TestShapeOps(t *testing.T) {
	x23 := seqF32(2, 3)
	runCases(t, []opCase{
		{name: "reshape infer", op: "Reshape", in: ins(x23, i64(sh(2), 3, -1)), want: outs(f32(sh(3, 2), 0, 1, 2, 3, 4, 5))},
		{name: "reshape copy zero", op: "Reshape", in: ins(x23, i64(sh(3), 0, 3, 1)), want: outs(f32(sh(2, 3, 1), 0, 1, 2, 3, 4, 5))},
		{name: "reshape allowzero", op: "Reshape", attrs: attrs(ia("allowzero", 1)), in: ins(f32(sh(0, 3)), i64(sh(2), 3, 0)), want: outs(f32(sh(3, 0)))},
		{name: "reshape bad", op: "Reshape", in: ins(x23, i64(sh(1), 4)), wantErr: true},
		{name: "reshape two -1", op: "Reshape", in: ins(x23, i64(sh(2), -1, -1)), wantErr: true},
		{name: "expand", op: "Expand", in: ins(f32(sh(2, 1), 1, 2), i64(sh(2), 2, 3)), want: outs(f32(sh(2, 3), 1, 1, 1, 2, 2, 2))},
		{name: "expand lower rank shape", op: "Expand", in: ins(f32(sh(2, 1), 1, 2), i64(sh(1), 2)), want: outs(f32(sh(2, 2), 1, 1, 2, 2))},
		{name: "tile", op: "Tile", in: ins(f32(sh(2), 1, 2), i64(sh(1), 3)), want: outs(f32(sh(6), 1, 2, 1, 2, 1, 2))},
		{name: "tile 2d", op: "Tile", in: ins(f32(sh(1, 2), 1, 2), i64(sh(2), 2, 1)), want: outs(f32(sh(2, 2), 1, 2, 1, 2))},
		{name: "transpose default", op: "Transpose", in: ins(x23), want: outs(f32(sh(3, 2), 0, 3, 1, 4, 2, 5))},
		{name: "transpose perm", op: "Transpose", attrs: attrs(isa("perm", 1, 0, 2)), in: ins(seqF32(2, 2, 1)), want: outs(f32(sh(2, 2, 1), 0, 2, 1, 3))},
		{name: "transpose bad perm", op: "Transpose", attrs: attrs(isa("perm", 0, 0)), in: ins(x23), wantErr: true},
		{name: "split input", op: "Split", attrs: attrs(ia("axis", 1)), in: ins(x23, i64(sh(2), 1, 2)),
			want: outs(f32(sh(2, 1), 0, 3), f32(sh(2, 2), 1, 2, 4, 5))},
		{name: "split attr opset 11", op: "Split", opset: 11, attrs: attrs(isa("split", 2, 1), ia("axis", 1)), in: ins(x23),
			want: outs(f32(sh(2, 2), 0, 1, 3, 4), f32(sh(2, 1), 2, 5))},
		{name: "split equal", op: "Split", in: ins(seqF32(4)), want: outs(f32(sh(2), 0, 1), f32(sh(2), 2, 3))},
		{name: "split num_outputs uneven", op: "Split", attrs: attrs(ia("num_outputs", 2)), in: ins(seqF32(5)), want: outs(f32(sh(3), 0, 1, 2), f32(sh(2), 3, 4))},
		{name: "split bad sum", op: "Split", in: ins(seqF32(4), i64(sh(2), 1, 1)), want: outs(nil, nil), wantErr: true},
		{name: "slice", op: "Slice", in: ins(seqF32(6), i64(sh(1), 1), i64(sh(1), 4)), want: outs(f32(sh(3), 1, 2, 3))},
		{name: "slice axes steps", op: "Slice", in: ins(x23, i64(sh(1), 0), i64(sh(1), 100), i64(sh(1), 1), i64(sh(1), 2)), want: outs(f32(sh(2, 2), 0, 2, 3, 5))},
		{name: "slice negative step", op: "Slice", in: ins(seqF32(5), i64(sh(1), -1), i64(sh(1), -100), i64(sh(1), 0), i64(sh(1), -2)), want: outs(f32(sh(3), 4, 2, 0))},
		{name: "slice int64 max end", op: "Slice", in: ins(seqF32(4), i64(sh(1), 2), i64(sh(1), 1<<62)), want: outs(f32(sh(2), 2, 3))},
		{name: "slice empty", op: "Slice", in: ins(seqF32(4), i64(sh(1), 3), i64(sh(1), 1)), want: outs(f32(sh(0)))},
		{name: "slice opset 9 attrs", op: "Slice", opset: 9, attrs: attrs(isa("starts", 1), isa("ends", 3), isa("axes", 1)), in: ins(x23), want: outs(f32(sh(2, 2), 1, 2, 4, 5))},
		{name: "concat", op: "Concat", attrs: attrs(ia("axis", -1)), in: ins(f32(sh(2, 1), 1, 2), x23), want: outs(f32(sh(2, 4), 1, 0, 1, 2, 2, 3, 4, 5))},
		{name: "concat mismatch", op: "Concat", attrs: attrs(ia("axis", 0)), in: ins(f32(sh(2, 1), 1, 2), x23), wantErr: true},
		{name: "squeeze all", op: "Squeeze", in: ins(f32(sh(1, 2, 1), 1, 2)), want: outs(f32(sh(2), 1, 2))},
		{name: "squeeze axes input", op: "Squeeze", in: ins(f32(sh(1, 2, 1), 1, 2), i64(sh(1), -1)), want: outs(f32(sh(1, 2), 1, 2))},
		{name: "squeeze axes attr opset 11", op: "Squeeze", opset: 11, attrs: attrs(isa("axes", 0)), in: ins(f32(sh(1, 2, 1), 1, 2)), want: outs(f32(sh(2, 1), 1, 2))},
		{name: "squeeze non-1", op: "Squeeze", in: ins(f32(sh(1, 2), 1, 2), i64(sh(1), 1)), wantErr: true},
		{name: "unsqueeze input", op: "Unsqueeze", in: ins(f32(sh(2), 1, 2), i64(sh(2), 0, -1)), want: outs(f32(sh(1, 2, 1), 1, 2))},
		{name: "unsqueeze attr opset 11", op: "Unsqueeze", opset: 11, attrs: attrs(isa("axes", 1)), in: ins(f32(sh(2), 1, 2)), want: outs(f32(sh(2, 1), 1, 2))},
		{name: "flatten", op: "Flatten", attrs: attrs(ia("axis", 2)), in: ins(seqF32(2, 3, 4)), want: outs(seqF32(6, 4))},
		{name: "flatten zero", op: "Flatten", attrs: attrs(ia("axis", 0)), in: ins(x23), want: outs(seqF32(1, 6))},
		{name: "shape", op: "Shape", in: ins(seqF32(2, 3, 4)), want: outs(i64(sh(3), 2, 3, 4))},
		{name: "shape start end", op: "Shape", attrs: attrs(ia("start", 1), ia("end", -1)), in: ins(seqF32(2, 3, 4)), want: outs(i64(sh(1), 3))},
		{name: "size", op: "Size", in: ins(seqF32(2, 3, 4)), want: outs(i64(nil, 24))},
		{name: "constantofshape default", op: "ConstantOfShape", in: ins(i64(sh(2), 1, 2)), want: outs(f32(sh(1, 2), 0, 0))},
		{name: "constantofshape value", op: "ConstantOfShape", attrs: attrs(graph.TensorAttr("value", &pb.TensorProto{DataType: proto.Int32(int32(pb.TensorProto_INT64)), Dims: []int64{1}, Int64Data: []int64{7}})),
			in: ins(i64(sh(1), 3)), want: outs(i64(sh(3), 7, 7, 7))},
		{name: "range int", op: "Range", in: ins(i64(nil, 1), i64(nil, 10), i64(nil, 3)), want: outs(i64(sh(3), 1, 4, 7))},
		{name: "range float negative", op: "Range", in: ins(f32(nil, 1), f32(nil, 0), f32(nil, -0.25)), want: outs(f32(sh(4), 1, 0.75, 0.5, 0.25))},
		{name: "range empty", op: "Range", in: ins(i64(nil, 5), i64(nil, 1), i64(nil, 1)), want: outs(i64(sh(0)))},
		{name: "trilu upper", op: "Trilu", in: ins(seqF32(3, 3)), want: outs(f32(sh(3, 3), 0, 1, 2, 0, 4, 5, 0, 0, 8))},
		{name: "trilu lower k", op: "Trilu", attrs: attrs(ia("upper", 0)), in: ins(seqF32(3, 3), i64(nil, -1)), want: outs(f32(sh(3, 3), 0, 0, 0, 3, 0, 0, 6, 7, 0))},
		{name: "identity", op: "Identity", in: ins(x23), want: outs(x23)},
		{name: "dropout inference", op: "Dropout", in: ins(x23), want: outs(x23, bl(sh(2, 3), true, true, true, true, true, true))},
		{name: "pad constant", op: "Pad", in: ins(f32(sh(2), 1, 2), i64(sh(2), 1, 2), f32(nil, 9)), want: outs(f32(sh(5), 9, 1, 2, 9, 9))},
		{name: "pad reflect", op: "Pad", attrs: attrs(sa("mode", "reflect")), in: ins(f32(sh(3), 1, 2, 3), i64(sh(2), 2, 1)), want: outs(f32(sh(6), 3, 2, 1, 2, 3, 2))},
		{name: "pad edge", op: "Pad", attrs: attrs(sa("mode", "edge")), in: ins(f32(sh(2), 1, 2), i64(sh(2), 1, 1)), want: outs(f32(sh(4), 1, 1, 2, 2))},
	})
}

func TestConstantOp(t *testing.T) {
	tp := &pb.TensorProto{DataType: proto.Int32(int32(pb.TensorProto_FLOAT)), Dims: []int64{2}, FloatData: []float32{1, 2}}
	runCases(t, []opCase{
		{name: "value", op: "Constant", attrs: attrs(graph.TensorAttr("value", tp)), want: outs(f32(sh(2), 1, 2))},
		{name: "value_float", op: "Constant", attrs: attrs(fa("value_float", 1.5)), want: outs(f32(nil, 1.5))},
		{name: "value_floats", op: "Constant", attrs: attrs(&pb.AttributeProto{Name: proto.String("value_floats"), Type: pb.AttributeProto_FLOATS.Enum(), Floats: []float32{1, 2}}), want: outs(f32(sh(2), 1, 2))},
		{name: "value_int", op: "Constant", attrs: attrs(ia("value_int", 3)), want: outs(i64(nil, 3))},
		{name: "value_ints", op: "Constant", attrs: attrs(isa("value_ints", 3, 4)), want: outs(i64(sh(2), 3, 4))},
		{name: "no value", op: "Constant", wantErr: true},
	})
}

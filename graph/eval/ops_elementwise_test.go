package eval

import (
	"math"
	"slices"
	"testing"

	pb "github.com/mokopt/mokopt/graph/onnxpb"
)

func TestBroadcastShapes(t *testing.T) {
	cases := []struct {
		in      [][]int
		want    []int
		wantErr bool
	}{
		{[][]int{{2, 3}, {3}}, []int{2, 3}, false},
		{[][]int{{2, 1, 4}, {3, 1}}, []int{2, 3, 4}, false},
		{[][]int{{}, {5}}, []int{5}, false},
		{[][]int{{1}, {0}}, []int{0}, false},
		{[][]int{{2, 3}, {2}}, nil, true},
		{[][]int{{4, 1}, {1, 5}, {5}}, []int{4, 5}, false},
	}
	for _, c := range cases {
		got, err := BroadcastShapes(c.in...)
		if (err != nil) != c.wantErr || (!c.wantErr && !slices.Equal(got, c.want)) {
			t.Errorf("BroadcastShapes(%v) = %v, %v; want %v (err %v)", c.in, got, err, c.want, c.wantErr)
		}
	}
}

func TestBcastIndex(t *testing.T) {
	cases := []struct {
		in, out []int
		want    []int
	}{
		{[]int{3}, []int{2, 3}, []int{0, 1, 2, 0, 1, 2}},
		{[]int{2, 1}, []int{2, 3}, []int{0, 0, 0, 1, 1, 1}},
		{[]int{1}, []int{2, 2}, []int{0, 0, 0, 0}},
		{[]int{2, 1, 2}, []int{2, 2, 2}, []int{0, 1, 0, 1, 2, 3, 2, 3}},
	}
	for _, c := range cases {
		got := bcastIndex(c.in, c.out)
		if len(got) != len(c.want) {
			t.Fatalf("bcastIndex(%v, %v) = %v, want %v", c.in, c.out, got, c.want)
		}
		for i := range got {
			if got[i] != c.want[i] {
				t.Fatalf("bcastIndex(%v, %v) = %v, want %v", c.in, c.out, got, c.want)
			}
		}
	}
	if bcastIndex([]int{2, 3}, []int{2, 3}) != nil {
		t.Error("identity broadcast should return nil")
	}
}

func TestArithmeticOps(t *testing.T) {
	nan := float32(math.NaN())
	runCases(t, []opCase{
		{name: "add broadcast", op: "Add", in: ins(f32(sh(2, 2), 1, 2, 3, 4), f32(sh(2), 10, 20)), want: outs(f32(sh(2, 2), 11, 22, 13, 24))},
		{name: "add scalar", op: "Add", in: ins(f32(nil, 1), f32(sh(3), 1, 2, 3)), want: outs(f32(sh(3), 2, 3, 4))},
		{name: "add shape error", op: "Add", in: ins(f32(sh(2), 1, 2), f32(sh(3), 1, 2, 3)), wantErr: true},
		{name: "add type mismatch", op: "Add", in: ins(f32(sh(1), 1), i64(sh(1), 1)), wantErr: true},
		{name: "sub int", op: "Sub", in: ins(i64(sh(2), 5, 7), i64(sh(2), 10, 2)), want: outs(i64(sh(2), -5, 5))},
		{name: "mul double", op: "Mul", in: ins(f64(sh(2), 1.5, 2), f64(sh(1), 2)), want: outs(f64(sh(2), 3, 4))},
		{name: "div float", op: "Div", in: ins(f32(sh(2), 1, 3), f32(sh(2), 2, 4)), want: outs(f32(sh(2), 0.5, 0.75))},
		{name: "div int truncates", op: "Div", in: ins(i64(sh(2), 7, -7), i64(sh(2), 2, 2)), want: outs(i64(sh(2), 3, -3))},
		{name: "div int by zero", op: "Div", in: ins(i64(sh(1), 7), i64(sh(1), 0)), wantErr: true},
		{name: "int32 wraps", op: "Add", in: ins(typed(pb.TensorProto_INT32, sh(1), math.MaxInt32), typed(pb.TensorProto_INT32, sh(1), 1)),
			want: outs(typed(pb.TensorProto_INT32, sh(1), math.MinInt32))},
		{name: "uint8 wraps", op: "Sub", in: ins(typed(pb.TensorProto_UINT8, sh(1), 1), typed(pb.TensorProto_UINT8, sh(1), 2)),
			want: outs(typed(pb.TensorProto_UINT8, sh(1), 255))},
		{name: "pow float", op: "Pow", in: ins(f32(sh(3), 2, 3, 4), f32(sh(1), 2)), want: outs(f32(sh(3), 4, 9, 16))},
		{name: "pow int exponent", op: "Pow", in: ins(f32(sh(2), 2, 9), i64(sh(2), 3, 0)), want: outs(f32(sh(2), 8, 1))},
		{name: "pow int base", op: "Pow", in: ins(i64(sh(2), 2, 3), i64(sh(2), 10, 2)), want: outs(i64(sh(2), 1024, 9))},
		{name: "mod python sign", op: "Mod", in: ins(i64(sh(4), 5, -5, 5, -5), i64(sh(4), 3, 3, -3, -3)), want: outs(i64(sh(4), 2, 1, -1, -2))},
		{name: "mod fmod", op: "Mod", attrs: attrs(ia("fmod", 1)), in: ins(f32(sh(2), 5.5, -5.5), f32(sh(2), 2, 2)), want: outs(f32(sh(2), 1.5, -1.5))},
		{name: "max variadic", op: "Max", in: ins(f32(sh(2), 1, 5), f32(sh(2), 3, 2), f32(sh(1), 4)), want: outs(f32(sh(2), 4, 5))},
		{name: "min nan", op: "Min", in: ins(f32(sh(2), 1, nan), f32(sh(2), 0, 0)), want: outs(f32(sh(2), 0, nan))},
		{name: "sum single", op: "Sum", in: ins(f32(sh(2), 1, 2)), want: outs(f32(sh(2), 1, 2))},
		{name: "mean", op: "Mean", in: ins(f32(sh(2), 1, 2), f32(sh(2), 3, 6)), want: outs(f32(sh(2), 2, 4))},
		{name: "prelu", op: "PRelu", in: ins(f32(sh(2, 2), -1, 2, -3, 4), f32(sh(2), 0.5, 0.1)), want: outs(f32(sh(2, 2), -0.5, 2, -1.5, 4))},
		{name: "bitshift", op: "BitShift", attrs: attrs(sa("direction", "LEFT")), in: ins(typed(pb.TensorProto_UINT8, sh(2), 1, 3), typed(pb.TensorProto_UINT8, sh(2), 2, 7)),
			want: outs(typed(pb.TensorProto_UINT8, sh(2), 4, 128))},
	})
}

func TestUnaryOps(t *testing.T) {
	e := float32(math.E)
	runCases(t, []opCase{
		{name: "abs", op: "Abs", in: ins(f32(sh(2), -1, 2)), want: outs(f32(sh(2), 1, 2))},
		{name: "abs int", op: "Abs", in: ins(i64(sh(2), -1, 2)), want: outs(i64(sh(2), 1, 2))},
		{name: "neg", op: "Neg", in: ins(f32(sh(2), -1, 2)), want: outs(f32(sh(2), 1, -2))},
		{name: "exp", op: "Exp", in: ins(f32(sh(2), 0, 1)), want: outs(f32(sh(2), 1, e))},
		{name: "log", op: "Log", in: ins(f32(sh(2), 1, e)), want: outs(f32(sh(2), 0, 1))},
		{name: "sqrt", op: "Sqrt", in: ins(f32(sh(2), 4, 9)), want: outs(f32(sh(2), 2, 3))},
		{name: "reciprocal", op: "Reciprocal", in: ins(f32(sh(2), 4, -0.5)), want: outs(f32(sh(2), 0.25, -2))},
		{name: "erf", op: "Erf", in: ins(f32(sh(2), 0, 1)), want: outs(f32(sh(2), 0, float32(math.Erf(1))))},
		{name: "tanh", op: "Tanh", in: ins(f32(sh(1), 0.5)), want: outs(f32(sh(1), float32(math.Tanh(0.5))))},
		{name: "relu", op: "Relu", in: ins(f32(sh(2), -1, 2)), want: outs(f32(sh(2), 0, 2))},
		{name: "sigmoid", op: "Sigmoid", in: ins(f32(sh(3), 0, -100, 100)), want: outs(f32(sh(3), 0.5, 0, 1))},
		{name: "floor ceil", op: "Floor", in: ins(f32(sh(2), -1.5, 1.5)), want: outs(f32(sh(2), -2, 1))},
		{name: "ceil", op: "Ceil", in: ins(f32(sh(2), -1.5, 1.5)), want: outs(f32(sh(2), -1, 2))},
		{name: "round half even", op: "Round", in: ins(f32(sh(3), 0.5, 1.5, 2.5)), want: outs(f32(sh(3), 0, 2, 2))},
		{name: "sin cos", op: "Cos", in: ins(f32(sh(1), 0)), want: outs(f32(sh(1), 1))},
		{name: "softplus", op: "Softplus", in: ins(f32(sh(2), 0, 100)), want: outs(f32(sh(2), float32(math.Log(2)), 100))},
		{name: "hardsigmoid", op: "HardSigmoid", attrs: attrs(fa("alpha", 0.5), fa("beta", 0.5)), in: ins(f32(sh(3), -2, 0, 2)), want: outs(f32(sh(3), 0, 0.5, 1))},
		{name: "gelu", op: "Gelu", in: ins(f32(sh(2), 0, 1)), want: outs(f32(sh(2), 0, float32(0.5*(1+math.Erf(1/math.Sqrt2)))))},
		{name: "gelu tanh", op: "Gelu", attrs: attrs(sa("approximate", "tanh")), in: ins(f32(sh(1), 1)),
			want: outs(f32(sh(1), float32(0.5*(1+math.Tanh(math.Sqrt(2/math.Pi)*(1+0.044715))))))},
		{name: "bias gelu", op: "com.microsoft::BiasGelu", in: ins(f32(sh(2, 2), 0, 1, -1, 0.5), f32(sh(2), 1, -1)),
			want: outs(f32(sh(2, 2), float32(0.5*(1+math.Erf(1/math.Sqrt2))), 0, 0, float32(-0.25*(1+math.Erf(-0.5/math.Sqrt2)))))},
		{name: "fast gelu with bias", op: "com.microsoft::FastGelu", in: ins(f32(sh(2), 0.5, 2), f32(sh(2), 0.5, -2)),
			want: outs(f32(sh(2), float32(0.5*(1+math.Tanh(math.Sqrt(2/math.Pi)*(1+0.044715)))), 0))},
		{name: "fast gelu", op: "com.microsoft::FastGelu", in: ins(f32(sh(1), 1)),
			want: outs(f32(sh(1), float32(0.5*(1+math.Tanh(math.Sqrt(2/math.Pi)*(1+0.044715))))))},
		{name: "leakyrelu", op: "LeakyRelu", attrs: attrs(fa("alpha", 0.1)), in: ins(f32(sh(2), -1, 1)), want: outs(f32(sh(2), -0.1, 1))},
		{name: "isnan", op: "IsNaN", in: ins(f32(sh(2), float32(math.NaN()), 1)), want: outs(bl(sh(2), true, false))},
		{name: "isinf", op: "IsInf", attrs: attrs(ia("detect_negative", 0)), in: ins(f32(sh(2), float32(math.Inf(-1)), float32(math.Inf(1)))), want: outs(bl(sh(2), false, true))},
		{name: "float16 rounds", op: "Add", in: ins(&Tensor{DType: pb.TensorProto_FLOAT16, Shape: sh(1), F32: []float32{1}}, &Tensor{DType: pb.TensorProto_FLOAT16, Shape: sh(1), F32: []float32{0.0001}}),
			want: outs(&Tensor{DType: pb.TensorProto_FLOAT16, Shape: sh(1), F32: []float32{1}})},
	})
}

func TestCompareAndLogicOps(t *testing.T) {
	runCases(t, []opCase{
		{name: "equal", op: "Equal", in: ins(i64(sh(3), 1, 2, 3), i64(sh(1), 2)), want: outs(bl(sh(3), false, true, false))},
		{name: "equal bool", op: "Equal", in: ins(bl(sh(2), true, false), bl(sh(2), true, true)), want: outs(bl(sh(2), true, false))},
		{name: "less", op: "Less", in: ins(f32(sh(3), 1, 2, 3), f32(sh(1), 2)), want: outs(bl(sh(3), true, false, false))},
		{name: "greater", op: "Greater", in: ins(f32(sh(3), 1, 2, 3), f32(sh(1), 2)), want: outs(bl(sh(3), false, false, true))},
		{name: "lessorequal", op: "LessOrEqual", in: ins(f32(sh(3), 1, 2, 3), f32(sh(1), 2)), want: outs(bl(sh(3), true, true, false))},
		{name: "greaterorequal", op: "GreaterOrEqual", in: ins(i64(sh(3), 1, 2, 3), i64(sh(1), 2)), want: outs(bl(sh(3), false, true, true))},
		{name: "not", op: "Not", in: ins(bl(sh(2), true, false)), want: outs(bl(sh(2), false, true))},
		{name: "and", op: "And", in: ins(bl(sh(2), true, true), bl(sh(2), true, false)), want: outs(bl(sh(2), true, false))},
		{name: "or", op: "Or", in: ins(bl(sh(2), false, false), bl(sh(2), true, false)), want: outs(bl(sh(2), true, false))},
		{name: "xor", op: "Xor", in: ins(bl(sh(2), true, true), bl(sh(1), true)), want: outs(bl(sh(2), false, false))},
		{name: "where", op: "Where", in: ins(bl(sh(2, 1), true, false), f32(sh(2), 1, 2), f32(nil, 9)), want: outs(f32(sh(2, 2), 1, 2, 9, 9))},
		{name: "where type mismatch", op: "Where", in: ins(bl(sh(1), true), f32(sh(1), 1), i64(sh(1), 2)), wantErr: true},
	})
}

func TestClipAndCast(t *testing.T) {
	runCases(t, []opCase{
		{name: "clip min max", op: "Clip", in: ins(f32(sh(3), -2, 0, 2), f32(nil, -1), f32(nil, 1)), want: outs(f32(sh(3), -1, 0, 1))},
		{name: "clip max only", op: "Clip", in: ins(f32(sh(3), -2, 0, 2), nil, f32(nil, 1)), want: outs(f32(sh(3), -2, 0, 1))},
		{name: "clip int", op: "Clip", in: ins(i64(sh(3), -2, 0, 2), i64(nil, 0)), want: outs(i64(sh(3), 0, 0, 2))},
		{name: "clip attrs opset 6", op: "Clip", opset: 6, attrs: attrs(fa("min", -1), fa("max", 1)), in: ins(f32(sh(2), -2, 2)), want: outs(f32(sh(2), -1, 1))},
		{name: "cast float to int truncates", op: "Cast", attrs: attrs(ia("to", int64(pb.TensorProto_INT64))), in: ins(f32(sh(3), 1.7, -1.7, 0)), want: outs(i64(sh(3), 1, -1, 0))},
		{name: "cast to bool", op: "Cast", attrs: attrs(ia("to", int64(pb.TensorProto_BOOL))), in: ins(f32(sh(2), 0, 0.1)), want: outs(bl(sh(2), false, true))},
		{name: "cast bool to float", op: "Cast", attrs: attrs(ia("to", int64(pb.TensorProto_FLOAT))), in: ins(bl(sh(2), true, false)), want: outs(f32(sh(2), 1, 0))},
		{name: "cast to int8 wraps", op: "Cast", attrs: attrs(ia("to", int64(pb.TensorProto_INT8))), in: ins(i64(sh(1), 200)), want: outs(typed(pb.TensorProto_INT8, sh(1), -56))},
		{name: "cast to float16 rounds", op: "Cast", attrs: attrs(ia("to", int64(pb.TensorProto_FLOAT16))), in: ins(f32(sh(1), 1.0001)),
			want: outs(&Tensor{DType: pb.TensorProto_FLOAT16, Shape: sh(1), F32: []float32{1}})},
		{name: "cast string to float", op: "Cast", attrs: attrs(ia("to", int64(pb.TensorProto_FLOAT))), in: ins(&Tensor{DType: pb.TensorProto_STRING, Shape: sh(2), Str: []string{"1.5", "-INF"}}),
			want: outs(f32(sh(2), 1.5, float32(math.Inf(-1))))},
		{name: "castlike", op: "CastLike", in: ins(i64(sh(2), 1, 2), f64(sh(0))), want: outs(f64(sh(2), 1, 2))},
		{name: "cast no to", op: "Cast", in: ins(f32(sh(1), 1)), wantErr: true},
	})
}

func TestFloat8(t *testing.T) {
	cases := []struct {
		dt   pb.TensorProto_DataType
		v    float32
		want float32
	}{
		{pb.TensorProto_FLOAT8E4M3FN, 1, 1},
		{pb.TensorProto_FLOAT8E4M3FN, 448, 448},
		{pb.TensorProto_FLOAT8E4M3FN, 1.0625, 1},    // tie between 1 and 1.125 -> even
		{pb.TensorProto_FLOAT8E4M3FN, 1.1875, 1.25}, // tie between 1.125 and 1.25 -> even
		{pb.TensorProto_FLOAT8E4M3FN, 0.001953125, 0.001953125},
		{pb.TensorProto_FLOAT8E4M3FNUZ, 240, 240},
		{pb.TensorProto_FLOAT8E5M2, 57344, 57344},
		{pb.TensorProto_FLOAT8E5M2, 1e6, float32(math.Inf(1))},
		{pb.TensorProto_FLOAT8E5M2FNUZ, -3, -3},
	}
	for _, c := range cases {
		f := f8formats[c.dt]
		if got := f.round(c.v); got != c.want {
			t.Errorf("%s round(%v) = %v, want %v", c.dt, c.v, got, c.want)
		}
		if got := f.decode(f.encode(float64(c.want))); float32(got) != c.want {
			t.Errorf("%s: %v does not survive encode/decode (%v)", c.dt, c.want, got)
		}
	}
	if !math.IsNaN(f8formats[pb.TensorProto_FLOAT8E4M3FN].decode(0x7f)) || !math.IsNaN(f8formats[pb.TensorProto_FLOAT8E4M3FN].decode(uint8(f8formats[pb.TensorProto_FLOAT8E4M3FN].encode(1000)))) {
		t.Error("E4M3FN NaN handling")
	}
	to := func(dt pb.TensorProto_DataType) *pb.AttributeProto { return ia("to", int64(dt)) }
	f8 := func(dt pb.TensorProto_DataType, v ...float32) *Tensor {
		return &Tensor{DType: dt, Shape: sh(len(v)), F32: v}
	}
	runCases(t, []opCase{
		{name: "cast saturates", op: "Cast", opset: 19, attrs: attrs(to(pb.TensorProto_FLOAT8E4M3FN)), in: ins(f32(sh(3), 1000, -1000, 0.3)),
			want: outs(f8(pb.TensorProto_FLOAT8E4M3FN, 448, -448, 0.3125))},
		{name: "cast no saturate", op: "Cast", opset: 19, attrs: attrs(to(pb.TensorProto_FLOAT8E5M2), ia("saturate", 0)), in: ins(f32(sh(1), 1e6)),
			want: outs(f8(pb.TensorProto_FLOAT8E5M2, float32(math.Inf(1))))},
		{name: "cast back", op: "Cast", opset: 19, attrs: attrs(to(pb.TensorProto_FLOAT)), in: ins(f8(pb.TensorProto_FLOAT8E4M3FNUZ, 0.5)), want: outs(f32(sh(1), 0.5))},
	})
	p, err := ToProto(f8(pb.TensorProto_FLOAT8E4M3FN, 1, -2, 448), "x")
	if err != nil {
		t.Fatal(err)
	}
	back, err := FromProto(p, nil)
	if err != nil {
		t.Fatal(err)
	}
	expectTensor(t, back, f8(pb.TensorProto_FLOAT8E4M3FN, 1, -2, 448))
}

// TestArithEqualShapesMatchClosure checks the written-out float32 loops of
// Add, Sub, Mul and Div over equal shapes bit for bit against each
// operator's element function, on values with zeros, infinities and NaNs.
func TestArithEqualShapesMatchClosure(t *testing.T) {
	inf := float32(math.Inf(1))
	a := []float32{1.5, -2, 0, 3e38, inf, -inf, float32(math.NaN()), 1e-40, 7}
	b := []float32{0.25, 0, -0, 3e38, inf, 2, 1, -1e-40, -3}
	for _, name := range []string{"Add", "Sub", "Mul", "Div"} {
		op := arithOps[name]
		if op.sym == 0 {
			t.Fatalf("%s has no written-out loop", name)
		}
		got, err := applyArith(op, NewFloat32([]int{3, 3}, a), NewFloat32([]int{3, 3}, b))
		if err != nil {
			t.Fatal(err)
		}
		for i := range a {
			if w := op.f32(a[i], b[i]); math.Float32bits(got.F32[i]) != math.Float32bits(w) {
				t.Errorf("%s element %d: %g, want %g", name, i, got.F32[i], w)
			}
		}
	}
}

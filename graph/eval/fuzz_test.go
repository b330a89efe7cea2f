package eval

import (
	"context"
	"encoding/binary"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/mokopt/mokopt/graph"
	pb "github.com/mokopt/mokopt/graph/onnxpb"
)

// fuzzShape decodes up to 5 dims in 0..4 from b (one byte each, the first
// byte is the rank).
func fuzzShape(b []byte) []int {
	if len(b) == 0 {
		return nil
	}
	r := int(b[0]) % 6
	s := make([]int, 0, r)
	for i := 0; i < r; i++ {
		d := 1
		if 1+i < len(b) {
			d = int(b[1+i]) % 5
		}
		s = append(s, d)
	}
	return s
}

// fuzzInts decodes b as little-endian int64s (at most 6), so specs can hold
// huge, negative and special values.
func fuzzInts(b []byte) []int64 {
	var out []int64
	for len(b) >= 8 && len(out) < 6 {
		out = append(out, int64(binary.LittleEndian.Uint64(b)))
		b = b[8:]
	}
	if len(b) > 0 && len(out) < 6 {
		out = append(out, int64(int8(b[0])))
	}
	return out
}

// shapeOps are the interpreter's shape-manipulating ops that FuzzShapeOps
// runs with a fuzzed data shape and a fuzzed int64 second input.
var shapeOps = []string{"Reshape", "Expand", "Tile", "Slice", "Squeeze", "Unsqueeze", "Transpose",
	"ConstantOfShape", "Range", "Split", "Flatten", "Pad", "Gather", "Concat", "Add", "Where", "TopK",
	"ReduceSum", "CumSum", "OneHot", "Trilu", "GatherElements", "ScatterND", "MatMul", "Softmax", "ArgMax"}

// FuzzShapeOps exercises the interpreter's shape logic: broadcasting of two
// shapes (checked against the rule, and every broadcast index in range),
// Reshape spec resolution (element count kept), and one node of a
// shape-manipulating op run on a fuzzed data shape and fuzzed int64 operand
// under a memory limit and a deadline. Errors are fine; a panic, a kernel
// panic turned into an error, or a hang is not.
func FuzzShapeOps(f *testing.F) {
	i64le := func(v ...int64) []byte {
		var b []byte
		for _, x := range v {
			b = binary.LittleEndian.AppendUint64(b, uint64(x))
		}
		return b
	}
	f.Add([]byte{2, 3, 4}, []byte{2, 1, 4}, i64le(4, 3), uint8(0), int64(0))
	f.Add([]byte{3, 2, 0, 4}, []byte{1, 4}, i64le(-1, 0), uint8(1), int64(1))
	f.Add([]byte{1, 4}, []byte{0}, i64le(1<<40, 1<<40, -1), uint8(0), int64(-1))
	f.Add([]byte{2, 4, 4}, []byte{2, 4, 1}, i64le(2, 2), uint8(2), int64(1))
	f.Add([]byte{2, 3, 3}, []byte{}, i64le(1, -1, 1), uint8(3), int64(5))
	f.Add([]byte{4, 1, 2, 3, 4}, []byte{3, 2, 3, 4}, i64le(0, 2, 1, 3), uint8(6), int64(0))
	f.Add([]byte{1, 3}, []byte{1, 3}, i64le(9223372036854775807), uint8(7), int64(0))
	f.Fuzz(func(t *testing.T, sa, sb, spec []byte, opi uint8, attr int64) {
		a, b := fuzzShape(sa), fuzzShape(sb)
		ints := fuzzInts(spec)

		// Broadcasting.
		out, err := BroadcastShapes(a, b)
		if err == nil {
			for _, in := range [][]int{a, b} {
				off := len(out) - len(in)
				for i, d := range in {
					if d != out[off+i] && d != 1 {
						t.Fatalf("BroadcastShapes(%v, %v) = %v: dim %d of %v neither equal nor 1", a, b, out, i, in)
					}
				}
				n := numel(in)
				for _, ix := range bcastIndex(in, out) {
					if ix < 0 || ix >= n {
						t.Fatalf("bcastIndex(%v, %v) yields %d, out of [0,%d)", in, out, ix, n)
					}
				}
			}
		}

		// Reshape spec resolution.
		if got, err := reshapeTo(a, ints, attr&1 == 1); err == nil {
			for _, d := range got {
				if d < 0 {
					t.Fatalf("reshapeTo(%v, %v) = %v has a negative dim", a, ints, got)
				}
			}
			if _, err := checkedNumel(got); err != nil || numel(got) != numel(a) {
				t.Fatalf("reshapeTo(%v, %v) = %v changes the element count (%d -> %d, %v)", a, ints, got, numel(a), numel(got), err)
			}
		}

		// One node of a shape op.
		op := shapeOps[int(opi)%len(shapeOps)]
		x := New(pb.TensorProto_FLOAT, a)
		for i := range x.F32 {
			x.F32[i] = float32(i%7) - 3
		}
		var second *Tensor
		switch op {
		case "Add", "MatMul", "Concat", "Where":
			second = New(pb.TensorProto_FLOAT, b)
		default:
			second = NewInt64([]int{len(ints)}, ints)
			if len(b) == 0 && len(ints) > 0 {
				second = NewInt64(nil, ints[:1]) // a scalar operand
			}
		}
		names := []string{"x", "s"}
		inputs := []*Tensor{x, second}
		var attrs []*pb.AttributeProto
		switch op {
		case "Where":
			names = []string{"c", "x", "s"}
			c := New(pb.TensorProto_BOOL, b)
			inputs = []*Tensor{c, x, second}
		case "Concat", "Flatten", "Gather", "Softmax", "ArgMax", "CumSum", "Split", "GatherElements", "TopK":
			attrs = append(attrs, graph.IntAttr("axis", attr%8))
		case "Trilu":
			attrs = append(attrs, graph.IntAttr("upper", attr&1))
		case "Range":
			// start, limit, delta: scalars from the fuzzed ints.
			sc := func(i int) *Tensor {
				if i < len(ints) {
					return NewInt64(nil, []int64{ints[i]})
				}
				return NewInt64(nil, []int64{1})
			}
			names = []string{"a", "b", "c"}
			inputs = []*Tensor{sc(0), sc(1), sc(2)}
		case "OneHot":
			names = []string{"x", "s", "v"}
			inputs = []*Tensor{NewInt64([]int{len(ints)}, ints), NewInt64(nil, []int64{attr % 64}), NewFloat32([]int{2}, []float32{0, 1})}
		case "ScatterND":
			names = []string{"x", "i", "u"}
			idx := NewInt64([]int{1, len(ints)}, ints)
			upd := New(pb.TensorProto_FLOAT, b)
			inputs = []*Tensor{x, idx, upd}
		}
		nOut := 1
		if op == "TopK" {
			nOut = 2
		}
		var outs []string
		for i := 0; i < nOut; i++ {
			outs = append(outs, "y"+string(rune('0'+i)))
		}
		feeds := map[string]*Tensor{}
		for i, n := range names {
			feeds[n] = inputs[i]
		}
		m := modelOf(18, []*pb.NodeProto{graph.NewNode(op, "", "n0", names, outs, attrs...)}, names, inputs, outs)
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_, err = Run(ctx, m, feeds, Options{MemLimit: 1 << 22, Threads: 1})
		if err != nil {
			if strings.Contains(err.Error(), "panicked") {
				t.Fatalf("%s on %v with %v (attr %d): %v", op, a, ints, attr, err)
			}
			if errors.Is(err, context.DeadlineExceeded) {
				t.Fatalf("%s on %v with %v: did not finish in 5 s", op, a, ints)
			}
		}
	})
}

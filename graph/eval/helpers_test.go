package eval

import (
	"context"
	"math"
	"slices"
	"strings"
	"testing"

	"github.com/mokopt/mokopt/graph"
	pb "github.com/mokopt/mokopt/graph/onnxpb"
	"google.golang.org/protobuf/proto"
)

// Builders for test tensors.
func f32(shape []int, v ...float32) *Tensor { return NewFloat32(shape, v) }
func f64(shape []int, v ...float64) *Tensor { return NewFloat64(shape, v) }
func i64(shape []int, v ...int64) *Tensor   { return NewInt64(shape, v) }
func bl(shape []int, v ...bool) *Tensor     { return NewBool(shape, v) }
func sh(d ...int) []int                     { return d }

func typed(dt pb.TensorProto_DataType, shape []int, v ...int64) *Tensor {
	t := NewInt64(shape, v)
	t.DType = dt
	return t
}

// valueInfo declares a tensor value of t's type and shape.
func valueInfo(name string, t *Tensor) *pb.ValueInfoProto {
	dims := make([]*pb.TensorShapeProto_Dimension, len(t.Shape))
	for i, d := range t.Shape {
		dims[i] = &pb.TensorShapeProto_Dimension{Value: &pb.TensorShapeProto_Dimension_DimValue{DimValue: int64(d)}}
	}
	return &pb.ValueInfoProto{Name: proto.String(name), Type: &pb.TypeProto{Value: &pb.TypeProto_TensorType{
		TensorType: &pb.TypeProto_Tensor{ElemType: proto.Int32(int32(t.DType)), Shape: &pb.TensorShapeProto{Dim: dims}}}}}
}

// untypedValue declares a value without type information.
func untypedValue(name string) *pb.ValueInfoProto {
	return &pb.ValueInfoProto{Name: proto.String(name)}
}

// modelOf wraps nodes into a model whose inputs are fed from feeds (in
// order of names) and whose outputs are outs.
func modelOf(opset int64, nodes []*pb.NodeProto, inNames []string, ins []*Tensor, outs []string) *graph.Model {
	g := &pb.GraphProto{Name: proto.String("test"), Node: nodes}
	for i, n := range inNames {
		if ins[i] != nil {
			g.Input = append(g.Input, valueInfo(n, ins[i]))
		}
	}
	for _, o := range outs {
		g.Output = append(g.Output, untypedValue(o))
	}
	mp := &pb.ModelProto{IrVersion: proto.Int64(8), Graph: g,
		OpsetImport: []*pb.OperatorSetIdProto{{Domain: proto.String(""), Version: proto.Int64(opset)}}}
	return &graph.Model{Proto: mp}
}

// runOp evaluates a single node at the given opset (op may be
// "domain::op", imported at version 1); nil inputs become omitted optional
// inputs.
func runOp(t *testing.T, opset int64, op string, attrs []*pb.AttributeProto, nOut int, inputs ...*Tensor) ([]*Tensor, error) {
	t.Helper()
	var names []string
	feeds := map[string]*Tensor{}
	for i, in := range inputs {
		if in == nil {
			names = append(names, "")
			continue
		}
		n := "x" + string(rune('0'+i))
		names = append(names, n)
		feeds[n] = in
	}
	var outs []string
	for i := 0; i < nOut; i++ {
		outs = append(outs, "y"+string(rune('0'+i)))
	}
	domain, typ, ok := strings.Cut(op, "::")
	if !ok {
		domain, typ = "", op
	}
	node := graph.NewNode(typ, domain, "n0", names, outs, attrs...)
	m := modelOf(opset, []*pb.NodeProto{node}, names, inputs, outs)
	if domain != "" {
		m.Proto.OpsetImport = append(m.Proto.OpsetImport, &pb.OperatorSetIdProto{Domain: proto.String(domain), Version: proto.Int64(1)})
	}
	res, err := Run(context.Background(), m, feeds, Options{})
	if err != nil {
		return nil, err
	}
	out := make([]*Tensor, nOut)
	for i, o := range outs {
		out[i] = res[o]
	}
	return out, nil
}

// opCase is one row of an op table test.
type opCase struct {
	name    string
	op      string
	opset   int64 // 0 means 18
	attrs   []*pb.AttributeProto
	in      []*Tensor
	want    []*Tensor // nil entries are not checked
	wantErr bool
}

// runCases runs a table of single-node cases.
func runCases(t *testing.T, cases []opCase) {
	t.Helper()
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			opset := c.opset
			if opset == 0 {
				opset = 18
			}
			got, err := runOp(t, opset, c.op, c.attrs, max(len(c.want), 1), c.in...)
			if c.wantErr {
				if err == nil {
					t.Fatalf("want an error, got %v", got)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			for i, w := range c.want {
				if w == nil {
					continue
				}
				expectTensor(t, got[i], w)
			}
		})
	}
}

// expectTensor fails unless got equals want (floats within 1e-6 relative).
func expectTensor(t *testing.T, got, want *Tensor) {
	t.Helper()
	if got == nil {
		t.Fatalf("no output, want %v", want)
	}
	if got.DType != want.DType || !slices.Equal(got.Shape, want.Shape) {
		t.Fatalf("got %v, want %v", got, want)
	}
	for i := 0; i < want.Len(); i++ {
		if want.kind() == kStr {
			if got.Str[i] != want.Str[i] {
				t.Fatalf("element %d: got %q, want %q", i, got.Str[i], want.Str[i])
			}
			continue
		}
		g, w := got.Float64At(i), want.Float64At(i)
		if math.IsNaN(w) && math.IsNaN(g) {
			continue
		}
		if math.Abs(g-w) > 1e-6*math.Max(1, math.Abs(w)) {
			t.Fatalf("element %d: got %v, want %v\n got %v\nwant %v", i, g, w, got.Float64s(), want.Float64s())
		}
	}
}

func ia(name string, v int64) *pb.AttributeProto     { return graph.IntAttr(name, v) }
func fa(name string, v float32) *pb.AttributeProto   { return graph.FloatAttr(name, v) }
func sa(name, v string) *pb.AttributeProto           { return graph.StringAttr(name, v) }
func isa(name string, v ...int64) *pb.AttributeProto { return graph.IntsAttr(name, v...) }
func attrs(a ...*pb.AttributeProto) []*pb.AttributeProto {
	return a
}
func ins(t ...*Tensor) []*Tensor  { return t }
func outs(t ...*Tensor) []*Tensor { return t }

package canon

import (
	"context"
	"math/rand/v2"
	"testing"

	"github.com/mokopt/mokopt/graph"
	"github.com/mokopt/mokopt/graph/eval"
	pb "github.com/mokopt/mokopt/graph/onnxpb"
	"google.golang.org/protobuf/proto"
)

// fn builds a model-local function in domain "local".
func fn(name string, in, out, attrs []string, opset int64, nodes ...*pb.NodeProto) *pb.FunctionProto {
	return &pb.FunctionProto{Name: proto.String(name), Domain: proto.String("local"), Input: in, Output: out, Attribute: attrs, Node: nodes,
		OpsetImport: []*pb.OperatorSetIdProto{{Domain: proto.String(""), Version: proto.Int64(opset)}, {Domain: proto.String("local"), Version: proto.Int64(1)}}}
}

func refAttr(name, ref string, t pb.AttributeProto_AttributeType) *pb.AttributeProto {
	return &pb.AttributeProto{Name: proto.String(name), RefAttrName: proto.String(ref), Type: t.Enum()}
}

func TestInline(t *testing.T) {
	r := rand.New(rand.NewPCG(11, 12))
	x := map[string]*eval.Tensor{"x": randF32(r, 2, 3), "w": randF32(r, 3, 3)}
	// inner(a, w; alpha) = LeakyRelu(a @ w, alpha); outer(a, w) = inner(inner(a, w), w) + a.
	inner := fn("inner", []string{"a", "w"}, []string{"o"}, []string{"alpha"}, 17,
		graph.NewNode("MatMul", "", "mm", []string{"a", "w"}, []string{"t"}),
		&pb.NodeProto{OpType: proto.String("LeakyRelu"), Name: proto.String("act"), Input: []string{"t"}, Output: []string{"o"},
			Attribute: []*pb.AttributeProto{refAttr("alpha", "alpha", pb.AttributeProto_FLOAT)}})
	outer := fn("outer", []string{"a", "w"}, []string{"o"}, nil, 17,
		graph.NewNode("inner", "local", "i1", []string{"a", "w"}, []string{"t"}, graph.FloatAttr("alpha", 0.1)),
		graph.NewNode("inner", "local", "i2", []string{"t", "w"}, []string{"t2"}, graph.FloatAttr("alpha", 0.3)),
		graph.NewNode("Add", "", "add", []string{"t2", "a"}, []string{"o"}))
	local := []*pb.OperatorSetIdProto{{Domain: proto.String("local"), Version: proto.Int64(1)}}
	// flat evaluates, as the truth, the computation written out without
	// functions: LeakyRelu(LeakyRelu(x @ w, a1) @ w, a2) (+ x when add).
	flat := func(a1, a2 float32, add bool) func(map[string]*eval.Tensor) map[string]*eval.Tensor {
		return func(in map[string]*eval.Tensor) map[string]*eval.Tensor {
			nodes := []*pb.NodeProto{
				node("MatMul", []string{"x", "w"}, []string{"t1"}), node("LeakyRelu", []string{"t1"}, []string{"l1"}, graph.FloatAttr("alpha", a1)),
				node("MatMul", []string{"l1", "w"}, []string{"t2"}), node("LeakyRelu", []string{"t2"}, []string{"l2"}, graph.FloatAttr("alpha", a2))}
			last := "l2"
			if add {
				nodes = append(nodes, node("Add", []string{"l2", "x"}, []string{"s"}))
				last = "s"
			}
			nodes = append(nodes, node("Identity", []string{last}, []string{"y"}))
			rc := ruleCase{nodes: nodes, inputs: in, outputs: []string{"y"}}
			out, err := eval.Run(context.Background(), rc.model(t), in, eval.Options{})
			if err != nil {
				t.Fatal(err)
			}
			return out
		}
	}
	runRuleCases(t, []Rule{Inline}, []ruleCase{
		{name: "nested with attributes", nodes: []*pb.NodeProto{graph.NewNode("outer", "local", "call", []string{"x", "w"}, []string{"y"})},
			funcs: []*pb.FunctionProto{inner, outer}, extra: local, inputs: x, outputs: []string{"y"},
			want: map[string]int{"local::outer": 0, "local::inner": 0, "MatMul": 2, "LeakyRelu": 2, "Add": 1}, ref: flat(0.1, 0.3, true)},
		{name: "two calls get distinct names", nodes: []*pb.NodeProto{
			graph.NewNode("inner", "local", "c1", []string{"x", "w"}, []string{"y1"}, graph.FloatAttr("alpha", 0.2)),
			graph.NewNode("inner", "local", "c2", []string{"y1", "w"}, []string{"y"}, graph.FloatAttr("alpha", 0.2))},
			funcs: []*pb.FunctionProto{inner}, extra: local, inputs: x, outputs: []string{"y"},
			want: map[string]int{"local::inner": 0, "MatMul": 2}, ref: flat(0.2, 0.2, false)},
		// A body need not list its nodes in order (a float16 converter
		// appends its casts at the end): inlined producers first.
		{name: "body out of order", nodes: []*pb.NodeProto{graph.NewNode("rev", "local", "c", []string{"x", "w"}, []string{"y"})},
			funcs: []*pb.FunctionProto{fn("rev", []string{"a", "w"}, []string{"o"}, nil, 17,
				graph.NewNode("Add", "", "add", []string{"t2", "a"}, []string{"o"}),
				graph.NewNode("MatMul", "", "mm2", []string{"t", "w"}, []string{"t2"}),
				graph.NewNode("MatMul", "", "mm1", []string{"a", "w"}, []string{"t"}))},
			extra: local, inputs: x, outputs: []string{"y"}, want: map[string]int{"local::rev": 0, "MatMul": 2, "Add": 1}},
		{name: "other opset not inlined", opset: 13, nodes: []*pb.NodeProto{graph.NewNode("inner", "local", "c", []string{"x", "w"}, []string{"y"})},
			funcs: []*pb.FunctionProto{inner}, extra: local, inputs: x, outputs: []string{"y"}, noChange: true},
	})
}

package canon

import (
	"math"
	"math/rand/v2"
	"testing"

	"github.com/mokopt/mokopt/graph"
	"github.com/mokopt/mokopt/graph/eval"
	pb "github.com/mokopt/mokopt/graph/onnxpb"
)

func TestSpelledSigmoid(t *testing.T) {
	r := rand.New(rand.NewPCG(8, 9))
	x := map[string]*eval.Tensor{"x": randF32(r, 4, 6)}
	scalar := func(v float32) *eval.Tensor { return eval.NewFloat32([]int{}, []float32{v}) }
	k := map[string]*eval.Tensor{"one": scalar(1), "two": scalar(2), "half": scalar(0.5),
		"b": randF32(r, 6)}
	neg := node("Neg", []string{"x"}, []string{"n"})
	exp := node("Exp", []string{"n"}, []string{"e"})
	onePlus := node("Add", []string{"one", "e"}, []string{"d"})
	runRuleCases(t, []Rule{SpelledSigmoid, DropDead}, []ruleCase{
		{name: "reciprocal of one plus exp of minus x", nodes: []*pb.NodeProto{neg, exp, onePlus, node("Reciprocal", []string{"d"}, []string{"y"})},
			inputs: x, inits: k, outputs: []string{"y"}, want: map[string]int{"Sigmoid": 1, "Exp": 0, "Neg": 0, "Reciprocal": 0}},
		{name: "one over exp of minus x plus one", nodes: []*pb.NodeProto{neg, exp, node("Add", []string{"e", "one"}, []string{"d"}),
			node("Div", []string{"one", "d"}, []string{"y"})},
			inputs: x, inits: k, outputs: []string{"y"}, want: map[string]int{"Sigmoid": 1, "Div": 0}},
		{name: "exp of x over one plus exp of x", nodes: []*pb.NodeProto{node("Exp", []string{"x"}, []string{"e"}), onePlus,
			node("Div", []string{"e", "d"}, []string{"y"})},
			inputs: x, inits: k, outputs: []string{"y"}, want: map[string]int{"Sigmoid": 1, "Exp": 0}},
		{name: "half of one plus tanh of half x", nodes: []*pb.NodeProto{node("Mul", []string{"x", "half"}, []string{"h"}),
			node("Tanh", []string{"h"}, []string{"th"}), node("Add", []string{"th", "one"}, []string{"p"}),
			node("Mul", []string{"half", "p"}, []string{"y"})},
			inputs: x, inits: k, outputs: []string{"y"}, want: map[string]int{"Sigmoid": 1, "Tanh": 0, "Mul": 0}},
		{name: "a sigmoid times one", nodes: []*pb.NodeProto{node("Sigmoid", []string{"x"}, []string{"s"}), node("Mul", []string{"s", "one"}, []string{"y"})},
			inputs: x, inits: k, outputs: []string{"y"}, want: map[string]int{"Sigmoid": 1, "Mul": 0}},
		// The widest region computes sigmoid(2x); cut at 2x it is a sigmoid.
		{name: "sigmoid of a scaled input, cut", nodes: []*pb.NodeProto{node("Mul", []string{"x", "two"}, []string{"x2"}),
			node("Neg", []string{"x2"}, []string{"n"}), exp, onePlus, node("Reciprocal", []string{"d"}, []string{"y"})},
			inputs: x, inits: k, outputs: []string{"y"}, want: map[string]int{"Sigmoid": 1, "Mul": 1, "Exp": 0}},
		// A vector bias is an outside input: the sigmoid starts after it.
		{name: "sigmoid after a vector bias", nodes: []*pb.NodeProto{node("Add", []string{"x", "b"}, []string{"xb"}),
			node("Neg", []string{"xb"}, []string{"n"}), exp, onePlus, node("Reciprocal", []string{"d"}, []string{"y"})},
			inputs: x, inits: k, outputs: []string{"y"}, want: map[string]int{"Sigmoid": 1, "Add": 1, "Exp": 0}},
		{name: "silu keeps its product", nodes: []*pb.NodeProto{neg, exp, onePlus, node("Div", []string{"x", "d"}, []string{"y"})},
			inputs: x, inits: k, outputs: []string{"y"}, noChange: true},
		{name: "one over two plus exp kept", nodes: []*pb.NodeProto{neg, exp, node("Add", []string{"two", "e"}, []string{"d"}),
			node("Reciprocal", []string{"d"}, []string{"y"})},
			inputs: x, inits: k, outputs: []string{"y"}, noChange: true},
		{name: "float16", nodes: []*pb.NodeProto{neg, exp, node("Add", []string{"one16", "e"}, []string{"d"}), node("Reciprocal", []string{"d"}, []string{"y"})},
			inputs:  map[string]*eval.Tensor{"x": eval.NewFloatAs(pb.TensorProto_FLOAT16, []int{2, 3}, []float32{-3, -0.5, 0, 0.25, 2, 9})},
			inits:   map[string]*eval.Tensor{"one16": eval.NewFloatAs(pb.TensorProto_FLOAT16, []int{}, []float32{1})},
			outputs: []string{"y"}, want: map[string]int{"Sigmoid": 1, "Exp": 0},
			// the spelled form rounds each step to float16; the Sigmoid once
			ref: func(in map[string]*eval.Tensor) map[string]*eval.Tensor {
				x := in["x"].Float64s()
				y := make([]float32, len(x))
				for i, v := range x {
					y[i] = float32(1 / (1 + math.Exp(-v)))
				}
				return map[string]*eval.Tensor{"y": eval.NewFloatAs(pb.TensorProto_FLOAT16, []int{2, 3}, y)}
			}},
		{name: "rational function kept", nodes: []*pb.NodeProto{node("Add", []string{"one", "x"}, []string{"d"}), node("Reciprocal", []string{"d"}, []string{"y"})},
			inputs: x, inits: k, outputs: []string{"y"}, noChange: true},
	})
}

func TestExpOfLogSoftmax(t *testing.T) {
	r := rand.New(rand.NewPCG(10, 11))
	x := map[string]*eval.Tensor{"x": randF32(r, 3, 7)}
	runRuleCases(t, []Rule{ExpOfLogSoftmax, DropDead}, []ruleCase{
		{name: "last axis", opset: 18, nodes: []*pb.NodeProto{node("LogSoftmax", []string{"x"}, []string{"l"}), node("Exp", []string{"l"}, []string{"y"})},
			inputs: x, outputs: []string{"y"}, want: map[string]int{"Softmax": 1, "LogSoftmax": 0, "Exp": 0}},
		{name: "first axis", opset: 18, nodes: []*pb.NodeProto{node("LogSoftmax", []string{"x"}, []string{"l"}, graph.IntAttr("axis", 0)),
			node("Exp", []string{"l"}, []string{"y"})},
			inputs: x, outputs: []string{"y"}, want: map[string]int{"Softmax": 1}},
		{name: "exp of a log kept", opset: 18, nodes: []*pb.NodeProto{node("Log", []string{"x"}, []string{"l"}), node("Exp", []string{"l"}, []string{"y"})},
			inputs: map[string]*eval.Tensor{"x": eval.NewFloat32([]int{3}, []float32{1, 2, 3})}, outputs: []string{"y"}, noChange: true},
	})
}

func TestEinsumMatMul(t *testing.T) {
	r := rand.New(rand.NewPCG(12, 13))
	x := map[string]*eval.Tensor{"x": randF32(r, 2, 3, 8)}
	w := map[string]*eval.Tensor{"w": randF32(r, 8, 5), "wt": randF32(r, 5, 8), "v": randF32(r, 8)}
	es := func(eq string, in ...string) *pb.NodeProto {
		return node("Einsum", in, []string{"y"}, graph.StringAttr("equation", eq))
	}
	runRuleCases(t, []Rule{EinsumMatMul, DropDead}, []ruleCase{
		{name: "linear layer with ellipsis", nodes: []*pb.NodeProto{es("...i,ij->...j", "x", "w")},
			inputs: x, inits: w, outputs: []string{"y"}, want: map[string]int{"MatMul": 1, "Einsum": 0}},
		{name: "linear layer, letters", nodes: []*pb.NodeProto{es("bti, ij -> btj", "x", "w")},
			inputs: x, inits: w, outputs: []string{"y"}, want: map[string]int{"MatMul": 1, "Einsum": 0}},
		{name: "weight stored out by in", nodes: []*pb.NodeProto{es("...i,ji->...j", "x", "wt")},
			inputs: x, inits: w, outputs: []string{"y"}, want: map[string]int{"MatMul": 1, "Transpose": 1, "Einsum": 0}},
		{name: "batched product", nodes: []*pb.NodeProto{es("bti,bij->btj", "x", "w3")},
			inputs: x, inits: map[string]*eval.Tensor{"w3": randF32(r, 2, 8, 5)}, outputs: []string{"y"}, want: map[string]int{"MatMul": 1}},
		{name: "batched, second operand transposed", nodes: []*pb.NodeProto{es("bti,bji->btj", "x", "w3")},
			inputs: x, inits: map[string]*eval.Tensor{"w3": randF32(r, 2, 5, 8)}, outputs: []string{"y"}, want: map[string]int{"MatMul": 1, "Transpose": 1}},
		{name: "sum over tokens kept", nodes: []*pb.NodeProto{es("bti,ij->bj", "x", "w")},
			inputs: x, inits: w, outputs: []string{"y"}, noChange: true},
		{name: "dot with a vector kept", nodes: []*pb.NodeProto{es("...i,i->...", "x", "v")},
			inputs: x, inits: w, outputs: []string{"y"}, noChange: true},
		{name: "output axes reordered kept", nodes: []*pb.NodeProto{es("bti,ij->tbj", "x", "w")},
			inputs: x, inits: w, outputs: []string{"y"}, noChange: true},
	})
}

func TestMulReciprocal(t *testing.T) {
	r := rand.New(rand.NewPCG(14, 15))
	x := map[string]*eval.Tensor{"a": randF32(r, 3, 4), "b": randF32(r, 3, 1)}
	rc := node("Reciprocal", []string{"b"}, []string{"rb"})
	runRuleCases(t, []Rule{MulReciprocal, DropDead}, []ruleCase{
		{name: "a times 1/b", nodes: []*pb.NodeProto{rc, node("Mul", []string{"a", "rb"}, []string{"y"})},
			inputs: x, outputs: []string{"y"}, want: map[string]int{"Div": 1, "Reciprocal": 0, "Mul": 0}},
		{name: "1/b times a", nodes: []*pb.NodeProto{rc, node("Mul", []string{"rb", "a"}, []string{"y"})},
			inputs: x, outputs: []string{"y"}, want: map[string]int{"Div": 1, "Reciprocal": 0}},
		{name: "reciprocal read elsewhere stays", nodes: []*pb.NodeProto{rc, node("Mul", []string{"a", "rb"}, []string{"y"})},
			inputs: x, outputs: []string{"y", "rb"}, want: map[string]int{"Div": 1, "Reciprocal": 1}},
		{name: "plain product kept", nodes: []*pb.NodeProto{node("Mul", []string{"a", "b"}, []string{"y"})},
			inputs: x, outputs: []string{"y"}, noChange: true},
	})
}

func TestPowOfConstant(t *testing.T) {
	r := rand.New(rand.NewPCG(25, 26))
	pos := randF32(r, 3, 4)
	for i, v := range pos.F32 {
		pos.F32[i] = float32(math.Abs(float64(v))) + 0.1
	}
	x := map[string]*eval.Tensor{"x": pos}
	e := func(v float32) map[string]*eval.Tensor {
		return map[string]*eval.Tensor{"e": eval.NewFloat32(nil, []float32{v})}
	}
	pow := node("Pow", []string{"x", "e"}, []string{"p"})
	relu := node("Relu", []string{"p"}, []string{"y"})
	runRuleCases(t, []Rule{PowOfConstant, DropIdentity, DropDead}, []ruleCase{
		{name: "-1", nodes: []*pb.NodeProto{pow, relu}, inputs: x, inits: e(-1), outputs: []string{"y"}, want: map[string]int{"Pow": 0, "Reciprocal": 1}},
		{name: "0.5", nodes: []*pb.NodeProto{pow, relu}, inputs: x, inits: e(0.5), outputs: []string{"y"}, want: map[string]int{"Pow": 0, "Sqrt": 1}},
		{name: "1", nodes: []*pb.NodeProto{pow, relu}, inputs: x, inits: e(1), outputs: []string{"y"}, want: map[string]int{"Pow": 0, "Identity": 0}},
		{name: "2 kept", nodes: []*pb.NodeProto{pow, relu}, inputs: x, inits: e(2), outputs: []string{"y"}, noChange: true},
		{name: "3 kept", nodes: []*pb.NodeProto{pow, relu}, inputs: x, inits: e(3), outputs: []string{"y"}, noChange: true},
		{name: "exponent of higher rank kept", nodes: []*pb.NodeProto{pow, relu}, inputs: x,
			inits: map[string]*eval.Tensor{"e": eval.NewFloat32([]int{1, 1, 1}, []float32{-1})}, outputs: []string{"y"}, noChange: true},
	})
}

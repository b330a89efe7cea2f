package models

import (
	"fmt"
	"math"
	"strings"

	"github.com/mokopt/mokopt/graph"
	pb "github.com/mokopt/mokopt/graph/onnxpb"
	"github.com/mokopt/mokopt/moe"
	"google.golang.org/protobuf/proto"
)

// Spelling is one way a graph may write an expert activation: Emit appends
// nodes to b computing it from the gate projection g ("" for an ungated
// activation) and the up projection u and returns the result. Opset is the
// default-domain opset its ops need (0: 13); MS is set when it uses
// com.microsoft contrib ops.
type Spelling struct {
	Name  string
	Opset int64
	MS    bool
	Emit  func(b *moe.Builder, g, u string) string
	// EmitW, when set instead of Emit, also takes the intermediate size
	// (a contrib op whose bias must have the projection's last dim).
	EmitW func(b *moe.Builder, g, u string, inter int64) string
}

// Write appends the spelling's nodes to b (inter is the intermediate size
// of the projections) and returns its output.
func (sp Spelling) Write(b *moe.Builder, g, u string, inter int64) string {
	if sp.EmitW != nil {
		return sp.EmitW(b, g, u, inter)
	}
	return sp.Emit(b, g, u)
}

// ActCase is an activation of moe.Activations with its parameters and the
// spellings it must be identified from.
type ActCase struct {
	Act       string
	Params    moe.ActParams
	Spellings []Spelling
}

func op(b *moe.Builder, o string, in ...string) string { return b.Op(o, in) }
func sc(b *moe.Builder, f float64) string              { return b.Scalar(float32(f)) }
func msOp(b *moe.Builder, o string, in []string, attrs ...*pb.AttributeProto) string {
	out := b.Op(o, in, attrs...)
	b.Nodes[len(b.Nodes)-1].Domain = proto.String("com.microsoft")
	return out
}

// Hand-written pieces the spellings share.
func sigmoidDivExp(b *moe.Builder, x string) string {
	return op(b, "Div", sc(b, 1), op(b, "Add", sc(b, 1), op(b, "Exp", op(b, "Neg", x))))
}
func siluTanh(b *moe.Builder, x string) string { // x·0.5·(1 + tanh(x/2))
	t := op(b, "Tanh", op(b, "Div", x, sc(b, 2)))
	return op(b, "Mul", op(b, "Mul", x, sc(b, 0.5)), op(b, "Add", t, sc(b, 1)))
}
func geluErfDiv(b *moe.Builder, x string) string { // x·0.5·(1 + erf(x/√2)), associated differently from the body
	e := op(b, "Erf", op(b, "Div", x, sc(b, math.Sqrt2)))
	return op(b, "Mul", op(b, "Mul", x, op(b, "Add", sc(b, 1), e)), sc(b, 0.5))
}
func geluTanhPow(b *moe.Builder, x string) string {
	c := op(b, "Mul", sc(b, 0.044715), op(b, "Pow", x, sc(b, 3)))
	t := op(b, "Tanh", op(b, "Mul", sc(b, math.Sqrt(2/math.Pi)), op(b, "Add", x, c)))
	return op(b, "Mul", op(b, "Mul", sc(b, 0.5), x), op(b, "Add", sc(b, 1), t))
}
func geluTanhSigmoid(b *moe.Builder, x string) string { // 0.5(1+tanh z) = σ(2z)
	z := op(b, "Mul", op(b, "Add", x, op(b, "Mul", op(b, "Mul", op(b, "Mul", x, x), x), sc(b, 0.044715))), sc(b, 2*math.Sqrt(2/math.Pi)))
	return op(b, "Mul", x, op(b, "Sigmoid", z))
}

// Spellings written with Exp the way a hand port does, which overflow
// float32 in the tails (an inf/inf or inf·0 there) where the function is
// finite; the identifier excuses those probes (passes/actident.go).
func sigmoidExpRatio(b *moe.Builder, x string) string { // eˣ/(1 + eˣ)
	e := op(b, "Exp", x)
	return op(b, "Div", e, op(b, "Add", sc(b, 1), e))
}
func tanhExp2(b *moe.Builder, x string) string { // (e²ˣ − 1)/(e²ˣ + 1)
	e := op(b, "Exp", op(b, "Mul", x, sc(b, 2)))
	return op(b, "Div", op(b, "Sub", e, sc(b, 1)), op(b, "Add", e, sc(b, 1)))
}
func tanhExpPair(b *moe.Builder, x string) string { // (eˣ − e⁻ˣ)/(eˣ + e⁻ˣ)
	p, n := op(b, "Exp", x), op(b, "Exp", op(b, "Neg", x))
	return op(b, "Div", op(b, "Sub", p, n), op(b, "Add", p, n))
}
func geluTanhPowExp(b *moe.Builder, x string) string { // gelu_tanh with Pow and its tanh by exp
	z := op(b, "Mul", sc(b, math.Sqrt(2/math.Pi)), op(b, "Add", x, op(b, "Mul", sc(b, 0.044715), op(b, "Pow", x, sc(b, 3)))))
	return op(b, "Mul", op(b, "Mul", sc(b, 0.5), x), op(b, "Add", sc(b, 1), tanhExp2(b, z)))
}
func siluReciprocal(b *moe.Builder, x string) string { // x·(1/(1 + e⁻ˣ)) by Reciprocal
	return op(b, "Mul", x, op(b, "Reciprocal", op(b, "Add", op(b, "Exp", op(b, "Neg", x)), sc(b, 1))))
}
func siluExpRatio(b *moe.Builder, x string) string { return op(b, "Mul", x, sigmoidExpRatio(b, x)) }

// maskMul is x·[x > 0] + neg·[x ≤ 0] with the masks cast to float: inf·0
// where neg overflows for a large positive x.
func maskMul(b *moe.Builder, x, neg string) string {
	pos := b.Op("Cast", []string{op(b, "Greater", x, sc(b, 0))}, graph.IntAttr("to", int64(pb.TensorProto_FLOAT)))
	nm := b.Op("Cast", []string{op(b, "LessOrEqual", x, sc(b, 0))}, graph.IntAttr("to", int64(pb.TensorProto_FLOAT)))
	return op(b, "Add", op(b, "Mul", x, pos), op(b, "Mul", neg, nm))
}

func onnxGelu(approx string) func(b *moe.Builder, x string) string {
	return func(b *moe.Builder, x string) string {
		return b.Op("Gelu", []string{x}, graph.StringAttr("approximate", approx))
	}
}

// gatedBy turns an ungated spelling f of the gate's function into a gated
// one, f(g)·u (or u·f(g) with upFirst).
func gatedBy(upFirst bool, f func(b *moe.Builder, x string) string) func(b *moe.Builder, g, u string) string {
	return func(b *moe.Builder, g, u string) string {
		if upFirst {
			return op(b, "Mul", u, f(b, g))
		}
		return op(b, "Mul", f(b, g), u)
	}
}
func ungated(f func(b *moe.Builder, x string) string) func(b *moe.Builder, g, u string) string {
	return func(b *moe.Builder, _, u string) string { return f(b, u) }
}
func body(name string, p moe.ActParams) func(b *moe.Builder, g, u string) string {
	return func(b *moe.Builder, g, u string) string { return moe.LookupActivation(name).Body(b, g, u, p) }
}

// ActivationCases lists, for every row of moe.Activations, parameters and
// several spellings (the function body's own, hand-written algebraic
// variants, fused contrib ops). Adding an activation adds one case here.
var ActivationCases = []ActCase{
	{Act: moe.SwiGLU, Spellings: []Spelling{
		{Name: "body", Emit: body(moe.SwiGLU, moe.ActParams{Alpha: 1})},
		{Name: "div-exp", Emit: gatedBy(false, func(b *moe.Builder, x string) string { return op(b, "Mul", x, sigmoidDivExp(b, x)) })},
		{Name: "x-over-1-exp", Emit: func(b *moe.Builder, g, u string) string {
			return op(b, "Div", op(b, "Mul", g, u), op(b, "Add", sc(b, 1), op(b, "Exp", op(b, "Neg", g))))
		}},
		{Name: "tanh-half", Emit: gatedBy(true, siluTanh)},
		{Name: "quickgelu-alpha1", MS: true, Emit: gatedBy(false, func(b *moe.Builder, x string) string {
			return msOp(b, "QuickGelu", []string{x}, graph.FloatAttr("alpha", 1))
		})},
		{Name: "exp-ratio", Emit: gatedBy(false, siluExpRatio)},
		{Name: "reciprocal", Emit: gatedBy(true, siluReciprocal)},
	}},
	{Act: moe.SwiGLUClamped, Params: moe.ActParams{Alpha: 1, Limit: 7}, Spellings: []Spelling{
		{Name: "body", Emit: body(moe.SwiGLUClamped, moe.ActParams{Alpha: 1, Limit: 7})},
		{Name: "max-min", Emit: func(b *moe.Builder, g, u string) string {
			g = op(b, "Min", g, sc(b, 7))
			u = op(b, "Max", op(b, "Min", u, sc(b, 7)), sc(b, -7))
			return op(b, "Mul", u, op(b, "Div", g, op(b, "Add", sc(b, 1), op(b, "Exp", op(b, "Neg", g)))))
		}},
	}},
	{Act: moe.SwiGLUOAI, Params: moe.ActParams{Alpha: 1.702, Limit: 7}, Spellings: []Spelling{
		{Name: "body", Emit: body(moe.SwiGLUOAI, moe.ActParams{Alpha: 1.702, Limit: 7})},
		{Name: "gpt-oss", Emit: func(b *moe.Builder, g, u string) string {
			g = b.Op("Clip", []string{g, "", sc(b, 7)})
			u = op(b, "Clip", u, sc(b, -7), sc(b, 7))
			glu := op(b, "Mul", g, op(b, "Sigmoid", op(b, "Mul", g, sc(b, 1.702))))
			return op(b, "Mul", op(b, "Add", u, sc(b, 1)), glu)
		}},
	}},
	{Act: moe.GeGLU, Spellings: []Spelling{
		{Name: "body", Emit: body(moe.GeGLU, moe.ActParams{Alpha: 1})},
		{Name: "erf-div", Emit: gatedBy(true, geluErfDiv)},
		{Name: "onnx-gelu", Opset: 20, Emit: gatedBy(false, onnxGelu("none"))},
		{Name: "ms-gelu", MS: true, Emit: gatedBy(false, func(b *moe.Builder, x string) string { return msOp(b, "Gelu", []string{x}) })},
	}},
	{Act: moe.GeGLUTanh, Spellings: []Spelling{
		{Name: "body", Emit: body(moe.GeGLUTanh, moe.ActParams{Alpha: 1})},
		{Name: "pow", Emit: gatedBy(false, geluTanhPow)},
		{Name: "pow-exp-tanh", Emit: gatedBy(true, geluTanhPowExp)},
		{Name: "ms-fastgelu", MS: true, Emit: gatedBy(true, func(b *moe.Builder, x string) string { return msOp(b, "FastGelu", []string{x}) })},
	}},
	{Act: moe.ReGLU, Spellings: []Spelling{
		{Name: "body", Emit: body(moe.ReGLU, moe.ActParams{Alpha: 1})},
		{Name: "max0", Emit: gatedBy(true, func(b *moe.Builder, x string) string { return op(b, "Max", x, sc(b, 0)) })},
	}},
	{Act: moe.Identity, Spellings: []Spelling{
		{Name: "none", Emit: body(moe.Identity, moe.ActParams{Alpha: 1})},
		{Name: "identity-op", Emit: ungated(func(b *moe.Builder, x string) string { return op(b, "Identity", x) })},
	}},
	{Act: moe.ReLU, Spellings: []Spelling{
		{Name: "body", Emit: body(moe.ReLU, moe.ActParams{Alpha: 1})},
		{Name: "max0", Emit: ungated(func(b *moe.Builder, x string) string { return op(b, "Max", x, sc(b, 0)) })},
		{Name: "where", Emit: ungated(func(b *moe.Builder, x string) string {
			return op(b, "Where", op(b, "Greater", x, sc(b, 0)), x, sc(b, 0))
		})},
	}},
	{Act: moe.ReLU2, Spellings: []Spelling{
		{Name: "body", Emit: body(moe.ReLU2, moe.ActParams{Alpha: 1})},
		{Name: "pow2", Emit: ungated(func(b *moe.Builder, x string) string { return op(b, "Pow", op(b, "Relu", x), sc(b, 2)) })},
	}},
	{Act: moe.GELU, Spellings: []Spelling{
		{Name: "body", Emit: body(moe.GELU, moe.ActParams{Alpha: 1})},
		{Name: "erf-div", Emit: ungated(geluErfDiv)},
		{Name: "onnx-gelu", Opset: 20, Emit: ungated(onnxGelu("none"))},
		{Name: "ms-gelu", MS: true, Emit: ungated(func(b *moe.Builder, x string) string { return msOp(b, "Gelu", []string{x}) })},
		{Name: "ms-biasgelu", MS: true, EmitW: func(b *moe.Builder, _, u string, inter int64) string {
			zero := b.Op("Constant", nil, graph.TensorAttr("value", moe.Float32Tensor("", []int64{inter}, make([]float32, inter))))
			return msOp(b, "BiasGelu", []string{u, zero})
		}},
	}},
	{Act: moe.GELUTanh, Spellings: []Spelling{
		{Name: "body", Emit: body(moe.GELUTanh, moe.ActParams{Alpha: 1})},
		{Name: "pow", Emit: ungated(geluTanhPow)},
		{Name: "pow-exp-tanh", Emit: ungated(geluTanhPowExp)},
		{Name: "sigmoid", Emit: ungated(geluTanhSigmoid)},
		{Name: "onnx-gelu-tanh", Opset: 20, Emit: ungated(onnxGelu("tanh"))},
		{Name: "ms-fastgelu", MS: true, Emit: ungated(func(b *moe.Builder, x string) string { return msOp(b, "FastGelu", []string{x}) })},
	}},
	{Act: moe.SiLU, Spellings: []Spelling{
		{Name: "body", Emit: body(moe.SiLU, moe.ActParams{Alpha: 1})},
		{Name: "div-exp", Emit: ungated(func(b *moe.Builder, x string) string {
			return op(b, "Div", x, op(b, "Add", sc(b, 1), op(b, "Exp", op(b, "Neg", x))))
		})},
		{Name: "tanh-half", Emit: ungated(siluTanh)},
		{Name: "reciprocal", Emit: ungated(siluReciprocal)},
		{Name: "exp-ratio", Emit: ungated(siluExpRatio)},
		{Name: "x-exp-over-1-exp", Emit: ungated(func(b *moe.Builder, x string) string { // x·eˣ/(eˣ + 1)
			e := op(b, "Exp", x)
			return op(b, "Div", op(b, "Mul", x, e), op(b, "Add", e, sc(b, 1)))
		})},
	}},
	{Act: moe.QuickGELU, Spellings: []Spelling{
		{Name: "body", Emit: body(moe.QuickGELU, moe.ActParams{Alpha: 1})},
		{Name: "ms-quickgelu", MS: true, Emit: ungated(func(b *moe.Builder, x string) string { return msOp(b, "QuickGelu", []string{x}) })},
		{Name: "div-exp", Emit: ungated(func(b *moe.Builder, x string) string {
			return op(b, "Div", x, op(b, "Add", sc(b, 1), op(b, "Exp", op(b, "Mul", x, sc(b, -1.702)))))
		})},
		{Name: "exp-ratio", Emit: ungated(func(b *moe.Builder, x string) string {
			return op(b, "Mul", x, sigmoidExpRatio(b, op(b, "Mul", x, sc(b, 1.702))))
		})},
	}},
	{Act: moe.Mish, Spellings: []Spelling{
		{Name: "body", Emit: body(moe.Mish, moe.ActParams{Alpha: 1})},
		{Name: "log-exp", Emit: ungated(func(b *moe.Builder, x string) string {
			return op(b, "Mul", x, op(b, "Tanh", op(b, "Log", op(b, "Add", op(b, "Exp", x), sc(b, 1)))))
		})},
		{Name: "mish-op", Opset: 18, Emit: ungated(func(b *moe.Builder, x string) string { return op(b, "Mish", x) })},
		{Name: "exp-only", Emit: ungated(func(b *moe.Builder, x string) string { // x·n/(n + 2), n = eˣ(eˣ + 2)
			e := op(b, "Exp", x)
			n := op(b, "Mul", e, op(b, "Add", e, sc(b, 2)))
			return op(b, "Div", op(b, "Mul", x, n), op(b, "Add", n, sc(b, 2)))
		})},
		{Name: "tanh-exp-softplus", Emit: ungated(func(b *moe.Builder, x string) string { // x·tanh(log(1 + eˣ)), both by exp
			return op(b, "Mul", x, tanhExp2(b, op(b, "Log", op(b, "Add", sc(b, 1), op(b, "Exp", x)))))
		})},
	}},
	{Act: moe.SELU, Spellings: []Spelling{
		{Name: "body", Emit: body(moe.SELU, moe.ActParams{Alpha: 1})},
		{Name: "by-hand", Emit: ungated(func(b *moe.Builder, x string) string {
			neg := op(b, "Min", sc(b, 0), op(b, "Mul", sc(b, 1.6732632423543772), op(b, "Sub", op(b, "Exp", x), sc(b, 1))))
			return op(b, "Mul", sc(b, 1.0507009873554805), op(b, "Add", op(b, "Max", x, sc(b, 0)), neg))
		})},
		{Name: "mask-mul", Emit: ungated(func(b *moe.Builder, x string) string { // γ·(x·[x > 0] + α(eˣ − 1)·[x ≤ 0])
			neg := op(b, "Mul", sc(b, 1.6732632423543772), op(b, "Sub", op(b, "Exp", x), sc(b, 1)))
			return op(b, "Mul", maskMul(b, x, neg), sc(b, 1.0507009873554805))
		})},
	}},
	{Act: moe.HardSwish, Spellings: []Spelling{
		{Name: "body", Emit: body(moe.HardSwish, moe.ActParams{Alpha: 1})},
		{Name: "x-hardsigmoid", Emit: ungated(func(b *moe.Builder, x string) string { // x·hardsigmoid(x), PyTorch's constants
			hs := b.Op("HardSigmoid", []string{x}, graph.FloatAttr("alpha", float32(1.0/6)), graph.FloatAttr("beta", 0.5))
			return op(b, "Mul", x, hs)
		})},
		{Name: "relu6", Emit: ungated(func(b *moe.Builder, x string) string { // x·relu6(x+3)/6
			return op(b, "Div", op(b, "Mul", x, op(b, "Clip", op(b, "Add", x, sc(b, 3)), sc(b, 0), sc(b, 6))), sc(b, 6))
		})},
		{Name: "relu6-min-max", Emit: ungated(func(b *moe.Builder, x string) string { // x·min(max(x + 3, 0), 6)/6
			r6 := op(b, "Min", op(b, "Max", op(b, "Add", x, sc(b, 3)), sc(b, 0)), sc(b, 6))
			return op(b, "Mul", op(b, "Div", r6, sc(b, 6)), x)
		})},
		{Name: "relu6-relu-min", Emit: ungated(func(b *moe.Builder, x string) string { // x·min(relu(x + 3), 6)·(1/6)
			r6 := op(b, "Min", op(b, "Relu", op(b, "Add", sc(b, 3), x)), sc(b, 6))
			return op(b, "Mul", op(b, "Mul", x, r6), sc(b, 1.0/6))
		})},
		{Name: "clip-hardsigmoid", Emit: ungated(func(b *moe.Builder, x string) string { // x·clip(x/6 + ½, 0, 1)
			return op(b, "Mul", x, op(b, "Clip", op(b, "Add", op(b, "Div", x, sc(b, 6)), sc(b, 0.5)), sc(b, 0), sc(b, 1)))
		})},
	}},
	{Act: moe.LeakyReLU, Params: moe.ActParams{Alpha: 0.1}, Spellings: []Spelling{
		{Name: "body", Emit: body(moe.LeakyReLU, moe.ActParams{Alpha: 0.1})},
		{Name: "where", Emit: ungated(func(b *moe.Builder, x string) string { // where(x > 0, x, 0.1·x)
			return op(b, "Where", op(b, "Greater", x, sc(b, 0)), x, op(b, "Mul", x, sc(b, 0.1)))
		})},
	}},
	{Act: moe.ELU, Params: moe.ActParams{Alpha: 0.7}, Spellings: []Spelling{
		{Name: "body", Emit: body(moe.ELU, moe.ActParams{Alpha: 0.7})},
		{Name: "where", Emit: ungated(func(b *moe.Builder, x string) string { // where(x > 0, x, α·(eˣ − 1))
			return op(b, "Where", op(b, "Greater", x, sc(b, 0)), x, op(b, "Mul", sc(b, 0.7), op(b, "Sub", op(b, "Exp", x), sc(b, 1))))
		})},
		{Name: "max-min", Emit: ungated(func(b *moe.Builder, x string) string { // max(x, 0) + min(0, α·(eˣ − 1))
			return op(b, "Add", op(b, "Max", x, sc(b, 0)), op(b, "Min", sc(b, 0), op(b, "Mul", op(b, "Sub", op(b, "Exp", x), sc(b, 1)), sc(b, 0.7))))
		})},
		{Name: "where-le", Emit: ungated(func(b *moe.Builder, x string) string { // where(x ≤ 0, α·(eˣ − 1), x)
			return op(b, "Where", op(b, "LessOrEqual", x, sc(b, 0)), op(b, "Mul", op(b, "Sub", op(b, "Exp", x), sc(b, 1)), sc(b, 0.7)), x)
		})},
		{Name: "mask-mul", Emit: ungated(func(b *moe.Builder, x string) string { // x·[x > 0] + α(eˣ − 1)·[x ≤ 0]
			return maskMul(b, x, op(b, "Mul", sc(b, 0.7), op(b, "Sub", op(b, "Exp", x), sc(b, 1))))
		})},
	}},
	{Act: moe.CELU, Params: moe.ActParams{Alpha: 2}, Spellings: []Spelling{
		{Name: "body", Emit: body(moe.CELU, moe.ActParams{Alpha: 2})},
		{Name: "max-min-div", Emit: ungated(func(b *moe.Builder, x string) string { // max(0, x) + min(0, α·(exp(x/α) − 1))
			e := op(b, "Sub", op(b, "Exp", op(b, "Div", x, sc(b, 2))), sc(b, 1))
			return op(b, "Add", op(b, "Max", sc(b, 0), x), op(b, "Min", sc(b, 0), op(b, "Mul", sc(b, 2), e)))
		})},
		{Name: "where-mul", Emit: ungated(func(b *moe.Builder, x string) string { // where(x < 0, α·(exp(x·(1/α)) − 1), x)
			e := op(b, "Sub", op(b, "Exp", op(b, "Mul", x, sc(b, 0.5))), sc(b, 1))
			return op(b, "Where", op(b, "Less", x, sc(b, 0)), op(b, "Mul", e, sc(b, 2)), x)
		})},
		{Name: "mask-mul", Emit: ungated(func(b *moe.Builder, x string) string { // x·[x > 0] + α(e^(x/α) − 1)·[x ≤ 0]
			return maskMul(b, x, op(b, "Mul", sc(b, 2), op(b, "Sub", op(b, "Exp", op(b, "Div", x, sc(b, 2))), sc(b, 1))))
		})},
		{Name: "min-exp", Emit: ungated(func(b *moe.Builder, x string) string { // max(0, x) + α(e^(min(0, x)/α) − 1)
			e := op(b, "Sub", op(b, "Exp", op(b, "Div", op(b, "Min", x, sc(b, 0)), sc(b, 2))), sc(b, 1))
			return op(b, "Add", op(b, "Relu", x), op(b, "Mul", e, sc(b, 2)))
		})},
	}},
	{Act: moe.Swish, Params: moe.ActParams{Alpha: 1.25}, Spellings: []Spelling{
		{Name: "body", Emit: body(moe.Swish, moe.ActParams{Alpha: 1.25})},
		{Name: "div-exp", Emit: ungated(func(b *moe.Builder, x string) string { // x/(1 + e^(−β·x))
			return op(b, "Div", x, op(b, "Add", sc(b, 1), op(b, "Exp", op(b, "Mul", x, sc(b, -1.25)))))
		})},
		{Name: "sigmoid-tau", Emit: ungated(func(b *moe.Builder, x string) string { // x·σ(x/τ), τ = 1/β
			return op(b, "Mul", x, op(b, "Sigmoid", op(b, "Div", x, sc(b, 0.8))))
		})},
		{Name: "ms-quickgelu-alpha", MS: true, Emit: ungated(func(b *moe.Builder, x string) string {
			return msOp(b, "QuickGelu", []string{x}, graph.FloatAttr("alpha", 1.25))
		})},
		{Name: "exp-ratio", Emit: ungated(func(b *moe.Builder, x string) string { // x·e^(βx)/(1 + e^(βx))
			return op(b, "Mul", x, sigmoidExpRatio(b, op(b, "Mul", sc(b, 1.25), x)))
		})},
		{Name: "reciprocal-neg", Emit: ungated(func(b *moe.Builder, x string) string { // x·1/(1 + e^(−(βx)))
			return op(b, "Mul", x, op(b, "Reciprocal", op(b, "Add", sc(b, 1), op(b, "Exp", op(b, "Neg", op(b, "Mul", x, sc(b, 1.25)))))))
		})},
	}},
	{Act: moe.Softplus, Spellings: []Spelling{
		{Name: "body", Emit: body(moe.Softplus, moe.ActParams{Alpha: 1})},
		{Name: "stable", Emit: ungated(func(b *moe.Builder, x string) string { // max(x, 0) + log(1 + e^(−|x|))
			return op(b, "Add", op(b, "Max", x, sc(b, 0)), op(b, "Log", op(b, "Add", sc(b, 1), op(b, "Exp", op(b, "Neg", op(b, "Abs", x))))))
		})},
		{Name: "threshold", Emit: ungated(func(b *moe.Builder, x string) string { // PyTorch's: where(x > 20, x, log(1 + eˣ))
			return op(b, "Where", op(b, "Greater", x, sc(b, 20)), x, op(b, "Log", op(b, "Add", op(b, "Exp", x), sc(b, 1))))
		})},
		{Name: "naive", Emit: ungated(func(b *moe.Builder, x string) string { // log(1 + eˣ), infinite past x ≈ 88
			return op(b, "Log", op(b, "Add", sc(b, 1), op(b, "Exp", x)))
		})},
		{Name: "log1p-exp", Emit: ungated(func(b *moe.Builder, x string) string { // torch.log1p(torch.exp(x)) as exported: log(eˣ + 1)
			return op(b, "Log", op(b, "Add", op(b, "Exp", x), sc(b, 1)))
		})},
		{Name: "neg-log-sigmoid", Emit: ungated(func(b *moe.Builder, x string) string { // −log(1/(1 + eˣ))
			return op(b, "Neg", op(b, "Log", op(b, "Div", sc(b, 1), op(b, "Add", op(b, "Exp", x), sc(b, 1)))))
		})},
	}},
	{Act: moe.Tanh, Spellings: []Spelling{
		{Name: "body", Emit: body(moe.Tanh, moe.ActParams{Alpha: 1})},
		{Name: "sigmoid", Emit: ungated(func(b *moe.Builder, x string) string { // 2·σ(2x) − 1
			return op(b, "Sub", op(b, "Mul", sc(b, 2), op(b, "Sigmoid", op(b, "Mul", x, sc(b, 2)))), sc(b, 1))
		})},
		{Name: "exp-abs", Emit: ungated(func(b *moe.Builder, x string) string { // sign(x)·(1 − e^(−2|x|))/(1 + e^(−2|x|))
			e := op(b, "Exp", op(b, "Mul", op(b, "Abs", x), sc(b, -2)))
			return op(b, "Mul", op(b, "Sign", x), op(b, "Div", op(b, "Sub", sc(b, 1), e), op(b, "Add", e, sc(b, 1))))
		})},
		{Name: "exp2", Emit: ungated(tanhExp2)},
		{Name: "exp-pair", Emit: ungated(tanhExpPair)},
	}},
	{Act: moe.SigmoidAct, Spellings: []Spelling{
		{Name: "body", Emit: body(moe.SigmoidAct, moe.ActParams{Alpha: 1})},
		{Name: "div-exp", Emit: ungated(sigmoidDivExp)},
		{Name: "exp-ratio", Emit: ungated(sigmoidExpRatio)},
		{Name: "reciprocal", Emit: ungated(func(b *moe.Builder, x string) string {
			return op(b, "Reciprocal", op(b, "Add", op(b, "Exp", op(b, "Neg", x)), sc(b, 1)))
		})},
		{Name: "tanh-half", Emit: ungated(func(b *moe.Builder, x string) string { // ½ + ½·tanh(x/2)
			return op(b, "Add", sc(b, 0.5), op(b, "Mul", sc(b, 0.5), op(b, "Tanh", op(b, "Mul", x, sc(b, 0.5)))))
		})},
	}},
	{Act: moe.QuickGeGLU, Spellings: []Spelling{
		{Name: "body", Emit: body(moe.QuickGeGLU, moe.ActParams{Alpha: 1})},
		{Name: "ms-quickgelu", MS: true, Emit: gatedBy(true, func(b *moe.Builder, x string) string { return msOp(b, "QuickGelu", []string{x}) })},
		{Name: "div-exp", Emit: func(b *moe.Builder, g, u string) string { // g·u/(1 + e^(−1.702·g))
			return op(b, "Div", op(b, "Mul", g, u), op(b, "Add", sc(b, 1), op(b, "Exp", op(b, "Mul", g, sc(b, -1.702)))))
		}},
		{Name: "exp-ratio", Emit: gatedBy(false, func(b *moe.Builder, x string) string {
			return op(b, "Mul", x, sigmoidExpRatio(b, op(b, "Mul", x, sc(b, 1.702))))
		})},
	}},
	{Act: moe.SwishGLU, Params: moe.ActParams{Alpha: 1.25}, Spellings: []Spelling{
		{Name: "body", Emit: body(moe.SwishGLU, moe.ActParams{Alpha: 1.25})},
		{Name: "div-exp", Emit: gatedBy(false, func(b *moe.Builder, x string) string {
			return op(b, "Div", x, op(b, "Add", sc(b, 1), op(b, "Exp", op(b, "Mul", x, sc(b, -1.25)))))
		})},
		{Name: "sigmoid-tau", Emit: gatedBy(true, func(b *moe.Builder, x string) string {
			return op(b, "Mul", x, op(b, "Sigmoid", op(b, "Div", x, sc(b, 0.8))))
		})},
		{Name: "exp-ratio", Emit: gatedBy(true, func(b *moe.Builder, x string) string {
			return op(b, "Mul", x, sigmoidExpRatio(b, op(b, "Mul", x, sc(b, 1.25))))
		})},
	}},
	{Act: moe.GLU, Spellings: []Spelling{
		{Name: "body", Emit: body(moe.GLU, moe.ActParams{Alpha: 1})},
		{Name: "div-exp", Emit: func(b *moe.Builder, g, u string) string { // u/(1 + e^(−g))
			return op(b, "Div", u, op(b, "Add", sc(b, 1), op(b, "Exp", op(b, "Neg", g))))
		}},
		{Name: "tanh-half", Emit: func(b *moe.Builder, g, u string) string { // u·(½ + ½·tanh(g/2))
			t := op(b, "Tanh", op(b, "Mul", g, sc(b, 0.5)))
			return op(b, "Mul", op(b, "Add", op(b, "Mul", t, sc(b, 0.5)), sc(b, 0.5)), u)
		}},
		{Name: "exp-ratio", Emit: func(b *moe.Builder, g, u string) string { return op(b, "Mul", u, sigmoidExpRatio(b, g)) }},
	}},
	{Act: moe.Bilinear, Spellings: []Spelling{
		{Name: "body", Emit: body(moe.Bilinear, moe.ActParams{Alpha: 1})},
		{Name: "neg-neg", Emit: func(b *moe.Builder, g, u string) string { return op(b, "Mul", op(b, "Neg", g), op(b, "Neg", u)) }},
		{Name: "div-reciprocal", Emit: func(b *moe.Builder, g, u string) string { // g/(1/u), infinite where u is 0
			return op(b, "Div", g, op(b, "Reciprocal", u))
		}},
		{Name: "identity-gate", Emit: func(b *moe.Builder, g, u string) string { return op(b, "Mul", op(b, "Identity", g), u) }},
	}},
}

// ActivationCase returns the case of activation act, or nil.
func ActivationCase(act string) *ActCase {
	for i := range ActivationCases {
		if ActivationCases[i].Act == act {
			return &ActivationCases[i]
		}
	}
	return nil
}

// Respell replaces every SwiGLU expert activation of a model Build wrote
// (shapes batched, unrolled and dense; inter is its Config.Inter) by sp:
// for an ungated activation the gate projection is left unread. It raises the default-domain opset
// to sp.Opset and imports com.microsoft where sp needs it.
func Respell(m *graph.Model, sp Spelling, inter int64) error {
	gp := m.Proto.Graph
	prod := map[string]*pb.NodeProto{}
	for _, n := range gp.Node {
		for _, o := range n.Output {
			prod[o] = n
		}
	}
	drop := map[*pb.NodeProto]bool{}
	var add []*pb.NodeProto
	count := 0
	for _, n := range gp.Node {
		if n.GetOpType() != "Mul" || !strings.HasSuffix(n.Output[0], "act") {
			continue
		}
		silu := prod[n.Input[0]]
		if silu == nil || silu.GetOpType() != "Mul" || prod[silu.Input[1]] == nil || prod[silu.Input[1]].GetOpType() != "Sigmoid" {
			return fmt.Errorf("node %q is not the builder's SwiGLU", n.GetName())
		}
		g, u := silu.Input[0], n.Input[1]
		drop[n], drop[silu], drop[prod[silu.Input[1]]] = true, true, true
		count++
		b := &moe.Builder{Prefix: fmt.Sprintf("%s/act%d/", n.Output[0], count)}
		out := sp.Write(b, g, u, inter)
		add = append(add, b.Nodes...)
		add = append(add, graph.NewNode("Identity", "", n.GetName()+"/respelled", []string{out}, n.Output))
	}
	if count == 0 {
		return fmt.Errorf("no SwiGLU activation found to respell")
	}
	var keep []*pb.NodeProto
	for _, n := range gp.Node {
		if !drop[n] {
			keep = append(keep, n)
		}
	}
	gp.Node = append(keep, add...)
	if sp.Opset > m.Opset("") {
		m.SetOpset("", sp.Opset)
	}
	if sp.MS {
		m.SetOpset("com.microsoft", 1)
	}
	return m.Graph().Sort()
}

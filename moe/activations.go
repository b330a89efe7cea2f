package moe

import (
	"math"

	"github.com/mokopt/mokopt/graph"
	"sort"
)

// Expert activations added to the contract's first four (see spec.go).
const (
	// GELUTanh is down(gelu_tanh(up)): the tanh approximation
	// 0.5·x·(1 + tanh(√(2/π)·(x + 0.044715·x³))).
	GELUTanh = "gelu_tanh"
	// QuickGELU is down(up·σ(1.702·up)).
	QuickGELU = "quick_gelu"
	// SiLU is the ungated down(silu(up)).
	SiLU = "silu"
	// ReLU is down(max(up, 0)).
	ReLU = "relu"
	// ReLU2 is down(max(up, 0)²), the squared ReLU.
	ReLU2 = "relu2"
	// Identity is a linear expert, down(up).
	Identity = "identity"
	// Mish is down(up·tanh(softplus(up))).
	Mish = "mish"
	// SELU is down(selu(up)) with the ONNX Selu defaults (α 1.67326, γ 1.0507).
	SELU = "selu"
	// GeGLU is gelu(gate)·up with the exact (erf) GELU.
	GeGLU = "geglu"
	// GeGLUTanh is gelu_tanh(gate)·up.
	GeGLUTanh = "geglu_tanh"
	// ReGLU is relu(gate)·up.
	ReGLU = "reglu"
	// HardSwish is down(up·max(0, min(1, up/6 + 1/2))), MobileNetV3's
	// hard swish (ONNX HardSwish, PyTorch nn.Hardswish).
	HardSwish = "hardswish"
	// LeakyReLU is down(max(up, 0) + α·min(up, 0)); its negative slope α
	// is the swiglu_alpha attribute.
	LeakyReLU = "leaky_relu"
	// ELU is down(elu(up)): up if up > 0, else α·(e^up − 1); α is the
	// swiglu_alpha attribute (ONNX Elu's alpha, 1 by default).
	ELU = "elu"
	// CELU is down(max(0, up) + min(0, α·(e^(up/α) − 1))), ONNX Celu; α is
	// the swiglu_alpha attribute.
	CELU = "celu"
	// Swish is down(up·σ(β·up)) with β the swiglu_alpha attribute, for the
	// β that are neither SiLU's 1 nor QuickGELU's 1.702.
	Swish = "swish"
	// Softplus is down(log(1 + e^up)).
	Softplus = "softplus"
	// Tanh is down(tanh(up)).
	Tanh = "tanh"
	// SigmoidAct is down(σ(up)), the logistic sigmoid as an expert
	// activation (named apart from the router's Sigmoid, which is the
	// router_activation value).
	SigmoidAct = "sigmoid"
	// QuickGeGLU is quick_gelu(gate)·up: gate·σ(1.702·gate)·up.
	QuickGeGLU = "quick_geglu"
	// SwishGLU is swish(gate)·up: gate·σ(β·gate)·up, with β the
	// swiglu_alpha attribute (neither SwiGLU's 1 nor QuickGeGLU's 1.702).
	SwishGLU = "swishglu"
	// GLU is σ(gate)·up, the original gated linear unit (PyTorch's
	// F.glu on a fused projection, with the gate the second half).
	GLU = "glu"
	// Bilinear is gate·up, the gated unit without an activation.
	Bilinear = "bilinear"
)

// ActParams are the parameters of a parametrised activation: Alpha
// (swiglu_alpha, 1 when unused) and Limit (swiglu_limit, 0: no clamp).
type ActParams struct{ Alpha, Limit float32 }

// Which parameters an activation takes.
const (
	LimitNone     = iota // no limit: swiglu_limit is 0
	LimitRequired        // a clamp limit > 0
	LimitOptional        // a clamp limit, or 0 for none
)

// ORTActivation is how ONNX Runtime's com.microsoft::MoE computes an
// activation exactly: its activation_type and, for swiglu, activation_alpha,
// activation_beta and swiglu_limit (0: no clamp).
type ORTActivation struct {
	Type               string
	Alpha, Beta, Limit float32
}

// ActivationDef is one row of the activation table: everything the
// contract, the reference, the function body, the detector and the targets
// need to know about one expert activation.
type ActivationDef struct {
	// Name is the fused node's activation attribute.
	Name string
	// Gated: the activation reads a gate and an up projection; otherwise
	// only up (the expert has no gate weight).
	Gated bool
	// Alpha: the activation takes swiglu_alpha; Limit: which swiglu_limit.
	Alpha bool
	Limit int
	// Eval is the reference, in float64: g is the gate projection (ignored
	// when not Gated), u the up projection.
	Eval func(g, u float64, p ActParams) float64
	// RTol and ATol are how closely a float32 subgraph must agree with Eval
	// on the detector's probes to be identified as this activation:
	// |got − want| ≤ RTol·|want| + ATol·scale, with scale (1+|g|)(1+|u|).
	RTol, ATol float64
	// Body appends the activation in standard ONNX ops (opset 13) to b and
	// returns its output; g is "" when not Gated.
	Body func(b *Builder, g, u string, p ActParams) string
	// ORT maps the activation onto ONNX Runtime's MoE where that computes
	// exactly the same function; otherwise it returns the reason it cannot.
	ORT func(p ActParams) (ORTActivation, string)
	// MoK: the MoK kernel computes it (SwiGLU and clamped SwiGLU only).
	MoK bool
}

// Parametrised reports whether the row takes a parameter (swiglu_alpha or
// swiglu_limit). Where a row without parameters and a parametrised one
// both compute a subgraph (SiLU and Swish with β = 1), the identifier
// names the one without.
func (d *ActivationDef) Parametrised() bool { return d.Alpha || d.Limit != LimitNone }

const sqrt2OverPi = 0.7978845608028654 // √(2/π)

func sigmoid64(x float64) float64 { return 1 / (1 + math.Exp(-x)) }
func geluErf(x float64) float64   { return 0.5 * x * (1 + math.Erf(x/math.Sqrt2)) }
func geluTanh(x float64) float64 {
	return 0.5 * x * (1 + math.Tanh(sqrt2OverPi*(x+0.044715*x*x*x)))
}
func softplus64(x float64) float64 {
	if x > 30 {
		return x
	}
	return math.Log1p(math.Exp(x))
}

// The ONNX Selu defaults, as float32 attributes hold them.
const (
	seluAlpha = 1.67326319217681884765625
	seluGamma = 1.05070102214813232421875
)

func elu64(x, alpha float64) float64 {
	if x > 0 {
		return x
	}
	return alpha * math.Expm1(x)
}

func celu64(x, alpha float64) float64 {
	return math.Max(0, x) + math.Min(0, alpha*math.Expm1(x/alpha))
}

func clampPair(g, u float64, p ActParams) (float64, float64) {
	if p.Limit > 0 {
		L := float64(p.Limit)
		g = math.Min(g, L)
		u = math.Max(math.Min(u, L), -L)
	}
	return g, u
}

// noORT is a row's ORT field for an activation ONNX Runtime's MoE lacks.
func noORT(why string) func(ActParams) (ORTActivation, string) {
	return func(ActParams) (ORTActivation, string) { return ORTActivation{}, why }
}

// ortUngated maps an ungated activation onto one of ONNX Runtime's.
func ortUngated(t string) func(ActParams) (ORTActivation, string) {
	return func(ActParams) (ORTActivation, string) { return ORTActivation{Type: t}, "" }
}

// Body helpers.
func bodySilu(b *Builder, x string) string {
	return b.Op("Mul", []string{x, b.Op("Sigmoid", []string{x})})
}
func bodyGeluErf(b *Builder, x string) string {
	inner := b.Op("Erf", []string{b.Op("Mul", []string{x, b.Scalar(float32(1 / math.Sqrt2))})})
	return b.Op("Mul", []string{b.Op("Mul", []string{x, b.Scalar(0.5)}), b.Op("Add", []string{inner, b.Scalar(1)})})
}
func bodyGeluTanh(b *Builder, x string) string {
	x3 := b.Op("Mul", []string{b.Op("Mul", []string{x, x}), x})
	inner := b.Op("Add", []string{x, b.Op("Mul", []string{x3, b.Scalar(0.044715)})})
	th := b.Op("Tanh", []string{b.Op("Mul", []string{inner, b.Scalar(float32(sqrt2OverPi))})})
	return b.Op("Mul", []string{b.Op("Mul", []string{x, b.Scalar(0.5)}), b.Op("Add", []string{th, b.Scalar(1)})})
}
func bodyClamp(b *Builder, g, u string, p ActParams) (string, string) {
	if p.Limit > 0 {
		g = b.Op("Min", []string{g, b.Scalar(p.Limit)})
		u = b.Op("Clip", []string{u, b.Scalar(-p.Limit), b.Scalar(p.Limit)})
	}
	return g, u
}
func mul(b *Builder, x, y string) string { return b.Op("Mul", []string{x, y}) }

// Activations is the table of expert activations, in the order the
// detector tries them (simpler functions first). Adding an activation is
// one row here plus one row in the table-driven tests.
var Activations = []ActivationDef{
	{Name: SwiGLU, Gated: true, RTol: 1e-5, ATol: 1e-6, MoK: true,
		Eval: func(g, u float64, _ ActParams) float64 { return g * sigmoid64(g) * u },
		Body: func(b *Builder, g, u string, _ ActParams) string { return mul(b, bodySilu(b, g), u) },
		ORT: func(ActParams) (ORTActivation, string) {
			return ORTActivation{Type: "swiglu", Alpha: 1}, ""
		}},
	{Name: SwiGLUClamped, Gated: true, Limit: LimitRequired, RTol: 1e-5, ATol: 1e-6, MoK: true,
		Eval: func(g, u float64, p ActParams) float64 { g, u = clampPair(g, u, p); return g * sigmoid64(g) * u },
		Body: func(b *Builder, g, u string, p ActParams) string {
			g, u = bodyClamp(b, g, u, p)
			return mul(b, bodySilu(b, g), u)
		},
		ORT: func(p ActParams) (ORTActivation, string) {
			return ORTActivation{Type: "swiglu", Alpha: 1, Limit: p.Limit}, ""
		}},
	{Name: SwiGLUOAI, Gated: true, Alpha: true, Limit: LimitOptional, RTol: 1e-5, ATol: 1e-6,
		Eval: func(g, u float64, p ActParams) float64 {
			g, u = clampPair(g, u, p)
			return (u + 1) * g * sigmoid64(float64(p.Alpha)*g)
		},
		Body: func(b *Builder, g, u string, p ActParams) string {
			g, u = bodyClamp(b, g, u, p)
			glu := mul(b, g, b.Op("Sigmoid", []string{mul(b, g, b.Scalar(p.Alpha))}))
			return mul(b, b.Op("Add", []string{u, b.Scalar(1)}), glu)
		},
		ORT: func(p ActParams) (ORTActivation, string) {
			return ORTActivation{Type: "swiglu", Alpha: p.Alpha, Beta: 1, Limit: p.Limit}, ""
		}},
	{Name: GeGLU, Gated: true, RTol: 1e-5, ATol: 1e-6,
		Eval: func(g, u float64, _ ActParams) float64 { return geluErf(g) * u },
		Body: func(b *Builder, g, u string, _ ActParams) string { return mul(b, bodyGeluErf(b, g), u) },
		ORT:  noORT("the gated GELU (geglu): the op's only gated form is SwiGLU, and its CPU kernel has no fc3")},
	{Name: GeGLUTanh, Gated: true, RTol: 1e-5, ATol: 1e-6,
		Eval: func(g, u float64, _ ActParams) float64 { return geluTanh(g) * u },
		Body: func(b *Builder, g, u string, _ ActParams) string { return mul(b, bodyGeluTanh(b, g), u) },
		ORT:  noORT("the gated tanh GELU (geglu_tanh): the op's only gated form is SwiGLU, and its CPU kernel has no fc3")},
	{Name: ReGLU, Gated: true, RTol: 1e-5, ATol: 1e-6,
		Eval: func(g, u float64, _ ActParams) float64 { return math.Max(g, 0) * u },
		Body: func(b *Builder, g, u string, _ ActParams) string { return mul(b, b.Op("Relu", []string{g}), u) },
		ORT:  noORT("the gated ReLU (reglu): the op's only gated form is SwiGLU, and its CPU kernel has no fc3")},
	{Name: Identity, RTol: 1e-6, ATol: 1e-7,
		Eval: func(_, u float64, _ ActParams) float64 { return u },
		Body: func(b *Builder, _, u string, _ ActParams) string { return u },
		ORT:  ortUngated("identity")},
	{Name: ReLU, RTol: 1e-6, ATol: 1e-7,
		Eval: func(_, u float64, _ ActParams) float64 { return math.Max(u, 0) },
		Body: func(b *Builder, _, u string, _ ActParams) string { return b.Op("Relu", []string{u}) },
		ORT:  ortUngated("relu")},
	{Name: ReLU2, RTol: 1e-5, ATol: 1e-7,
		Eval: func(_, u float64, _ ActParams) float64 { r := math.Max(u, 0); return r * r },
		Body: func(b *Builder, _, u string, _ ActParams) string { r := b.Op("Relu", []string{u}); return mul(b, r, r) },
		ORT:  noORT("the squared ReLU (relu2), which the op lacks")},
	{Name: GELU, RTol: 1e-5, ATol: 1e-6,
		Eval: func(_, u float64, _ ActParams) float64 { return geluErf(u) },
		Body: func(b *Builder, _, u string, _ ActParams) string { return bodyGeluErf(b, u) },
		ORT:  noORT("the exact-erf GELU expert (the op's gelu is the tanh approximation)")},
	{Name: GELUTanh, RTol: 1e-5, ATol: 1e-6,
		Eval: func(_, u float64, _ ActParams) float64 { return geluTanh(u) },
		Body: func(b *Builder, _, u string, _ ActParams) string { return bodyGeluTanh(b, u) },
		ORT:  ortUngated("gelu")},
	{Name: SiLU, RTol: 1e-5, ATol: 1e-6,
		Eval: func(_, u float64, _ ActParams) float64 { return u * sigmoid64(u) },
		Body: func(b *Builder, _, u string, _ ActParams) string { return bodySilu(b, u) },
		ORT:  ortUngated("silu")},
	{Name: QuickGELU, RTol: 1e-5, ATol: 1e-6,
		Eval: func(_, u float64, _ ActParams) float64 { return u * sigmoid64(1.702*u) },
		Body: func(b *Builder, _, u string, _ ActParams) string {
			return mul(b, u, b.Op("Sigmoid", []string{mul(b, u, b.Scalar(1.702))}))
		},
		ORT: noORT("the quick GELU (quick_gelu, x·σ(1.702·x)), which the op lacks")},
	{Name: Mish, RTol: 1e-5, ATol: 1e-6,
		Eval: func(_, u float64, _ ActParams) float64 { return u * math.Tanh(softplus64(u)) },
		Body: func(b *Builder, _, u string, _ ActParams) string {
			return mul(b, u, b.Op("Tanh", []string{b.Op("Softplus", []string{u})}))
		},
		ORT: noORT("mish, which the op lacks")},
	{Name: SELU, RTol: 1e-5, ATol: 1e-6,
		Eval: func(_, u float64, _ ActParams) float64 {
			if u > 0 {
				return seluGamma * u
			}
			return seluGamma * seluAlpha * math.Expm1(u)
		},
		Body: func(b *Builder, _, u string, _ ActParams) string { return b.Op("Selu", []string{u}) },
		ORT:  noORT("selu, which the op lacks")},
	{Name: HardSwish, RTol: 1e-5, ATol: 1e-6,
		Eval: func(_, u float64, _ ActParams) float64 { return u * math.Max(0, math.Min(1, u/6+0.5)) },
		Body: func(b *Builder, _, u string, _ ActParams) string { return b.Op("HardSwish", []string{u}) },
		ORT:  noORT("hardswish, which the op lacks")},
	{Name: LeakyReLU, Alpha: true, RTol: 1e-5, ATol: 1e-6,
		Eval: func(_, u float64, p ActParams) float64 { return math.Max(u, 0) + float64(p.Alpha)*math.Min(u, 0) },
		Body: func(b *Builder, _, u string, p ActParams) string {
			return b.Op("LeakyRelu", []string{u}, graph.FloatAttr("alpha", p.Alpha))
		},
		ORT: noORT("leaky ReLU (leaky_relu), which the op lacks")},
	{Name: ELU, Alpha: true, RTol: 1e-5, ATol: 1e-6,
		Eval: func(_, u float64, p ActParams) float64 { return elu64(u, float64(p.Alpha)) },
		Body: func(b *Builder, _, u string, p ActParams) string {
			return b.Op("Elu", []string{u}, graph.FloatAttr("alpha", p.Alpha))
		},
		ORT: noORT("elu, which the op lacks")},
	{Name: CELU, Alpha: true, RTol: 1e-5, ATol: 1e-6,
		Eval: func(_, u float64, p ActParams) float64 { return celu64(u, float64(p.Alpha)) },
		Body: func(b *Builder, _, u string, p ActParams) string {
			return b.Op("Celu", []string{u}, graph.FloatAttr("alpha", p.Alpha))
		},
		ORT: noORT("celu, which the op lacks")},
	{Name: Swish, Alpha: true, RTol: 1e-5, ATol: 1e-6,
		Eval: func(_, u float64, p ActParams) float64 { return u * sigmoid64(float64(p.Alpha)*u) },
		Body: func(b *Builder, _, u string, p ActParams) string {
			return mul(b, u, b.Op("Sigmoid", []string{mul(b, u, b.Scalar(p.Alpha))}))
		},
		ORT: noORT("swish with β other than 1 (x·σ(β·x)), which the op lacks (its silu has β 1)")},
	{Name: Softplus, RTol: 1e-5, ATol: 1e-6,
		Eval: func(_, u float64, _ ActParams) float64 { return softplus64(u) },
		Body: func(b *Builder, _, u string, _ ActParams) string { return b.Op("Softplus", []string{u}) },
		ORT:  noORT("softplus, which the op lacks")},
	{Name: Tanh, RTol: 1e-5, ATol: 1e-6,
		Eval: func(_, u float64, _ ActParams) float64 { return math.Tanh(u) },
		Body: func(b *Builder, _, u string, _ ActParams) string { return b.Op("Tanh", []string{u}) },
		ORT:  noORT("tanh, which the op lacks")},
	{Name: SigmoidAct, RTol: 1e-5, ATol: 1e-6,
		Eval: func(_, u float64, _ ActParams) float64 { return sigmoid64(u) },
		Body: func(b *Builder, _, u string, _ ActParams) string { return b.Op("Sigmoid", []string{u}) },
		ORT:  noORT("the sigmoid expert activation (sigmoid), which the op lacks")},
	{Name: QuickGeGLU, Gated: true, RTol: 1e-5, ATol: 1e-6,
		Eval: func(g, u float64, _ ActParams) float64 { return g * sigmoid64(1.702*g) * u },
		Body: func(b *Builder, g, u string, _ ActParams) string {
			return mul(b, mul(b, g, b.Op("Sigmoid", []string{mul(b, g, b.Scalar(1.702))})), u)
		},
		ORT: func(ActParams) (ORTActivation, string) {
			return ORTActivation{Type: "swiglu", Alpha: 1.702}, ""
		}},
	{Name: SwishGLU, Gated: true, Alpha: true, RTol: 1e-5, ATol: 1e-6,
		Eval: func(g, u float64, p ActParams) float64 { return g * sigmoid64(float64(p.Alpha)*g) * u },
		Body: func(b *Builder, g, u string, p ActParams) string {
			return mul(b, mul(b, g, b.Op("Sigmoid", []string{mul(b, g, b.Scalar(p.Alpha))})), u)
		},
		ORT: func(p ActParams) (ORTActivation, string) {
			return ORTActivation{Type: "swiglu", Alpha: p.Alpha}, ""
		}},
	{Name: GLU, Gated: true, RTol: 1e-5, ATol: 1e-6,
		Eval: func(g, u float64, _ ActParams) float64 { return sigmoid64(g) * u },
		Body: func(b *Builder, g, u string, _ ActParams) string { return mul(b, b.Op("Sigmoid", []string{g}), u) },
		ORT:  noORT("the gated sigmoid (glu, σ(g)·u): the op's only gated form is SwiGLU, and its CPU kernel has no fc3")},
	{Name: Bilinear, Gated: true, RTol: 1e-5, ATol: 1e-6,
		Eval: func(g, u float64, _ ActParams) float64 { return g * u },
		Body: func(b *Builder, g, u string, _ ActParams) string { return mul(b, g, u) },
		ORT:  noORT("the bilinear gated unit (bilinear, g·u): the op's only gated form is SwiGLU, and its CPU kernel has no fc3")},
}

// LookupActivation returns the table row named name, or nil.
func LookupActivation(name string) *ActivationDef {
	for i := range Activations {
		if Activations[i].Name == name {
			return &Activations[i]
		}
	}
	return nil
}

// ActivationNames lists the table's names, sorted.
func ActivationNames() []string {
	out := make([]string, len(Activations))
	for i, a := range Activations {
		out[i] = a.Name
	}
	sort.Strings(out)
	return out
}

// ActParams returns the spec's activation parameters as its row reads them.
func (s *Spec) ActParams() ActParams { return ActParams{Alpha: s.SwiGLUAlpha, Limit: s.SwiGLULimit} }

// ActivationDef returns the row of the spec's activation, or nil.
func (s *Spec) ActivationDef() *ActivationDef { return LookupActivation(s.Activation) }

// Gated reports whether the spec's activation reads a gate projection (an
// unknown activation counts as gated, as the contract's default is).
func (s *Spec) Gated() bool {
	if a := s.ActivationDef(); a != nil {
		return a.Gated
	}
	return true
}

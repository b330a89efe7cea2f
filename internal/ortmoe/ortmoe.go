// Package ortmoe implements ONNX Runtime's contrib operators
// com.microsoft::MoE and com.microsoft::QMoE in plain Go, from their
// documented semantics (models/ORT_MOE.md records the sources): routing
// from the router_probs input, the fc1/fc2/fc3 expert layouts (current
// [E, out, in] and legacy [E, in, out]), every activation_type, the three
// swiglu_fusion layouts with activation_alpha, activation_beta and
// swiglu_limit, expert biases, and QMoE's int8/int4 weights with per-row or
// block-wise scales and optional zero points.
//
// Importing the package registers both kernels with the reference
// interpreter (graph/eval), so a model holding these nodes can be run, and
// numerically checked, without ONNX Runtime. The ort-tagged tests in
// internal/ortrun compare the kernels with ONNX Runtime itself.
package ortmoe

import (
	"fmt"
	"math"
	"sort"

	"github.com/mokopt/mokopt/graph"
	pb "github.com/mokopt/mokopt/graph/onnxpb"
)

// Domain is ONNX Runtime's contrib-op domain; OpMoE and OpQMoE its MoE ops.
const (
	Domain = "com.microsoft"
	OpMoE  = "MoE"
	OpQMoE = "QMoE"
)

// Activation types of the activation_type attribute.
const (
	Relu     = "relu"
	Gelu     = "gelu"
	Silu     = "silu"
	Identity = "identity"
	SwiGLU   = "swiglu"
)

// Swiglu_fusion values: fc1 and fc3 separate, fc1 holding gate and linear
// rows interleaved (gate 2i, linear 2i+1), or concatenated (gate rows, then
// linear rows).
const (
	FusionNone         = 0
	FusionInterleaved  = 1
	FusionConcatenated = 2
)

// Input positions of com.microsoft::MoE.
const (
	MoEInput = iota
	MoERouter
	MoEFC1
	MoEFC1Bias
	MoEFC2
	MoEFC2Bias
	MoEFC3
	MoEFC3Bias
)

// Input positions of com.microsoft::QMoE.
const (
	QInput = iota
	QRouter
	QFC1
	QFC1Scales
	QFC1Bias
	QFC2
	QFC2Scales
	QFC2Bias
	QFC3
	QFC3Scales
	QFC3Bias
	QFC1Zero
	QFC2Zero
	QFC3Zero
	QRouterWeights
)

// Attrs are the attributes of one MoE or QMoE node, with ONNX Runtime's
// defaults filled in.
type Attrs struct {
	// Quantized is true for QMoE.
	Quantized bool
	// K is the number of experts per token.
	K int
	// Activation is activation_type (default relu).
	Activation string
	// Normalize is normalize_routing_weights: the k selected weights are
	// divided by their sum.
	Normalize bool
	// SparseMixer is use_sparse_mixer (Phi-3.5's routing, k = 2).
	SparseMixer bool
	// Fusion is swiglu_fusion.
	Fusion int
	// Alpha, Beta and Limit are activation_alpha (default 1),
	// activation_beta (default 0) and swiglu_limit (default +inf).
	Alpha, Beta, Limit float32
	// Bits is QMoE's expert_weight_bits (8 or 4; default 4).
	Bits int
	// BlockSize is QMoE's block_size; 0 means one scale per output row.
	BlockSize int
}

// ParseAttrs reads the attributes of a com.microsoft::MoE or QMoE node.
func ParseAttrs(n *pb.NodeProto) (*Attrs, error) {
	if n.GetDomain() != Domain || (n.GetOpType() != OpMoE && n.GetOpType() != OpQMoE) {
		return nil, fmt.Errorf("node %q is %s::%s, not %s::MoE or QMoE", graph.NodeLabel(n), n.GetDomain(), n.GetOpType(), Domain)
	}
	a := &Attrs{
		Quantized:   n.GetOpType() == OpQMoE,
		K:           int(graph.AttrInt(n, "k", 1)),
		Activation:  graph.AttrString(n, "activation_type", Relu),
		Normalize:   graph.AttrInt(n, "normalize_routing_weights", 0) == 1,
		SparseMixer: graph.AttrInt(n, "use_sparse_mixer", 0) == 1,
		Fusion:      int(graph.AttrInt(n, "swiglu_fusion", 0)),
		Alpha:       graph.AttrFloat(n, "activation_alpha", 1),
		Beta:        graph.AttrFloat(n, "activation_beta", 0),
		Limit:       graph.AttrFloat(n, "swiglu_limit", float32(math.Inf(1))),
		Bits:        int(graph.AttrInt(n, "expert_weight_bits", 4)),
		BlockSize:   int(graph.AttrInt(n, "block_size", 0)),
	}
	switch a.Activation {
	case Relu, Gelu, Silu, Identity, SwiGLU:
	default:
		return nil, fmt.Errorf("node %q: unsupported activation_type %q", graph.NodeLabel(n), a.Activation)
	}
	if a.Fusion < 0 || a.Fusion > 2 {
		return nil, fmt.Errorf("node %q: swiglu_fusion %d not in 0..2", graph.NodeLabel(n), a.Fusion)
	}
	if a.SparseMixer && a.K != 2 {
		return nil, fmt.Errorf("node %q: use_sparse_mixer needs k = 2, has %d", graph.NodeLabel(n), a.K)
	}
	if a.Quantized {
		if a.Bits != 4 && a.Bits != 8 {
			return nil, fmt.Errorf("node %q: expert_weight_bits %d (want 4 or 8)", graph.NodeLabel(n), a.Bits)
		}
		if q := graph.AttrString(n, "quant_type", "int"); q != "int" {
			return nil, fmt.Errorf("node %q: quant_type %q is not supported (only int)", graph.NodeLabel(n), q)
		}
	}
	return a, nil
}

// NodeAttrs encodes a as node attributes (every one written explicitly, so
// that no ONNX Runtime build's defaults matter).
func (a *Attrs) NodeAttrs() []*pb.AttributeProto {
	b := func(v bool) int64 {
		if v {
			return 1
		}
		return 0
	}
	attrs := []*pb.AttributeProto{
		graph.IntAttr("k", int64(a.K)),
		graph.StringAttr("activation_type", a.Activation),
		graph.IntAttr("normalize_routing_weights", b(a.Normalize)),
		graph.IntAttr("use_sparse_mixer", b(a.SparseMixer)),
	}
	if a.Activation == SwiGLU {
		limit := a.Limit
		if math.IsInf(float64(limit), 1) {
			limit = math.MaxFloat32
		}
		attrs = append(attrs, graph.IntAttr("swiglu_fusion", int64(a.Fusion)),
			graph.FloatAttr("activation_alpha", a.Alpha), graph.FloatAttr("activation_beta", a.Beta),
			graph.FloatAttr("swiglu_limit", limit))
	}
	if a.Quantized {
		attrs = append(attrs, graph.IntAttr("expert_weight_bits", int64(a.Bits)))
		if a.BlockSize > 0 {
			attrs = append(attrs, graph.IntAttr("block_size", int64(a.BlockSize)))
		}
	}
	return attrs
}

// Experts holds a node's expert weights as float32 in ONNX Runtime's current
// layout, [E, out, in] per expert: FC1 [E, f·I, H] (f = 2 when SwiGLU is
// fused), FC2 [E, H, I], FC3 [E, I, H]; biases FC1B [E, f·I], FC2B [E, H],
// FC3B [E, I]. Absent parts are nil.
type Experts struct {
	E, H, I          int
	FC1, FC2, FC3    []float32
	FC1B, FC2B, FC3B []float32
}

// fused reports whether fc1 holds both SwiGLU halves.
func (a *Attrs) fused() bool { return a.Activation == SwiGLU && a.Fusion != FusionNone }

// Route returns, for one token's router row, the selected experts and their
// weights: top-k of the softmax over all experts (ties to the lower id),
// renormalised to sum 1 when normalize_routing_weights is set and always for
// QMoE (ONNX Runtime 1.30's CPU QMoE weights the experts by the softmax over
// the k selected logits whatever the attribute says); with use_sparse_mixer,
// Phi-3.5's sparse mixer (the CUDA kernels' routing; 1.30's CPU kernel
// ignores the attribute).
func (a *Attrs) Route(logits []float32) ([]int, []float32) {
	if a.SparseMixer {
		return sparseMixer(logits)
	}
	p := make([]float64, len(logits))
	m := math.Inf(-1)
	for _, v := range logits {
		m = max(m, float64(v))
	}
	var s float64
	for i, v := range logits {
		p[i] = math.Exp(float64(v) - m)
		s += p[i]
	}
	idx := make([]int, len(p))
	for i := range idx {
		idx[i] = i
	}
	sort.SliceStable(idx, func(x, y int) bool { return p[idx[x]] > p[idx[y]] })
	ids := idx[:a.K]
	w := make([]float32, a.K)
	var sum float64
	for _, e := range ids {
		sum += p[e] / s
	}
	for i, e := range ids {
		v := p[e] / s
		if a.Normalize || a.Quantized {
			v /= sum
		}
		w[i] = float32(v)
	}
	return ids, w
}

// SparseMixerThreshold is the mask threshold of use_sparse_mixer: 2 ×
// Phi-3.5-MoE's jitter epsilon 0.01.
const SparseMixerThreshold = 0.02

// sparseMixer is Phi-3.5-MoE's inference routing (k = 2): the best expert
// (logit m), weighted by the softmax over the experts e with
// (m − z_e) / max(|z_e|, m) ≤ SparseMixerThreshold; then the best of the
// others, weighted likewise among them.
func sparseMixer(logits []float32) ([]int, []float32) {
	pick := func(skip int) (int, float32) {
		best := -1
		for e, v := range logits {
			if e != skip && (best < 0 || v > logits[best]) {
				best = e
			}
		}
		top := float64(logits[best])
		var den float64
		for e, v := range logits {
			if e == skip {
				continue
			}
			f := max(math.Abs(float64(v)), top)
			if (top-float64(v))/f > SparseMixerThreshold {
				continue
			}
			den += math.Exp(float64(v) - top)
		}
		return best, float32(1 / den)
	}
	e1, w1 := pick(-1)
	e2, w2 := pick(e1)
	return []int{e1, e2}, []float32{w1, w2}
}

func logistic(x float32) float32 { return float32(1 / (1 + math.Exp(-float64(x)))) }

// act applies a one-input activation.
func act(kind string, x float32) float32 {
	switch kind {
	case Relu:
		return max(x, 0)
	case Gelu: // the tanh approximation, as ONNX Runtime's MoE kernels compute it
		v := float64(x)
		return float32(0.5 * v * (1 + math.Tanh(0.7978845608028654*(v+0.044715*v*v*v))))
	case Silu:
		return x * logistic(x)
	}
	return x
}

// swiglu is G·σ(α·G)·(L + β) with G = min(g, limit), L = clamp(l, ±limit).
func (a *Attrs) swiglu(g, l float32) float32 {
	g = min(g, a.Limit)
	l = max(min(l, a.Limit), -a.Limit)
	return g * logistic(a.Alpha*g) * (l + a.Beta)
}

func dot(x, w []float32) float32 {
	var s float32
	for i, v := range x {
		s += v * w[i]
	}
	return s
}

// Check verifies that the weights fit the attributes.
func (a *Attrs) Check(w *Experts) error {
	E, H, I := w.E, w.H, w.I
	f := 1
	if a.fused() {
		f = 2
	}
	if a.K < 1 || a.K > E {
		return fmt.Errorf("k %d not in 1..%d experts", a.K, E)
	}
	type req struct {
		name string
		v    []float32
		n    int
		need bool
	}
	for _, r := range []req{
		{"fc1_experts_weights", w.FC1, E * f * I * H, true},
		{"fc2_experts_weights", w.FC2, E * H * I, true},
		{"fc3_experts_weights", w.FC3, E * I * H, a.Activation == SwiGLU && a.Fusion == FusionNone},
		{"fc1_experts_bias", w.FC1B, E * f * I, false},
		{"fc2_experts_bias", w.FC2B, E * H, false},
		{"fc3_experts_bias", w.FC3B, E * I, false},
	} {
		if r.v == nil {
			if r.need {
				return fmt.Errorf("%s is missing (activation_type %s, swiglu_fusion %d)", r.name, a.Activation, a.Fusion)
			}
			continue
		}
		if len(r.v) != r.n {
			return fmt.Errorf("%s has %d values, want %d (E=%d H=%d I=%d)", r.name, len(r.v), r.n, E, H, I)
		}
	}
	return nil
}

// Forward computes the op's output for T tokens x [T, H] and router rows
// [T, E]: the weighted sum of the selected experts' FFNs. A non-SwiGLU
// activation with FC3 present multiplies act(fc1) by fc3 elementwise (the
// CUDA kernels' Mixtral form).
func (a *Attrs) Forward(w *Experts, x, router []float32, T int) ([]float32, error) {
	if err := a.Check(w); err != nil {
		return nil, err
	}
	E, H, I := w.E, w.H, w.I
	if len(x) != T*H || len(router) != T*E {
		return nil, fmt.Errorf("input has %d values and router_probs %d, want %d tokens x %d and x %d", len(x), len(router), T, H, E)
	}
	f := 1
	if a.fused() {
		f = 2
	}
	out := make([]float32, T*H)
	bufs := newFFNBufs(f, I, H)
	for t := 0; t < T; t++ {
		xt := x[t*H : (t+1)*H]
		ids, ws := a.Route(router[t*E : (t+1)*E])
		acc := make([]float64, H)
		for j, e := range ids {
			v := a.ffn(w.expert(e, f), xt, bufs)
			for c := range acc {
				acc[c] += float64(ws[j]) * float64(v[c])
			}
		}
		for c := range acc {
			out[t*H+c] = float32(acc[c])
		}
	}
	return out, nil
}

// expertMats is one expert's matrices in the current layout (fc1 [f·I, H],
// fc2 [H, I], fc3 [I, H]) and biases; absent parts are nil.
type expertMats struct {
	fc1, fc2, fc3    []float32
	fc1b, fc2b, fc3b []float32
}

// part is expert e's n values of v (nil when v is).
func part(v []float32, e, n int) []float32 {
	if v == nil {
		return nil
	}
	return v[e*n : (e+1)*n]
}

// expert returns expert e's slices of w (f fc1 rows per intermediate unit).
func (w *Experts) expert(e, f int) expertMats {
	H, I := w.H, w.I
	return expertMats{fc1: part(w.FC1, e, f*I*H), fc2: part(w.FC2, e, H*I), fc3: part(w.FC3, e, I*H),
		fc1b: part(w.FC1B, e, f*I), fc2b: part(w.FC2B, e, H), fc3b: part(w.FC3B, e, I)}
}

// ffnBufs are the scratch rows of ffn.
type ffnBufs struct {
	f, I, H     int
	h1, h3, mid []float32
	v           []float32
}

func newFFNBufs(f, I, H int) *ffnBufs {
	return &ffnBufs{f: f, I: I, H: H, h1: make([]float32, f*I), h3: make([]float32, I), mid: make([]float32, I), v: make([]float32, H)}
}

// ffn returns one expert's output [H] for token row xt (in b.v, which the
// next call overwrites). A non-SwiGLU activation with fc3 present
// multiplies act(fc1) by fc3 elementwise.
func (a *Attrs) ffn(m expertMats, xt []float32, b *ffnBufs) []float32 {
	f, I, H := b.f, b.I, b.H
	h1, h3, mid := b.h1, b.h3, b.mid
	for r := 0; r < f*I; r++ {
		h1[r] = dot(xt, m.fc1[r*H:(r+1)*H])
		if m.fc1b != nil {
			h1[r] += m.fc1b[r]
		}
	}
	if m.fc3 != nil {
		for r := 0; r < I; r++ {
			h3[r] = dot(xt, m.fc3[r*H:(r+1)*H])
			if m.fc3b != nil {
				h3[r] += m.fc3b[r]
			}
		}
	}
	for r := 0; r < I; r++ {
		switch {
		case a.Activation == SwiGLU && a.Fusion == FusionInterleaved:
			mid[r] = a.swiglu(h1[2*r], h1[2*r+1])
		case a.Activation == SwiGLU && a.Fusion == FusionConcatenated:
			mid[r] = a.swiglu(h1[r], h1[I+r])
		case a.Activation == SwiGLU:
			mid[r] = a.swiglu(h1[r], h3[r])
		case m.fc3 != nil:
			mid[r] = act(a.Activation, h1[r]) * h3[r]
		default:
			mid[r] = act(a.Activation, h1[r])
		}
	}
	for c := 0; c < H; c++ {
		v := dot(mid, m.fc2[c*I:(c+1)*I])
		if m.fc2b != nil {
			v += m.fc2b[c]
		}
		b.v[c] = v
	}
	return b.v
}

// Package moe defines the fused ai.mok::MoE operator: its attributes (Spec),
// its weights in canonical layout, its reference semantics in plain Go, and
// the canonical decomposition into standard ONNX ops that becomes the
// model-local function body of every fused node.
package moe

import (
	"fmt"
	"math"
	"sort"
	"strconv"
	"strings"

	"github.com/mokopt/mokopt/graph"
	pb "github.com/mokopt/mokopt/graph/onnxpb"
)

// Domain and OpType name the fused operator; Version is its contract version.
const (
	Domain  = "ai.mok"
	OpType  = "MoE"
	Version = 1
)

// Router activations and orders.
const (
	Softmax = "softmax"
	Sigmoid = "sigmoid"
	// SparseMixer is PhiMoE's router: for each of the k picks in turn, the
	// best remaining logit m and its expert i are taken, logits z_e with
	// (m - z_e) / max(|z_e|, m) > sparsemixer_threshold are masked out, and
	// the pick's weight is softmax over the remaining unmasked logits at i;
	// picked experts are excluded from later picks (their logits become
	// -inf, while the mask test still reads the original logits). Its
	// router_order is topk_then_activation.
	SparseMixer = "sparsemixer"

	ActivationThenTopK = "activation_then_topk"
	TopKThenActivation = "topk_then_activation"

	// GroupScoreTop2Sum scores an expert group by the sum of its two best
	// choice scores (DeepSeek-V3, the default); GroupScoreMax by its best
	// one (DeepSeek-V2's group_limited_greedy).
	GroupScoreTop2Sum = "top2_sum"
	GroupScoreMax     = "max"
)

// Expert activations.
const (
	// SwiGLU is silu(gate) * up.
	SwiGLU = "swiglu"
	// SwiGLUClamped is silu(min(gate, limit)) * clamp(up, -limit, limit), the form MoK supports.
	SwiGLUClamped = "swiglu_clamped"
	// SwiGLUOAI is GPT-OSS's form: g = min(gate, limit), u = clamp(up, -limit, limit),
	// out = (u + 1) * g * sigmoid(alpha * g).
	SwiGLUOAI = "swiglu_oai"
	// GELU is a two-layer MLP down(gelu(up(x))) with the exact (erf) GELU; no gate.
	GELU = "gelu"
)

// Input positions of the fused node. Absent optional inputs are "".
const (
	InHidden = iota
	InRouterW
	InRouterB
	InCorrectionBias
	InGate
	InUp
	InDown
	InGateBias
	InUpBias
	InDownBias
	InSharedGate
	InSharedUp
	InSharedDown
	InSharedGateW
	NumInputs
)

// InputNames are the formal input names of the fused node's function.
var InputNames = [NumInputs]string{
	"hidden_states", "router_weight", "router_bias", "router_correction_bias",
	"gate", "up", "down", "gate_bias", "up_bias", "down_bias",
	"shared_gate", "shared_up", "shared_down", "shared_gate_weight",
}

// Spec pins the semantics of one fused MoE block. Every field is written as
// an attribute of the fused node; nothing is left to convention.
type Spec struct {
	NumExperts int `json:"num_experts"`
	TopK       int `json:"top_k"`
	Hidden     int `json:"hidden"`
	Inter      int `json:"inter"`

	RouterActivation    string  `json:"router_activation"`
	RouterOrder         string  `json:"router_order"`
	NormalizeTopK       bool    `json:"normalize_topk"`
	RoutedScalingFactor float32 `json:"routed_scaling_factor"`
	NGroup              int     `json:"n_group"`
	TopKGroup           int     `json:"topk_group"`
	WeightsOnInput      bool    `json:"weights_on_input"`
	RouterBias          bool    `json:"router_bias"`
	CorrectionBias      bool    `json:"correction_bias"`

	Activation        string  `json:"activation"`
	SwiGLUAlpha       float32 `json:"swiglu_alpha"`
	SwiGLULimit       float32 `json:"swiglu_limit"`
	GateUpInterleaved bool    `json:"gate_up_interleaved"`
	ExpertBias        bool    `json:"expert_bias"`

	SharedInter int  `json:"shared_inter"` // 0: no shared expert
	SharedGated bool `json:"shared_expert_gated"`

	EPSize       int `json:"ep_size"`
	ExpertOffset int `json:"expert_offset"`

	// SparseMixerThreshold is the mask threshold of the sparsemixer router
	// (2 x PhiMoE's router_jitter_noise); used only with that router.
	SparseMixerThreshold float32 `json:"sparsemixer_threshold,omitempty"`
	// GroupScore is how group-limited routing (NGroup > 1) scores a group:
	// GroupScoreTop2Sum (also when empty) or GroupScoreMax.
	GroupScore string `json:"group_score,omitempty"`
	// LocalExperts is the number of routed experts whose weights the node
	// holds when it is one rank's shard of an expert-parallel group
	// (NumExperts/EPSize, experts ExpertOffset onwards); 0 when it holds all
	// NumExperts. It is read from the weights' leading dimension, not
	// written as an attribute.
	LocalExperts int `json:"local_experts,omitempty"`
	// IOType is the element type of hidden_states and the output when it is
	// not float32: IOFloat16 or IOBFloat16 (a half-precision export). The
	// block computes in float32 with float32 weights between a cast in and
	// a cast out.
	IOType string `json:"io_type,omitempty"`
	// WeightType is the element type the expert matrices (gate, up, down
	// and the shared expert's gate, up, down) are stored in when it is not
	// float32: IOFloat16 or IOBFloat16, the type an export stored them in,
	// kept as it was. The block widens them to float32, exactly, and
	// computes in float32; the router and the biases are float32.
	WeightType string `json:"weight_type,omitempty"`
	// RouterLogits says the node has its optional second output,
	// router_logits (see RouterLogits). It is read from the node's
	// outputs, not written as an attribute.
	RouterLogits bool `json:"router_logits,omitempty"`
}

// Half-precision block I/O types (Spec.IOType).
const (
	IOFloat16  = "float16"
	IOBFloat16 = "bfloat16"
)

// IOElemType returns the ONNX element type of the block's input and output.
func (s *Spec) IOElemType() pb.TensorProto_DataType {
	switch s.IOType {
	case IOFloat16:
		return pb.TensorProto_FLOAT16
	case IOBFloat16:
		return pb.TensorProto_BFLOAT16
	}
	return pb.TensorProto_FLOAT
}

// WeightElemType returns the ONNX element type of the expert matrices.
func (s *Spec) WeightElemType() pb.TensorProto_DataType {
	return (&Spec{IOType: s.WeightType}).IOElemType()
}

// IOTypeOf returns the Spec.IOType naming an ONNX element type: "" for
// float32, IOFloat16 or IOBFloat16; ok is false for other types.
func IOTypeOf(dt pb.TensorProto_DataType) (string, bool) {
	switch dt {
	case pb.TensorProto_FLOAT:
		return "", true
	case pb.TensorProto_FLOAT16:
		return IOFloat16, true
	case pb.TensorProto_BFLOAT16:
		return IOBFloat16, true
	}
	return "", false
}

// GroupScoreTop returns how many of a group's best scores add up to the
// group's score: 1 for GroupScoreMax, else 2.
func (s *Spec) GroupScoreTop() int {
	if s.GroupScore == GroupScoreMax {
		return 1
	}
	return 2
}

// Shard reports whether the node holds only one EP rank's experts.
func (s *Spec) Shard() bool { return s.LocalExperts > 0 && s.LocalExperts != s.NumExperts }

// StoredExperts is the number of experts whose weights the node holds.
func (s *Spec) StoredExperts() int {
	if s.Shard() {
		return s.LocalExperts
	}
	return s.NumExperts
}

// Validate checks the spec's internal consistency.
func (s *Spec) Validate() error {
	var errs []string
	if s.NumExperts < 1 {
		errs = append(errs, fmt.Sprintf("num_experts %d < 1", s.NumExperts))
	}
	if s.TopK < 1 || s.TopK > s.NumExperts {
		errs = append(errs, fmt.Sprintf("top_k %d not in 1..num_experts (%d)", s.TopK, s.NumExperts))
	}
	if s.RouterActivation != Softmax && s.RouterActivation != Sigmoid && s.RouterActivation != SparseMixer {
		errs = append(errs, fmt.Sprintf("router_activation %q", s.RouterActivation))
	}
	if s.RouterActivation == SparseMixer && (s.RouterOrder != TopKThenActivation || s.CorrectionBias || s.NGroup > 1 || s.NormalizeTopK || s.SparseMixerThreshold < 0) {
		errs = append(errs, "the sparsemixer router takes router_order topk_then_activation, no correction bias, no groups, no renormalisation and a threshold >= 0")
	}
	if s.RouterOrder != ActivationThenTopK && s.RouterOrder != TopKThenActivation {
		errs = append(errs, fmt.Sprintf("router_order %q", s.RouterOrder))
	}
	if s.IOType != "" && s.IOType != IOFloat16 && s.IOType != IOBFloat16 {
		errs = append(errs, fmt.Sprintf("io_type %q", s.IOType))
	}
	if s.WeightType != "" && s.WeightType != IOFloat16 && s.WeightType != IOBFloat16 {
		errs = append(errs, fmt.Sprintf("weight_type %q", s.WeightType))
	}
	if s.GroupScore != "" && s.GroupScore != GroupScoreTop2Sum && s.GroupScore != GroupScoreMax {
		errs = append(errs, fmt.Sprintf("group_score %q", s.GroupScore))
	}
	if s.NGroup < 1 || s.NGroup > 1 && (s.NumExperts%s.NGroup != 0 || s.TopKGroup < 1 || s.TopKGroup > s.NGroup) || s.NGroup == 1 && s.TopKGroup != 1 {
		errs = append(errs, fmt.Sprintf("n_group %d / topk_group %d do not fit %d experts", s.NGroup, s.TopKGroup, s.NumExperts))
	}
	if f := float64(s.RoutedScalingFactor); f == 0 || math.IsNaN(f) || math.IsInf(f, 0) {
		errs = append(errs, fmt.Sprintf("routed_scaling_factor %v (must be finite and nonzero)", s.RoutedScalingFactor))
	}
	if s.SwiGLULimit < 0 {
		errs = append(errs, fmt.Sprintf("swiglu_limit %v (must be >= 0; 0 for none)", s.SwiGLULimit))
	}
	if s.ActivationDef() == nil {
		errs = append(errs, fmt.Sprintf("activation %q (known: %s)", s.Activation, strings.Join(ActivationNames(), ", ")))
	}
	if s.EPSize < 1 || s.NumExperts%s.EPSize != 0 {
		errs = append(errs, fmt.Sprintf("ep_size %d does not divide %d experts", s.EPSize, s.NumExperts))
	} else if s.Shard() {
		L := s.NumExperts / s.EPSize
		if s.LocalExperts != L || s.ExpertOffset < 0 || s.ExpertOffset%L != 0 || s.ExpertOffset+L > s.NumExperts {
			errs = append(errs, fmt.Sprintf("an EP shard holds %d experts from %d, want %d (num_experts %d / ep_size %d) from a multiple of %d", s.LocalExperts, s.ExpertOffset, L, s.NumExperts, s.EPSize, L))
		}
	} else if s.ExpertOffset != 0 {
		errs = append(errs, fmt.Sprintf("expert_offset %d on a node holding all %d experts (must be 0)", s.ExpertOffset, s.NumExperts))
	}
	if len(errs) > 0 {
		return fmt.Errorf("invalid MoE spec: %s", strings.Join(errs, "; "))
	}
	return nil
}

// Overload names the function body of s: its Variant and the values the
// body holds as constants (E, k, H, the routed scaling factor, the SwiGLU
// alpha and limit, the sparsemixer threshold), so that two fused nodes share
// a body only when it computes what each of them means. It is the fused
// node's overload and its function's.
func (s *Spec) Overload() string {
	f := func(v float32) string { return strconv.FormatFloat(float64(v), 'g', -1, 32) }
	parts := []string{s.Variant(), fmt.Sprintf("e%d_k%d_h%d", s.NumExperts, s.TopK, s.Hidden)}
	if s.RoutedScalingFactor != 1 && s.RoutedScalingFactor != 0 {
		parts = append(parts, "rs"+f(s.RoutedScalingFactor))
	}
	if d := s.ActivationDef(); d != nil && d.Alpha && s.SwiGLUAlpha != 1 {
		parts = append(parts, "a"+f(s.SwiGLUAlpha))
	}
	if s.SwiGLULimit > 0 {
		parts = append(parts, "l"+f(s.SwiGLULimit))
	}
	if s.RouterActivation == SparseMixer {
		parts = append(parts, "t"+f(s.SparseMixerThreshold))
	}
	return strings.Join(parts, "_")
}

// CanonicalRouting returns s with a router that activates the top-k logits
// (TopKThenActivation) written as its equal that activates all of them
// first: a softmax over the top-k logits is the softmax over all, the
// top-k, renormalised over the selected (exp(lᵢ)/Σ over the selected either
// way); a sigmoid, being increasing and elementwise, selects the same
// experts before or after and gives them the same weights, renormalised or
// not. Equal up to float rounding, so two spellings of one router compare
// equal by their canonical specs. Other specs are returned as they are.
func (s Spec) CanonicalRouting() Spec {
	if s.RouterOrder != TopKThenActivation || s.CorrectionBias || s.NGroup > 1 {
		return s
	}
	switch s.RouterActivation {
	case Softmax:
		s.RouterOrder, s.NormalizeTopK = ActivationThenTopK, true
	case Sigmoid:
		s.RouterOrder = ActivationThenTopK
	}
	return s
}

// Variant is a short stable name of the semantic variant, used as the
// function overload of the fused node so that each variant has its own body.
func (s *Spec) Variant() string {
	parts := []string{s.RouterActivation, map[string]string{ActivationThenTopK: "act_topk", TopKThenActivation: "topk_act"}[s.RouterOrder]}
	if s.NormalizeTopK {
		parts = append(parts, "norm")
	}
	if s.RoutedScalingFactor != 1 {
		parts = append(parts, "scaled")
	}
	if s.NGroup > 1 {
		parts = append(parts, fmt.Sprintf("g%dof%d", s.TopKGroup, s.NGroup))
		if s.GroupScore == GroupScoreMax {
			parts = append(parts, "gmax")
		}
	}
	if s.RouterBias {
		parts = append(parts, "rbias")
	}
	if s.CorrectionBias {
		parts = append(parts, "cbias")
	}
	if s.WeightsOnInput {
		parts = append(parts, "winput")
	}
	parts = append(parts, s.Activation)
	if s.ExpertBias {
		parts = append(parts, "ebias")
	}
	if s.SharedInter > 0 {
		if s.SharedGated {
			parts = append(parts, "shared_gated")
		} else {
			parts = append(parts, "shared")
		}
	}
	if s.Shard() {
		parts = append(parts, "epshard")
	}
	switch s.IOType {
	case IOFloat16:
		parts = append(parts, "f16io")
	case IOBFloat16:
		parts = append(parts, "bf16io")
	}
	switch s.WeightType {
	case IOFloat16:
		parts = append(parts, "f16w")
	case IOBFloat16:
		parts = append(parts, "bf16w")
	}
	if s.RouterLogits {
		parts = append(parts, "logits")
	}
	return strings.Join(parts, "_")
}

// Attributes encodes the spec as node attributes, sorted by name.
func (s *Spec) Attributes() []*pb.AttributeProto {
	b := func(v bool) int64 {
		if v {
			return 1
		}
		return 0
	}
	attrs := []*pb.AttributeProto{
		graph.IntAttr("num_experts", int64(s.NumExperts)),
		graph.IntAttr("top_k", int64(s.TopK)),
		graph.StringAttr("router_activation", s.RouterActivation),
		graph.StringAttr("router_order", s.RouterOrder),
		graph.IntAttr("normalize_topk", b(s.NormalizeTopK)),
		graph.FloatAttr("routed_scaling_factor", s.RoutedScalingFactor),
		graph.IntAttr("n_group", int64(max(s.NGroup, 1))),
		graph.IntAttr("topk_group", int64(max(s.TopKGroup, 1))),
		graph.IntAttr("weights_on_input", b(s.WeightsOnInput)),
		graph.StringAttr("activation", s.Activation),
		graph.FloatAttr("swiglu_alpha", s.SwiGLUAlpha),
		graph.FloatAttr("swiglu_limit", s.SwiGLULimit),
		graph.IntAttr("gate_up_interleaved", b(s.GateUpInterleaved)),
		graph.IntAttr("shared_expert_gated", b(s.SharedGated)),
		graph.IntAttr("ep_size", int64(s.EPSize)),
		graph.IntAttr("expert_offset", int64(s.ExpertOffset)),
	}
	if s.RouterActivation == SparseMixer {
		attrs = append(attrs, graph.FloatAttr("sparsemixer_threshold", s.SparseMixerThreshold))
	}
	if s.NGroup > 1 && s.GroupScore == GroupScoreMax {
		attrs = append(attrs, graph.StringAttr("group_score", s.GroupScore))
	}
	if s.IOType != "" {
		attrs = append(attrs, graph.StringAttr("io_type", s.IOType))
	}
	if s.WeightType != "" {
		attrs = append(attrs, graph.StringAttr("weight_type", s.WeightType))
	}
	sort.Slice(attrs, func(i, j int) bool { return attrs[i].GetName() < attrs[j].GetName() })
	return attrs
}

// InitializerDims returns the dims function SpecFromNode needs for a node
// whose weights are initializers of g: the dims of the initializer at an
// input position, nil when the input is absent or not an initializer.
func InitializerDims(g *graph.Graph, n *pb.NodeProto) func(pos int) []int64 {
	return func(pos int) []int64 {
		if pos >= len(n.Input) || n.Input[pos] == "" {
			return nil
		}
		if t := g.Initializer(n.Input[pos]); t != nil {
			return t.GetDims()
		}
		return nil
	}
}

// SpecFromNode decodes a fused node's attributes; shapes (Hidden, Inter,
// SharedInter) and the presence flags come from the weights' dims, given as
// a function from input position to dims (nil when absent; see
// InitializerDims). A nil function is an error.
func SpecFromNode(n *pb.NodeProto, dims func(pos int) []int64) (*Spec, error) {
	if dims == nil {
		return nil, fmt.Errorf("node %q: SpecFromNode needs the weights' dims (see InitializerDims)", graph.NodeLabel(n))
	}
	if n.GetDomain() != Domain || n.GetOpType() != OpType {
		return nil, fmt.Errorf("node %q is %s::%s, not %s::%s", graph.NodeLabel(n), n.GetDomain(), n.GetOpType(), Domain, OpType)
	}
	if err := CheckNodeForm(n); err != nil {
		return nil, err
	}
	s := &Spec{
		NumExperts:          int(graph.AttrInt(n, "num_experts", 0)),
		TopK:                int(graph.AttrInt(n, "top_k", 0)),
		RouterActivation:    graph.AttrString(n, "router_activation", Softmax),
		RouterOrder:         graph.AttrString(n, "router_order", ActivationThenTopK),
		NormalizeTopK:       graph.AttrInt(n, "normalize_topk", 0) != 0,
		RoutedScalingFactor: graph.AttrFloat(n, "routed_scaling_factor", 1),
		NGroup:              int(graph.AttrInt(n, "n_group", 1)),
		TopKGroup:           int(graph.AttrInt(n, "topk_group", 1)),
		WeightsOnInput:      graph.AttrInt(n, "weights_on_input", 0) != 0,
		Activation:          graph.AttrString(n, "activation", SwiGLU),
		SwiGLUAlpha:         graph.AttrFloat(n, "swiglu_alpha", 1),
		SwiGLULimit:         graph.AttrFloat(n, "swiglu_limit", 0),
		GateUpInterleaved:   graph.AttrInt(n, "gate_up_interleaved", 0) != 0,
		SharedGated:         graph.AttrInt(n, "shared_expert_gated", 0) != 0,
		EPSize:              int(graph.AttrInt(n, "ep_size", 1)),
		ExpertOffset:        int(graph.AttrInt(n, "expert_offset", 0)),
	}
	if s.RouterActivation == SparseMixer {
		s.SparseMixerThreshold = graph.AttrFloat(n, "sparsemixer_threshold", 0)
	}
	if gs := graph.AttrString(n, "group_score", ""); gs != "" && gs != GroupScoreTop2Sum {
		s.GroupScore = gs
	}
	s.IOType = graph.AttrString(n, "io_type", "")
	s.WeightType = graph.AttrString(n, "weight_type", "")
	s.RouterLogits = len(n.Output) > OutRouterLogits && n.Output[OutRouterLogits] != ""
	has := func(pos int) bool { return pos < len(n.Input) && n.Input[pos] != "" }
	s.RouterBias = has(InRouterB)
	s.CorrectionBias = has(InCorrectionBias)
	s.ExpertBias = has(InGateBias) || has(InUpBias) || has(InDownBias)
	if d := dims(InDown); len(d) == 3 {
		s.Hidden, s.Inter = int(d[1]), int(d[2])
		if int(d[0]) != s.NumExperts {
			s.LocalExperts = int(d[0])
		}
	}
	if has(InSharedDown) {
		if d := dims(InSharedDown); len(d) == 2 {
			s.SharedInter = int(d[1])
		}
	}
	if err := s.Validate(); err != nil {
		return s, err
	}
	return s, CheckDims(n, s, dims)
}

package passes

import (
	"fmt"

	"github.com/mokopt/mokopt/graph"
	pb "github.com/mokopt/mokopt/graph/onnxpb"
	"github.com/mokopt/mokopt/internal/ortmoe"
	"github.com/mokopt/mokopt/moe"
)

// isORTMoE reports whether n is an ONNX Runtime com.microsoft::MoE or QMoE node.
func isORTMoE(n *pb.NodeProto) bool {
	return n.GetDomain() == ortmoe.Domain && (n.GetOpType() == ortmoe.OpMoE || n.GetOpType() == ortmoe.OpQMoE)
}

// detectORT converts an ONNX Runtime com.microsoft::MoE or QMoE node (layout
// and semantics in models/ORT_MOE.md, implemented by package ortmoe, whose
// kernels the numerical check runs): softmax over the router logits, top-k,
// optional renormalisation (always for QMoE); fc1 gate (or interleaved or
// concatenated gate+linear), fc3 up, fc2 down, each [E, out, in] (the legacy
// [E, in, out] float layout is recognised by ONNX Runtime's own rule);
// expert biases; QMoE's int8/int4 weights are dequantized to float.
func (c *ctx) detectORT(n *pb.NodeProto) (b *Block, err error) {
	if err := attempt(func() (e error) { b, e = c.ort(n); return e }); err != nil {
		return nil, err
	}
	return b, nil
}

func (c *ctx) ort(n *pb.NodeProto) (*Block, error) {
	label := fmt.Sprintf("com.microsoft::%s node %q", n.GetOpType(), graph.NodeLabel(n))
	in := func(i int) string {
		if i < len(n.Input) {
			return n.Input[i]
		}
		return ""
	}
	a, err := ortmoe.ParseAttrs(n)
	if err != nil {
		return nil, rejectf("%v", err)
	}
	if a.SparseMixer && a.Normalize {
		return nil, rejectf("%s: use_sparse_mixer with normalize_routing_weights is ambiguous (the sparse mixer's weights are not renormalised)", label)
	}
	if a.Quantized && in(ortmoe.QRouterWeights) != "" {
		return nil, rejectf("%s: a separate router_weights input (selection and mixing weights differ) is not supported", label)
	}
	// Router: the logits come from a linear layer on the block input.
	lin := c.producerOp(in(1))
	if lin == nil {
		return nil, rejectf("%s: router_probs is not computed by a linear layer", label)
	}
	ri, err := c.ortRouter(lin, label)
	if err != nil {
		return nil, err
	}
	if c.through(ri.x) != c.through(in(0)) {
		return nil, rejectf("%s: the router reads a different tensor than the experts", label)
	}
	rd := ri.w.GetDims()
	if len(rd) != 2 {
		return nil, rejectf("router weight %q has dims %v, want a matrix", ri.w.GetName(), rd)
	}
	H := int(rd[1])
	if ri.wInOut {
		H = int(rd[0])
	}
	s := moe.Spec{TopK: a.K, RouterActivation: moe.Softmax, RouterOrder: moe.ActivationThenTopK,
		NormalizeTopK: a.Normalize || a.Quantized, RoutedScalingFactor: 1,
		NGroup: 1, TopKGroup: 1, EPSize: 1, SwiGLUAlpha: 1, RouterBias: ri.bias != nil}
	if a.SparseMixer { // Phi-3.5's sparse mixer is ai.mok::MoE's sparsemixer router
		s.RouterActivation, s.RouterOrder, s.SparseMixerThreshold = moe.SparseMixer, moe.TopKThenActivation, ortmoe.SparseMixerThreshold
	}
	switch fc3 := c.present(n, a, 3); {
	case fc3 && ortGatedActs[a.Activation] != "":
		s.Activation = ortGatedActs[a.Activation]
	case !fc3 && ortUngatedActs[a.Activation] != "":
		s.Activation = ortUngatedActs[a.Activation]
	case a.Activation == ortmoe.SwiGLU:
		limit := a.Limit
		if limit >= 1e38 {
			limit = 0
		}
		switch {
		case a.Beta == 1:
			s.Activation, s.SwiGLUAlpha, s.SwiGLULimit = moe.SwiGLUOAI, a.Alpha, limit
		case a.Beta == 0 && a.Alpha == 1 && limit == 0:
			s.Activation = moe.SwiGLU
		case a.Beta == 0 && a.Alpha == 1:
			s.Activation, s.SwiGLULimit = moe.SwiGLUClamped, limit
		default:
			return nil, rejectf("%s: swiglu with activation_alpha %g, activation_beta %g has no ai.mok::MoE form (it has beta 0 with alpha 1, or beta 1)", label, a.Alpha, a.Beta)
		}
		if a.Fusion == ortmoe.FusionNone && !c.present(n, a, 3) {
			return nil, rejectf("%s: swiglu with swiglu_fusion 0 needs fc3_experts_weights", label)
		}
		s.GateUpInterleaved = a.Fusion == ortmoe.FusionInterleaved
	default:
		return nil, rejectf("%s: activation_type %q (with fc3 %v) has no ai.mok::MoE form (it has relu, gelu, silu and identity without fc3; relu, gelu and silu with fc3; and swiglu)", label, a.Activation, c.present(n, a, 3))
	}
	var plan *WeightPlan
	if a.Quantized {
		plan, err = c.ortQuantPlan(n, a, &s, H)
	} else {
		plan, err = c.ortFloatPlan(n, a, &s, H)
	}
	if err != nil {
		return nil, err
	}
	plan.Router = Proj{Init: ri.w, Expert: -1, InOut: ri.wInOut}
	if ri.bias != nil {
		plan.RouterB = &Proj{Init: ri.bias, Expert: -1}
	}
	region := []*pb.NodeProto{n}
	if len(c.g.Consumers(lin.Output[0])) == 1 {
		region = append([]*pb.NodeProto{lin}, region...)
	}
	// com.microsoft::ShardedMoE: one EP rank's experts (ep.go)
	if err := c.shardedSpec(n, &s, plan); err != nil {
		return nil, err
	}
	b := &Block{Name: blockName(n.Output[0], ri.w.GetName(), region), Kind: KindORT, Spec: s, Input: in(0), Router: in(0), Output: n.Output[0],
		Nodes: len(region), Region: region, W: plan}
	if err := s.Validate(); err != nil {
		return nil, rejectf("%s: %v", label, err)
	}
	return b, nil
}

// ortRouter reads the linear layer lin that computes an ONNX Runtime MoE
// node's router logits (label names the node in errors): a Gemm or MatMul
// with a constant weight, and for a Gemm an optional constant bias vector.
func (c *ctx) ortRouter(lin *pb.NodeProto, label string) (*routerInfo, error) {
	ri := &routerInfo{}
	switch lin.GetOpType() {
	case "Gemm":
		w := c.constTensor(lin.Input[1])
		if w == nil || graph.AttrInt(lin, "transA", 0) != 0 || graph.AttrFloat(lin, "alpha", 1) != 1 {
			return nil, rejectf("router Gemm %q has no constant weight", graph.NodeLabel(lin))
		}
		ri.linear, ri.x, ri.w, ri.wInOut = lin, lin.Input[0], w, graph.AttrInt(lin, "transB", 0) == 0
		if len(lin.Input) > 2 && lin.Input[2] != "" {
			if ri.bias = c.constTensor(lin.Input[2]); ri.bias == nil || len(ri.bias.GetDims()) != 1 {
				return nil, rejectf("router Gemm %q has a bias that is not a constant vector", graph.NodeLabel(lin))
			}
			if graph.AttrFloat(lin, "beta", 1) != 1 {
				return nil, rejectf("router Gemm %q scales its bias (beta %g)", graph.NodeLabel(lin), graph.AttrFloat(lin, "beta", 1))
			}
		}
	case "MatMul":
		w := c.matmulWeight(lin.Input[1])
		if w == nil {
			return nil, rejectf("router MatMul %q has no constant weight", graph.NodeLabel(lin))
		}
		ri.linear, ri.x, ri.w, ri.wInOut = lin, lin.Input[0], w.t, !w.swapped
	default:
		return nil, rejectf("%s: router_probs comes from %s, not a linear layer", label, lin.GetOpType())
	}
	return ri, nil
}

// present reports whether the node has fc<i> weights (i = 1, 2, 3).
func (c *ctx) present(n *pb.NodeProto, a *ortmoe.Attrs, fc int) bool {
	pos := map[int]int{1: ortmoe.MoEFC1, 2: ortmoe.MoEFC2, 3: ortmoe.MoEFC3}[fc]
	if a.Quantized {
		pos = map[int]int{1: ortmoe.QFC1, 2: ortmoe.QFC2, 3: ortmoe.QFC3}[fc]
	}
	return pos < len(n.Input) && n.Input[pos] != ""
}

// ortParts says which fc1 rows are the gate and which the up projection.
func ortParts(a *ortmoe.Attrs) (gate, up int, upInFC1 bool) {
	if a.Activation == ortmoe.SwiGLU {
		switch a.Fusion {
		case ortmoe.FusionInterleaved:
			return PartEven, PartOdd, true
		case ortmoe.FusionConcatenated:
			return PartFirstHalf, PartSecondHalf, true
		}
	}
	return PartWhole, PartWhole, false
}

// ortFloatPlan reads the expert weights of a float MoE node lazily from its
// initializers.
func (c *ctx) ortFloatPlan(n *pb.NodeProto, a *ortmoe.Attrs, s *moe.Spec, H int) (*WeightPlan, error) {
	in := func(i int) string {
		if i < len(n.Input) {
			return n.Input[i]
		}
		return ""
	}
	// consts reads the constant inputs at pos (an absent one is nil), in order.
	consts := func(pos [3]int, what [3]string) (ts [3]*pb.TensorProto, err error) {
		for i, p := range pos {
			if in(p) == "" {
				continue
			}
			if ts[i] = c.constTensor(in(p)); ts[i] == nil {
				return ts, rejectf("%s %q of node %q is not a constant", what[i], in(p), graph.NodeLabel(n))
			}
		}
		return ts, nil
	}
	fc, err := consts([3]int{ortmoe.MoEFC1, ortmoe.MoEFC2, ortmoe.MoEFC3}, [3]string{"fc1_experts_weights", "fc2_experts_weights", "fc3_experts_weights"})
	if err != nil {
		return nil, err
	}
	fc1, fc2, fc3 := fc[0], fc[1], fc[2]
	if fc1 == nil || fc2 == nil || len(fc1.GetDims()) != 3 || len(fc2.GetDims()) != 3 {
		return nil, rejectf("node %q: fc1/fc2 expert weights are not constant [E, N, K] tensors", graph.NodeLabel(n))
	}
	d1, d2 := fc1.GetDims(), fc2.GetDims()
	E := int(d2[0])
	if int(d2[1]*d2[2])%H != 0 {
		return nil, rejectf("node %q: fc2_experts_weights dims %v do not fit hidden size %d", graph.NodeLabel(n), d2, H)
	}
	I := int(d2[1]*d2[2]) / H
	f := int64(1)
	gatePart, upPart, upInFC1 := ortParts(a)
	if upInFC1 {
		f = 2
	}
	legacy := (H != I && int(d2[1]) == I) || (H == I && f == 2 && d1[1] == int64(H))
	want1 := []int64{int64(E), f * int64(I), int64(H)}
	if legacy {
		want1[1], want1[2] = want1[2], want1[1]
	}
	if d1[0] != want1[0] || d1[1] != want1[1] || d1[2] != want1[2] {
		return nil, rejectf("node %q: fc1_experts_weights dims %v, want %v (H=%d I=%d, legacy layout %v)", graph.NodeLabel(n), d1, want1, H, I, legacy)
	}
	s.NumExperts, s.Hidden, s.Inter = E, H, I
	bs, err := consts([3]int{ortmoe.MoEFC1Bias, ortmoe.MoEFC2Bias, ortmoe.MoEFC3Bias}, [3]string{"fc1_experts_bias", "fc2_experts_bias", "fc3_experts_bias"})
	if err != nil {
		return nil, err
	}
	b1, b2, b3 := bs[0], bs[1], bs[2]
	plan := &WeightPlan{Experts: make([]ExpertProj, E)}
	upInit, upBias := fc3, b3
	if upInFC1 {
		upInit, upBias = fc1, b1
	}
	s.ExpertBias = b1 != nil || b2 != nil || b3 != nil
	for e := 0; e < E; e++ {
		plan.Experts[e] = ExpertProj{
			Gate: &Proj{Init: fc1, Expert: e, InOut: legacy, Part: gatePart},
			Up:   &Proj{Init: upInit, Expert: e, InOut: legacy, Part: upPart},
			Down: &Proj{Init: fc2, Expert: e, InOut: legacy},
		}
	}
	addBiases(plan, s, b1, upBias, b2, gatePart, upPart)
	ungate(plan, s)
	return plan, nil
}

// addBiases sets every expert's gate, up and down biases from the fc1
// bias (gate rows gatePart), the up bias (rows upPart of up) and the fc2
// bias, when any is present; an absent one becomes zeros, so that the fused
// node has all three (its function body reads all three).
func addBiases(plan *WeightPlan, s *moe.Spec, gate, up, down *pb.TensorProto, gatePart, upPart int) {
	s.ExpertBias = gate != nil || up != nil || down != nil
	if !s.ExpertBias {
		return
	}
	E := len(plan.Experts)
	zero := map[int]*pb.TensorProto{}
	proj := func(t *pb.TensorProto, e, part, n int) *Proj {
		if t == nil {
			if zero[n] == nil {
				zero[n] = moe.Float32Tensor(fmt.Sprintf("zero_bias_%d", n), []int64{int64(E), int64(n)}, make([]float32, E*n))
			}
			t, part = zero[n], PartWhole
		}
		return &Proj{Init: t, Expert: e, Part: part}
	}
	for e := range plan.Experts {
		ep := &plan.Experts[e]
		ep.GateB, ep.UpB, ep.DownB = proj(gate, e, gatePart, s.Inter), proj(up, e, upPart, s.Inter), proj(down, e, PartWhole, s.Hidden)
	}
}

// initSource reads a QMoE node's inputs from the model's initializers.
// Its tensors are resolved at detection (where a non-constant input fails
// the detection), so reading them later, on another goroutine, cannot.
type initSource struct {
	m *graph.Model
	t map[int]*pb.TensorProto
	H int
}

// newInitSource resolves every input of n from position 2 on.
func (c *ctx) newInitSource(n *pb.NodeProto, H int) (initSource, error) {
	s := initSource{m: c.m, t: map[int]*pb.TensorProto{}, H: H}
	for pos := 2; pos < len(n.Input); pos++ {
		if n.Input[pos] == "" {
			continue
		}
		t := c.constTensor(n.Input[pos])
		if t == nil {
			return initSource{}, rejectf("input %d (%q) of node %q is not a constant", pos, n.Input[pos], graph.NodeLabel(n))
		}
		s.t[pos] = t
	}
	return s, nil
}

func (s initSource) tensor(pos int) *pb.TensorProto { return s.t[pos] }

func (s initSource) Dims(pos int) []int64 {
	if pos == ortmoe.QInput {
		return []int64{1, int64(s.H)}
	}
	if t := s.tensor(pos); t != nil {
		return t.GetDims()
	}
	return nil
}

func (s initSource) Floats(pos int) ([]float32, error) {
	t := s.tensor(pos)
	if t == nil {
		return nil, nil
	}
	b, err := s.m.TensorBytes(t)
	if err != nil {
		return nil, err
	}
	return graph.DecodeFloat32(graph.DataType(t), b)
}

func (s initSource) Ints(pos int) ([]int64, error) {
	t := s.tensor(pos)
	if t == nil {
		return nil, nil
	}
	if graph.DataType(t) != pb.TensorProto_UINT8 {
		return nil, fmt.Errorf("initializer %q is %s, want uint8", t.GetName(), graph.DataType(t))
	}
	b, err := s.m.TensorBytes(t)
	if err != nil {
		return nil, err
	}
	out := make([]int64, len(b))
	for i, v := range b {
		out[i] = int64(v)
	}
	return out, nil
}

// ortQuantPlan plans a QMoE node's weights as float tensors dequantized
// on demand (when the plan is materialized) from the uint8 weights and
// their scales.
func (c *ctx) ortQuantPlan(n *pb.NodeProto, a *ortmoe.Attrs, s *moe.Spec, H int) (*WeightPlan, error) {
	src, err := c.newInitSource(n, H)
	if err != nil {
		return nil, err
	}
	d2 := src.Dims(ortmoe.QFC2)
	if len(d2) != 3 || d2[1] != int64(H) {
		return nil, rejectf("QMoE node %q: fc2_experts_weights dims %v, want [E, %d, I/pack]", graph.NodeLabel(n), d2, H)
	}
	E, I := int(d2[0]), int(d2[2])*8/a.Bits
	s.NumExperts, s.Hidden, s.Inter = E, H, I
	gatePart, upPart, upInFC1 := ortParts(a)
	f := 1
	if upInFC1 {
		f = 2
	}
	label := graph.NodeLabel(n)
	deq := func(wPos, sPos, zPos, N, K int, what string) (*pb.TensorProto, error) {
		if src.tensor(wPos) == nil {
			if what == "fc3" {
				return nil, nil
			}
			return nil, rejectf("QMoE node %q lacks %s weights", label, what)
		}
		st, err := newQMoEStack(c.m, a, src.tensor(wPos), src.tensor(sPos), src.tensor(zPos), E, N, K, label, what)
		if err != nil {
			return nil, rejectf("%v", err)
		}
		return st.deferred(n.Input[wPos] + "/dequantized"), nil
	}
	fc1, err := deq(ortmoe.QFC1, ortmoe.QFC1Scales, ortmoe.QFC1Zero, f*I, H, "fc1")
	if err != nil {
		return nil, err
	}
	fc2, err := deq(ortmoe.QFC2, ortmoe.QFC2Scales, ortmoe.QFC2Zero, H, I, "fc2")
	if err != nil {
		return nil, err
	}
	fc3, err := deq(ortmoe.QFC3, ortmoe.QFC3Scales, ortmoe.QFC3Zero, I, H, "fc3")
	if err != nil {
		return nil, err
	}
	upInit, upBias := fc3, src.tensor(ortmoe.QFC3Bias)
	if upInFC1 {
		upInit, upBias = fc1, src.tensor(ortmoe.QFC1Bias)
	}
	plan := &WeightPlan{Experts: make([]ExpertProj, E)}
	for e := 0; e < E; e++ {
		plan.Experts[e] = ExpertProj{
			Gate: &Proj{Init: fc1, Expert: e, Part: gatePart},
			Up:   &Proj{Init: upInit, Expert: e, Part: upPart},
			Down: &Proj{Init: fc2, Expert: e},
		}
	}
	addBiases(plan, s, src.tensor(ortmoe.QFC1Bias), upBias, src.tensor(ortmoe.QFC2Bias), gatePart, upPart)
	ungate(plan, s)
	return plan, nil
}

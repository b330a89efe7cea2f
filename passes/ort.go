package passes

import (
	"math"

	"github.com/mokopt/mokopt/graph"
	pb "github.com/mokopt/mokopt/graph/onnxpb"
	"github.com/mokopt/mokopt/moe"
)

// detectORT converts an ONNX Runtime com.microsoft::MoE node (layout and
// semantics in models/ORT_MOE.md): softmax over the router logits, top-k,
// optional renormalisation; fc1 gate (or interleaved/concatenated gate+up),
// fc3 up, fc2 down, each [E, out, in] (the legacy [E, in, out] layout is
// recognised by ORT's own rule).
func (c *ctx) detectORT(n *pb.NodeProto) (b *Block, err error) {
	if err := attempt(func() { b = c.ort(n) }); err != nil {
		return nil, err
	}
	return b, nil
}

func (c *ctx) ort(n *pb.NodeProto) *Block {
	in := func(i int) string {
		if i < len(n.Input) {
			return n.Input[i]
		}
		return ""
	}
	if graph.AttrInt(n, "use_sparse_mixer", 0) != 0 {
		fail("com.microsoft::MoE with use_sparse_mixer is not supported")
	}
	fc1, fc2 := c.constTensor(in(2)), c.constTensor(in(4))
	if fc1 == nil || fc2 == nil || len(fc1.GetDims()) != 3 || len(fc2.GetDims()) != 3 {
		fail("com.microsoft::MoE expert weights are not constant [E, N, K] tensors")
	}
	var fc3 *pb.TensorProto
	if in(6) != "" {
		if fc3 = c.constTensor(in(6)); fc3 == nil {
			fail("fc3_experts_weights is not constant")
		}
	}
	// Router: the logits come from a linear layer on the block input.
	lin := c.producerOp(in(1))
	if lin == nil {
		fail("router_probs is not computed by a linear layer")
	}
	ri := &routerInfo{}
	switch lin.GetOpType() {
	case "Gemm":
		w := c.constTensor(lin.Input[1])
		if w == nil || graph.AttrInt(lin, "transA", 0) != 0 || graph.AttrFloat(lin, "alpha", 1) != 1 {
			fail("router Gemm %q has no constant weight", graph.NodeLabel(lin))
		}
		ri.linear, ri.x, ri.w, ri.wInOut = lin, lin.Input[0], w, graph.AttrInt(lin, "transB", 0) == 0
		if len(lin.Input) > 2 && lin.Input[2] != "" {
			ri.bias = c.constTensor(lin.Input[2])
		}
	case "MatMul":
		w := c.matmulWeight(lin.Input[1])
		if w == nil {
			fail("router MatMul %q has no constant weight", graph.NodeLabel(lin))
		}
		ri.linear, ri.x, ri.w, ri.wInOut = lin, lin.Input[0], w.t, !w.swapped
	default:
		fail("router_probs comes from %s, not a linear layer", lin.GetOpType())
	}
	if c.through(ri.x) != c.through(in(0)) {
		fail("the router reads a different tensor than the experts")
	}
	d1, d2 := fc1.GetDims(), fc2.GetDims()
	E, H := int(d2[0]), int(d2[1])
	I := int(d2[2])
	act := graph.AttrString(n, "activation_type", "relu")
	fusion := graph.AttrInt(n, "swiglu_fusion", 0)
	f := int64(1)
	if act == "swiglu" && fusion != 0 {
		f = 2
	}
	legacy := false
	if H != I && int(d2[1]) != H { // [E, I, H] down: legacy [E, in, out]
		legacy = true
		H, I = int(d2[2]), int(d2[1])
	}
	if legacy && d1[1] != int64(H) || !legacy && d1[1] != f*int64(I) {
		fail("fc1_experts_weights dims %v do not fit H=%d I=%d", d1, H, I)
	}
	s := moe.Spec{NumExperts: E, TopK: int(graph.AttrInt(n, "k", 1)), Hidden: H, Inter: I,
		RouterActivation: moe.Softmax, RouterOrder: moe.ActivationThenTopK,
		NormalizeTopK: graph.AttrInt(n, "normalize_routing_weights", 0) != 0, RoutedScalingFactor: 1,
		NGroup: 1, TopKGroup: 1, EPSize: 1, SwiGLUAlpha: 1, RouterBias: ri.bias != nil}
	gatePart, upPart := PartWhole, PartWhole
	upInit := fc3
	switch {
	case act == "silu" && fc3 != nil:
		s.Activation = moe.SwiGLU
	case act == "swiglu":
		alpha := graph.AttrFloat(n, "activation_alpha", 1)
		beta := graph.AttrFloat(n, "activation_beta", 0)
		limit := graph.AttrFloat(n, "swiglu_limit", float32(math.Inf(1)))
		if limit >= 1e38 {
			limit = 0
		}
		switch {
		case beta == 1:
			s.Activation, s.SwiGLUAlpha, s.SwiGLULimit = moe.SwiGLUOAI, alpha, limit
		case beta == 0 && alpha == 1 && limit == 0:
			s.Activation = moe.SwiGLU
		case beta == 0 && alpha == 1:
			s.Activation, s.SwiGLULimit = moe.SwiGLUClamped, limit
		default:
			fail("swiglu with alpha %g, beta %g has no ai.mok::MoE form", alpha, beta)
		}
		switch fusion {
		case 1:
			gatePart, upPart, upInit = PartEven, PartOdd, fc1
			s.GateUpInterleaved = true
		case 2:
			gatePart, upPart, upInit = PartFirstHalf, PartSecondHalf, fc1
		default:
			if fc3 == nil {
				fail("swiglu without fusion needs fc3_experts_weights")
			}
		}
	default:
		fail("com.microsoft::MoE activation %q (with fc3 %v) is not supported", act, fc3 != nil)
	}
	if in(3) != "" || in(5) != "" || in(7) != "" {
		fail("com.microsoft::MoE expert biases are not supported yet")
	}
	plan := &WeightPlan{Router: Proj{Init: ri.w, Expert: -1, InOut: ri.wInOut}, Experts: make([]ExpertProj, E)}
	if ri.bias != nil {
		plan.RouterB = &Proj{Init: ri.bias, Expert: -1}
	}
	for e := 0; e < E; e++ {
		plan.Experts[e] = ExpertProj{
			Gate: &Proj{Init: fc1, Expert: e, InOut: legacy, Part: gatePart},
			Up:   &Proj{Init: upInit, Expert: e, InOut: legacy, Part: upPart},
			Down: &Proj{Init: fc2, Expert: e, InOut: legacy},
		}
	}
	region := []*pb.NodeProto{n}
	if len(c.g.Consumers(lin.Output[0])) == 1 {
		region = append([]*pb.NodeProto{lin}, region...)
	}
	b := &Block{Name: blockName(n.Output[0], ri.w.GetName(), region), Kind: KindORT, Spec: s, Input: in(0), Router: in(0), Output: n.Output[0],
		Nodes: len(region), Region: region, W: plan}
	if err := s.Validate(); err != nil {
		fail("%v", err)
	}
	return b
}

package lowering

// Domain, OpType and Version name the kernel node a fused MoE block lowers to.
const (
	Domain  = "ai.mok"
	OpType  = "MoKDispatchFFNCombine"
	Version = 1
)

// Input positions of the MoKDispatchFFNCombine node. Every input is present.
const (
	InX = iota
	InTopKExperts
	InRouterWeights
	InGate
	InGateScale
	InUp
	InUpScale
	InDown
	InDownScale
	InSharedGate
	InSharedUp
	InSharedDown
	NumInputs
)

// InputNames are the formal input names of the kernel node's function; they
// are the tensor names of the kernel contract (kernel.Tensors).
var InputNames = [NumInputs]string{
	"x", "topk_experts", "router_weights",
	"w_routed_gate", "w_routed_gate_sc", "w_routed_up", "w_routed_up_sc", "w_routed_down", "w_routed_down_sc",
	"w_shared_gate", "w_shared_up", "w_shared_down",
}

// Attribute names of the kernel node.
const (
	AttrRoutedPrecision   = "routed_precision" // "mxfp8"
	AttrSharedPrecision   = "shared_precision" // "bf16"
	AttrFwdNumCommSMs     = "fwd_num_comm_sms"
	AttrBwdNumCommSMs     = "bwd_num_comm_sms"
	AttrMinibatchSize     = "minibatch_size"
	AttrMacrobatchSize    = "macrobatch_size"
	AttrCapacityMult      = "schedule_capacity_multiplier"
	AttrAllGatherChunk    = "all_gather_top_experts_chunk_bytes"
	AttrEPSize            = "ep_size"
	AttrExpertsPerRank    = "experts_per_rank"
	AttrExpertOffset      = "expert_offset"
	AttrTarget            = "target"
	AttrNumExperts        = "num_experts"
	AttrTopK              = "top_k"
	AttrActivation        = "activation" // "swiglu" or "swiglu_clamped"
	AttrSwiGLULimit       = "swiglu_limit"
	AttrSharedExpert      = "shared_expert" // SharedInKernel, SharedOutside or SharedNone
	AttrTokensPerRank     = "tokens_per_rank"
	AttrEmulateActQuant   = "emulate_activation_quant"
	overloadSwiGLU        = "swiglu"
	overloadSwiGLUClamped = "swiglu_clamped"
)

// Where a block's shared expert goes (the shared_expert attribute).
const (
	// SharedInKernel: the kernel runs the shared expert (ungated, same I).
	SharedInKernel = "in_kernel"
	// SharedOutside: the shared expert is gated or wider than the routed
	// experts; it runs as standard ONNX ops added to the kernel's output, and
	// the kernel gets zero shared weights.
	SharedOutside = "outside"
	// SharedNone: the block has no shared expert; the kernel, which always runs
	// one, gets zero shared weights (silu(0)·0 = 0).
	SharedNone = "none"
)

// attrNames are the attributes the kernel node's function declares.
var attrNames = []string{
	AttrActivation, AttrAllGatherChunk, AttrBwdNumCommSMs, AttrEPSize, AttrEmulateActQuant, AttrExpertOffset,
	AttrExpertsPerRank, AttrFwdNumCommSMs, AttrMacrobatchSize, AttrMinibatchSize, AttrNumExperts,
	AttrRoutedPrecision, AttrCapacityMult, AttrSharedExpert, AttrSharedPrecision, AttrSwiGLULimit,
	AttrTarget, AttrTokensPerRank, AttrTopK,
}

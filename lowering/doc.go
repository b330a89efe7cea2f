// Package lowering lowers fused ai.mok::MoE nodes to the Mixture-of-Kittens
// (MoK) MoE megakernel for GB200/GB300 NVL72 racks.
//
// For each fused node, Lower checks the kernel contract (kernel.Check plus the
// few rules only a lowering can see, every violation numbered, see
// Constraints) and, when the kernel can take the block, replaces the node by
//
//   - the router, as standard ONNX ops taken from the fused node's own
//     canonical decomposition (moe.Function), producing topk_experts int64
//     [T, k] (global expert ids) and router_weights float32 [T, k] with
//     renormalisation, routed_scaling_factor, the correction-bias choice and
//     group-limited top-k folded in exactly as moe.Route does;
//   - a Cast of the tokens to bfloat16;
//   - one ai.mok::MoKDispatchFFNCombine node (version 1) with the routed
//     experts as MXFP8 pairs (FLOAT8E4M3FN codes [E, N, K] and UE8M0 scales in
//     the tcgen05 layout [E·N/128, K/128, 32, 16], quantized by kernel/mxfp8),
//     the shared expert in BF16, the precision annotations, every kernel knob,
//     the expert-parallel placement and the target as attributes;
//   - a Cast back to float32, and, when the block has a shared expert the
//     kernel cannot run (gated, or wider than the routed experts), that
//     shared expert as standard ONNX ops added to the kernel's output;
//   - a Reshape to the block input's shape, under the fused node's output name.
//
// The weights are quantized while the model is saved (graph.Model.SetDeferred),
// one expert's [N, K] slab at a time, so a lowering never holds a whole weight
// tensor; the output is byte-identical whatever GOMAXPROCS is.
//
// The lowered model carries a model-local function for MoKDispatchFFNCombine
// in standard ONNX ops (it dequantizes the weights with Cast from
// float8e4m3fn and the scales expanded from the tcgen05 layout, and runs the
// SwiGLU experts), and this package registers a reference kernel for the
// interpreter (graph/eval) that emulates the kernel's numerics more closely
// (activations quantized to MXFP8 inside the routed GEMMs). The interpreter has
// no float8 tensors: DecodeFP8ForEval turns the FLOAT8E4M3FN initializers of a
// loaded lowered model into float32 ones so that eval.Run can read them.
//
// Lower also produces a launch Plan (shapes, expert placement, workspace and
// schedule capacity, weight bytes, knobs, and the kernel/perf prediction
// against an unfused DeepEP baseline, plus the vendor's four benchmark shapes).
package lowering

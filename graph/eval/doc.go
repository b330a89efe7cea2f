// Package eval is a CPU reference interpreter for ONNX graphs.
//
// It evaluates a model's main graph node by node in topological order on
// dense tensors held in plain Go slices (see Tensor), freeing each
// intermediate after its last use. It covers the operators that PyTorch's
// exporters emit for transformer and mixture-of-experts blocks (elementwise
// math with numpy broadcasting, MatMul/Gemm, gathers and scatters, TopK,
// reductions, softmax and normalizations, shape manipulation), control flow
// (If, Loop, Scan), model-local functions (inlined) and a registry for
// custom kernels (Register).
//
// The interpreter favours clarity and determinism over speed: float32 math
// is done in float32 or float64 per kernel, MatMul is a blocked float32
// kernel split across goroutines. It is meant for checking that a rewritten
// graph computes what the original did, not for serving.
package eval

package mokopt

import (
	"sync"

	"github.com/mokopt/mokopt/graph/eval"
	"github.com/mokopt/mokopt/internal/ortmoe"
	"github.com/mokopt/mokopt/lowering"
	"github.com/mokopt/mokopt/moe"
)

// Kernels returns the Go kernels of every custom op mokopt writes or
// reads: ai.mok::MoE (fused, and EP shards), ai.mok::MoKDispatchFFNCombine
// (lowered, MXFP8 as the MoK kernel computes it) and ONNX Runtime's
// com.microsoft::MoE and QMoE. Verify and Run evaluate with them; nothing is
// registered on import, so a program that runs models through package
// verify or graph/eval gets these kernels only by passing this set in
// eval.Options.Kernels (otherwise ai.mok nodes run their function bodies).
// The set must not be modified.
func Kernels() *eval.Kernels { return kernels() }

var kernels = sync.OnceValue(func() *eval.Kernels {
	return lowering.AddKernels(ortmoe.AddKernels(moe.AddKernels(eval.NewKernels())))
})

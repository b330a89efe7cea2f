package passes

import (
	"sync"

	"github.com/mokopt/mokopt/graph/eval"
	"github.com/mokopt/mokopt/internal/ortmoe"
	"github.com/mokopt/mokopt/moe"
)

// evalKernels is the kernel set passes evaluates models with (the numerical
// check, the EP group check): ai.mok::MoE, and ONNX Runtime's MoE and QMoE
// that exports may hold. It is passed explicitly to every run, so the check
// does not depend on what a program links.
var evalKernels = sync.OnceValue(func() *eval.Kernels {
	return ortmoe.AddKernels(moe.AddKernels(eval.NewKernels()))
})

package mokopt

import (
	"context"
	"fmt"

	"github.com/mokopt/mokopt/internal/verify"
	"github.com/mokopt/mokopt/lowering"
	"github.com/mokopt/mokopt/passes"
)

// VerifyReport holds per case and per output the largest absolute and
// relative errors and the worst element.
type VerifyReport = verify.Report

// Default tolerances of Verify: |a-b| <= ATol + RTol*|b|.
const (
	DefaultRTol = verify.DefaultRTol
	DefaultATol = verify.DefaultATol
)

// Engines Verify runs models with.
const (
	// EngineRef is mokopt's reference interpreter (graph/eval).
	EngineRef = "ref"
)

// Runner evaluates a model on feeds keyed by graph input name and returns
// its outputs by name (for example ortrun.RunModel, ONNX Runtime, in
// builds with -tags ort).
type Runner = verify.Runner

// VerifyOptions control Verify and Run.
type VerifyOptions struct {
	// Engine names the evaluator: "" or EngineRef for the reference
	// interpreter; any other name needs Runner.
	Engine string
	// Runner, when set, runs the models instead of the reference
	// interpreter.
	Runner Runner
	// Tokens lists the token counts of the random-input cases (dynamic
	// dims only); empty means one default case.
	Tokens []int
	// Seed makes random inputs reproducible.
	Seed int64
	// RTol and ATol are the tolerances; zero means exact (see
	// DefaultVerifyOptions).
	RTol, ATol float64
	// DataDir, when set, supplies the inputs (an ONNX test_data_set folder,
	// or one holding test_data_set_* folders).
	DataDir string
	// Progress, when set, receives "verify" events (model runs done).
	Progress Progress
	// MemLimit caps the reference interpreter's live tensor bytes (see
	// eval.Options.MemLimit); 0 means no limit.
	MemLimit int64
	// QuantBound selects the comparison of float outputs: 0 compares
	// element-wise, except when a model holds MXFP8 weights, where each
	// output's mean relative error and relative L2 error are held to
	// verify.DefaultMXFP8Bound, and when a model computes in float16 or
	// bfloat16 behind float32 outputs, compared at that type's precision
	// (both said in the report's notes); > 0 always compares statistically
	// against this bound; < 0 always element-wise at RTol and ATol.
	QuantBound float64
	// WholeModel compares only the graph outputs of a lowered model and
	// the fused model it came from. By default, when the comparison is
	// statistical (MXFP8), each fused block is compared with its lowering
	// on the fused model's block input with the fused model's routing
	// forced, against the bound, the routing flips counted, and the graph
	// outputs held to a looser end-to-end bound (the report's Blocks).
	WholeModel bool
}

// DefaultVerifyOptions returns the CLI's defaults: tokens 1, 7 and 64,
// seed 1, the default tolerances, the reference interpreter.
func DefaultVerifyOptions() VerifyOptions {
	return VerifyOptions{Engine: EngineRef, Tokens: []int{1, 7, 64}, Seed: 1, RTol: DefaultRTol, ATol: DefaultATol}
}

func (o VerifyOptions) lower() (verify.Options, error) {
	if o.Runner == nil && o.Engine != "" && o.Engine != EngineRef {
		return verify.Options{}, fmt.Errorf("verify engine %q needs a Runner (only %q is built in)", o.Engine, EngineRef)
	}
	vo := verify.Options{Tokens: o.Tokens, Seed: o.Seed, RTol: o.RTol, ATol: o.ATol, DataDir: o.DataDir, Runner: o.Runner, Engine: o.Engine, QuantBound: o.QuantBound, WholeModel: o.WholeModel, KernelRouting: lowering.KernelRouting}
	vo.Eval.MemLimit = o.MemLimit
	vo.Eval.Kernels = Kernels()
	if o.Progress != nil {
		vo.Progress = func(done, total int) { o.Progress.report(StageVerify, done, total) }
	}
	return vo, nil
}

// Verify runs a and b on the same inputs and compares their outputs by
// position, b being the reference of the tolerance. When outputs differ it
// returns the report and a *MismatchError; evaluation failures (an
// unsupported op, a malformed model) are other errors.
func Verify(ctx context.Context, a, b *Model, opt VerifyOptions) (*VerifyReport, error) {
	if err := errCtx(ctx); err != nil {
		return nil, err
	}
	vo, err := opt.lower()
	if err != nil {
		return nil, err
	}
	ga, gb := a.g, b.g
	if vo.Runner == nil {
		ga, gb = passes.Evaluable(ctx, ga), passes.Evaluable(ctx, gb)
	}
	rep, err := verify.Compare(ctx, ga, gb, vo)
	if err != nil {
		return nil, err
	}
	if !rep.Pass {
		return rep, mismatchError(rep)
	}
	return rep, nil
}

// Run runs m on every ONNX test data set under dataDir and compares its
// outputs with the stored output_N.pb files (opt.Tokens, Seed and DataDir
// are ignored). Differences give the report and a *MismatchError.
func Run(ctx context.Context, m *Model, dataDir string, opt VerifyOptions) (*VerifyReport, error) {
	if err := errCtx(ctx); err != nil {
		return nil, err
	}
	vo, err := opt.lower()
	if err != nil {
		return nil, err
	}
	g := m.g
	if vo.Runner == nil {
		g = passes.Evaluable(ctx, g)
	}
	rep, err := verify.RunAndCheck(ctx, g, dataDir, vo)
	if err != nil {
		return nil, err
	}
	if !rep.Pass {
		return rep, mismatchError(rep)
	}
	return rep, nil
}

package mokopt

import (
	"context"
	"errors"
	"fmt"
	"math"

	"github.com/mokopt/mokopt/graph"
	"github.com/mokopt/mokopt/graph/eval"
	"github.com/mokopt/mokopt/internal/verify"
	"github.com/mokopt/mokopt/lowering"
	"github.com/mokopt/mokopt/passes"
)

// VerifyReport holds per case and per output the largest absolute and
// relative errors and the worst element; Summary() is the text the
// command prints. Its fields (docs/json.md gives their JSON):
//
//   - SchemaVersion: 1.
//   - ModelA, ModelB: the model checked and the one compared against
//     (ModelB empty for Run); Reference: the side whose values scale the
//     tolerance (model B, or the data folder).
//   - Engine: "ref" or the VerifyOptions.Engine given; Inputs: "data" or
//     "random"; Seed: the seed random inputs were drawn with.
//   - RTol, ATol: the tolerances used; QuantBound: the bound of a
//     statistical comparison (0 for element-wise).
//   - Pass: at least one case, and every case passed.
//   - Notes: the choices made (shapes used, ignored options, precision).
//   - BlockReference, BlockBound, EndToEndBound: for a block-by-block
//     comparison of a lowered model (VerifyOptions.WholeModel unset), the
//     model whose fused blocks are the reference, the bound each block is
//     held to and the looser bound of the graph outputs.
//   - Cases: one per set of inputs: Name ("tokens=N", "fixed_shapes" or
//     the data set), Tokens, Inputs (name, dtype, shape), Pass, Message,
//     and Outputs, one per output position: Index, NameA, NameB, DTypeA,
//     DTypeB, ShapeA, ShapeB, Elements, Mismatches, NonFinite, MaxAbsErr,
//     MaxRelErr, MaxAbsRef, RTol, ATol, and the worst element (WorstIndex,
//     WorstMultiIndex, WorstA, WorstB); for a statistical comparison
//     MeanRel (mean relative error) and RelL2 (relative L2 error);
//     NearTieTokens, the tokens a half-precision comparison left out as
//     routing near ties (Message says where);
//     Blocks, for a block-by-block comparison, one per fused block: Index,
//     Node, KernelNode, Output, Elements, MeanRel, RelL2, MaxAbsErr,
//     MaxAbsRef, Bound, Decisions, RouterFlips, EndToEndFlips, Pass and
//     Message.
type VerifyReport = verify.Report

// Defaults of Verify and Run, the mokopt command's: the tolerances of
// |a-b| <= ATol + RTol*|b|, and the seed of the random inputs.
const (
	DefaultRTol       = verify.DefaultRTol
	DefaultATol       = verify.DefaultATol
	DefaultSeed int64 = 1
)

// DefaultTokens are the token counts of Verify's random-input cases when
// VerifyOptions.Tokens is empty (the command's --tokens 1,7,64).
func DefaultTokens() []int { return []int{1, 7, 64} }

// Engines Verify runs models with.
const (
	// EngineRef is mokopt's reference interpreter (graph/eval).
	EngineRef = "ref"
)

// Runner evaluates a model on feeds keyed by graph input name and returns
// its outputs by name (for example ortrun.RunModel, ONNX Runtime, in
// builds with -tags ort).
type Runner func(ctx context.Context, m *graph.Model, feeds map[string]*eval.Tensor) (map[string]*eval.Tensor, error)

// VerifyOptions control Verify and Run. The zero value is what the mokopt
// command does by default: the reference interpreter, random inputs for
// DefaultTokens drawn with DefaultSeed, and the default tolerances. An
// exact comparison is asked for with Exact (or a negative tolerance).
type VerifyOptions struct {
	// Engine names the evaluator: "" or EngineRef for the reference
	// interpreter; any other name needs Runner.
	Engine string
	// Runner, when set, runs the models instead of the reference
	// interpreter.
	Runner Runner
	// Tokens lists the token counts of the random-input cases (dynamic
	// dims only); empty means DefaultTokens.
	Tokens []int
	// Seed makes random inputs reproducible; 0 means DefaultSeed, so the
	// zero value draws the inputs the command draws.
	Seed int64
	// RTol and ATol are the tolerances of |a-b| <= ATol + RTol*|b|: zero
	// means DefaultRTol and DefaultATol, a negative value no tolerance of
	// that kind (as net.Dialer.KeepAlive spells "off").
	RTol, ATol float64
	// Exact compares exactly: both tolerances zero and every float output
	// element-wise, with no allowance for half precision or MXFP8 weights.
	// RTol, ATol and QuantBound must then be zero.
	Exact bool
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

// DefaultVerifyOptions returns the CLI's defaults spelled out: tokens 1, 7
// and 64, seed 1, the default tolerances, the reference interpreter. The
// zero VerifyOptions means the same.
func DefaultVerifyOptions() VerifyOptions {
	return VerifyOptions{Engine: EngineRef, Tokens: DefaultTokens(), Seed: DefaultSeed, RTol: DefaultRTol, ATol: DefaultATol}
}

// tolerance is a VerifyOptions tolerance resolved: 0 the default, < 0 none.
func tolerance(v, def float64) float64 {
	switch {
	case v == 0:
		return def
	case v < 0:
		return 0
	}
	return v
}

func (o VerifyOptions) lower() (verify.Options, error) {
	if o.Runner == nil && o.Engine != "" && o.Engine != EngineRef {
		return verify.Options{}, fmt.Errorf("verify engine %q needs a Runner (only %q is built in)", o.Engine, EngineRef)
	}
	if math.IsNaN(o.RTol) || math.IsNaN(o.ATol) {
		return verify.Options{}, errors.New("verify: a tolerance is NaN")
	}
	if o.Exact && (o.RTol != 0 || o.ATol != 0 || o.QuantBound != 0) {
		return verify.Options{}, errors.New("verify: Exact excludes RTol, ATol and QuantBound")
	}
	vo := verify.Options{Tokens: o.Tokens, Seed: o.Seed, RTol: tolerance(o.RTol, DefaultRTol), ATol: tolerance(o.ATol, DefaultATol), DataDir: o.DataDir, Runner: verify.Runner(o.Runner), Engine: o.Engine, QuantBound: o.QuantBound, WholeModel: o.WholeModel, KernelRouting: lowering.KernelRouting}
	if len(vo.Tokens) == 0 {
		vo.Tokens = DefaultTokens()
	}
	if vo.Seed == 0 {
		vo.Seed = DefaultSeed
	}
	if o.Exact {
		vo.RTol, vo.ATol, vo.QuantBound, vo.Exact = 0, 0, -1, true
	}
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

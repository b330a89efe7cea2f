package verify

import (
	"encoding/json"
	"fmt"
	"math"
	"strings"

	"github.com/mokopt/mokopt/graph"
	"github.com/mokopt/mokopt/graph/eval"
	pb "github.com/mokopt/mokopt/graph/onnxpb"
	"github.com/mokopt/mokopt/moe"
)

// DefaultMXFP8Bound is the bound Compare applies, when a model holds MXFP8
// weights, to both the mean relative error Σ|a−b| / Σ|b| and the relative
// L2 error ‖a−b‖₂ / ‖b‖₂ of each float output. One E4M3 rounding (3
// mantissa bits under a power-of-two block scale) has a relative error of
// about 2.6% rms; quantizing the experts' weights gives 4-5% on their
// output, the MoK kernel's full MXFP8 (weights and activations) 6-7%.
const DefaultMXFP8Bound = 0.08

// holdsMXFP8 reports whether m carries MXFP8 data: a float8 initializer or
// a node of the MoK kernel (whose routed experts are MXFP8 by contract, also
// once an evaluator decoded the codes to float).
func holdsMXFP8(m *graph.Model) bool {
	g := m.Proto.GetGraph()
	for _, t := range g.GetInitializer() {
		switch graph.DataType(t) {
		case pb.TensorProto_FLOAT8E4M3FN, pb.TensorProto_FLOAT8E4M3FNUZ, pb.TensorProto_FLOAT8E5M2, pb.TensorProto_FLOAT8E5M2FNUZ:
			return true
		}
	}
	for _, n := range g.GetNode() {
		if n.GetDomain() == "ai.mok" && n.GetOpType() == "MoKDispatchFFNCombine" {
			return true
		}
	}
	return false
}

// quantMode settles Options.QuantBound for a comparison of a and b: an
// explicit bound is kept; 0 becomes DefaultMXFP8Bound when either model
// holds MXFP8 data (and Exact is off), with a note saying so; a negative
// bound, or no MXFP8 data, means element-wise comparison.
func quantMode(a, b *graph.Model, opt *Options, r *Report) {
	if opt.QuantBound != 0 || opt.Exact {
		if opt.QuantBound < 0 {
			opt.QuantBound = 0
		}
		if opt.QuantBound > 0 {
			r.QuantBound = opt.QuantBound
			r.Notes = append(r.Notes, fmt.Sprintf("quantization-aware comparison: each float output passes when its mean relative error and relative L2 error are both <= %.3g", opt.QuantBound))
		}
		return
	}
	side := ""
	switch {
	case holdsMXFP8(b):
		side = "b (" + b.Name() + ")"
	case holdsMXFP8(a):
		side = "a (" + a.Name() + ")"
	default:
		return
	}
	opt.QuantBound = DefaultMXFP8Bound
	r.QuantBound = opt.QuantBound
	r.Notes = append(r.Notes, fmt.Sprintf("%s holds MXFP8 weights: each float output is compared by its mean relative error and relative L2 error against the MXFP8 bound %.0f%% instead of element by element (near-zero elements make element-wise relative errors meaningless); rtol/atol are not used", side, 100*opt.QuantBound))
}

// compareQuant compares float outputs statistically (Options.QuantBound):
// oc has types and shapes set and equal; it fills the error measures and
// the verdict.
func compareQuant(oc *OutputCheck, a, b *eval.Tensor, bound float64) {
	var d2, w2, dAbs, wAbs, maxAbs, maxRel, peak float64
	worst := -1
	for j := 0; j < b.Len(); j++ {
		x, y := a.Float64At(j), b.Float64At(j)
		d, w := math.Abs(x-y), math.Abs(y)
		if math.IsNaN(d) {
			d = math.Inf(1)
		}
		d2 += d * d
		w2 += w * w
		dAbs += d
		wAbs += w
		peak = max(peak, w)
		if worst < 0 || d > maxAbs {
			maxAbs, worst = d, j
		}
		if w != 0 {
			maxRel = max(maxRel, d/w)
		}
	}
	oc.Elements = b.Len()
	oc.MaxAbsErr, oc.MaxRelErr, oc.MaxAbsRef = Float(maxAbs), Float(maxRel), Float(peak)
	rel := func(num, den float64) float64 {
		if den == 0 {
			if num == 0 {
				return 0
			}
			return math.Inf(1)
		}
		return num / den
	}
	oc.RelL2 = Float(rel(math.Sqrt(d2), math.Sqrt(w2)))
	oc.MeanRel = Float(rel(dAbs, wAbs))
	oc.QuantBound = bound
	if worst >= 0 {
		oc.WorstIndex = worst
		oc.WorstMultiIndex = eval.Unravel(worst, b.Shape)
		oc.WorstA, oc.WorstB = Float(a.Float64At(worst)), Float(b.Float64At(worst))
	}
	oc.Pass = float64(oc.MeanRel) <= bound && float64(oc.RelL2) <= bound
	if !oc.Pass {
		oc.Mismatches = oc.Elements
		oc.Message = fmt.Sprintf("mean relative error %.3g and relative L2 error %.3g: above the quantization bound %.3g", float64(oc.MeanRel), float64(oc.RelL2), bound)
	}
}

// isFloat reports whether dt is a floating-point type compareQuant takes.
func isFloat(dt pb.TensorProto_DataType) bool {
	switch dt {
	case pb.TensorProto_FLOAT, pb.TensorProto_DOUBLE, pb.TensorProto_FLOAT16, pb.TensorProto_BFLOAT16:
		return true
	}
	return false
}

// halfMode settles the precision float outputs are compared at when a
// model computes in half precision behind float32 inputs and outputs (a
// float16 conversion that keeps its I/O types): its float16 or bfloat16
// weights round every step, so outputs are compared at that type's
// precision, as a half-precision output would be, and a note says so.
// Exact or a QuantBound other than 0 (statistical, or < 0: element-wise
// as asked) keeps the given tolerances.
func halfMode(opt *Options, r *Report, ms ...*graph.Model) {
	if opt.Exact || opt.QuantBound != 0 {
		return
	}
	for _, m := range ms {
		if m == nil {
			continue
		}
		if dt, ok := halfWeights(m); ok {
			opt.halfCompute = dt
			r.Notes = append(r.Notes, fmt.Sprintf("%s computes at %s precision (its weights, or those its fused nodes replaced, are stored so): float outputs are compared at that precision (%s; atol that fraction of the output's largest magnitude); --elementwise keeps --rtol/--atol", m.Name(), strings.ToLower(dt.String()), eval.HalfToleranceText(dt)))
			return
		}
	}
}

// halfWeights returns the half-precision type of m's float16 or bfloat16
// initializers, or of the weights its fused nodes replaced (their
// provenance's source type), bfloat16 when both; false when there are
// none.
func halfWeights(m *graph.Model) (pb.TensorProto_DataType, bool) {
	found := pb.TensorProto_UNDEFINED
	see := func(dt pb.TensorProto_DataType) { found = graph.CoarserHalf(found, dt) }
	for _, t := range m.Proto.GetGraph().GetInitializer() {
		see(graph.DataType(t))
	}
	for _, p := range m.Proto.GetMetadataProps() {
		if !strings.HasPrefix(p.GetKey(), moe.ProvenanceKey) {
			continue
		}
		var prov moe.Provenance
		if json.Unmarshal([]byte(p.GetValue()), &prov) == nil {
			see((&moe.Spec{IOType: prov.SourceType}).IOElemType())
		}
	}
	return found, found != pb.TensorProto_UNDEFINED
}

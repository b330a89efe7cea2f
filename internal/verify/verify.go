// Package verify checks that two ONNX models compute the same function, or
// that a model reproduces the reference outputs of an ONNX test data set,
// by evaluating them with the reference interpreter (package graph/eval) and
// comparing every output elementwise.
//
// An element passes when |a-b| <= atol + rtol*|b|, where b is the reference
// (the second model in Compare, the stored output in RunAndCheck). Reports
// are JSON-serialisable with stable field names and carry
// "schema_version": 1.
package verify

import (
	"context"
	"encoding/json"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strconv"
	"strings"

	"github.com/mokopt/mokopt/graph"
	"github.com/mokopt/mokopt/graph/eval"
	pb "github.com/mokopt/mokopt/graph/onnxpb"
	"github.com/mokopt/mokopt/moe"
)

// SchemaVersion is the version of the Report JSON layout.
const SchemaVersion = 1

// Default tolerances and token count, for callers that want them.
const (
	DefaultRTol   = 1e-4
	DefaultATol   = 1e-5
	DefaultTokens = 8
)

// Options controls a comparison.
type Options struct {
	// Tokens lists the sequence lengths to generate random inputs for (one
	// comparison case each); empty means {DefaultTokens}. Ignored when every
	// input has fixed dims, or when DataDir is set.
	Tokens []int
	// Seed makes random inputs reproducible.
	Seed int64
	// RTol and ATol are the tolerances of |a-b| <= ATol + RTol*|b|; zero
	// means exact (use DefaultRTol, DefaultATol for the usual check).
	RTol, ATol float64
	// DataDir, when set, supplies the inputs: a folder holding input_N.pb
	// files, or one holding test_data_set_* folders.
	DataDir string
	// Eval is passed to eval.Run (memory limit, threads, ...).
	Eval eval.Options
	// Exact keeps RTol and ATol for half-precision (float16, bfloat16)
	// outputs too; by default those are compared within eval.HalfTolerance
	// (0.0049 float16, 0.039 bfloat16) relative and that fraction of the output's largest
	// magnitude absolute, the precision the type carries. Exact also keeps
	// the element-wise comparison for models holding MXFP8 weights.
	Exact bool
	// QuantBound, when > 0, compares float outputs statistically: each
	// passes when its mean relative error Σ|a−b|/Σ|b| and its relative L2
	// error ‖a−b‖/‖b‖ are both at most QuantBound (RTol and ATol unused).
	// 0 chooses DefaultMXFP8Bound when either model holds MXFP8 weights
	// (unless Exact), element-wise otherwise; < 0 is always element-wise.
	QuantBound float64
	// Runner, when set, evaluates both models instead of the reference
	// interpreter (for example ONNX Runtime, ortrun.RunModel); Eval is then
	// ignored.
	Runner Runner
	// Engine names the evaluator in the report: "ref" when empty.
	Engine string
	// Progress, when set, is called after each model run with the runs
	// done so far and the total (two per case for Compare, one for
	// RunAndCheck).
	Progress func(done, total int)

	// KernelRouting, when set, names the routing inputs of lowered kernel
	// nodes: a model holding such nodes, compared with the model of fused
	// ai.mok::MoE nodes it was lowered from, is then compared block by
	// block (see CompareBlocks) whenever the comparison is statistical
	// (QuantBound > 0, or 0 with MXFP8 weights) and the reference
	// interpreter runs the models.
	KernelRouting KernelRouting
	// WholeModel compares only the graph outputs, also where KernelRouting
	// would compare block by block.
	WholeModel bool

	// halfCompute, set by halfMode, is the half type a model computes in
	// behind float32 outputs (their comparison precision).
	halfCompute pb.TensorProto_DataType
}

func (o Options) progress(done, total int) {
	if o.Progress != nil {
		o.Progress(done, total)
	}
}

// Runner evaluates a model on feeds, keyed by graph input name, and returns
// its outputs by name.
type Runner func(ctx context.Context, m *graph.Model, feeds map[string]*eval.Tensor) (map[string]*eval.Tensor, error)

// Float is a float64 that marshals NaN and ±Inf as the JSON strings "NaN",
// "Inf" and "-Inf" (plain JSON numbers cannot hold them).
type Float float64

// MarshalJSON implements json.Marshaler.
func (f Float) MarshalJSON() ([]byte, error) {
	v := float64(f)
	switch {
	case math.IsNaN(v):
		return []byte(`"NaN"`), nil
	case math.IsInf(v, 1):
		return []byte(`"Inf"`), nil
	case math.IsInf(v, -1):
		return []byte(`"-Inf"`), nil
	}
	return []byte(strconv.FormatFloat(v, 'g', -1, 64)), nil
}

// UnmarshalJSON implements json.Unmarshaler.
func (f *Float) UnmarshalJSON(b []byte) error {
	var s string
	if err := json.Unmarshal(b, &s); err == nil {
		switch s {
		case "NaN":
			*f = Float(math.NaN())
		case "Inf":
			*f = Float(math.Inf(1))
		case "-Inf":
			*f = Float(math.Inf(-1))
		default:
			return fmt.Errorf("bad float %q", s)
		}
		return nil
	}
	var v float64
	if err := json.Unmarshal(b, &v); err != nil {
		return err
	}
	*f = Float(v)
	return nil
}

// Report is the outcome of Compare or RunAndCheck.
type Report struct {
	// SchemaVersion is SchemaVersion (1).
	SchemaVersion int `json:"schema_version"`
	// ModelA is the model checked (the candidate).
	ModelA string `json:"model_a"`
	// ModelB is the model compared against; empty for RunAndCheck.
	ModelB string `json:"model_b,omitempty"`
	// Reference names the side whose values scale the tolerance: model b,
	// or the data folder for RunAndCheck.
	Reference string `json:"reference"`
	// Engine is the evaluator that ran the models: "ref" (mokopt's
	// reference interpreter) or the Options.Engine given.
	Engine string `json:"engine"`
	// Inputs is "data" (from a data folder) or "random".
	Inputs string `json:"inputs"`
	// Seed is the seed random inputs were drawn with.
	Seed int64 `json:"seed"`
	// RTol and ATol are the tolerances of |a-b| <= atol + rtol*|b|.
	RTol float64 `json:"rtol"`
	ATol float64 `json:"atol"`
	// QuantBound is the bound of the quantization-aware comparison, when
	// one was made (Options.QuantBound); 0 for element-wise.
	QuantBound float64 `json:"quant_bound,omitempty"`
	// Pass is true when there is at least one case and every case passed.
	Pass bool `json:"pass"`
	// Notes explain choices: shapes used, id ranges, ignored options.
	Notes []string `json:"notes,omitempty"`
	// BlockReference names the model of fused nodes whose blocks a
	// block-by-block comparison took as the reference ("" when the
	// comparison was of the graph outputs only); BlockBound is the bound of
	// each block, EndToEndBound that of the graph outputs.
	BlockReference string  `json:"block_reference,omitempty"`
	BlockBound     float64 `json:"block_bound,omitempty"`
	EndToEndBound  float64 `json:"end_to_end_bound,omitempty"`
	// Cases holds one entry per set of inputs.
	Cases []Case `json:"cases"`
}

// Case is one set of inputs run through both sides.
type Case struct {
	// Name is "tokens=N", "fixed_shapes" or the data set folder name.
	Name string `json:"name"`
	// Tokens is the sequence length used for random inputs (0 otherwise).
	Tokens int `json:"tokens,omitempty"`
	// Inputs describes the tensors fed.
	Inputs []TensorInfo `json:"inputs"`
	// Pass is true when every output passed and the output counts agree.
	Pass bool `json:"pass"`
	// Message says what failed (output count, the failing outputs).
	Message string `json:"message,omitempty"`
	// Outputs compares the outputs position by position.
	Outputs []OutputCheck `json:"outputs"`
	// Blocks compares each fused block with its lowering, in a
	// block-by-block comparison (Report.BlockReference).
	Blocks []BlockCheck `json:"blocks,omitempty"`
}

// TensorInfo describes a fed input.
type TensorInfo struct {
	// Name is the graph input fed.
	Name string `json:"name"`
	// DType is the ONNX element type name, e.g. "FLOAT".
	DType string `json:"dtype"`
	// Shape is the tensor's shape.
	Shape []int `json:"shape"`
}

// OutputCheck compares one output (by position) of the two sides.
type OutputCheck struct {
	// Index is the output's position.
	Index int `json:"index"`
	// NameA and NameB are the output's names on each side.
	NameA string `json:"name_a"`
	NameB string `json:"name_b"`
	// DTypeA and DTypeB are the element types on each side.
	DTypeA string `json:"dtype_a"`
	DTypeB string `json:"dtype_b"`
	// ShapeA and ShapeB are the shapes on each side.
	ShapeA []int `json:"shape_a"`
	ShapeB []int `json:"shape_b"`
	// Elements is the number of elements compared (0 when types or shapes differ).
	Elements int `json:"elements"`
	// Mismatches counts the elements failing the check.
	Mismatches int `json:"mismatches"`
	// NonFinite counts the elements NaN in both models, or the same
	// infinity: they pass, but say nothing of the computation.
	NonFinite int `json:"non_finite,omitempty"`
	// MaxAbsErr is the largest |a-b|.
	MaxAbsErr Float `json:"max_abs_err"`
	// MaxRelErr is the largest |a-b|/|b| over elements with b != 0.
	MaxRelErr Float `json:"max_rel_err"`
	// MaxAbsRef is the largest |b| (the reference's scale).
	MaxAbsRef Float `json:"max_abs_ref"`
	// RTol and ATol are the tolerances this output was checked with: the
	// report's, widened for float16/bfloat16 outputs unless Options.Exact.
	RTol float64 `json:"rtol"`
	ATol float64 `json:"atol"`
	// WorstIndex is the flat index of the element furthest past (or, when
	// all pass, closest to) its tolerance; -1 when nothing was compared.
	WorstIndex int `json:"worst_index"`
	// WorstMultiIndex is the same element as a multi-index.
	WorstMultiIndex []int `json:"worst_multi_index"`
	// WorstA and WorstB are that element's values.
	WorstA Float `json:"worst_a"`
	WorstB Float `json:"worst_b"`
	// RelL2 and MeanRel are the relative L2 error ‖a−b‖/‖b‖ and the mean
	// relative error Σ|a−b|/Σ|b|, and QuantBound the bound they were held
	// to, in a quantization-aware comparison (Options.QuantBound).
	RelL2      Float   `json:"rel_l2,omitempty"`
	MeanRel    Float   `json:"mean_rel,omitempty"`
	QuantBound float64 `json:"quant_bound,omitempty"`
	// NearTieTokens is how many tokens' rows a half-precision comparison
	// left out because their routing is a near tie in some fused block
	// (an engine rounding the router otherwise may pick another expert
	// there); the case's message names the blocks. 0: none left out.
	NearTieTokens int `json:"near_tie_tokens,omitempty"`
	// Pass is true when types and shapes agree and every element passed
	// (the quantization bound held, in a quantization-aware comparison).
	Pass bool `json:"pass"`
	// Message explains a failure.
	Message string `json:"message,omitempty"`
}

// Compare runs a and b on the same inputs and compares their outputs by
// position. Model b is the reference of the tolerance check. Evaluation
// errors (unsupported op, malformed model) are returned as errors; output
// mismatches, including differing output counts, shapes or types, are
// failures in the report.
func Compare(ctx context.Context, a, b *graph.Model, opt Options) (*Report, error) {
	if err := checkTol(opt); err != nil {
		return nil, err
	}
	for _, m := range []*graph.Model{a, b} {
		if err := moe.CheckBodies(m); err != nil {
			return nil, err
		}
	}
	r := newReport(opt)
	r.ModelA, r.ModelB, r.Reference = a.Name(), b.Name(), b.Name()
	halfMode(&opt, r, b, a)
	quantMode(a, b, &opt, r)
	sets, err := inputSets(a, opt, r)
	if err != nil {
		return nil, err
	}
	ref, low, blocks := blockMode(a, b, &opt, r)
	aIns, bIns := eval.GraphInputs(a), eval.GraphInputs(b)
	byName := slices.Equal(aIns, bIns)
	if !byName {
		r.Notes = append(r.Notes, fmt.Sprintf("inputs differ in names (a: %v, b: %v); b is fed by position", aIns, bIns))
	}
	runs := 0
	for _, s := range sets {
		c := Case{Name: s.name, Tokens: s.tokens, Inputs: infos(s.names, s.tensors)}
		feedA, err := eval.Feeds(a, s.tensors, s.names)
		if err != nil {
			return nil, err
		}
		bNames := s.names
		if !byName {
			bNames = nil
		}
		feedB, err := eval.Feeds(b, s.tensors, bNames)
		if err != nil {
			return nil, err
		}
		hint := ""
		if opt.DataDir == "" {
			hint = " (random inputs; a graph traced on other inputs may have their shapes or routing baked in: use a data dir)"
		}
		if blocks != nil {
			feedRef, feedLow := feedB, feedA
			if ref == a {
				feedRef, feedLow = feedA, feedB
			}
			if err := blockCase(ctx, &c, ref, low, feedRef, feedLow, blocks, ref == a, opt); err != nil {
				return nil, fmt.Errorf("case %s: %w%s", s.name, err, hint)
			}
			runs += 2
			opt.progress(runs, 2*len(sets))
			r.Cases = append(r.Cases, c)
			continue
		}
		outA, err := runOutputs(ctx, a, feedA, opt)
		if err != nil {
			return nil, fmt.Errorf("case %s: model a: %w%s", s.name, err, hint)
		}
		runs++
		opt.progress(runs, 2*len(sets))
		outB, err := runOutputs(ctx, b, feedB, opt)
		if err != nil {
			return nil, fmt.Errorf("case %s: model b: %w%s", s.name, err, hint)
		}
		runs++
		opt.progress(runs, 2*len(sets))
		compareCase(&c, outA, outB, opt)
		if fused, feeds := fusedOf(a, b, feedA, feedB); fused != nil {
			excuseNearTies(ctx, &c, fused, feeds, outA, outB, opt)
		}
		r.Cases = append(r.Cases, c)
	}
	r.finish()
	return r, nil
}

// RunAndCheck runs m on every test data set under dataDir (a folder of
// input_N.pb/output_N.pb files, or one holding test_data_set_* folders) and
// compares its outputs with the stored output_N.pb, which are the
// reference. Options.Tokens, Seed and DataDir are ignored.
func RunAndCheck(ctx context.Context, m *graph.Model, dataDir string, opt Options) (*Report, error) {
	if err := checkTol(opt); err != nil {
		return nil, err
	}
	if err := moe.CheckBodies(m); err != nil {
		return nil, err
	}
	r := newReport(opt)
	r.ModelA, r.Reference, r.Inputs = m.Name(), dataDir, "data"
	halfMode(&opt, r, m)
	if opt.QuantBound < 0 {
		opt.QuantBound = 0 // element-wise, as asked
	}
	dirs, err := dataSetDirs(dataDir)
	if err != nil {
		return nil, err
	}
	for i, d := range dirs {
		ds, err := eval.ReadDataSet(d)
		if err != nil {
			return nil, err
		}
		if len(ds.Outputs) == 0 {
			return nil, &graph.InputError{File: d, Msg: "no output_N.pb files to check against"}
		}
		feeds, err := eval.Feeds(m, ds.Inputs, ds.InputNames)
		if err != nil {
			return nil, err
		}
		out, err := runOutputs(ctx, m, feeds, opt)
		if err != nil {
			return nil, fmt.Errorf("data set %s: %w", filepath.Base(d), err)
		}
		opt.progress(i+1, len(dirs))
		ref := make([]named, len(ds.Outputs))
		for i, t := range ds.Outputs {
			n := ds.OutputNames[i]
			if n == "" {
				n = fmt.Sprintf("output_%d.pb", i)
			}
			ref[i] = named{n, t}
		}
		c := Case{Name: filepath.Base(d), Inputs: infos(ds.InputNames, ds.Inputs)}
		compareCase(&c, out, ref, opt)
		excuseNearTies(ctx, &c, m, feeds, out, ref, opt)
		r.Cases = append(r.Cases, c)
	}
	r.finish()
	return r, nil
}

func checkTol(opt Options) error {
	if opt.RTol < 0 || opt.ATol < 0 || math.IsNaN(opt.RTol) || math.IsNaN(opt.ATol) {
		return fmt.Errorf("verify: tolerances must be >= 0 (rtol %g, atol %g)", opt.RTol, opt.ATol)
	}
	return nil
}

func newReport(opt Options) *Report {
	engine := opt.Engine
	if engine == "" {
		engine = "ref"
	}
	return &Report{SchemaVersion: SchemaVersion, Engine: engine, Seed: opt.Seed, RTol: opt.RTol, ATol: opt.ATol, Inputs: "random", Cases: []Case{}}
}

func (r *Report) finish() {
	r.Pass = len(r.Cases) > 0
	for _, c := range r.Cases {
		if !c.Pass {
			r.Pass = false
		}
	}
}

// named is an output value with its name.
type named struct {
	name string
	t    *eval.Tensor
}

// runOutputs evaluates m and returns its graph outputs in order.
func runOutputs(ctx context.Context, m *graph.Model, feeds map[string]*eval.Tensor, opt Options) ([]named, error) {
	var res map[string]*eval.Tensor
	var err error
	if opt.Runner != nil {
		res, err = opt.Runner(ctx, m, feeds)
	} else {
		eo := opt.Eval
		eo.Capture, eo.KeepAll = nil, false
		res, err = eval.Run(ctx, m, feeds, eo)
	}
	if err != nil {
		return nil, err
	}
	var out []named
	for _, v := range m.Proto.GetGraph().GetOutput() {
		out = append(out, named{v.GetName(), res[v.GetName()]})
	}
	return out, nil
}

// compareCase fills c's outputs by comparing a (candidate) with b (reference).
func compareCase(c *Case, a, b []named, opt Options) {
	c.Pass = true
	c.Outputs = []OutputCheck{}
	if len(a) != len(b) {
		c.Pass = false
		c.Message = fmt.Sprintf("output count differs: a has %d (%s), b has %d (%s)", len(a), namesOf(a), len(b), namesOf(b))
	}
	for i := 0; i < min(len(a), len(b)); i++ {
		oc := compareOutput(i, a[i], b[i], opt)
		if !oc.Pass {
			c.Pass = false
		}
		c.Outputs = append(c.Outputs, oc)
	}
	if c.Message == "" && !c.Pass {
		var bad []string
		for _, o := range c.Outputs {
			if !o.Pass {
				bad = append(bad, fmt.Sprintf("%q", o.NameA))
			}
		}
		c.Message = "outputs differ: " + strings.Join(bad, ", ")
	}
}

func namesOf(v []named) string {
	var s []string
	for _, n := range v {
		s = append(s, n.name)
	}
	return strings.Join(s, ", ")
}

func compareOutput(i int, a, b named, opt Options) OutputCheck {
	oc := OutputCheck{Index: i, NameA: a.name, NameB: b.name, WorstIndex: -1}
	if a.t == nil || b.t == nil {
		oc.Message = "output was not produced"
		return oc
	}
	oc.DTypeA, oc.DTypeB = a.t.DType.String(), b.t.DType.String()
	oc.ShapeA, oc.ShapeB = append([]int{}, a.t.Shape...), append([]int{}, b.t.Shape...)
	if a.t.DType != b.t.DType {
		oc.Message = fmt.Sprintf("type differs: a is %s, b is %s", oc.DTypeA, oc.DTypeB)
		return oc
	}
	if !slices.Equal(a.t.Shape, b.t.Shape) {
		oc.Message = fmt.Sprintf("shape differs: a is %v, b is %v", a.t.Shape, b.t.Shape)
		return oc
	}
	if opt.QuantBound > 0 && isFloat(b.t.DType) {
		compareQuant(&oc, a.t, b.t, opt.QuantBound)
		return oc
	}
	peak := 0.0
	if b.t.Str == nil {
		for j := 0; j < b.t.Len(); j++ {
			if v := math.Abs(b.t.Float64At(j)); v > peak {
				peak = v
			}
		}
	}
	rtol, atol := opt.RTol, opt.ATol
	if !opt.Exact {
		// A half-precision output carries 11 (float16) or 8 (bfloat16)
		// significant bits: a graph that computes in float32 where the
		// other rounds every step differs by that much, relative to the
		// output's magnitude.
		dt := b.t.DType
		if opt.halfCompute != pb.TensorProto_UNDEFINED && isFloat(dt) {
			dt = opt.halfCompute
		}
		if rel, ok := eval.HalfTolerance(dt); ok {
			rtol, atol = max(rtol, rel), max(atol, rel*peak)
		}
	}
	oc.RTol, oc.ATol = rtol, atol
	d, err := eval.Compare(a.t, b.t, rtol, atol)
	if err != nil {
		oc.Message = err.Error()
		return oc
	}
	oc.Elements = b.t.Len()
	oc.Mismatches, oc.NonFinite = d.Mismatches, d.NonFinite
	oc.MaxAbsErr, oc.MaxRelErr = Float(d.MaxAbs), Float(d.MaxRel)
	oc.MaxAbsRef = Float(peak)
	if d.Worst >= 0 {
		oc.WorstIndex = d.Worst
		oc.WorstMultiIndex = eval.Unravel(d.Worst, b.t.Shape)
		if b.t.Str == nil {
			oc.WorstA, oc.WorstB = Float(a.t.Float64At(d.Worst)), Float(b.t.Float64At(d.Worst))
		}
	}
	oc.Pass = d.OK()
	if !oc.Pass {
		oc.Message = fmt.Sprintf("%d of %d elements exceed atol %g + rtol %g*|b|; worst at %v: a=%g b=%g",
			d.Mismatches, oc.Elements, atol, rtol, oc.WorstMultiIndex, float64(oc.WorstA), float64(oc.WorstB))
	}
	return oc
}

func infos(names []string, ts []*eval.Tensor) []TensorInfo {
	out := make([]TensorInfo, len(ts))
	for i, t := range ts {
		n := ""
		if i < len(names) {
			n = names[i]
		}
		out[i] = TensorInfo{Name: n, DType: t.DType.String(), Shape: append([]int{}, t.Shape...)}
	}
	return out
}

// inputSet is one case's inputs.
type inputSet struct {
	name    string
	tokens  int
	names   []string
	tensors []*eval.Tensor
}

// inputSets builds the cases: from DataDir, or random per token count.
func inputSets(a *graph.Model, opt Options, r *Report) ([]inputSet, error) {
	if opt.DataDir != "" {
		r.Inputs = "data"
		r.Notes = append(r.Notes, "inputs from "+opt.DataDir+"; stored outputs, if any, are not used (see RunAndCheck)")
		if len(opt.Tokens) > 0 {
			r.Notes = append(r.Notes, "token counts ignored: inputs come from the data dir")
		}
		dirs, err := dataSetDirs(opt.DataDir)
		if err != nil {
			return nil, err
		}
		var sets []inputSet
		for _, d := range dirs {
			ds, err := eval.ReadDataSet(d)
			if err != nil {
				return nil, err
			}
			if len(ds.Inputs) == 0 {
				return nil, &graph.InputError{File: d, Msg: "no input_N.pb files"}
			}
			names, err := feedNames(a, ds.InputNames, len(ds.Inputs))
			if err != nil {
				return nil, err
			}
			sets = append(sets, inputSet{name: filepath.Base(d), names: names, tensors: ds.Inputs})
		}
		return sets, nil
	}
	specs, err := inputSpecs(a)
	if err != nil {
		return nil, err
	}
	names := make([]string, len(specs))
	dynamic := false
	for i, s := range specs {
		names[i] = s.Name
		if s.dynamic() {
			dynamic = true
		}
	}
	tokens := dedupe(opt.Tokens)
	if len(tokens) == 0 {
		tokens = []int{DefaultTokens}
	}
	for _, t := range tokens {
		if t <= 0 {
			return nil, fmt.Errorf("verify: token count %d must be positive", t)
		}
	}
	if !dynamic {
		var shapes []string
		for i, s := range specs {
			shapes = append(shapes, fmt.Sprintf("%s %v", s.Name, resolveDims(specs, 0)[i]))
		}
		note := "every input has fixed dims (" + strings.Join(shapes, ", ") + "); the model's fixed shapes are used"
		if len(opt.Tokens) > 0 {
			note += fmt.Sprintf(" and the token counts %v are ignored", opt.Tokens)
		}
		r.Notes = append(r.Notes, note)
		tensors, notes, err := randomInputs(a, specs, 0, opt.Seed, opt.Eval.MemLimit)
		if err != nil {
			return nil, err
		}
		r.Notes = append(r.Notes, notes...)
		return []inputSet{{name: "fixed_shapes", names: names, tensors: tensors}}, nil
	}
	r.Notes = append(r.Notes, "symbolic dims: batch = 1, sequence = token count (rule: named dims agree across inputs; a name with \"batch\" is 1, with \"seq\"/\"token\"/\"len\" is the token count; otherwise the leading dim of a rank>=2 input is 1 and other symbolic dims are the token count)")
	var sets []inputSet
	for _, t := range tokens {
		tensors, notes, err := randomInputs(a, specs, t, opt.Seed, opt.Eval.MemLimit)
		if err != nil {
			return nil, err
		}
		if t == tokens[0] {
			r.Notes = append(r.Notes, notes...)
		}
		sets = append(sets, inputSet{name: fmt.Sprintf("tokens=%d", t), tokens: t, names: names, tensors: tensors})
	}
	return sets, nil
}

// feedNames resolves which graph inputs of m n data-set tensors feed: their
// stored names when all of them name graph inputs, else the fed graph inputs
// in order.
func feedNames(m *graph.Model, stored []string, n int) ([]string, error) {
	all := map[string]bool{}
	for _, v := range m.Proto.GetGraph().GetInput() {
		all[v.GetName()] = true
	}
	ok := len(stored) == n
	for _, s := range stored {
		if !all[s] {
			ok = false
		}
	}
	if ok {
		return stored, nil
	}
	ins := eval.GraphInputs(m)
	if n > len(ins) {
		return nil, &graph.InputError{File: m.Name(), Msg: fmt.Sprintf("%d input tensors for a model with %d inputs", n, len(ins))}
	}
	return ins[:n], nil
}

func dedupe(v []int) []int {
	seen := map[int]bool{}
	var out []int
	for _, x := range v {
		if !seen[x] {
			seen[x] = true
			out = append(out, x)
		}
	}
	return out
}

// DataSets reads the ONNX test data sets under dir (a folder of input_N.pb
// and output_N.pb files, or one holding test_data_set_* folders), in order.
func DataSets(dir string) ([]*eval.DataSet, error) {
	dirs, err := dataSetDirs(dir)
	if err != nil {
		return nil, err
	}
	var out []*eval.DataSet
	for _, d := range dirs {
		ds, err := eval.ReadDataSet(d)
		if err != nil {
			return nil, err
		}
		out = append(out, ds)
	}
	return out, nil
}

// dataSetDirs resolves a data dir: itself when it holds input_N.pb or
// output_N.pb files, else its test_data_set_* folders in numeric order.
func dataSetDirs(dir string) ([]string, error) {
	st, err := os.Stat(dir)
	if err != nil {
		return nil, &graph.InputError{File: dir, Msg: "cannot read data dir", Err: err}
	}
	if !st.IsDir() {
		return nil, &graph.InputError{File: dir, Msg: "data dir is not a folder"}
	}
	own, _ := filepath.Glob(filepath.Join(dir, "input_*.pb"))
	outs, _ := filepath.Glob(filepath.Join(dir, "output_*.pb"))
	if len(own) > 0 || len(outs) > 0 {
		return []string{dir}, nil
	}
	sets, _ := filepath.Glob(filepath.Join(dir, "test_data_set_*"))
	var dirs []string
	for _, s := range sets {
		if fi, err := os.Stat(s); err == nil && fi.IsDir() {
			dirs = append(dirs, s)
		}
	}
	if len(dirs) == 0 {
		return nil, &graph.InputError{File: dir, Msg: "holds neither input_N.pb files nor test_data_set_* folders"}
	}
	num := func(p string) int {
		n, err := strconv.Atoi(strings.TrimPrefix(filepath.Base(p), "test_data_set_"))
		if err != nil {
			return math.MaxInt
		}
		return n
	}
	sort.SliceStable(dirs, func(i, j int) bool {
		if num(dirs[i]) != num(dirs[j]) {
			return num(dirs[i]) < num(dirs[j])
		}
		return dirs[i] < dirs[j]
	})
	return dirs, nil
}

// Summary renders the report as a few human-readable lines.
func (r *Report) Summary() string {
	var b strings.Builder
	verdict := "PASS"
	if !r.Pass {
		verdict = "FAIL"
	}
	against := r.ModelB
	if against == "" {
		against = r.Reference
	}
	fmt.Fprintf(&b, "%s: %s vs %s (%s inputs, engine %s, rtol %g, atol %g)\n", verdict, r.ModelA, against, r.Inputs, r.Engine, r.RTol, r.ATol)
	for _, n := range r.Notes {
		fmt.Fprintf(&b, "  note: %s\n", n)
	}
	for _, c := range r.Cases {
		st := "ok"
		if !c.Pass {
			st = "FAIL"
		}
		fmt.Fprintf(&b, "  case %s: %s", c.Name, st)
		if c.Message != "" {
			fmt.Fprintf(&b, " (%s)", c.Message)
		}
		b.WriteString("\n")
		for _, o := range c.Outputs {
			fmt.Fprintf(&b, "    output %d %q %v: max abs err %.3g, max rel err %.3g, max |ref| %.3g", o.Index, o.NameA, o.ShapeA, float64(o.MaxAbsErr), float64(o.MaxRelErr), float64(o.MaxAbsRef))
			if !o.Pass {
				fmt.Fprintf(&b, " FAIL: %s", o.Message)
			}
			b.WriteString("\n")
		}
	}
	return b.String()
}

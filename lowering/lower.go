package lowering

import (
	"encoding/json"
	"errors"
	"fmt"
	"sort"
	"strings"

	"github.com/mokopt/mokopt/graph"
	pb "github.com/mokopt/mokopt/graph/onnxpb"
	"github.com/mokopt/mokopt/kernel"
	"github.com/mokopt/mokopt/kernel/perf"
	"github.com/mokopt/mokopt/moe"
	"google.golang.org/protobuf/proto"
)

// ErrRefused is wrapped by the error Lower returns when Options.Strict is set
// and some block violates a rule; the model is then left unchanged.
var ErrRefused = errors.New("the MoK kernel contract refuses the model")

// ErrNoFusedNode is returned for a model without ai.mok::MoE nodes.
var ErrNoFusedNode = errors.New("no ai.mok::MoE node to lower (run mokopt rewrite first)")

// MetadataKey prefixes the metadata_props key under which each kernel node's
// lowering record (JSON) is stored: MetadataKey + kernel node name.
const MetadataKey = "ai.mok.lowered/"

// DefaultPlanTokensPerRank is the tokens per rank a plan assumes when the
// lowering is not told (the vendor's benchmark setting).
const DefaultPlanTokensPerRank = 2048

// Options control Lower.
type Options struct {
	// Target is the machine (kernel.LookupTarget).
	Target kernel.Target
	// EP is the expert-parallel group size.
	EP int
	// TokensPerRank is T, the static number of tokens per rank; 0 when not
	// known (the T rules are then not checked).
	TokensPerRank int
	// Strict refuses the whole model (ErrRefused, nothing edited) when any
	// block violates an error-severity rule, instead of keeping such blocks
	// unlowered or their shared expert outside the kernel. Warnings (e.g. the
	// minibatch rule of thumb) never refuse.
	Strict bool
	// RequireAll refuses the whole model (ErrRefused, nothing edited) when
	// some fused node cannot be lowered at all, instead of keeping it as
	// ai.mok::MoE with a warning. A block whose shared expert stays outside
	// the kernel is lowered.
	RequireAll bool
	// Knobs are the kernel knobs written on each node; nil means
	// kernel.DefaultKnobs().
	Knobs *kernel.Knobs
	// Workers is the number of goroutines quantizing each expert slab when
	// the model is saved; 0 means GOMAXPROCS. The bytes never depend on it.
	Workers int
	// PlanTokensPerRank is the T the plan's workspace and performance figures
	// assume when TokensPerRank is 0; 0 means DefaultPlanTokensPerRank.
	PlanTokensPerRank int
	// PerfParams are kernel/perf's efficiency assumptions; nil means
	// perf.DefaultParams().
	PerfParams *perf.Params
}

// Block is what happened to one fused node.
type Block struct {
	// Node is the fused ai.mok::MoE node's name.
	Node string `json:"node"`
	// Spec is the node's decoded spec (nil if it could not be decoded).
	Spec *moe.Spec `json:"spec,omitempty"`
	// Lowered is true when the node was replaced.
	Lowered bool `json:"lowered"`
	// KernelNode names the MoKDispatchFFNCombine node that replaced it.
	KernelNode string `json:"kernel_node,omitempty"`
	// SharedExpert is SharedInKernel, SharedOutside or SharedNone.
	SharedExpert string `json:"shared_expert,omitempty"`
	// TopKExperts and RouterWeights name the router's output values.
	TopKExperts   string `json:"topk_experts,omitempty"`
	RouterWeights string `json:"router_weights,omitempty"`
	// Violations lists every failed rule, errors and warnings.
	Violations []Violation `json:"violations"`
	// Reason says why the block was not lowered, or what was kept outside.
	Reason string `json:"reason,omitempty"`
}

// Report is the result of Lower.
type Report struct {
	// SchemaVersion is 1.
	SchemaVersion int `json:"schema_version"`
	// Target, EP, TokensPerRank and Strict echo the options.
	Target        string `json:"target"`
	EP            int    `json:"ep"`
	TokensPerRank int    `json:"tokens_per_rank"`
	Strict        bool   `json:"strict"`
	// Blocks has one entry per fused node, in graph order.
	Blocks []Block `json:"blocks"`
	// Notes are model-level remarks (e.g. an opset raised).
	Notes []string `json:"notes,omitempty"`
	// Plan is the launch plan.
	Plan *Plan `json:"plan"`
}

// Lowered returns how many blocks were lowered.
func (r *Report) Lowered() int {
	n := 0
	for _, b := range r.Blocks {
		if b.Lowered {
			n++
		}
	}
	return n
}

// Warnings lists, one line each, what a user should know: blocks kept
// unlowered (naming the constraints), shared experts kept outside, and
// warning-severity violations.
func (r *Report) Warnings() []string {
	var out []string
	for _, b := range r.Blocks {
		if b.Reason != "" {
			out = append(out, b.Node+": "+b.Reason)
		}
		for _, v := range b.Violations {
			if v.Severity == kernel.SeverityWarning {
				out = append(out, b.Node+": "+v.String())
			}
		}
	}
	return out
}

// Lower lowers every ai.mok::MoE node of m that the MoK kernel can take (see
// the package documentation), editing m in place, and returns the report
// with the launch plan. The weights of the kernel nodes are computed when m
// is saved. With Options.Strict, any error-severity violation returns an
// error wrapping ErrRefused and leaves m unchanged.
func Lower(m *graph.Model, opt Options) (*Report, error) {
	knobs := kernel.DefaultKnobs()
	if opt.Knobs != nil {
		knobs = *opt.Knobs
	}
	if opt.PlanTokensPerRank <= 0 {
		opt.PlanTokensPerRank = DefaultPlanTokensPerRank
	}
	params := perf.DefaultParams()
	if opt.PerfParams != nil {
		params = *opt.PerfParams
	}
	rep := &Report{SchemaVersion: 1, Target: opt.Target.Name, EP: opt.EP, TokensPerRank: opt.TokensPerRank, Strict: opt.Strict}
	g := m.Graph()
	fused, err := fusedNodes(g)
	if err != nil {
		return rep, err
	}
	if err := moe.CheckBodies(m); err != nil {
		return rep, err
	}
	opset := m.Opset("")
	if opset < 13 {
		return rep, fmt.Errorf("model imports default-domain opset %d; lowering needs >= 13", opset)
	}

	type job struct {
		n       *pb.NodeProto
		blk     int
		outside bool
	}
	var jobs []job
	var refusals []string
	for i, n := range fused {
		blk := Block{Node: n.GetName(), Violations: []Violation{}}
		if blk.Node == "" {
			blk.Node = fmt.Sprintf("MoE_%d", i)
		}
		s, err := moe.SpecFromNode(n, nodeDims(g, n))
		if err != nil {
			blk.Violations = append(blk.Violations, newViolation(CodeBadSpec, "%v", err))
		} else {
			s.SharedGated = len(n.Input) > moe.InSharedGateW && n.Input[moe.InSharedGateW] != ""
			blk.Spec = s
			blk.Violations = append(blk.Violations, checkBlock(s, &opt, knobs)...)
			blk.Violations = append(blk.Violations, constantWeights(g, n, s)...)
		}
		ok, outside, blocking := decide(blk.Violations)
		switch {
		case !ok:
			var parts []string
			for _, v := range blocking {
				parts = append(parts, fmt.Sprintf("#%d %s (%s)", v.Number, v.Code, v.Message))
			}
			blk.Reason = "kept unlowered: the MoK kernel cannot take this block: " + strings.Join(parts, "; ")
		case outside:
			blk.Reason = "shared expert kept outside the kernel as standard ONNX ops: " + sharedReason(blk.Violations)
		}
		for _, v := range blk.Violations {
			if v.Severity == kernel.SeverityError {
				refusals = append(refusals, blk.Node+": "+v.String())
			}
		}
		rep.Blocks = append(rep.Blocks, blk)
		if ok {
			jobs = append(jobs, job{n: n, blk: len(rep.Blocks) - 1, outside: outside})
		}
	}
	if opt.Strict && len(refusals) > 0 {
		return rep, fmt.Errorf("%w (Strict option, mokopt lower --strict): %s", ErrRefused, strings.Join(refusals, "; "))
	}
	if opt.RequireAll && len(jobs) < len(rep.Blocks) {
		taken := map[int]bool{}
		for _, j := range jobs {
			taken[j.blk] = true
		}
		var why []string
		for i, b := range rep.Blocks {
			if !taken[i] {
				why = append(why, b.Node+": "+b.Reason)
			}
		}
		return rep, fmt.Errorf("%w: %d of %d fused node(s) cannot be lowered (the Partial option, mokopt lower --partial, keeps them as ai.mok::MoE): %s",
			ErrRefused, len(rep.Blocks)-len(jobs), len(rep.Blocks), strings.Join(why, "; "))
	}

	if len(jobs) > 0 {
		bodyOpset := max(opset, fp8Opset)
		candidates := map[string]bool{}
		overloads := map[string]bool{}
		drop := map[*pb.NodeProto]bool{}
		for _, j := range jobs {
			drop[j.n] = true
			for _, in := range j.n.Input {
				if in != "" {
					candidates[in] = true
				}
			}
		}
		var added []*pb.NodeProto
		for _, j := range jobs {
			blk := &rep.Blocks[j.blk]
			nodes, ov, err := emit(m, g, j.n, blk, j.outside, &opt, knobs, opset)
			if err != nil {
				return rep, fmt.Errorf("lowering %s: %w", blk.Node, err)
			}
			added = append(added, nodes...)
			overloads[ov] = true
			blk.Lowered = true
		}
		g.RemoveNodes(drop)
		for _, n := range added {
			g.AddNode(n)
		}
		removeOrphans(g, candidates)
		pruneFunctions(m)
		for _, ov := range sortedKeys(overloads) {
			m.Proto.Functions = append(m.Proto.Functions, kernelFunction(ov == overloadSwiGLUClamped, bodyOpset))
		}
		if opset < fp8Opset {
			raiseOpset(m, opset, fp8Opset)
			rep.Notes = append(rep.Notes, fmt.Sprintf("default-domain opset raised from %d to %d (Cast from float8e4m3fn); "+
				"every op of opset %d keeps its meaning at %d, and the ai.mok functions import %d too", opset, fp8Opset, opset, fp8Opset, fp8Opset))
		}
		m.SetOpset(Domain, Version)
		if m.Proto.GetIrVersion() < 10 {
			m.Proto.IrVersion = proto.Int64(10) // float8 types need 9, function overloads 10
		}
		if err := g.Sort(); err != nil {
			return rep, err
		}
		for _, j := range jobs {
			blk := rep.Blocks[j.blk]
			rec := map[string]any{"fused_node": blk.Node, "spec": blk.Spec, "target": opt.Target.Name, "ep": opt.EP,
				"shared_expert": blk.SharedExpert, "violations": blk.Violations}
			js, _ := json.Marshal(rec)
			m.SetMetadata(MetadataKey+blk.KernelNode, string(js))
		}
	}
	plan, err := buildPlan(rep, &opt, knobs, params)
	if err != nil {
		return rep, err
	}
	rep.Plan = plan
	return rep, nil
}

// constantWeights reports expert weights that are not initializers.
func constantWeights(g *graph.Graph, n *pb.NodeProto, s *moe.Spec) []Violation {
	var vs []Violation
	for _, pos := range []int{moe.InGate, moe.InUp, moe.InDown, moe.InSharedGate, moe.InSharedUp, moe.InSharedDown} {
		if pos < len(n.Input) && n.Input[pos] != "" && g.Initializer(n.Input[pos]) == nil {
			vs = append(vs, newViolation(CodeWeightsNotConstant, "%s (%q) is computed or fed at run time, not an initializer", moe.InputNames[pos], n.Input[pos]))
		}
	}
	if s.Activation != moe.GELU && (moe.InGate >= len(n.Input) || n.Input[moe.InGate] == "") {
		vs = append(vs, newViolation(CodeBadSpec, "the fused node has no gate weight"))
	}
	return vs
}

func sharedReason(vs []Violation) string {
	var parts []string
	for _, v := range vs {
		if splittable[v.Code] {
			parts = append(parts, fmt.Sprintf("#%d %s (%s)", v.Number, v.Code, v.Message))
		}
	}
	return strings.Join(parts, "; ")
}

// emit builds the nodes and initializers that replace fused node n and
// returns the nodes (not yet added) and the kernel function overload.
func emit(m *graph.Model, g *graph.Graph, n *pb.NodeProto, blk *Block, outside bool, opt *Options, knobs kernel.Knobs, opset int64) ([]*pb.NodeProto, string, error) {
	s := blk.Spec
	prefix := g.UniqueName(blk.Node + "/mok")
	d, err := decompose(s, opset)
	if err != nil {
		return nil, "", err
	}
	actual := actualInputs(n)
	blk.TopKExperts, blk.RouterWeights = prefix+"/topk_experts", prefix+"/router_weights"
	outs := []string{d.ids, d.weights}
	if outside {
		outs = append(outs, d.shared)
	}
	rename := map[string]string{d.ids: blk.TopKExperts, d.weights: blk.RouterWeights}
	if s.RouterLogits { // the optional router_logits output: the router Gemm's, beside the kernel
		outs = append(outs, d.logits)
		rename[d.logits] = n.Output[moe.OutRouterLogits]
	}
	nodes, err := d.extract(actual, prefix, rename, outs...)
	if err != nil {
		return nil, "", err
	}
	x2 := prefix + "/" + d.x2

	E, H, I, Is := s.NumExperts, s.Hidden, s.Inter, s.SharedInter
	init := func(pos int) *pb.TensorProto { return g.Initializer(actual[pos]) }
	gateSrc, err := newSource(m, init(moe.InGate), E, I, H)
	if err != nil {
		return nil, "", err
	}
	upSrc, err := newSource(m, init(moe.InUp), E, I, H)
	if err != nil {
		return nil, "", err
	}
	downSrc, err := newSource(m, init(moe.InDown), E, H, I)
	if err != nil {
		return nil, "", err
	}
	kin := make([]string, NumInputs)
	kin[InX] = prefix + "/x_bf16"
	kin[InTopKExperts], kin[InRouterWeights] = blk.TopKExperts, blk.RouterWeights
	for _, w := range []struct {
		pos, scale int
		src        source
	}{{InGate, InGateScale, gateSrc}, {InUp, InUpScale, upSrc}, {InDown, InDownScale, downSrc}} {
		kin[w.pos] = g.UniqueName(prefix + "/" + InputNames[w.pos])
		kin[w.scale] = g.UniqueName(prefix + "/" + InputNames[w.scale])
		deferMXFP8(m, g, kin[w.pos], w.src, partData, opt.Workers)
		deferMXFP8(m, g, kin[w.scale], w.src, partScales, opt.Workers)
	}
	for _, p := range []int{InSharedGate, InSharedUp, InSharedDown} {
		kin[p] = g.UniqueName(prefix + "/" + InputNames[p])
	}
	switch {
	case Is > 0 && !outside:
		blk.SharedExpert = SharedInKernel
		for _, w := range []struct {
			pos, src int
			dims     []int
		}{{InSharedGate, moe.InSharedGate, []int{I, H}}, {InSharedUp, moe.InSharedUp, []int{I, H}}, {InSharedDown, moe.InSharedDown, []int{H, I}}} {
			src, err := newSource(m, init(w.src), w.dims...)
			if err != nil {
				return nil, "", err
			}
			deferBF16(m, g, kin[w.pos], src)
		}
	default:
		blk.SharedExpert = SharedNone
		if outside {
			blk.SharedExpert = SharedOutside
		}
		deferZeroBF16(m, g, kin[InSharedGate], int64(I), int64(H))
		deferZeroBF16(m, g, kin[InSharedUp], int64(I), int64(H))
		deferZeroBF16(m, g, kin[InSharedDown], int64(H), int64(I))
	}

	nodes = append(nodes, graph.NewNode("Cast", "", prefix+"/Cast_x_bf16", []string{x2}, []string{kin[InX]}, graph.IntAttr("to", int64(pb.TensorProto_BFLOAT16))))
	clamped := s.Activation == moe.SwiGLUClamped && s.SwiGLULimit > 0
	overload := overloadSwiGLU
	if clamped {
		overload = overloadSwiGLUClamped
	}
	blk.KernelNode = g.UniqueName(prefix + "/" + OpType)
	kn := graph.NewNode(OpType, Domain, blk.KernelNode, kin, []string{prefix + "/y_bf16"}, kernelAttrs(s, opt, knobs, blk.SharedExpert, clamped)...)
	kn.Overload = proto.String(overload)
	nodes = append(nodes, kn)
	y := prefix + "/y"
	nodes = append(nodes, graph.NewNode("Cast", "", prefix+"/Cast_y", []string{prefix + "/y_bf16"}, []string{y}, graph.IntAttr("to", int64(pb.TensorProto_FLOAT))))
	if outside {
		sum := prefix + "/y_plus_shared"
		nodes = append(nodes, graph.NewNode("Add", "", prefix+"/Add_shared", []string{y, prefix + "/" + d.shared}, []string{sum}))
		y = sum
	}
	if s.IOType != "" {
		// Half-precision I/O: the router ran on the input cast to float32
		// (the body's first Cast); the output goes back to the I/O type.
		yio := prefix + "/y_" + s.IOType
		nodes = append(nodes, graph.NewNode("Cast", "", prefix+"/Cast_y_"+s.IOType, []string{y}, []string{yio}, graph.IntAttr("to", int64(s.IOElemType()))))
		y = yio
	}
	shape := prefix + "/input_shape"
	nodes = append(nodes,
		graph.NewNode("Shape", "", prefix+"/Shape_input", []string{actual[moe.InHidden]}, []string{shape}),
		graph.NewNode("Reshape", "", prefix+"/Reshape_output", []string{y, shape}, []string{n.Output[0]}))
	return nodes, overload, nil
}

// kernelAttrs returns the kernel node's attributes, sorted by name.
func kernelAttrs(s *moe.Spec, opt *Options, knobs kernel.Knobs, shared string, clamped bool) []*pb.AttributeProto {
	act, limit := overloadSwiGLU, float32(0)
	if clamped {
		act, limit = overloadSwiGLUClamped, s.SwiGLULimit
	}
	attrs := []*pb.AttributeProto{
		graph.StringAttr(AttrRoutedPrecision, string(kernel.MXFP8)),
		graph.StringAttr(AttrSharedPrecision, string(kernel.BF16)),
		graph.IntAttr(AttrFwdNumCommSMs, int64(knobs.FwdNumCommSMs)),
		graph.IntAttr(AttrBwdNumCommSMs, int64(knobs.BwdNumCommSMs)),
		graph.IntAttr(AttrMinibatchSize, int64(knobs.MinibatchSize)),
		graph.IntAttr(AttrMacrobatchSize, int64(knobs.MacrobatchSize)),
		graph.FloatAttr(AttrCapacityMult, float32(knobs.ScheduleCapacityMultiplier)),
		graph.IntAttr(AttrAllGatherChunk, int64(knobs.AllGatherTopExpertsChunkBytes)),
		graph.IntAttr(AttrEPSize, int64(opt.EP)),
		graph.IntAttr(AttrExpertsPerRank, int64(s.NumExperts/opt.EP)),
		graph.IntAttr(AttrExpertOffset, int64(s.ExpertOffset)),
		graph.StringAttr(AttrTarget, opt.Target.Name),
		graph.IntAttr(AttrNumExperts, int64(s.NumExperts)),
		graph.IntAttr(AttrTopK, int64(s.TopK)),
		graph.StringAttr(AttrActivation, act),
		graph.FloatAttr(AttrSwiGLULimit, limit),
		graph.StringAttr(AttrSharedExpert, shared),
		graph.IntAttr(AttrTokensPerRank, int64(opt.TokensPerRank)),
		graph.IntAttr(AttrEmulateActQuant, 1),
	}
	sort.Slice(attrs, func(i, j int) bool { return attrs[i].GetName() < attrs[j].GetName() })
	return attrs
}

// removeOrphans deletes the initializers among names that nothing reads any
// more (and graph inputs of the same name that only gave them a default).
func removeOrphans(g *graph.Graph, names map[string]bool) {
	gone := map[string]bool{}
	for name := range names {
		if g.Initializer(name) != nil && len(g.Consumers(name)) == 0 && !g.IsOutput(name) {
			gone[name] = true
		}
	}
	if len(gone) == 0 {
		return
	}
	kept := g.P.Initializer[:0]
	for _, t := range g.P.Initializer {
		if !gone[t.GetName()] {
			kept = append(kept, t)
		}
	}
	g.P.Initializer = kept
	ins := g.P.Input[:0]
	for _, v := range g.P.Input {
		if !gone[v.GetName()] {
			ins = append(ins, v)
		}
	}
	g.P.Input = ins
	g.Reindex()
}

// pruneFunctions drops the ai.mok::MoE functions whose overload no node
// uses any more.
func pruneFunctions(m *graph.Model) {
	used := map[string]bool{}
	for _, n := range m.Proto.GetGraph().GetNode() {
		if n.GetDomain() == moe.Domain && n.GetOpType() == moe.OpType {
			used[n.GetOverload()] = true
		}
	}
	kept := m.Proto.Functions[:0]
	for _, f := range m.Proto.Functions {
		if f.GetDomain() == moe.Domain && f.GetName() == moe.OpType && !used[f.GetOverload()] {
			continue
		}
		kept = append(kept, f)
	}
	m.Proto.Functions = kept
}

// raiseOpset sets the model's default-domain opset to to, and that of every
// ai.mok function that imported from, so that model and functions agree.
func raiseOpset(m *graph.Model, from, to int64) {
	m.SetOpset("", to)
	for _, f := range m.Proto.Functions {
		if f.GetDomain() != Domain {
			continue
		}
		for _, o := range f.OpsetImport {
			if (o.GetDomain() == "" || o.GetDomain() == "ai.onnx") && o.GetVersion() == from {
				o.Version = proto.Int64(to)
			}
		}
	}
}

func sortedKeys(m map[string]bool) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}

// fusedNodes lists g's ai.mok::MoE nodes in graph order; ErrNoFusedNode
// when there are none.
func fusedNodes(g *graph.Graph) ([]*pb.NodeProto, error) {
	var fused []*pb.NodeProto
	for _, n := range g.P.Node {
		if n.GetDomain() == moe.Domain && n.GetOpType() == moe.OpType {
			fused = append(fused, n)
		}
	}
	if len(fused) == 0 {
		return nil, ErrNoFusedNode
	}
	return fused, nil
}

package passes

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"

	"github.com/mokopt/mokopt/graph"
	"github.com/mokopt/mokopt/graph/eval"
	pb "github.com/mokopt/mokopt/graph/onnxpb"
	"github.com/mokopt/mokopt/internal/ep"
	"github.com/mokopt/mokopt/moe"
	"google.golang.org/protobuf/proto"
)

// ProvenanceKey prefixes the metadata_props entries that record, per fused
// node, the nodes and initializers it replaced (moe.ProvenanceKey).
const ProvenanceKey = moe.ProvenanceKey

// Options control Rewrite.
type Options struct {
	// Partial fuses the blocks that pass and reports the rest, instead of
	// refusing the whole model when any candidate fails.
	Partial bool
	// Check runs each block's numerical check (the original model on random
	// inputs against the fused node's reference semantics) before editing.
	Check bool
	// Context cancels the rewrite; nil means context.Background().
	Context context.Context
	// RestoreTracedExperts rebuilds, with a warning, blocks whose
	// TorchScript trace computes fewer experts than the stacked weights
	// hold (see DetectOptions).
	RestoreTracedExperts bool
	// Progress, when set, is told how far each stage got: "detect"
	// (candidates), "weights" (blocks whose weights were read), "check"
	// (blocks checked: 0 of n, then n of n) and "fuse" (blocks fused).
	Progress func(stage string, done, total int)
	// EPTable names the EP collectives to recognise; nil means
	// ep.DefaultTable().
	EPTable *ep.Table
	// CheckData, when set, holds the input sets (graph input name to
	// tensor) the numerical check runs the original model on, instead of
	// random inputs: for graphs that only run on inputs like their export's,
	// such as traces unrolled over the experts hit at trace time.
	CheckData []map[string]*eval.Tensor
	// MemLimit caps the bytes the numerical check's interpreter holds at
	// once (eval.Options.MemLimit); 0 means no limit. A check over it fails
	// the rewrite with an error wrapping eval.ErrMemLimit.
	MemLimit int64
	// StreamWeights also defers the fused weights read from tensors stored
	// inside the model (those read from side files always are): they are
	// written from their sources when the model is saved instead of being
	// copied now, which saves a copy of the weights in memory and its time
	// when the model is saved right after. Until then the fused
	// initializers hold no data: only Save and Encode can write the model
	// (Marshal, the in-memory checker and other passes cannot read them).
	StreamWeights bool

	// checkAhead, when set, is offered the blocks to check on m (rep is
	// the report so far) when none was refused so far: when it returns
	// true it has taken their check over (see RewriteAhead) and they count
	// as passed here.
	checkAhead func(m *graph.Model, bs []*Block, rep *Report) bool
	// pending holds refusals found elsewhere (in subgraphs, see
	// rewriteScoped), reported with this graph's: with Partial off, any
	// of them keeps the graph unedited.
	pending *Report
	// beforeEdit, when set, is called once detection and the check are
	// done, before m is first edited (other goroutines may still be
	// reading m until then).
	beforeEdit func()
}

func (o *Options) progress(stage string, done, total int) {
	if o.Progress != nil {
		o.Progress(stage, done, total)
	}
}

// Provenance is what a fused node replaced, stored as JSON in metadata_props
// (moe.Provenance).
type Provenance = moe.Provenance

// Fused describes one fused node in a report.
type Fused struct {
	Block   *Block `json:"block"`
	Node    string `json:"node"`
	Variant string `json:"variant"`
	// Overload is the fused node's overload: the function body it calls.
	Overload     string `json:"overload"`
	NodesRemoved int    `json:"nodes_removed"`
	InitsRemoved int    `json:"initializers_removed"`
	// CheckPrecision is the half type (float16, bfloat16) the block's
	// original computes in, which its numerical check compares at, with
	// CheckRTol, the relative tolerance of that type (eval.HalfTolerance;
	// the absolute one is that fraction of the output's peak) and
	// CheckTolerance, how it is made; empty for float32 blocks, which use
	// CheckTolerance.
	CheckPrecision string  `json:"check_precision,omitempty"`
	CheckRTol      float64 `json:"check_rtol,omitempty"`
	CheckTolerance string  `json:"check_tolerance,omitempty"`
}

// Report is the result of Rewrite.
type Report struct {
	Fused    []Fused    `json:"fused"`
	NearMiss []NearMiss `json:"near_misses"`
	Refused  []NearMiss `json:"refused"`
	Warnings []string   `json:"warnings,omitempty"`

	// moved names the blocks whose input the check moved to the router's
	// (see checkBlock).
	moved []string
}

// ErrNotFused is returned (wrapped) when candidates failed and Partial is off.
var ErrNotFused = errors.New("MoE candidates could not be fused")

// Rewrite detects every MoE block of m and replaces each with one fused
// ai.mok::MoE node carrying a model-local function, stacked canonical
// weights, and provenance. With Partial off, nothing is edited unless every
// candidate fuses. Detection runs on a canonical working copy of m (see
// package canon) and the fused nodes are spliced into m, which keeps
// everything else as it was.
func Rewrite(m *graph.Model, opt Options) (*Report, error) { return rewriteScopes(m, opt) }

// rewriteIn is Rewrite on m as it is, without canonicalization.
func rewriteIn(m *graph.Model, opt Options) (*Report, error) {
	ctx := opt.Context
	if ctx == nil {
		ctx = context.Background()
	}
	g := m.Graph()
	det, err := detectIn(m, g, DetectOptions{RestoreTracedExperts: opt.RestoreTracedExperts, Context: ctx, EPTable: opt.EPTable,
		Progress: func(done, total int) { opt.progress("detect", done, total) }})
	if err != nil {
		return nil, err
	}
	rep := detectedReport(det, opt.pending)
	todo, err := readyBlocks(ctx, m, det.Blocks, rep, &opt)
	if err != nil {
		return rep, err
	}
	check := opt.Check
	if w := shardCheckNote(det.Blocks); w != "" && check {
		rep.Warnings = append(rep.Warnings, w)
		check = false
	}
	if check && len(todo) > 0 {
		if todo, err = checkReady(ctx, m, g, todo, len(det.Blocks), rep, &opt); err != nil {
			return rep, err
		}
	}
	if err := ctx.Err(); err != nil {
		return rep, err
	}
	if err := notFused(rep, opt.Partial); err != nil {
		return rep, err
	}
	if len(todo) == 0 {
		return rep, nil
	}
	if opt.beforeEdit != nil {
		opt.beforeEdit()
	}
	first := len(rep.Fused)
	if err := fuseReady(ctx, m, g, todo, rep, &opt); err != nil {
		return rep, err
	}
	if !check { // nothing was checked at any precision
		for i := first; i < len(rep.Fused); i++ {
			f := &rep.Fused[i]
			f.CheckPrecision, f.CheckRTol, f.CheckTolerance = "", 0, ""
		}
	}
	m.SetOpset(moe.Domain, moe.Version)
	if m.Proto.GetIrVersion() < 10 {
		m.Proto.IrVersion = proto.Int64(10) // function overloads need IR 10
	}
	return rep, nil
}

// detectedReport starts the report of a rewrite from what detection found:
// its near-misses, then those and the refusals pending from elsewhere, and
// a warning per block restored from a trace that computed fewer experts.
func detectedReport(det *Detection, pending *Report) *Report {
	rep := &Report{NearMiss: det.NearMiss, Warnings: slices.Clone(det.Warnings)}
	if pending != nil {
		rep.NearMiss = append(rep.NearMiss, pending.NearMiss...)
		rep.Refused = append(rep.Refused, pending.Refused...)
	}
	for _, b := range det.Blocks {
		if b.TracedExperts > 0 {
			rep.Warnings = append(rep.Warnings, fmt.Sprintf("%s: restored from a trace that computed only %d of %d experts per input: the fused node runs all %d experts from the stacked weights, so its outputs differ from the original graph's wherever the original dropped tokens", b.Name, b.TracedExperts, b.Spec.NumExperts, b.Spec.NumExperts))
		}
	}
	return rep
}

// readyBlock is a detected block whose fused tensors are valid: ready to
// be checked and fused.
type readyBlock struct {
	b  *Block
	ts []fusedTensor
}

// readyBlocks validates the fused tensors of each block of blocks, in
// order: a block whose tensors fail is refused in rep, the others are
// returned ready. The error is only ctx's.
func readyBlocks(ctx context.Context, m *graph.Model, blocks []*Block, rep *Report, opt *Options) ([]readyBlock, error) {
	var todo []readyBlock
	for i, b := range blocks {
		if err := ctx.Err(); err != nil {
			return nil, err
		}
		opt.progress("weights", i, len(blocks))
		// The weights are only validated here; the numerical check reads
		// each block's weights when it checks that block, and emit copies
		// them (or has them streamed to the output when it is saved).
		if n := unevaluable(m, b.Region, opt.epTable()); n != nil {
			rep.Refused = append(rep.Refused, NearMiss{Node: b.Name, Reason: fmt.Sprintf("the block's region holds node %q (%s), an op mokopt cannot evaluate: what it computes is not known, so the fused node cannot be shown to compute it", n.GetName(), graph.OpKey(n))})
			continue
		}
		ts, err := b.W.fusedTensors(&b.Spec)
		for i := range ts {
			if err == nil {
				err = ts[i].check(m)
			}
		}
		if err != nil {
			rep.Refused = append(rep.Refused, NearMiss{Node: b.Name, Reason: err.Error()})
			continue
		}
		b.Spec.WeightType = keepHalfWeights(ts)
		todo = append(todo, readyBlock{b, ts})
	}
	return todo, nil
}

// unevaluable returns the first node of region (or of a subgraph in it)
// whose op the interpreter has no kernel for, m no function of and tbl no
// EP collective of (those the detector reads by their table), or nil.
func unevaluable(m *graph.Model, region []*pb.NodeProto, tbl *ep.Table) *pb.NodeProto {
	for _, n := range region {
		if _, coll := tbl.Lookup(n.GetDomain(), n.GetOpType()); coll {
			continue
		}
		if !eval.Supported(n.GetDomain(), n.GetOpType()) && !slices.ContainsFunc(m.Proto.GetFunctions(), func(f *pb.FunctionProto) bool {
			return f.GetDomain() == n.GetDomain() && f.GetName() == n.GetOpType()
		}) {
			return n
		}
		for _, a := range n.GetAttribute() {
			for _, g := range append(slices.Clone(a.GetGraphs()), a.GetG()) {
				if u := unevaluable(m, g.GetNode(), tbl); u != nil {
					return u
				}
			}
		}
	}
	return nil
}

// epTable is the EP table the options name, or the default one.
func (o *Options) epTable() *ep.Table {
	if o.EPTable != nil {
		return o.EPTable
	}
	return ep.DefaultTable()
}

// checkReady runs the numerical check of the ready blocks on m (g its
// graph), unless opt.checkAhead takes it over, and returns the blocks that
// passed (todo's prefix reused); detected is how many blocks detection
// found, for the progress of the weights stage.
func checkReady(ctx context.Context, m *graph.Model, g *graph.Graph, todo []readyBlock, detected int, rep *Report, opt *Options) ([]readyBlock, error) {
	bs := make([]*Block, len(todo))
	for i, r := range todo {
		bs[i] = r.b
	}
	opt.progress("weights", detected, detected)
	if opt.checkAhead != nil && len(rep.NearMiss) == 0 && len(rep.Refused) == 0 && opt.checkAhead(m, bs, rep) {
		return todo, nil
	}
	opt.progress("check", 0, len(bs))
	m.KeepIndex(g) // the check reads the graph this index is current for
	inputs := blockInputs(bs)
	errs, err := numericCheck(ctx, m, bs, make([]*moe.Weights, len(bs)), opt.CheckData, opt.MemLimit)
	passed, err := checkResults(rep, bs, inputs, errs, err)
	if err != nil {
		return nil, err
	}
	opt.progress("check", len(bs), len(bs))
	kept := todo[:0]
	for i, r := range todo {
		if passed[i] {
			kept = append(kept, r)
		}
	}
	return kept, nil
}

// fuseReady replaces each ready block of m (g its graph) with its fused
// node, recording each in rep, removes the dead code they leave and sorts
// the graph.
func fuseReady(ctx context.Context, m *graph.Model, g *graph.Graph, todo []readyBlock, rep *Report, opt *Options) error {
	opset := m.Opset("")
	funcs := map[string]bool{}
	for _, f := range m.Proto.Functions {
		if f.GetDomain() == moe.Domain && f.GetName() == moe.OpType {
			funcs[f.GetOverload()] = true
		}
	}
	dc := newDeadCode(g, len(todo))
	for i, r := range todo {
		if err := ctx.Err(); err != nil {
			return err
		}
		opt.progress("fuse", i, len(todo))
		f, err := emit(m, g, dc, r.b, r.ts, opt.StreamWeights, opset, funcs)
		if err != nil {
			return err
		}
		rep.Fused = append(rep.Fused, *f)
	}
	dc.apply()
	opt.progress("fuse", len(todo), len(todo))
	return g.Sort()
}

// blockInputs lists the blocks' inputs, to tell afterwards whether the
// check moved one (see checkBlock).
func blockInputs(bs []*Block) []string {
	in := make([]string, len(bs))
	for i, b := range bs {
		in[i] = b.Input
	}
	return in
}

// checkResults applies the numerical check of bs (errs per block, err for
// the whole, inputs the blocks' inputs before it) to rep as Rewrite does:
// it records the blocks whose input moved, turns an inconclusive check
// into a warning, and refuses each block that failed. It returns which
// blocks passed, or the error that ends the rewrite.
func checkResults(rep *Report, bs []*Block, inputs []string, errs []error, err error) ([]bool, error) {
	for i, b := range bs {
		if b.Input != inputs[i] {
			rep.moved = append(rep.moved, b.Name)
		}
	}
	if errors.Is(err, ErrCheckInconclusive) {
		rep.Warnings = append(rep.Warnings, err.Error())
		errs, err = make([]error, len(bs)), nil
	}
	if err != nil {
		return nil, err
	}
	passed := make([]bool, len(bs))
	for i, b := range bs {
		if errs[i] != nil {
			rep.Refused = append(rep.Refused, NearMiss{Node: b.Name, Reason: errs[i].Error()})
			continue
		}
		passed[i] = true
	}
	return passed, nil
}

// notFused is Rewrite's error when candidates failed and partial is off
// (nil otherwise).
func notFused(rep *Report, partial bool) error {
	if partial || len(rep.NearMiss) == 0 && len(rep.Refused) == 0 {
		return nil
	}
	var msgs []string
	for _, n := range append(append([]NearMiss(nil), rep.NearMiss...), rep.Refused...) {
		msgs = append(msgs, fmt.Sprintf("%s: %s", n.Node, n.Reason))
	}
	return fmt.Errorf("%w (the Partial option, mokopt rewrite --partial, fuses the others): %s", ErrNotFused, strings.Join(msgs, "; "))
}

// emit replaces one block.
func emit(m *graph.Model, g *graph.Graph, dc *deadCode, b *Block, ts []fusedTensor, stream bool, opset int64, funcs map[string]bool) (*Fused, error) {
	s := &b.Spec
	name := g.UniqueName(b.Name + "/MoE")
	in := make([]string, moe.NumInputs)
	in[moe.InHidden] = b.Input
	slot := map[string]int{"router_weight": moe.InRouterW, "router_bias": moe.InRouterB, "router_correction_bias": moe.InCorrectionBias,
		"gate": moe.InGate, "up": moe.InUp, "down": moe.InDown, "gate_bias": moe.InGateBias, "up_bias": moe.InUpBias, "down_bias": moe.InDownBias,
		"shared_gate": moe.InSharedGate, "shared_up": moe.InSharedUp, "shared_down": moe.InSharedDown, "shared_gate_weight": moe.InSharedGateW}
	cache := map[*pb.TensorProto][]float32{}
	for i := range ts {
		ft := &ts[i]
		if len(ft.projs) == 0 {
			continue
		}
		n := g.UniqueName(b.Name + "/" + ft.role)
		if ft.external(m) || stream {
			// Written from its sources (the input's side file, or its
			// bytes in memory) when the model is saved.
			ft.deferTo(m, g, n)
			in[slot[ft.role]] = n
			continue
		}
		v, err := ft.values(m, cache)
		if err != nil {
			return nil, err
		}
		// v is the block's own copy: it becomes the raw data as it is
		// (float32), or is narrowed back to its sources' half type.
		g.AddInitializer(moe.FloatTensorAs(n, ft.dims, v, ft.dtype()))
		in[slot[ft.role]] = n
	}
	zeroBiases(g, b, in)
	for len(in) > 0 && in[len(in)-1] == "" {
		in = in[:len(in)-1]
	}
	// The fused node takes over the block's output name.
	old := g.Producer(b.Output)
	if old == nil {
		return nil, fmt.Errorf("block %s: output %q has no producer", b.Name, b.Output)
	}
	oldPos := int(g.ProducerPos(g.ValueID(b.Output)))
	detached := g.UniqueName(b.Output + "__unfused")
	for i, o := range old.Output {
		if o == b.Output {
			old.Output[i] = detached
		}
	}
	node := graph.NewNode(moe.OpType, moe.Domain, name, in, []string{b.Output}, s.Attributes()...)
	node.Overload = proto.String(s.Overload())
	logits, err := takeLogits(g, b, node) // the optional router_logits output (logits.go)
	if err != nil {
		return nil, err
	}
	g.AddNode(node) // the index now names node as b.Output's producer
	dc.replaced(old, oldPos, node, b.Output)
	logits.replaced(dc, node)
	if !funcs[s.Overload()] && !s.Shard() { // a shard needs its group: no standalone body
		f, err := moe.Function(s, opset)
		if err != nil {
			return nil, err
		}
		m.Proto.Functions = append(m.Proto.Functions, f)
		funcs[s.Overload()] = true
	}
	// Remove the region's nodes that are now dead, and the initializers only they read.
	removedNodes, removedInits := dc.removeDeadIn(b.Region)
	prov := Provenance{Node: name, Kind: b.Kind, Nodes: removedNodes, Initializers: removedInits, Spec: *s, TracedExperts: b.TracedExperts, NullExperts: b.NullExperts, SourceType: sourceType(b)}
	js, _ := json.Marshal(prov)
	m.SetMetadata(ProvenanceKey+name, string(js))
	f := &Fused{Block: b, Node: name, Variant: s.Variant(), Overload: s.Overload(), NodesRemoved: len(removedNodes), InitsRemoved: len(removedInits)}
	if dt := computeType(b, s.IOElemType()); dt != pb.TensorProto_FLOAT {
		f.CheckRTol, _ = eval.HalfTolerance(dt)
		f.CheckPrecision, f.CheckTolerance = strings.ToLower(dt.String()), eval.HalfToleranceText(dt)
	}
	return f, nil
}

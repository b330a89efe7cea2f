package verify

import (
	"context"
	"fmt"
	"math"
	"slices"
	"strings"

	"github.com/mokopt/mokopt/graph"
	"github.com/mokopt/mokopt/graph/eval"
	pb "github.com/mokopt/mokopt/graph/onnxpb"
	"github.com/mokopt/mokopt/moe"
)

// KernelRouting tells the routing inputs of a lowered kernel node: the
// values carrying its top-k expert ids (int64 [T, k]) and their weights
// (float [T, k]); ok is false for any other node.
type KernelRouting func(n *pb.NodeProto) (ids, weights string, ok bool)

// BlockCheck is one fused block of the reference compared with what the
// lowered model made of it, on the reference's own block input and, where
// the block was lowered to a kernel, with the reference's routing forced.
type BlockCheck struct {
	// Index is the block's position among the reference's fused nodes.
	Index int `json:"index"`
	// Node is the reference's ai.mok::MoE node.
	Node string `json:"node"`
	// KernelNode is the lowered kernel node computing the block ("" when
	// the lowered model kept the fused node).
	KernelNode string `json:"kernel_node,omitempty"`
	// Output is the block output value compared (the same name in both
	// models).
	Output string `json:"output"`
	// Elements, MeanRel, RelL2, MaxAbsErr and MaxAbsRef are the
	// comparison's figures (see OutputCheck); Bound is the bound MeanRel
	// and RelL2 are held to.
	Elements  int     `json:"elements"`
	MeanRel   Float   `json:"mean_rel"`
	RelL2     Float   `json:"rel_l2"`
	MaxAbsErr Float   `json:"max_abs_err"`
	MaxAbsRef Float   `json:"max_abs_ref"`
	Bound     float64 `json:"bound"`
	// Decisions is the routing decisions of the block (tokens × k).
	Decisions int `json:"decisions"`
	// RouterFlips counts the decisions where the lowered router, on the
	// reference's block input, chose an expert the reference did not
	// (-1 when the block has no kernel to read its routing from).
	RouterFlips int `json:"router_flips"`
	// EndToEndFlips counts the same in the lowered model's own run, where
	// the block reads what the lowered blocks before it computed.
	EndToEndFlips int `json:"end_to_end_flips"`
	// Pass is true when MeanRel and RelL2 are within Bound.
	Pass bool `json:"pass"`
	// Message explains a failure.
	Message string `json:"message,omitempty"`
}

// lowBlock is one fused node of the reference and where its values are in
// the lowered model.
type lowBlock struct {
	node            *pb.NodeProto
	name            string
	spec            *moe.Spec
	in, out         string
	kernel          string
	ids, weights    string // the kernel's routing inputs
	router          [3]string
	refIn, refOut   *eval.Tensor
	refIDs          [][]int
	refW            [][]float32
	lowOut          *eval.Tensor
	lowIDs, e2eIDs  *eval.Tensor
	inputFromRefRun bool
}

// blockPlan matches the fused nodes of ref with the lowered model low:
// the same value names carry each block's input and output in both (a
// lowering keeps them), and walking back from the output in low finds the
// kernel that computes it. nil when the models do not correspond so (a
// note then says why).
func blockPlan(ref, low *graph.Model, kr KernelRouting) ([]*lowBlock, string) {
	if kr == nil {
		return nil, ""
	}
	lg := low.Graph()
	kernels := 0
	for _, n := range lg.P.GetNode() {
		if _, _, ok := kr(n); ok {
			kernels++
		}
	}
	if kernels == 0 {
		return nil, ""
	}
	rg := ref.Graph()
	var blocks []*lowBlock
	for i, n := range rg.P.GetNode() {
		if n.GetDomain() != moe.Domain || n.GetOpType() != moe.OpType || len(n.Output) == 0 || len(n.Input) == 0 {
			continue
		}
		s, err := moe.SpecFromNode(n, moe.InitializerDims(rg, n))
		if err != nil {
			return nil, fmt.Sprintf("fused node %s: %v", graph.NodeLabel(n), err)
		}
		b := &lowBlock{node: n, name: n.GetName(), spec: s, in: n.Input[moe.InHidden], out: n.Output[0]}
		if b.name == "" {
			b.name = fmt.Sprintf("MoE_%d", i)
		}
		for j, pos := range []int{moe.InRouterW, moe.InRouterB, moe.InCorrectionBias} {
			if pos < len(n.Input) {
				b.router[j] = n.Input[pos]
			}
		}
		if lg.Producer(b.out) == nil {
			return nil, fmt.Sprintf("the output %q of fused node %s is not computed in %s", b.out, b.name, low.Name())
		}
		if lg.Producer(b.in) == nil && !lg.IsInput(b.in) {
			return nil, fmt.Sprintf("the input %q of fused node %s is not a value of %s", b.in, b.name, low.Name())
		}
		if k := kernelOf(lg, b.in, b.out, kr); k != nil {
			b.kernel = k.GetName()
			b.ids, b.weights, _ = kr(k)
		}
		blocks = append(blocks, b)
	}
	if len(blocks) == 0 {
		return nil, ""
	}
	return blocks, ""
}

// kernelOf walks back from out in g, not past in, to the kernel node that
// computes it; nil when there is none.
func kernelOf(g *graph.Graph, in, out string, kr KernelRouting) *pb.NodeProto {
	seen := map[string]bool{in: true}
	queue := []string{out}
	for len(queue) > 0 {
		v := queue[0]
		queue = queue[1:]
		if seen[v] {
			continue
		}
		seen[v] = true
		p := g.Producer(v)
		if p == nil {
			continue
		}
		if _, _, ok := kr(p); ok {
			return p
		}
		for _, x := range p.Input {
			if x != "" && g.Initializer(x) == nil {
				queue = append(queue, x)
			}
		}
	}
	return nil
}

// blockCase runs one case block by block: the reference once, capturing
// each fused block's input, output and router weights; the lowered model
// with each block's input replaced by the reference's and each kernel's
// routing by the reference's (its own routing recorded); then the lowered
// model as it is, for the end-to-end figures and routing.
func blockCase(ctx context.Context, c *Case, ref, low *graph.Model, feedRef, feedLow map[string]*eval.Tensor, blocks []*lowBlock, refIsA bool, opt Options) error {
	want := map[string]bool{}
	for _, b := range blocks {
		want[b.in], want[b.out] = true, true
		for _, r := range b.router {
			if r != "" {
				want[r] = true
			}
		}
	}
	eo := opt.Eval
	eo.KeepAll, eo.OnCapture, eo.Replace = false, nil, nil
	eo.Capture = func(n string) bool { return want[n] }
	refVals, err := eval.Run(ctx, ref, feedRef, eo)
	if err != nil {
		return fmt.Errorf("reference %s: %w", ref.Name(), err)
	}
	for _, b := range blocks {
		if err := b.reference(refVals, feedRef); err != nil {
			return fmt.Errorf("reference %s: %w", ref.Name(), err)
		}
	}
	refOut := graphOutputs(ref, refVals)

	if err := forcedRun(ctx, low, feedLow, blocks, opt); err != nil {
		return fmt.Errorf("lowered %s, blocks on the reference's inputs: %w", low.Name(), err)
	}
	tap := map[string][]*lowBlock{}
	for _, b := range blocks {
		if b.ids != "" {
			tap[b.ids] = append(tap[b.ids], b)
		}
	}
	eo.Capture = func(n string) bool { return tap[n] != nil }
	lowVals, err := eval.Run(ctx, low, feedLow, eo)
	if err != nil {
		return fmt.Errorf("lowered %s: %w", low.Name(), err)
	}
	for name, bs := range tap {
		for _, b := range bs {
			b.e2eIDs = lowVals[name]
		}
	}
	lowOut := graphOutputs(low, lowVals)

	c.Pass = true
	c.Blocks = []BlockCheck{}
	var bad []string
	for i, b := range blocks {
		bc := b.check(i, opt.QuantBound)
		if !bc.Pass {
			c.Pass = false
			bad = append(bad, fmt.Sprintf("block %d %s", i, b.name))
		}
		c.Blocks = append(c.Blocks, bc)
	}
	e2e := opt
	e2e.QuantBound = endToEndBound(opt.QuantBound, blocks)
	blockPass := c.Pass
	if refIsA {
		compareCase(c, refOut, lowOut, e2e)
	} else {
		compareCase(c, lowOut, refOut, e2e)
	}
	outPass, outMsg := c.Pass, c.Message
	c.Pass = blockPass && outPass
	switch {
	case !blockPass:
		c.Message = fmt.Sprintf("%s above the bound %.3g on the reference's block inputs", strings.Join(bad, ", "), opt.QuantBound)
		if !outPass {
			c.Message += "; end to end: " + outMsg
		}
	case !outPass:
		c.Message = fmt.Sprintf("every block within its bound, but the outputs differ beyond the end-to-end bound %.3g: %s", e2e.QuantBound, outMsg)
	}
	return nil
}

// reference takes the block's input, output and routing from the
// reference run's values.
func (b *lowBlock) reference(vals, feeds map[string]*eval.Tensor) error {
	get := func(n string) *eval.Tensor {
		if t := vals[n]; t != nil {
			return t
		}
		return feeds[n]
	}
	b.refIn, b.refOut = get(b.in), get(b.out)
	if b.refIn == nil || b.refOut == nil || b.refIn.F32 == nil || b.refOut.F32 == nil {
		return fmt.Errorf("fused node %s: its input %q or output %q was not computed as a float tensor", b.name, b.in, b.out)
	}
	var w moe.Weights
	for j, dst := range []*[]float32{&w.RouterW, &w.RouterB, &w.CorrectionBias} {
		if b.router[j] == "" {
			continue
		}
		t := get(b.router[j])
		if t == nil || t.F32 == nil {
			return fmt.Errorf("fused node %s: router input %q is not a float tensor", b.name, b.router[j])
		}
		*dst = t.F32
	}
	H := b.spec.Hidden
	if H <= 0 || len(b.refIn.F32)%H != 0 || len(w.RouterW) != b.spec.NumExperts*H {
		return fmt.Errorf("fused node %s: input %v or router weight of %d values does not fit E=%d H=%d", b.name, b.refIn.Shape, len(w.RouterW), b.spec.NumExperts, H)
	}
	b.refIDs, b.refW = moe.Route(b.spec, &w, b.refIn.F32, len(b.refIn.F32)/H)
	return nil
}

// forcedRun runs low with every block input replaced by the reference's
// and each kernel's routing by the reference's, recording each block's
// output and the routing its own router computed.
func forcedRun(ctx context.Context, low *graph.Model, feeds map[string]*eval.Tensor, blocks []*lowBlock, opt Options) error {
	ins, outs, ids, wts := map[string]*lowBlock{}, map[string][]*lowBlock{}, map[string]*lowBlock{}, map[string]*lowBlock{}
	for _, b := range blocks {
		ins[b.in] = b
		outs[b.out] = append(outs[b.out], b)
		if b.ids != "" {
			ids[b.ids], wts[b.weights] = b, b
		}
	}
	var bad error
	eo := opt.Eval
	eo.KeepAll, eo.OnCapture = false, nil
	eo.Capture = func(n string) bool { return ins[n] != nil || outs[n] != nil || ids[n] != nil || wts[n] != nil }
	eo.Replace = func(name string, t *eval.Tensor) *eval.Tensor {
		for _, b := range outs[name] {
			b.lowOut = t
		}
		var u *eval.Tensor
		if b := ids[name]; b != nil {
			b.lowIDs = t
			u = b.forcedIDs(t)
		}
		if b := wts[name]; b != nil {
			u = b.forcedWeights(t)
		}
		if b := ins[name]; b != nil {
			b.inputFromRefRun = true
			u = b.refIn
			if u.DType != t.DType || !slices.Equal(u.Shape, t.Shape) {
				u = nil
			}
		}
		if u == nil && (ids[name] != nil || wts[name] != nil) && bad == nil {
			bad = fmt.Errorf("routing value %q is %s%v, not the reference's [T, k] routing", name, t.DType, t.Shape)
		}
		return u
	}
	vals, err := eval.Run(ctx, low, feeds, eo)
	if err != nil {
		return err
	}
	if bad != nil {
		return bad
	}
	for _, b := range blocks {
		if b.lowOut == nil {
			b.lowOut = vals[b.out]
		}
	}
	return nil
}

// forcedIDs is the reference's top-k ids in t's type and shape; nil when
// they do not fit.
func (b *lowBlock) forcedIDs(t *eval.Tensor) *eval.Tensor {
	k := b.spec.TopK
	if t.I64 == nil || t.Len() != len(b.refIDs)*k {
		return nil
	}
	v := make([]int64, 0, t.Len())
	for _, row := range b.refIDs {
		for _, e := range row {
			v = append(v, int64(e))
		}
	}
	u := eval.NewInt64(t.Shape, v)
	u.DType = t.DType
	return u
}

// forcedWeights is the reference's routing weights in t's type and shape.
func (b *lowBlock) forcedWeights(t *eval.Tensor) *eval.Tensor {
	k := b.spec.TopK
	if t.F32 == nil || t.Len() != len(b.refW)*k {
		return nil
	}
	v := make([]float32, 0, t.Len())
	for _, row := range b.refW {
		v = append(v, row...)
	}
	return eval.NewFloatAs(t.DType, t.Shape, v)
}

// flips counts the decisions of ids ([T, k]) naming an expert that the
// reference's routing of the same token does not.
func (b *lowBlock) flips(ids *eval.Tensor) int {
	k := b.spec.TopK
	if ids == nil || ids.I64 == nil || ids.Len() != len(b.refIDs)*k {
		return -1
	}
	n := 0
	for t, row := range b.refIDs {
		for _, e := range ids.I64[t*k : (t+1)*k] {
			if !slices.Contains(row, int(e)) {
				n++
			}
		}
	}
	return n
}

// check compares the block's lowered output with the reference's.
func (b *lowBlock) check(i int, bound float64) BlockCheck {
	bc := BlockCheck{Index: i, Node: b.name, KernelNode: b.kernel, Output: b.out, Bound: bound,
		Decisions: len(b.refIDs) * b.spec.TopK, RouterFlips: -1, EndToEndFlips: -1}
	if b.kernel != "" {
		bc.RouterFlips, bc.EndToEndFlips = b.flips(b.lowIDs), b.flips(b.e2eIDs)
	}
	var oc OutputCheck
	switch {
	case b.lowOut == nil:
		bc.Message = "the lowered model did not compute the block's output"
		return bc
	case !slices.Equal(b.lowOut.Shape, b.refOut.Shape):
		bc.Message = fmt.Sprintf("shape differs: lowered %v, reference %v", b.lowOut.Shape, b.refOut.Shape)
		return bc
	}
	compareQuant(&oc, b.lowOut, b.refOut, bound)
	bc.Elements, bc.MeanRel, bc.RelL2, bc.MaxAbsErr, bc.MaxAbsRef, bc.Pass = oc.Elements, oc.MeanRel, oc.RelL2, oc.MaxAbsErr, oc.MaxAbsRef, oc.Pass
	if !bc.Pass {
		bc.Message = oc.Message
	}
	return bc
}

// MaxEndToEndBound caps the end-to-end bound of a block-by-block
// comparison: beyond half the output's size, it is no longer a noisy copy.
const MaxEndToEndBound = 0.5

// endToEndBound is the bound the graph outputs are held to when the blocks
// are compared one by one: the per-block bound times the square root of
// the lowered blocks (independent errors of that size add in quadrature),
// at most MaxEndToEndBound, and never below the per-block bound.
func endToEndBound(bound float64, blocks []*lowBlock) float64 {
	n := 0
	for _, b := range blocks {
		if b.kernel != "" {
			n++
		}
	}
	return max(bound, min(MaxEndToEndBound, bound*math.Sqrt(float64(n))))
}

// graphOutputs lists m's graph outputs from a run's values.
func graphOutputs(m *graph.Model, vals map[string]*eval.Tensor) []named {
	var out []named
	for _, v := range m.Proto.GetGraph().GetOutput() {
		out = append(out, named{v.GetName(), vals[v.GetName()]})
	}
	return out
}

// blockMode decides whether Compare goes block by block: which of a and b
// is the reference of fused nodes, which the lowered model, and their
// blocks; nils for a comparison of the graph outputs only.
func blockMode(a, b *graph.Model, opt *Options, r *Report) (ref, low *graph.Model, blocks []*lowBlock) {
	if opt.KernelRouting == nil || opt.QuantBound <= 0 {
		return nil, nil, nil
	}
	why := ""
	for _, p := range [][2]*graph.Model{{b, a}, {a, b}} {
		bs, w := blockPlan(p[0], p[1], opt.KernelRouting)
		if bs != nil {
			ref, low, blocks = p[0], p[1], bs
			break
		}
		if w != "" {
			why = w
		}
	}
	switch {
	case blocks == nil && why != "":
		r.Notes = append(r.Notes, "graph outputs compared only, not block by block: "+why)
		return nil, nil, nil
	case blocks == nil:
		return nil, nil, nil
	case opt.WholeModel:
		r.Notes = append(r.Notes, "graph outputs compared only (whole model, as asked); the lowered blocks' errors compound over the model's depth")
		return nil, nil, nil
	case opt.Runner != nil:
		r.Notes = append(r.Notes, "graph outputs compared only: a block-by-block comparison needs the reference interpreter (engine ref)")
		return nil, nil, nil
	}
	r.BlockReference, r.BlockBound = ref.Name(), opt.QuantBound
	r.EndToEndBound = endToEndBound(opt.QuantBound, blocks)
	r.Notes = append(r.Notes, fmt.Sprintf("block by block: each of the %d fused blocks of %s is compared with its lowering in %s on the reference's block input, with the reference's routing forced, against the bound %.3g; routing flips are counted on those inputs and in the lowered model's own run; the graph outputs are held to the end-to-end bound %.3g (the block bound times the square root of the lowered blocks, at most %.2g)",
		len(blocks), ref.Name(), low.Name(), opt.QuantBound, r.EndToEndBound, MaxEndToEndBound))
	return ref, low, blocks
}

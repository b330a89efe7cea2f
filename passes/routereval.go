package passes

import (
	"context"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"slices"

	"github.com/mokopt/mokopt/graph"
	"github.com/mokopt/mokopt/graph/eval"
	pb "github.com/mokopt/mokopt/graph/onnxpb"
	"github.com/mokopt/mokopt/moe"
	"google.golang.org/protobuf/proto"
)

// What the router computes is decided here by evaluation: the subgraph from
// the router logits to the top-k indices and to the routing weights is run
// in the interpreter on probe logits, and compared with the reference
// routing (moe.Route) of each router the fused op's contract expresses
// (routerCandidates). The first that reproduces the indices and the
// weights, up to a constant scale fitted from their ratio, is the router.
// Every spelling of one router is thus one router, spellings nobody has
// written yet included.

// errNoEval says that the routing subgraph cannot be evaluated alone (it
// reads values other than the logits and constants, or an op the
// interpreter lacks); the op walk's reading then stands.
var errNoEval = errors.New("routing subgraph not evaluable alone")

// routingRun is one evaluation of the routing subgraph on probe logits.
type routingRun struct {
	logits []float32 // [T, W] probe, W the logits' width
	T, W   int
	E, k   int                     // the TopK's width and k
	vals   map[string]*eval.Tensor // every value computed
	order  []string                // closure values in topological order
	dep    map[string]bool         // values that depend on the TopK
	idx    []int64                 // [T, k] selected ids
	half   bool                    // the logits are a half type
	nodes  []*pb.NodeProto         // the closure evaluated
}

// routerByEval decides the router's semantics by evaluation (see above)
// and writes them into s and ri. It returns false, nil when the routing
// cannot be evaluated alone and the op walk read the router (its reading
// then stands); a refusal says what the router computes that the contract
// cannot express.
func (c *ctx) routerByEval(tk *pb.NodeProto, ri *routerInfo, s *moe.Spec) (bool, error) {
	if c.sparse[tk] != nil {
		return false, nil
	}
	logits, postBias := ri.logits, []float32(nil)
	if logits == "" {
		logits = ri.linear.Output[0]
		if ri.bias != nil && !gemmHasBias(ri.linear) {
			postBias = c.floatsOf(ri.bias, mustBytes(c, ri.bias))
		}
	}
	d := ri.w.GetDims()
	W, H := int(d[0]), int(d[len(d)-1])
	if ri.wInOut {
		W, H = H, W
	}
	run, err := c.runRouting(tk, logits, ri.x, W, H)
	if err != nil {
		if !ri.generic {
			return false, nil
		}
		if errors.Is(err, errNoEval) {
			return true, rejectf("%v", err)
		}
		return true, rejectf("the router's post-processing cannot be evaluated: %v", err)
	}
	if run.E != run.W && ri.generic && postBias == nil {
		if done, err := c.routerOverSlice(tk, ri, s, run); done || err != nil {
			return true, err
		}
	}
	cands, ref := c.routerCandidates(tk, ri, run, postBias)
	pick, err := c.pickWeights(run, cands, ref)
	if err != nil {
		return true, err
	}
	if pick != nil {
		cd := cands[pick.cand]
		cd.spec.RoutedScalingFactor = pick.scale
		c.adoptRouter(ri, s, cd, run, postBias)
		return true, nil
	}
	if why := c.unevenGroups(tk, run.W); why != "" {
		return true, rejectf("%s", why)
	}
	return true, rejectf("%s", run.explain(cands, ref))
}

// unevenGroups says why a router that no candidate expresses groups its W
// scores in a way no group-limited router does: a Reshape between the
// router linear and the TopK to [..., G, S] with G·S ≠ W (G groups of S
// experts do not hold the W experts, so each row of groups takes scores of
// more than one token), or "" when there is none.
func (c *ctx) unevenGroups(tk *pb.NodeProto, W int) string {
	var found []*pb.NodeProto
	for n := range c.backwardTo(tk.Input[0], isLinear) {
		if n.GetOpType() != "Reshape" || len(n.Input) < 2 {
			continue
		}
		sh := c.constInts(n.Input[1])
		if len(sh) >= 3 && sh[len(sh)-2] > 1 && sh[len(sh)-1] > 0 && sh[len(sh)-2]*sh[len(sh)-1] != int64(W) {
			found = append(found, n)
		}
	}
	if len(found) == 0 {
		return ""
	}
	c.sortByOrder(found)
	n := found[0]
	sh := c.constInts(n.Input[1])
	g, e := sh[len(sh)-2], sh[len(sh)-1]
	return fmt.Sprintf("group-limited routing over uneven groups: Reshape %q groups the router's %d scores as %d groups of %d, which do not hold them (the number of experts is not a multiple of the groups), so each row of groups mixes the scores of several tokens; ai.mok::MoE expresses groups that divide the experts", graph.NodeLabel(n), W, g, e)
}

// gemmHasBias reports whether n is a Gemm with a bias input.
func gemmHasBias(n *pb.NodeProto) bool {
	return n.GetOpType() == "Gemm" && len(n.Input) > 2 && n.Input[2] != ""
}

// picksOneExpert reports whether n takes one constant slice of a routing
// value (a Gather by a constant scalar index, as an unrolled block picks
// each expert's mask): per-expert dispatch, not the routing map.
func (c *ctx) picksOneExpert(n *pb.NodeProto) bool {
	if n.GetOpType() != "Gather" || len(n.Input) < 2 {
		return false
	}
	t := c.g.Initializer(n.Input[1])
	if t == nil {
		if p := c.g.Producer(n.Input[1]); p != nil && p.GetOpType() == "Constant" {
			t = graph.AttrTensor(p, "value")
		}
	}
	return t != nil && len(t.GetDims()) == 0
}

// maxRoutingHops bounds how far after the TopK the routing subgraph is
// evaluated.
const maxRoutingHops = 12 // the weights lie within a few; spellings of the normalisation and scale add some

// routingReach lists, in topological order, the nodes (within the block
// bound) reached from the logits, pruned past maxRoutingHops nodes after
// the TopK by the shortest path (the exact count, the longest path, is
// only larger).
func (c *ctx) routingReach(tk *pb.NodeProto, logits string) []*pb.NodeProto {
	d := c.d
	mk := c.mk
	ep := mk.next()
	tkPos, _ := c.posOf(tk)
	type item struct {
		val  int32
		hops int
	}
	var out []int32
	var stack []item
	for _, j := range c.valueIDs(logits) {
		stack = append(stack, item{j, 0})
	}
	for len(stack) > 0 {
		it := stack[len(stack)-1]
		stack = stack[:len(stack)-1]
		for _, p := range d.consumers(it.val) {
			if mk.at[p] == ep || c.lim != nil && !c.lim[p] {
				continue
			}
			h := it.hops
			if h > 0 || p == tkPos {
				h++
			}
			if h > maxRoutingHops {
				continue
			}
			mk.at[p] = ep
			out = append(out, p)
			for _, o := range d.outVal[d.outOff[p]:d.outOff[p+1]] {
				if o >= 0 {
					stack = append(stack, item{o, h})
				}
			}
		}
	}
	slices.Sort(out)
	return c.nodesAt(out)
}

// routingClosure lists, in topological order, the nodes (within the block
// bound) computed from the logits and constants alone, with the constants
// they read; it says which value first reads something else when the
// TopK is not among them.
func (c *ctx) routingClosure(tk *pb.NodeProto, logits string) ([]*pb.NodeProto, []*pb.TensorProto, error) {
	have := map[string]bool{logits: true}
	// hops: how many nodes after the TopK a value is (0: not after it);
	// the routing weights lie within a few, the dispatch beyond them is
	// not evaluated.
	hops := map[string]int{}
	var nodes []*pb.NodeProto
	var inits []*pb.TensorProto
	seenInit := map[string]bool{}
	var blocked string
	for _, n := range c.routingReach(tk, logits) {
		if d := n.GetDomain(); d != "" && d != "ai.onnx" {
			continue // a collective or contrib op: not routing
		}
		ok := true
		var consts []*pb.NodeProto
		for _, in := range n.Input {
			if in == "" || have[in] {
				continue
			}
			if t := c.g.Initializer(in); t != nil {
				if !seenInit[in] {
					seenInit[in] = true
					inits = append(inits, t)
				}
				continue
			}
			if p := c.g.Producer(in); p != nil && p.GetOpType() == "Constant" {
				consts = append(consts, p)
				continue
			}
			if ok && blocked == "" {
				blocked = in
			}
			ok = false
		}
		h := 0
		for _, in := range n.Input {
			if hops[in] > 0 {
				h = max(h, hops[in]+1)
			}
		}
		if n == tk {
			h = 1
		}
		if !ok || h > maxRoutingHops || h > 0 && c.picksOneExpert(n) {
			continue
		}
		for _, p := range consts {
			if !slices.Contains(nodes, p) {
				nodes = append(nodes, p)
			}
		}
		nodes = append(nodes, n)
		for _, o := range n.Output {
			have[o] = true
			hops[o] = h
		}
	}
	if !slices.Contains(nodes, tk) {
		if blocked != "" {
			return nil, nil, fmt.Errorf("%w: the routing reads %q besides the router logits %q", errNoEval, blocked, logits)
		}
		return nil, nil, fmt.Errorf("%w: the TopK is not computed from the router logits %q", errNoEval, logits)
	}
	return nodes, inits, nil
}

// runRouting evaluates the routing closure on probe logits.
func (c *ctx) runRouting(tk *pb.NodeProto, logits, x string, W, H int) (*routingRun, error) {
	nodes, inits, err := c.routingClosure(tk, logits)
	if err != nil {
		return nil, err
	}
	k, ok := c.scalarInt(tk.Input[1])
	if !ok || k < 1 {
		return nil, fmt.Errorf("%w: TopK k is not a constant", errNoEval)
	}
	var out map[string]*eval.Tensor
	var run *routingRun
	for _, shape := range c.probeShapes(logits, x, W, H, bakedShapes(nodes, inits, W)) {
		T := 1
		for _, d := range shape[:len(shape)-1] {
			T *= d
		}
		run = &routingRun{T: T, W: W, k: int(k), logits: probeLogits(T, W), dep: map[string]bool{}}
		if _, half := eval.HalfTolerance(c.logitsType(tk, logits)); half {
			// An exp written out in half precision overflows past 11.
			for i := range run.logits {
				run.logits[i] /= 3
			}
		}
		if out, err = c.evalTrimmed(tk, logits, nodes, inits, shape, run); err == nil {
			break
		}
	}
	if err != nil {
		return nil, err
	}
	run.vals, run.nodes = out, nodes
	for _, n := range nodes {
		dep := n == tk
		for _, in := range n.Input {
			dep = dep || run.dep[in]
		}
		for _, o := range n.Output {
			if o != "" {
				run.order = append(run.order, o)
				run.dep[o] = dep
			}
		}
	}
	return run, run.readTopK(tk)
}

// logitsType is the element type of the router logits: declared or
// followed back, else the router linear's weight type (a linear computes
// in its weight's type), else float32.
func (c *ctx) logitsType(tk *pb.NodeProto, logits string) pb.TensorProto_DataType {
	if dt := c.elemType(logits); dt != pb.TensorProto_UNDEFINED {
		return dt
	}
	if p := c.g.Producer(logits); p != nil && (p.GetOpType() == "MatMul" || p.GetOpType() == "Gemm") {
		if w := c.linearWeight(p); w != nil {
			return graph.DataType(w.t)
		}
	}
	if p := c.g.Producer(logits); p != nil {
		for _, in := range p.Input {
			if t := c.constTensor(in); t != nil && graph.DataType(t) != pb.TensorProto_INT64 {
				return graph.DataType(t)
			}
		}
	}
	return pb.TensorProto_FLOAT
}

// evalRouting runs the closure's nodes on run's probe logits, of the
// given shape, in the logits' element type.
func (c *ctx) evalRouting(tk *pb.NodeProto, logits string, nodes []*pb.NodeProto, inits []*pb.TensorProto, shape []int, run *routingRun) (map[string]*eval.Tensor, error) {
	dt := c.logitsType(tk, logits)
	if !eval.StoredAsFloat32(dt) {
		return nil, rejectf("router logits %q are %s, not a float type", logits, dt)
	}
	_, run.half = eval.HalfTolerance(dt)
	// The probe is rounded to the logits' type, and the reference reads
	// the rounded values.
	feed := eval.NewFloatAs(dt, shape, run.logits)
	feed.F32 = slices.Clone(feed.F32)
	gp := &pb.GraphProto{Node: nodes, Initializer: inits,
		Input:  []*pb.ValueInfoProto{{Name: proto.String(logits)}},
		Output: []*pb.ValueInfoProto{{Name: proto.String(tk.Output[1])}}}
	return eval.Run(context.Background(), c.m.WithGraph(gp), map[string]*eval.Tensor{logits: feed}, eval.Options{KeepAll: true, MemLimit: 1 << 28, Kernels: evalKernels()})
}

// evalTrimmed is evalRouting, retried without a node downstream of the
// TopK that fails on the probe and what reads it: a trace that baked its
// dispatch sizes in cannot run the dispatch on other routings, while the
// routing weights before it still can.
func (c *ctx) evalTrimmed(tk *pb.NodeProto, logits string, nodes []*pb.NodeProto, inits []*pb.TensorProto, shape []int, run *routingRun) (map[string]*eval.Tensor, error) {
	for range 4 {
		out, err := c.evalRouting(tk, logits, nodes, inits, shape, run)
		var ie *graph.InputError
		if err == nil || !errors.As(err, &ie) {
			return out, err
		}
		at := slices.IndexFunc(nodes, func(n *pb.NodeProto) bool {
			return ie.Object == fmt.Sprintf("node %s (%s)", graph.NodeLabel(n), n.GetOpType())
		})
		tkAt := slices.Index(nodes, tk)
		if at < 0 || at <= tkAt {
			return nil, err
		}
		gone := map[string]bool{}
		var kept []*pb.NodeProto
		for i, n := range nodes {
			drop := i == at
			for _, in := range n.Input {
				drop = drop || gone[in]
			}
			if !drop {
				kept = append(kept, n)
				continue
			}
			for _, o := range n.Output {
				gone[o] = true
			}
		}
		nodes = kept
	}
	return nil, fmt.Errorf("%w: the routing subgraph fails on probe logits", errNoEval)
}

// readTopK reads the evaluated TopK's width and indices into run.
func (run *routingRun) readTopK(tk *pb.NodeProto) error {
	in, ix := run.vals[tk.Input[0]], run.vals[tk.Output[1]]
	if in == nil || ix == nil || len(in.Shape) == 0 || ix.I64 == nil || len(ix.I64) != run.T*run.k {
		return fmt.Errorf("%w: the TopK's evaluated indices do not have one row of %d per token", errNoEval, run.k)
	}
	run.E, run.idx = in.Shape[len(in.Shape)-1], ix.I64
	return nil
}

// probeShapes are the shapes to try for the probe logits, W wide: the
// logits' declared shape when it is static; the router input's, or a graph
// input's of the router's hidden size, with W for its last dim (a traced
// export bakes its token count into shape constants); baked, the shapes of
// the routing's own constants W wide (the -inf rows a trace scatters its
// top-k into, when the graph declares no static dims); 16 tokens in the
// logits' rank.
func (c *ctx) probeShapes(logits, x string, W, H int, baked [][]int) [][]int {
	r := c.rankOf(logits)
	if r < 0 {
		r = c.rankInfer(logits)
	}
	var out [][]int
	add := func(dims []int) {
		if len(dims) < 2 || slices.ContainsFunc(out, func(o []int) bool { return slices.Equal(o, dims) }) {
			return
		}
		if r < 2 || len(dims) == r {
			out = append(out, dims)
			return
		}
		T := 1
		for _, d := range dims[:len(dims)-1] {
			T *= d
		}
		flat := []int{T, W}
		for len(flat) < r {
			flat = append([]int{1}, flat...)
		}
		if !slices.ContainsFunc(out, func(o []int) bool { return slices.Equal(o, flat) }) {
			out = append(out, flat)
		}
	}
	if dims := c.staticDims(logits); len(dims) > 0 && dims[len(dims)-1] == W {
		add(dims)
	}
	sources := []string{x}
	for _, in := range c.g.P.GetInput() {
		sources = append(sources, in.GetName())
	}
	for _, v := range sources {
		if dims := c.staticDims(v); len(dims) >= 2 && dims[len(dims)-1] == H {
			add(append(slices.Clone(dims[:len(dims)-1]), W))
		}
	}
	for _, dims := range baked {
		add(dims)
	}
	def := []int{16, W}
	for len(def) < max(r, 2) {
		def = append([]int{1}, def...)
	}
	add(def)
	return out
}

// bakedShapes returns the shapes of the routing closure's constants (its
// initializers and Constant nodes) of rank 2 or more whose last dim is W,
// in the closure's order.
func bakedShapes(nodes []*pb.NodeProto, inits []*pb.TensorProto, W int) [][]int {
	ts := slices.Clone(inits)
	for _, n := range nodes {
		if n.GetOpType() == "Constant" {
			if t := graph.AttrTensor(n, "value"); t != nil {
				ts = append(ts, t)
			}
		}
	}
	var out [][]int
	for _, t := range ts {
		d := t.GetDims()
		if len(d) < 2 || d[len(d)-1] != int64(W) {
			continue
		}
		dims := make([]int, len(d))
		for i, v := range d {
			dims[i] = int(v)
		}
		out = append(out, dims)
	}
	return out
}

// staticDims returns v's declared shape when every dim is a known
// positive number, else nil.
func (c *ctx) staticDims(v string) []int {
	gp := c.g.P
	for _, list := range [][]*pb.ValueInfoProto{gp.Input, gp.Output, gp.ValueInfo} {
		for _, vi := range list {
			if vi.GetName() != v {
				continue
			}
			var out []int
			for _, d := range vi.GetType().GetTensorType().GetShape().GetDim() {
				if d.GetDimValue() <= 0 {
					return nil
				}
				out = append(out, int(d.GetDimValue()))
			}
			return out
		}
	}
	return nil
}

// probeLogits makes T rows of W probe logits: draws of several scales
// (values where softmax and sigmoid, and renormalised or not, differ most)
// and rows of evenly spaced, shuffled values (no ties anywhere).
func probeLogits(T, W int) []float32 {
	rng := rand.New(rand.NewPCG(0x726f75746572, uint64(W)))
	out := make([]float32, T*W)
	scales := []float64{1, 3, 0.3, 6}
	for t := 0; t < T; t++ {
		row := out[t*W : (t+1)*W]
		if t%5 == 4 {
			for i, p := range rng.Perm(W) {
				row[i] = float32(p-W/2) * 0.37
			}
			continue
		}
		for i := range row {
			row[i] = float32(rng.NormFloat64() * scales[t%len(scales)])
		}
	}
	return out
}

// routerCand is one router the contract expresses, with the constants it
// reads.
type routerCand struct {
	spec moe.Spec
	corr *pb.TensorProto // the correction bias, or nil
}

// corrOf returns the candidate's correction bias values, or nil.
func (c *ctx) corrOf(cd routerCand) []float32 {
	if cd.corr == nil {
		return nil
	}
	return c.floatsOf(cd.corr, mustBytes(c, cd.corr))
}

// adoptRouter writes the matched candidate into the spec and the router
// info: activation, order, renormalisation, scaling, groups, correction
// bias, and the value of the activated scores the weights may be gathered
// from.
func (c *ctx) adoptRouter(ri *routerInfo, s *moe.Spec, cd routerCand, run *routingRun, postBias []float32) {
	r := cd.spec
	s.RouterActivation, s.RouterOrder = r.RouterActivation, r.RouterOrder
	s.NormalizeTopK, s.RoutedScalingFactor = r.NormalizeTopK, r.RoutedScalingFactor
	s.NGroup, s.TopKGroup, s.GroupScore = r.NGroup, r.TopKGroup, r.GroupScore
	ri.act, ri.order, ri.nGroup, ri.topkGroup = r.RouterActivation, r.RouterOrder, r.NGroup, r.TopKGroup
	ri.groupMax = r.GroupScore == moe.GroupScoreMax
	ri.corr = cd.corr
	s.CorrectionBias = ri.corr != nil
	if r.RouterOrder != moe.ActivationThenTopK || ri.scores != "" {
		return
	}
	want := run.logits
	if postBias != nil {
		want = addRows(want, postBias)
	}
	want = activate(r.RouterActivation, want, run.W)
	rtol, atol := 1e-4, 1e-6
	if run.half {
		rtol, atol = 4e-2, 4e-3
	}
	for _, v := range run.order {
		if t := run.vals[v]; !run.dep[v] && t != nil && t.F32 != nil && len(t.F32) == len(want) && closeTo(t.F32, want, rtol, atol) {
			ri.scores = v
			return
		}
	}
}

// addRows adds the vector b to every row of x.
func addRows(x, b []float32) []float32 {
	out := slices.Clone(x)
	for i := range out {
		out[i] += b[i%len(b)]
	}
	return out
}

// activate applies the router activation to every row of x (width W).
func activate(act string, x []float32, W int) []float32 {
	out := slices.Clone(x)
	for t := 0; t+W <= len(out); t += W {
		row := out[t : t+W]
		if act == moe.Sigmoid {
			for i := range row {
				row[i] = moe.Logistic(row[i])
			}
			continue
		}
		m := float32(math.Inf(-1))
		for _, v := range row {
			m = max(m, v)
		}
		var sum float64
		for i, v := range row {
			row[i] = float32(math.Exp(float64(v - m)))
			sum += float64(row[i])
		}
		for i := range row {
			row[i] = float32(float64(row[i]) / sum)
		}
	}
	return out
}

// closeTo reports whether a and b agree within rtol and atol elementwise.
func closeTo(a, b []float32, rtol, atol float64) bool {
	for i := range a {
		d := math.Abs(float64(a[i]) - float64(b[i]))
		if math.IsNaN(d) || d > atol+rtol*math.Abs(float64(b[i])) {
			return false
		}
	}
	return true
}

// graphLabel names a value's producer for messages.
func (c *ctx) graphLabel(v string) string {
	if p := c.g.Producer(v); p != nil {
		return graph.NodeLabel(p)
	}
	return v
}

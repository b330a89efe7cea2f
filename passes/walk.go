// Package passes holds the graph rewrites of mokopt: the MoE detector, which
// canonicalises every exporter shape of a Mixture-of-Experts block into one
// moe.Spec plus weight sources, and the rewrite that replaces each block with
// one fused ai.mok::MoE node.
package passes

import (
	"encoding/binary"
	"maps"
	"slices"
	"sort"

	"github.com/mokopt/mokopt/graph"
	pb "github.com/mokopt/mokopt/graph/onnxpb"
	"github.com/mokopt/mokopt/internal/ep"
)

// noiseOps only change shape, dtype or nothing, and are looked through.
var noiseOps = map[string]bool{"Reshape": true, "Squeeze": true, "Unsqueeze": true, "Identity": true, "Cast": true, "Flatten": true}

// ctx bundles a model and its graph index for the detector.
type ctx struct {
	m *graph.Model
	g *graph.Graph
	// synPos holds the positions given to synthetic nodes (see orderOf);
	// byNode finds the positions of nodes without outputs (see posOf).
	synPos map[*pb.NodeProto]int32
	byNode *nodePositions
	topo   []*pb.NodeProto
	ranks  map[string]int                     // declared ranks of values (see declare)
	types  map[string]pb.TensorProto_DataType // declared element types of values
	// restore rebuilds blocks whose trace lost experts (DetectOptions).
	restore bool
	// sparse maps the synthetic selection nodes standing for sparsemixer
	// routers (sparseMixerAt) to what was read from them.
	sparse map[*pb.NodeProto]*sparseInfo
	// epTable names the EP collectives (see ep.go).
	epTable *ep.Table
	// epClone maps the MoE stand-in of a ShardedMoE node to the node.
	epClone map[*pb.NodeProto]*pb.NodeProto

	wmm     memo   // by position: MatMul/Gemm with a constant weight (see weightMatMulAt)
	anc     []bool // ancRoot and its ancestors by position (see ancestors)
	ancRoot int32
	// ancAdded and ancStack are ancestors' scratch.
	ancAdded, ancStack []int32
	auxTopK            []bool // by position: nodes from which a TopK is reached without crossing a MatMul/Gemm
	routerAt           []bool // by position: router linears (see selectors)
	idxDeps            *reach // per block: what the top-k indices reach (see branchExpert)
	// d numbers nodes, values and edges for the walks (see dense); mk
	// is this goroutine's visited set for them.
	d  *dense
	mk *marks
	// lim, when set, bounds forward walks to one block's region (by
	// topological position) so that per-branch analysis of a big model
	// stays linear in the block's size.
	lim []bool
	// after is postDominator's memo (see afterExpert there).
	after memo
	// rankMemo remembers rankInfer's answers on the unchanged graph.
	rankMemo map[string]int
	// limBuf backs lim; limSet lists the positions set in it.
	limBuf []bool
	limSet []int32
	// actMemo holds identified expert activations by subgraph key (see
	// identifyAct); each worker has its own.
	actMemo map[string]*actID
}

// through walks back from v over noise ops and returns the first value not
// produced by one.
func (c *ctx) through(v string) string {
	for {
		p := c.g.Producer(v)
		if p == nil || !noiseOps[p.GetOpType()] || len(p.Input) == 0 {
			return v
		}
		v = p.Input[0]
	}
}

// producerOp returns the producer of v looked through noise, or nil.
func (c *ctx) producerOp(v string) *pb.NodeProto { return c.g.Producer(c.through(v)) }

// constTensor returns the constant tensor behind v (an initializer or a
// Constant node's value), looking through noise ops, or nil.
func (c *ctx) constTensor(v string) *pb.TensorProto {
	v = c.through(v)
	if t := c.g.Initializer(v); t != nil {
		return t
	}
	if p := c.g.Producer(v); p != nil && p.GetOpType() == "Constant" {
		if t := graph.AttrTensor(p, "value"); t != nil {
			return t
		}
	}
	return nil
}

// constBytes returns the constant tensor behind v and its raw bytes, or
// nil when v is not a readable constant or (max >= 0) holds more than max
// elements: those are not read at all.
func (c *ctx) constBytes(v string, max int64) (*pb.TensorProto, []byte) {
	t := c.constTensor(v)
	if t == nil || max >= 0 && !atMost(t.GetDims(), max) {
		return nil, nil
	}
	b, err := c.m.TensorBytes(t)
	if err != nil {
		return nil, nil
	}
	return t, b
}

// atMost reports whether a tensor of the given dims has at most max elements.
func atMost(dims []int64, max int64) bool {
	if slices.Contains(dims, 0) {
		return true
	}
	n := int64(1)
	for _, d := range dims {
		if d < 0 || d > max {
			return false
		}
		if n *= d; n > max {
			return false
		}
	}
	return true
}

// floatsOf decodes constBytes' result as floats, or nil.
func (c *ctx) floatsOf(t *pb.TensorProto, b []byte) []float32 {
	if t == nil {
		return nil
	}
	f, err := graph.DecodeFloat32(graph.DataType(t), b)
	if err != nil {
		return nil
	}
	return f
}

// constInts decodes a constant integer tensor (int64/int32), or nil.
func (c *ctx) constInts(v string) []int64 { return intsOf(c.constBytes(v, -1)) }

// intsOf decodes constBytes' result as integers, or nil.
func intsOf(t *pb.TensorProto, b []byte) []int64 {
	if t == nil {
		return nil
	}
	switch graph.DataType(t) {
	case pb.TensorProto_INT64:
		out := make([]int64, len(b)/8)
		for i := range out {
			out[i] = int64(binary.LittleEndian.Uint64(b[8*i:]))
		}
		return out
	case pb.TensorProto_INT32:
		out := make([]int64, len(b)/4)
		for i := range out {
			out[i] = int64(int32(binary.LittleEndian.Uint32(b[4*i:])))
		}
		return out
	}
	return nil
}

// scalarFloat returns the single value of a constant float tensor.
func (c *ctx) scalarFloat(v string) (float32, bool) {
	f := c.floatsOf(c.constBytes(v, 1))
	if len(f) != 1 {
		return 0, false
	}
	return f[0], true
}

// scalarInt returns the single value of a constant integer tensor.
func (c *ctx) scalarInt(v string) (int64, bool) {
	f := intsOf(c.constBytes(v, 1))
	if len(f) != 1 {
		return 0, false
	}
	return f[0], true
}

// oneInt reports whether v is a constant of one integer.
func (c *ctx) oneInt(v string) bool {
	_, ok := c.scalarInt(v)
	return ok
}

// isConst reports whether v is a constant (initializer or Constant node).
func (c *ctx) isConst(v string) bool { return c.constTensor(v) != nil }

// forward returns the set of nodes reachable from the given values.
func (c *ctx) forward(vals ...string) map[*pb.NodeProto]bool {
	ps := c.fwdPos(vals...)
	seen := make(map[*pb.NodeProto]bool, len(ps))
	for _, p := range ps {
		seen[c.topo[p]] = true
	}
	return seen
}

// forwardNodes lists, in topological order, the nodes reachable from the
// given values.
func (c *ctx) forwardNodes(vals ...string) []*pb.NodeProto {
	ps := c.fwdPos(vals...)
	slices.Sort(ps)
	return c.nodesAt(ps)
}

// sortByOrder sorts nodes by topological position, looking each position
// up once (sort.Slice on the positions makes the same moves as sorting the
// nodes with a comparator that looks them up).
func (c *ctx) sortByOrder(nodes []*pb.NodeProto) {
	type posNode struct {
		pos int
		n   *pb.NodeProto
	}
	ps := make([]posNode, len(nodes))
	for i, n := range nodes {
		p, _ := c.orderOf(n)
		ps[i] = posNode{int(p), n}
	}
	sort.Slice(ps, func(i, j int) bool { return ps[i].pos < ps[j].pos })
	for i := range ps {
		nodes[i] = ps[i].n
	}
}

// backward returns the nodes v depends on, stopping at values in stop.
func (c *ctx) backward(v string, stop map[string]bool) map[*pb.NodeProto]bool {
	ps := c.backPos(v, c.valueIDs(slices.Collect(maps.Keys(stop))...))
	seen := make(map[*pb.NodeProto]bool, len(ps))
	for _, p := range ps {
		seen[c.topo[p]] = true
	}
	return seen
}

// backwardTo returns the nodes v depends on, not walking on past the inputs
// of nodes for which stop holds (those nodes are included).
func (c *ctx) backwardTo(v string, stop func(*pb.NodeProto) bool) map[*pb.NodeProto]bool {
	seen := map[*pb.NodeProto]bool{}
	j := c.g.ValueID(v)
	if j < 0 || c.d.prod[j] < 0 {
		return seen
	}
	d := c.d
	mk := c.mk
	ep := mk.next()
	stack := []int32{d.prod[j]}
	mk.at[stack[0]] = ep
	for len(stack) > 0 {
		p := stack[len(stack)-1]
		stack = stack[:len(stack)-1]
		seen[c.topo[p]] = true
		if stop(c.topo[p]) {
			continue
		}
		for _, q := range d.inPred[d.inOff[p]:d.inOff[p+1]] {
			if q >= 0 && mk.at[q] != ep {
				mk.at[q] = ep
				stack = append(stack, q)
			}
		}
	}
	return seen
}

// reach answers, lazily, whether a node is in forward(vals...) (within the
// limit in force when it was made): a node is reached when one of its inputs
// is one of vals or is produced by a reached node. Only the nodes asked
// about and their ancestors after the earliest producer of vals are
// visited, so a membership test costs the size of the region between, not
// the rest of the model as a full forward walk would.
type reach struct {
	c   *ctx
	src []int32 // value numbers
	lim []bool
	cut int32 // nodes at or before this topological position cannot be reached
	// memo[p-cut-1]: 0 unknown, 1 not reached (or being visited), 2 reached.
	memo []uint8
}

// reachFrom returns a lazy forward(vals...) for membership tests.
func (c *ctx) reachFrom(vals ...string) *reach {
	r := &reach{c: c, lim: c.lim, cut: int32(len(c.topo))}
	for _, j := range c.valueIDs(vals...) {
		if c.d.consOff[j] == c.d.consOff[j+1] {
			continue
		}
		r.src = append(r.src, j)
		if p := c.d.prod[j]; p >= 0 {
			r.cut = min(r.cut, p)
		} else {
			r.cut = -1
		}
	}
	return r
}

// has reports whether n is in forward(vals...).
func (r *reach) has(n *pb.NodeProto) bool {
	if p, ok := r.c.posOf(n); ok {
		return r.hasPos(p)
	}
	// A synthetic node: reached when an input is a source or is produced
	// by a reached node.
	pos, ok := r.c.synPos[n]
	if len(r.src) == 0 || !ok || pos <= r.cut || r.lim != nil {
		return false
	}
	for _, in := range graph.NodeInputs(n) {
		j := r.c.g.ValueID(in)
		if in == "" || j < 0 {
			continue
		}
		if slices.Contains(r.src, j) || r.c.d.prod[j] >= 0 && r.hasPos(r.c.d.prod[j]) {
			return true
		}
	}
	return false
}

// hasPos is has for the node at topological position p.
func (r *reach) hasPos(p int32) bool {
	if p <= r.cut || len(r.src) == 0 || (r.lim != nil && !r.lim[p]) {
		return false
	}
	i := int(p - r.cut - 1)
	if i >= len(r.memo) {
		r.memo = append(r.memo, make([]uint8, i+1-len(r.memo)+len(r.memo)/2)...)
	}
	if m := r.memo[i]; m != 0 {
		return m == 2
	}
	r.memo[i] = 1 // the graph is acyclic; this only guards against malformed input
	d := r.c.d
	for e := d.inOff[p]; e < d.inOff[p+1]; e++ {
		j := d.inVal[e]
		if j < 0 {
			continue
		}
		if slices.Contains(r.src, j) || d.inPred[e] >= 0 && r.hasPos(d.inPred[e]) {
			r.memo[i] = 2
			return true
		}
	}
	return false
}

// ancestors returns, indexed by topological position, backward(v, nil):
// the producer of v and every node it depends on. The set is kept between
// calls: when the previous root is an ancestor of the new one (the next
// layer of a chained model), only the nodes in between are walked, so
// asking for every layer's router in turn costs one walk over the model
// instead of one per layer. The returned slice must not be modified.
func (c *ctx) ancestors(v string) []bool {
	j := c.g.ValueID(v)
	if j < 0 || c.d.prod[j] < 0 {
		return make([]bool, len(c.topo))
	}
	d := c.d
	root := d.prod[j]
	if c.anc != nil && root == c.ancRoot {
		return c.anc
	}
	if c.anc != nil && !c.anc[root] {
		// Walk back from root, stopping at nodes already in the set: the
		// previous root is reached iff it is an ancestor of root (every path
		// to it runs through its descendants, none of which is in the set).
		mk := c.mk
		ep := mk.next()
		added := c.ancAdded[:0]
		reached := false
		stack := append(c.ancStack[:0], root)
		for len(stack) > 0 {
			p := stack[len(stack)-1]
			stack = stack[:len(stack)-1]
			if c.anc[p] {
				reached = reached || p == c.ancRoot
				continue
			}
			if mk.at[p] == ep {
				continue
			}
			mk.at[p] = ep
			added = append(added, p)
			for _, q := range d.inPred[d.inOff[p]:d.inOff[p+1]] {
				if q >= 0 {
					stack = append(stack, q)
				}
			}
		}
		c.ancAdded, c.ancStack = added, stack
		if reached {
			for _, p := range added {
				c.anc[p] = true
			}
			c.ancRoot = root
			return c.anc
		}
	}
	c.anc, c.ancRoot = make([]bool, len(c.topo)), root
	for _, p := range c.backPos(v, nil) {
		c.anc[p] = true
	}
	return c.anc
}

// masksOut reports whether f, written into a softmax's or a top-k's input
// where a choice is ruled out, masks it out: -inf, or a finite stand-in at
// or below float16's lowest value (-65504), as torch's masked_fill with its
// type's lowest value writes it. The numerical check proves the block
// either way.
func masksOut(f float32) bool { return f <= -65504 }

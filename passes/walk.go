// Package passes holds the graph rewrites of mokopt: the MoE detector, which
// canonicalises every exporter shape of a Mixture-of-Experts block into one
// moe.Spec plus weight sources, and the rewrite that replaces each block with
// one fused ai.mok::MoE node.
package passes

import (
	"encoding/binary"
	"math"
	"sort"

	"github.com/mokopt/mokopt/ep"
	"github.com/mokopt/mokopt/graph"
	pb "github.com/mokopt/mokopt/graph/onnxpb"
)

// noiseOps only change shape, dtype or nothing, and are looked through.
var noiseOps = map[string]bool{"Reshape": true, "Squeeze": true, "Unsqueeze": true, "Identity": true, "Cast": true, "Flatten": true}

// ctx bundles a model and its graph index for the detector.
type ctx struct {
	m     *graph.Model
	g     *graph.Graph
	order map[*pb.NodeProto]int // topological position
	topo  []*pb.NodeProto
	wmm   []*pb.NodeProto // MatMul/Gemm nodes with a constant weight
	ranks map[string]int  // declared ranks of values
	// limit, when set, bounds forward walks to one block's region so that
	// per-branch analysis of a big model stays linear in the block's size.
	limit map[*pb.NodeProto]bool
	// restore rebuilds blocks whose trace lost experts (DetectOptions).
	restore bool
	// sparse maps the synthetic selection nodes standing for sparsemixer
	// routers (sparseMixerAt) to what was read from them.
	sparse map[*pb.NodeProto]*sparseInfo
	// epTable names the EP collectives (see ep.go).
	epTable *ep.Table
	// epClone maps the MoE stand-in of a ShardedMoE node to the node.
	epClone map[*pb.NodeProto]*pb.NodeProto

	wmmSet  map[*pb.NodeProto]bool // the nodes of wmm
	anc     map[*pb.NodeProto]bool // ancRoot and its ancestors (see ancestors)
	ancRoot *pb.NodeProto
	auxTopK map[*pb.NodeProto]bool // nodes from which a TopK is reached without crossing a MatMul/Gemm
	idxDeps *reach                 // per block: what the top-k indices reach (see branchExpert)
	// preds caches, per topological position, the producers of the
	// node's NodeInputs (see predsOf).
	preds [][]*pb.NodeProto
}

// predsOf returns the producers of n's NodeInputs, aligned with them (nil
// where a value has none), cached for nodes of the topological order: the
// detector walks each block's nodes back several times.
func (c *ctx) predsOf(n *pb.NodeProto, ins []string) []*pb.NodeProto {
	pos, ok := c.order[n]
	// Synthetic nodes (sparsemixer selections) share a real node's position.
	ok = ok && pos < len(c.preds) && c.topo[pos] == n
	if ok && c.preds[pos] != nil {
		return c.preds[pos]
	}
	ps := make([]*pb.NodeProto, len(ins))
	for i, in := range ins {
		if in != "" {
			ps[i] = c.g.Producer(in)
		}
	}
	if ok {
		c.preds[pos] = ps
	}
	return ps
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
// nil when v is not a readable constant.
func (c *ctx) constBytes(v string) (*pb.TensorProto, []byte) {
	t := c.constTensor(v)
	if t == nil {
		return nil, nil
	}
	b, err := c.m.TensorBytes(t)
	if err != nil {
		return nil, nil
	}
	return t, b
}

// constFloats decodes a constant float tensor (float32/64/16), or nil.
func (c *ctx) constFloats(v string) []float32 {
	t, b := c.constBytes(v)
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
func (c *ctx) constInts(v string) []int64 {
	t, b := c.constBytes(v)
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
	f := c.constFloats(v)
	if len(f) != 1 {
		return 0, false
	}
	return f[0], true
}

// scalarInt returns the single value of a constant integer tensor.
func (c *ctx) scalarInt(v string) (int64, bool) {
	f := c.constInts(v)
	if len(f) != 1 {
		return 0, false
	}
	return f[0], true
}

// isConst reports whether v is a constant (initializer or Constant node).
func (c *ctx) isConst(v string) bool { return c.constTensor(v) != nil }

// forward returns the set of nodes reachable from the given values.
func (c *ctx) forward(vals ...string) map[*pb.NodeProto]bool {
	seen := map[*pb.NodeProto]bool{}
	stack := append([]string(nil), vals...)
	for len(stack) > 0 {
		v := stack[len(stack)-1]
		stack = stack[:len(stack)-1]
		for _, n := range c.g.Consumers(v) {
			if !seen[n] && (c.limit == nil || c.limit[n]) {
				seen[n] = true
				stack = append(stack, n.Output...)
			}
		}
	}
	return seen
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
		ps[i] = posNode{c.order[n], n}
	}
	sort.Slice(ps, func(i, j int) bool { return ps[i].pos < ps[j].pos })
	for i := range ps {
		nodes[i] = ps[i].n
	}
}

// backward returns the nodes v depends on, stopping at values in stop.
func (c *ctx) backward(v string, stop map[string]bool) map[*pb.NodeProto]bool {
	seen := map[*pb.NodeProto]bool{}
	if stop[v] {
		return seen
	}
	p := c.g.Producer(v)
	if p == nil {
		return seen
	}
	seen[p] = true
	stack := []*pb.NodeProto{p}
	for len(stack) > 0 {
		n := stack[len(stack)-1]
		stack = stack[:len(stack)-1]
		ins := graph.NodeInputs(n)
		for i, q := range c.predsOf(n, ins) {
			if q != nil && !seen[q] && !stop[ins[i]] {
				seen[q] = true
				stack = append(stack, q)
			}
		}
	}
	return seen
}

// backwardTo returns the nodes v depends on, not walking on past the inputs
// of nodes for which stop holds (those nodes are included).
func (c *ctx) backwardTo(v string, stop func(*pb.NodeProto) bool) map[*pb.NodeProto]bool {
	seen := map[*pb.NodeProto]bool{}
	p := c.g.Producer(v)
	if p == nil {
		return seen
	}
	seen[p] = true
	stack := []*pb.NodeProto{p}
	for len(stack) > 0 {
		n := stack[len(stack)-1]
		stack = stack[:len(stack)-1]
		if stop(n) {
			continue
		}
		for _, q := range c.predsOf(n, graph.NodeInputs(n)) {
			if q != nil && !seen[q] {
				seen[q] = true
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
	c     *ctx
	src   map[string]bool
	limit map[*pb.NodeProto]bool
	cut   int // nodes at or before this topological position cannot be reached
	memo  map[*pb.NodeProto]bool
}

// reachFrom returns a lazy forward(vals...) for membership tests.
func (c *ctx) reachFrom(vals ...string) *reach {
	r := &reach{c: c, src: map[string]bool{}, limit: c.limit, cut: len(c.topo), memo: map[*pb.NodeProto]bool{}}
	for _, v := range vals {
		if v == "" || len(c.g.Consumers(v)) == 0 {
			continue
		}
		r.src[v] = true
		if p := c.g.Producer(v); p != nil {
			r.cut = min(r.cut, c.order[p])
		} else {
			r.cut = -1
		}
	}
	return r
}

// has reports whether n is in forward(vals...).
func (r *reach) has(n *pb.NodeProto) bool {
	if v, ok := r.memo[n]; ok {
		return v
	}
	if len(r.src) == 0 || (r.limit != nil && !r.limit[n]) {
		return false
	}
	if pos, ok := r.c.order[n]; !ok || pos <= r.cut {
		return false
	}
	r.memo[n] = false // the graph is acyclic; this only guards against malformed input
	ins := graph.NodeInputs(n)
	ps := r.c.predsOf(n, ins)
	for i, in := range ins {
		if in == "" {
			continue
		}
		if r.src[in] {
			r.memo[n] = true
			return true
		}
		if p := ps[i]; p != nil && r.has(p) {
			r.memo[n] = true
			return true
		}
	}
	return false
}

// ancestors returns backward(v, nil): the producer of v and every node it
// depends on. The set is kept between calls: when the previous root is an
// ancestor of the new one (the next layer of a chained model), only the
// nodes in between are walked, so asking for every layer's router in turn
// costs one walk over the model instead of one per layer. The returned map
// must not be modified.
func (c *ctx) ancestors(v string) map[*pb.NodeProto]bool {
	root := c.g.Producer(v)
	if root == nil {
		return map[*pb.NodeProto]bool{}
	}
	if c.anc != nil && root == c.ancRoot {
		return c.anc
	}
	if c.anc != nil && !c.anc[root] {
		// Walk back from root, stopping at nodes already in the set: the
		// previous root is reached iff it is an ancestor of root (every path
		// to it runs through its descendants, none of which is in the set).
		seen := map[*pb.NodeProto]bool{}
		var added []*pb.NodeProto
		reached := false
		stack := []*pb.NodeProto{root}
		for len(stack) > 0 {
			n := stack[len(stack)-1]
			stack = stack[:len(stack)-1]
			if c.anc[n] {
				reached = reached || n == c.ancRoot
				continue
			}
			if seen[n] {
				continue
			}
			seen[n] = true
			added = append(added, n)
			for _, p := range c.predsOf(n, graph.NodeInputs(n)) {
				if p != nil {
					stack = append(stack, p)
				}
			}
		}
		if reached {
			for _, n := range added {
				c.anc[n] = true
			}
			c.ancRoot = root
			return c.anc
		}
	}
	c.anc, c.ancRoot = c.backward(v, nil), root
	return c.anc
}

func isInf(f float32, sign int) bool { return math.IsInf(float64(f), sign) }

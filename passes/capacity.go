package passes

import (
	"fmt"
	"slices"
	"strconv"
	"strings"

	"github.com/mokopt/mokopt/graph"
	pb "github.com/mokopt/mokopt/graph/onnxpb"
)

// Capacity-limited routers (Switch Transformers, GShard, NLLB-MoE with an
// expert_capacity) give each expert at most C tokens: a token's position in
// its expert's queue is a running count (CumSum) over a one-hot mask of the
// experts the router selected, and assignments whose position passes C are
// masked out. The MoK kernel never drops tokens, so such a block cannot fuse
// without changing what it computes; it is reported as a near-miss naming
// the capacity, never left looking like a model without MoE.
//
// The structure is read from dataflow only: router linear -> (softmax, ...)
// -> ArgMax or TopK -> one-hot (OneHot, or Equal against a constant range)
// -> CumSum -> (offsets, casts) -> comparison against the capacity.

// ClassCapacity and ClassQuantized name the near-miss classes that no
// change to the matcher can fuse as they are (NearMiss.Class).
const (
	ClassCapacity  = "capacity_limited"
	ClassQuantized = "int8_quantized"
)

// capacityRouter is one router whose selections are limited by a capacity.
type capacityRouter struct {
	router *pb.NodeProto   // the router linear
	sel    []*pb.NodeProto // its ArgMax/TopK selections feeding a capacity count
	cmps   []capacityCmp
	nodes  []*pb.NodeProto // CumSum and comparison nodes (to refuse blocks holding them)
}

// capacityCmp is one comparison of a running count against a capacity.
type capacityCmp struct {
	cumsum, cmp *pb.NodeProto
	capacity    int64 // tokens an expert takes; valid when known
	known       bool
	limit       string // the compared value as written
}

// capacityPassOps are the ops a position count passes through between its
// CumSum and the comparison with the capacity.
var capacityPassOps = map[string]bool{"Cast": true, "Identity": true, "Reshape": true, "Squeeze": true, "Unsqueeze": true,
	"Transpose": true, "Gather": true, "Slice": true, "Expand": true, "Flatten": true, "Mul": true, "Sub": true, "Add": true,
	"ReduceSum": true, "ReduceMax": true, "Where": true}

// maskPassOps are the ops a one-hot expert mask passes through before its
// CumSum (casts, re-layouts, a reorder by priority, a padding mask).
var maskPassOps = map[string]bool{"Cast": true, "Identity": true, "Reshape": true, "Squeeze": true, "Unsqueeze": true,
	"Transpose": true, "Gather": true, "Slice": true, "Expand": true, "Flatten": true, "Mul": true}

// capacityRouters finds every capacity-limited router of the graph, in
// topological order of their first selection.
func (c *ctx) capacityRouters() []*capacityRouter {
	byRouter := map[*pb.NodeProto]*capacityRouter{}
	var out []*capacityRouter
	for _, n := range c.topo {
		if n.GetOpType() != "CumSum" || n.GetDomain() != "" || len(n.Input) < 1 || len(n.Output) < 1 {
			continue
		}
		sel := c.oneHotSelection(n.Input[0], 0)
		if sel == nil {
			continue
		}
		router := c.routerLinear(sel.Input[0])
		if router == nil {
			continue
		}
		cmps := c.capacityCompares(n)
		if len(cmps) == 0 {
			continue
		}
		r := byRouter[router]
		if r == nil {
			r = &capacityRouter{router: router}
			byRouter[router] = r
			out = append(out, r)
		}
		if !slices.Contains(r.sel, sel) {
			r.sel = append(r.sel, sel)
		}
		r.nodes = append(r.nodes, n)
		for _, cm := range cmps {
			r.cmps = append(r.cmps, cm)
			r.nodes = append(r.nodes, cm.cmp)
		}
	}
	return out
}

// oneHotSelection returns the ArgMax or TopK whose indices the one-hot mask
// v is made of, or nil.
func (c *ctx) oneHotSelection(v string, depth int) *pb.NodeProto {
	for ; depth < 12; depth++ {
		p := c.g.Producer(v)
		if p == nil || p.GetDomain() != "" || len(p.Input) == 0 {
			return nil
		}
		switch op := p.GetOpType(); {
		case op == "OneHot":
			return c.indexSelection(p.Input[0])
		case op == "Equal" && len(p.Input) == 2:
			// one_hot as indices.unsqueeze(-1) == arange(E)
			for i, in := range p.Input {
				if c.isConst(in) || c.producerOp(in) != nil && c.producerOp(in).GetOpType() == "Range" {
					if s := c.indexSelection(p.Input[1-i]); s != nil {
						return s
					}
				}
			}
			return nil
		case op == "Gather" && len(p.Input) == 2 && c.isConst(p.Input[0]):
			// one_hot as rows of a constant identity: eye(E)[indices]
			return c.indexSelection(p.Input[1])
		case (op == "ScatterElements" || op == "Scatter") && len(p.Input) == 3:
			// one_hot as zeros.scatter(axis, indices, 1)
			return c.indexSelection(p.Input[1])
		case op == "Mul" && len(p.Input) == 2:
			// a mask times a mask (padding, sampling): follow the one that is one-hot
			if s := c.oneHotSelection(p.Input[1], depth+1); s != nil {
				return s
			}
			v = p.Input[0]
		case maskPassOps[op]:
			v = p.Input[0]
		default:
			return nil
		}
	}
	return nil
}

// indexSelection returns the ArgMax or TopK (indices output) that v's
// expert indices come from, or nil.
func (c *ctx) indexSelection(v string) *pb.NodeProto {
	for range 10 {
		p := c.g.Producer(v)
		if p == nil || p.GetDomain() != "" || len(p.Input) == 0 {
			return nil
		}
		switch p.GetOpType() {
		case "ArgMax":
			return p
		case "TopK":
			if len(p.Output) > 1 && p.Output[1] == v {
				return p
			}
			return nil
		case "Cast", "Identity", "Reshape", "Squeeze", "Unsqueeze", "Flatten", "Gather", "Slice", "Transpose", "Split":
			v = p.Input[0]
		default:
			return nil
		}
	}
	return nil
}

// routerLinear returns the linear (MatMul, Gemm, or their fused or
// quantized forms) whose scores v ranks, walking back over the score
// transforms a router applies (softmax, sigmoid, bias, masking), or nil.
func (c *ctx) routerLinear(v string) *pb.NodeProto {
	seen := map[string]bool{}
	var walk func(v string, depth int) *pb.NodeProto
	walk = func(v string, depth int) *pb.NodeProto {
		if depth > 12 || seen[v] || c.isConst(v) {
			return nil
		}
		seen[v] = true
		p := c.g.Producer(v)
		if p == nil {
			return nil
		}
		switch p.GetOpType() {
		case "MatMul", "Gemm", "MatMulInteger", "FusedGemm", "FusedMatMul", "MatMulIntegerToFloat", "DynamicQuantizeMatMul", "QLinearMatMul":
			for _, in := range p.Input[:min(2, len(p.Input))] {
				if c.isConst(in) || c.weightBehind(in) {
					return p
				}
			}
			return nil
		case "Softmax", "LogSoftmax", "Sigmoid", "Exp", "Cast", "Identity", "Reshape", "Squeeze", "Unsqueeze", "Flatten",
			"Transpose", "Add", "Sub", "Mul", "Div", "Where", "Neg", "Tanh", "Clip", "Max", "Min", "DequantizeLinear", "QuantizeLinear":
			for _, in := range p.Input {
				if r := walk(in, depth+1); r != nil {
					return r
				}
			}
		}
		return nil
	}
	return walk(v, 0)
}

// weightBehind reports whether v is a constant seen through a transpose,
// a dequantization or a cast (a linear's weight as exporters write it).
func (c *ctx) weightBehind(v string) bool {
	for range 4 {
		p := c.g.Producer(v)
		if p == nil {
			return c.isConst(v)
		}
		switch p.GetOpType() {
		case "Transpose", "Cast", "Identity", "DequantizeLinear", "Reshape":
			v = p.Input[0]
			if c.isConst(v) {
				return true
			}
		default:
			return false
		}
	}
	return false
}

// capacityCompares follows a CumSum's running count forward to the
// comparisons against a capacity. Constant offsets on the way (the
// 0-based position cumsum-1) are folded into the capacity it reports.
func (c *ctx) capacityCompares(cs *pb.NodeProto) []capacityCmp {
	type item struct {
		v      string
		offset int64 // the value is the 1-based count plus offset
		depth  int
	}
	var out []capacityCmp
	seen := map[string]bool{}
	queue := []item{{cs.Output[0], 0, 0}}
	for len(queue) > 0 {
		it := queue[0]
		queue = queue[1:]
		if seen[it.v] || it.depth > 8 {
			continue
		}
		seen[it.v] = true
		for _, n := range c.g.Consumers(it.v) {
			if n.GetDomain() != "" || len(n.Output) == 0 {
				continue
			}
			op := n.GetOpType()
			if cmp := compareOps[op]; cmp != 0 && len(n.Input) == 2 {
				other, left := n.Input[1], true
				if n.Input[1] == it.v {
					other, left = n.Input[0], false
				}
				out = append(out, c.readCapacity(cs, n, other, left, it.offset))
				continue
			}
			if !capacityPassOps[op] {
				continue
			}
			next := item{n.Output[0], it.offset, it.depth + 1}
			if (op == "Sub" || op == "Add") && len(n.Input) == 2 {
				other := n.Input[1]
				if other == it.v {
					if op == "Sub" {
						continue // capacity minus count: not a position
					}
					other = n.Input[0]
				}
				if k, ok := c.scalarNumber(other); ok {
					if op == "Sub" {
						k = -k
					}
					next.offset += k
				}
				// a non-constant addend queues this assignment after others
				// (second choices after first ones): the bound is unchanged
			}
			queue = append(queue, next)
		}
	}
	return out
}

// compareOps are the comparisons a position is checked with: +1 when the
// position must be below the limit, +2 when it may equal it.
var compareOps = map[string]int{"Less": 1, "LessOrEqual": 2, "Greater": 1, "GreaterOrEqual": 2}

// readCapacity turns `position cmp limit` into the number of tokens an
// expert takes. left says the position is the left operand.
func (c *ctx) readCapacity(cs, cmp *pb.NodeProto, limit string, left bool, offset int64) capacityCmp {
	r := capacityCmp{cumsum: cs, cmp: cmp, limit: limit}
	k, ok := c.scalarNumber(limit)
	if !ok {
		return r
	}
	r.limit = strconv.FormatInt(k, 10)
	op := cmp.GetOpType()
	keeps := left && (op == "Less" || op == "LessOrEqual") || !left && (op == "Greater" || op == "GreaterOrEqual")
	if !keeps {
		return r // a mask of the dropped assignments: the limit is still the capacity
	}
	// kept while count+offset < k (or <= k): count <= k-offset-1 (or k-offset)
	capTokens := k - offset
	if compareOps[op] == 1 {
		capTokens--
	}
	r.capacity, r.known = capTokens, true
	return r
}

// scalarNumber returns the value of a constant scalar, integer or float
// (a float must be integral).
func (c *ctx) scalarNumber(v string) (int64, bool) {
	if k, ok := c.scalarInt(v); ok {
		return k, true
	}
	if f, ok := c.scalarFloat(v); ok && f == float32(int64(f)) {
		return int64(f), true
	}
	return 0, false
}

// reason says what the router does and why MoK cannot fuse it.
func (r *capacityRouter) reason() string {
	var caps []string
	var unknown []string
	seen := map[string]bool{}
	for _, cm := range r.cmps {
		if cm.known {
			s := strconv.FormatInt(cm.capacity, 10)
			if !seen[s] {
				seen[s] = true
				caps = append(caps, s)
			}
		} else if !seen["?"+cm.limit] {
			seen["?"+cm.limit] = true
			unknown = append(unknown, fmt.Sprintf("%s %q against %q (not a constant)", cm.cmp.GetOpType(), graph.NodeLabel(cm.cmp), cm.limit))
		}
	}
	slices.SortFunc(caps, func(a, b string) int {
		x, _ := strconv.ParseInt(a, 10, 64)
		y, _ := strconv.ParseInt(b, 10, 64)
		return int(x - y)
	})
	selBy := "TopK"
	if r.sel[0].GetOpType() == "ArgMax" {
		selBy = "ArgMax"
	}
	how := fmt.Sprintf("top-%d by %s", len(r.sel), selBy)
	if selBy == "TopK" {
		how = "top-k by TopK"
	}
	var capText string
	switch {
	case len(caps) > 0:
		capText = fmt.Sprintf("expert_capacity %s: each expert takes at most %s token(s)", strings.Join(caps, "/"), strings.Join(caps, "/"))
	default:
		capText = "expert capacity computed at run time (" + strings.Join(unknown, "; ") + ")"
	}
	var cmpNames []string
	for _, cm := range r.cmps {
		cmpNames = append(cmpNames, fmt.Sprintf("%s %q", cm.cmp.GetOpType(), graph.NodeLabel(cm.cmp)))
	}
	return fmt.Sprintf("capacity-limited router (router %q, %s): %s, counted by CumSum over the one-hot expert mask and checked by %s; "+
		"tokens past an expert's capacity are dropped, and the MoK kernel never drops tokens, so fusing would change the block's results",
		graph.NodeLabel(r.router), how, capText, strings.Join(cmpNames, ", "))
}

// refuseCapacity reports every capacity-limited router of the graph as a
// near-miss, replacing what detection said of its selections and refusing
// any block that holds its capacity count.
func (c *ctx) refuseCapacity(det *Detection) {
	for _, r := range c.capacityRouters() {
		c.orderCapacity(r)
		refuseClass(det, r.sel, r.nodes, NearMiss{Node: graph.NodeLabel(r.sel[0]), Reason: r.reason(), Class: ClassCapacity,
			Capacity: r.capacities()})
	}
}

// orderCapacity puts r's selections and comparisons in an order that
// does not depend on the graph's node order: the first choice (the
// selection no other selection feeds) first, then by name.
func (c *ctx) orderCapacity(r *capacityRouter) {
	fed := map[*pb.NodeProto]bool{}
	for _, s := range r.sel {
		for _, o := range r.sel {
			if o != s && c.feeds(o, s.Input[0], 12) {
				fed[s] = true
			}
		}
	}
	slices.SortStableFunc(r.sel, func(a, b *pb.NodeProto) int {
		if fed[a] != fed[b] {
			if fed[a] {
				return 1
			}
			return -1
		}
		return strings.Compare(graph.NodeLabel(a), graph.NodeLabel(b))
	})
	slices.SortStableFunc(r.cmps, func(a, b capacityCmp) int {
		return strings.Compare(graph.NodeLabel(a.cmp), graph.NodeLabel(b.cmp))
	})
}

// feeds reports whether node n's outputs reach value v within depth steps
// back from v.
func (c *ctx) feeds(n *pb.NodeProto, v string, depth int) bool {
	seen := map[string]bool{}
	var walk func(v string, d int) bool
	walk = func(v string, d int) bool {
		if d > depth || seen[v] {
			return false
		}
		seen[v] = true
		p := c.g.Producer(v)
		if p == nil {
			return false
		}
		if p == n {
			return true
		}
		for _, in := range p.Input {
			if walk(in, d+1) {
				return true
			}
		}
		return false
	}
	return walk(v, 0)
}

// capacities lists the capacities read (distinct, in order found).
func (r *capacityRouter) capacities() []int64 {
	var out []int64
	for _, cm := range r.cmps {
		if cm.known && !slices.Contains(out, cm.capacity) {
			out = append(out, cm.capacity)
		}
	}
	slices.Sort(out)
	return out
}

// refuseClass records nm for a block selected by sel: a block whose TopK is
// one of sel or whose region holds one of nodes is dropped, the near-misses
// at one of sel or of nodes are replaced by nm, otherwise nm is added.
func refuseClass(det *Detection, sel, nodes []*pb.NodeProto, nm NearMiss) {
	labels := map[string]bool{}
	for _, s := range sel {
		labels[graph.NodeLabel(s)] = true
	}
	hold := map[*pb.NodeProto]bool{}
	held := map[string]bool{} // labels of the block's nodes
	for _, n := range nodes {
		hold[n] = true
		held[graph.NodeLabel(n)] = true
	}
	kept := det.Blocks[:0]
	for _, b := range det.Blocks {
		drop := b.TopK != nil && (slices.Contains(sel, b.TopK) || labels[graph.NodeLabel(b.TopK)])
		for _, n := range b.Region {
			if drop {
				break
			}
			drop = hold[n]
		}
		if !drop {
			kept = append(kept, b)
		}
	}
	det.Blocks = kept
	out := det.NearMiss[:0]
	placed := false
	for _, m := range det.NearMiss {
		if labels[m.Node] || held[m.Node] {
			if !placed {
				out = append(out, nm)
				placed = true
			}
			continue
		}
		out = append(out, m)
	}
	det.NearMiss = out
	if !placed {
		det.NearMiss = append(det.NearMiss, nm)
	}
}

package passes

import (
	"fmt"
	"math"

	"github.com/mokopt/mokopt/graph"
	"github.com/mokopt/mokopt/graph/eval"
	pb "github.com/mokopt/mokopt/graph/onnxpb"
	"github.com/mokopt/mokopt/moe"
)

// Router outputs kept: when a block's router logits, or values computed
// from them inside the block (its probabilities, its chosen experts), are
// also read outside the block (a model output, an auxiliary loss), the
// fused node exposes the logits as its optional second output,
// router_logits, which takes over the graph's logits value. The other
// consumers keep reading what they read; the block's nodes between the
// logits and them stay in the graph (dead-code removal keeps them),
// reading the fused node's logits instead of the router linear's. So the
// consumers compute what they computed, and the router linear runs once.

// exposeLogits is the rule that gives block b (router ri) its
// router_logits output.
//
// Pattern: the router linear's output after its bias, z.
//
// Condition: a node outside b's region, or a graph output, reads z or a
// value of the region computed from z; z holds float32 [T, E] (rank 2),
// what the fused output holds. Otherwise nothing is exposed: a region
// value read outside keeps its nodes, the router linear included, alive
// in the graph, which is exact too.
//
// Replacement: b.RouterLogits = z (the fused node takes it over at
// emission, see takeLogits) and the spec's RouterLogits.
func (c *ctx) exposeLogits(b *Block, ri *routerInfo) {
	z := c.logitsValue(ri)
	if z == "" || !c.readBeside(b, z) || c.rankInfer(z) != 2 {
		return
	}
	dt := c.elemType(z)
	if dt == pb.TensorProto_UNDEFINED && ri.w != nil {
		dt = graph.DataType(ri.w)
	}
	if dt != pb.TensorProto_FLOAT {
		return
	}
	b.RouterLogits = z
	b.Spec.RouterLogits = true
}

// logitsValue returns the value of the router's logits: the router
// linear's output, or the output of the Add of its bias when the bias is
// added apart (through shape ops); "" when that Add is not found.
func (c *ctx) logitsValue(ri *routerInfo) string {
	if ri.linear == nil || len(ri.linear.Output) == 0 {
		return ""
	}
	v := ri.linear.Output[0]
	if ri.bias == nil || gemmBias(ri.linear) != "" {
		return v
	}
	for steps := 0; steps < 8; steps++ {
		cons := c.g.Consumers(v)
		next := ""
		for _, n := range cons {
			if n.GetOpType() == "Add" && len(n.Input) == 2 {
				other := n.Input[0]
				if other == v {
					other = n.Input[1]
				}
				if c.constTensor(other) == ri.bias {
					return n.Output[0]
				}
			}
			if len(cons) == 1 && noiseOps[n.GetOpType()] && n.GetOpType() != "Cast" {
				next = n.Output[0]
			}
		}
		if next == "" {
			return ""
		}
		v = next
	}
	return ""
}

// readBeside reports whether z, or a value b's region computes from it,
// is a graph output or read by a node outside the region (b's output
// aside). The region limit detection sets is in force (see analyze). One
// pass over the region's edges finds the values read outside it (most
// blocks have none); only their producers are asked whether they depend
// on z.
func (c *ctx) readBeside(b *Block, z string) bool {
	d := c.d
	zj := c.g.ValueID(z)
	if zj < 0 || len(b.regionPos) != len(b.Region) {
		return false
	}
	mk := c.mk
	ep := mk.next()
	for _, p := range b.regionPos {
		mk.at[p] = ep
	}
	out := c.g.ValueID(b.Output)
	var escaping []int32 // producers of values read outside the region
	for _, p := range b.regionPos {
		for _, j := range d.outVal[d.outOff[p]:d.outOff[p+1]] {
			if j < 0 || j == out {
				continue
			}
			esc := d.isOut[j]
			for _, q := range d.consumers(j) {
				esc = esc || mk.at[q] != ep
			}
			if esc {
				escaping = append(escaping, p)
				break
			}
		}
	}
	if len(escaping) == 0 {
		return false
	}
	fromZ := c.reachFrom(z)
	for _, p := range escaping {
		if p == d.prod[zj] || fromZ.hasPos(p) {
			return true
		}
	}
	return false
}

// logitsTakeover is what takeLogits detached: the node that computed the
// logits value v, and its position in the graph's node list.
type logitsTakeover struct {
	old    *pb.NodeProto
	oldPos int
	v      string
}

// takeLogits gives the fused node its router_logits output when block b
// exposes them: the node computing b.RouterLogits has that output renamed
// aside and the fused node, not yet added to g, produces the value. It
// returns nil when b exposes none.
func takeLogits(g *graph.Graph, b *Block, node *pb.NodeProto) (*logitsTakeover, error) {
	if b.RouterLogits == "" {
		return nil, nil
	}
	v := b.RouterLogits
	old := g.Producer(v)
	if old == nil {
		return nil, fmt.Errorf("block %s: router logits %q have no producer", b.Name, v)
	}
	pos := int(g.ProducerPos(g.ValueID(v)))
	detached := g.UniqueName(v + "__unfused")
	for i, o := range old.Output {
		if o == v {
			old.Output[i] = detached
		}
	}
	node.Output = append(node.Output, v)
	return &logitsTakeover{old: old, oldPos: pos, v: v}, nil
}

// replaced tells dc that the fused node now computes the logits (a nil t
// does nothing).
func (t *logitsTakeover) replaced(dc *deadCode, fused *pb.NodeProto) {
	if t != nil {
		dc.takeOver(t.old, t.oldPos, fused, t.v)
	}
}

// takeOver is replaced for a further output v of a fused node that
// replaced already numbered: v's readers now read fused, which they keep
// alive, and old loses them.
func (d *deadCode) takeOver(old *pb.NodeProto, oldPos int, fused *pb.NodeProto, v string) {
	d.grow()
	oi := d.at(old, oldPos)
	fi := d.id(fused)
	vid := d.g.ValueID(v)
	first, more := d.readers(vid)
	for _, rs := range [][]int32{first, more} {
		for _, ci := range rs {
			for k, x := range d.valsOf(ci) {
				if x == vid {
					d.predsOf(ci)[k] = fi
				}
			}
		}
	}
	d.consCache[oi], d.consCache[fi] = nil, nil
	refs := int32(0)
	if d.g.IsOutput(v) {
		refs++
	}
	for _, rs := range [][]int32{first, more} {
		for _, ci := range rs {
			if ci != fi && !d.removed[ci] && d.live(ci) {
				refs++
			}
		}
	}
	wasLive, fusedLive := d.live(oi), d.live(fi)
	d.count[fi] += refs
	if !fusedLive && refs > 0 {
		for _, p := range d.predsOf(fi) {
			if p >= 0 {
				d.count[p]++
			}
		}
	}
	d.count[oi] -= refs
	if wasLive && d.count[oi] == 0 {
		d.kill(oi)
	}
}

// checkLogits compares the logits the original graph computed for block b
// (vals[b.RouterLogits]) with the fused node's router_logits on the
// block's input x (T tokens), when b exposes them.
func checkLogits(b *Block, vals map[string]*eval.Tensor, w *moe.Weights, x []float32, T int, where string) error {
	if b.RouterLogits == "" {
		return nil
	}
	z := vals[b.RouterLogits]
	if z == nil || z.F32 == nil || len(z.F32) != T*b.Spec.NumExperts {
		return fmt.Errorf("numerical check: router logits %q not computed as float [%d, %d]", b.RouterLogits, T, b.Spec.NumExperts)
	}
	got, err := moe.RouterLogits(&b.Spec, w, x, T)
	if err != nil {
		return err
	}
	peak := 0.0
	for _, v := range z.F32 {
		peak = max(peak, math.Abs(float64(v)))
	}
	rtol, atol, _ := checkTolerance(computeType(b, pb.TensorProto_FLOAT), peak)
	if off, worst, at := tokensOff(got, z.F32, b.Spec.NumExperts, rtol, atol, nil); off > 0 {
		return fmt.Errorf("numerical check failed: the fused node's router_logits differ from the graph's %q by %.3g at element %d, %d of %d tokens off (%s)", b.RouterLogits, worst, at, off, T, where)
	}
	return nil
}

// dropSideSelections removes the near-misses of selections beside a fused
// block: a TopK (among missed) that reads the router linear of a block of
// det and whose chosen ids reach no expert compute (the top-k an
// auxiliary loss takes of the block's probabilities) is one of that
// router's other consumers, which the fused node serves through its
// router_logits output, not a block of its own.
func (c *ctx) dropSideSelections(det *Detection, missed []*pb.NodeProto) {
	if len(missed) == 0 || len(det.Blocks) == 0 {
		return
	}
	routers := map[*pb.NodeProto]bool{}
	for _, b := range det.Blocks {
		if b.TopK == nil {
			continue
		}
		var ri *routerInfo
		if attempt(func() (e error) { ri, e = c.router(b.TopK); return e }) == nil && ri.linear != nil {
			routers[ri.linear] = true
		}
	}
	drop := map[string]bool{}
	for _, tk := range missed {
		var ri *routerInfo
		if attempt(func() (e error) { ri, e = c.router(tk); return e }) != nil || !routers[ri.linear] || c.feedsExpertCompute(tk) {
			continue
		}
		drop[graph.NodeLabel(tk)] = true
	}
	if len(drop) == 0 {
		return
	}
	kept := det.NearMiss[:0]
	for _, nm := range det.NearMiss {
		if !drop[nm.Node] {
			kept = append(kept, nm)
		}
	}
	det.NearMiss = kept
}

// checkedValues lists the values the numerical check captures for b: its
// input, router input and output, and the router logits it exposes.
func checkedValues(b *Block) []string {
	if b.RouterLogits != "" {
		return []string{b.Input, b.Router, b.Output, b.RouterLogits}
	}
	return []string{b.Input, b.Router, b.Output}
}

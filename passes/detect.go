package passes

import (
	"context"
	"fmt"
	"slices"

	"github.com/mokopt/mokopt/graph"
	pb "github.com/mokopt/mokopt/graph/onnxpb"
	"github.com/mokopt/mokopt/internal/ep"
	"github.com/mokopt/mokopt/moe"
)

// Shape kinds of an MoE block, as exporters write them.
const (
	KindBatched  = "batched"  // top-k indices gather stacked expert weights
	KindUnrolled = "unrolled" // one branch per expert (loop traced or unrolled)
	KindDense    = "dense"    // every expert on every token, weighted by a routing matrix
	KindORT      = "ort"      // an ONNX Runtime com.microsoft::MoE node
)

// Block is one detected MoE block: its semantics, where it sits, and where
// its weights come from.
type Block struct {
	Name   string   `json:"name"`
	Kind   string   `json:"kind"`
	Spec   moe.Spec `json:"spec"`
	Input  string   `json:"input"`  // block input value (hidden states)
	Output string   `json:"output"` // block output value
	Nodes  int      `json:"nodes"`  // nodes in the region the fused node replaces
	// Placement is where an EP block multiplies the routing weights
	// (before_combine or after_combine), or "sharding" for a global block
	// whose EP size comes from sharding annotations; empty otherwise.
	Placement string `json:"placement,omitempty"`
	// Scope says where the block lives when not in the main graph: the
	// subgraph (e.g. `If node "cond"'s then_branch`), outermost first,
	// nested ones joined by " > ".
	Scope string `json:"scope,omitempty"`

	// Router is the value fed to the router linear (may be a reshaped Input).
	Router string          `json:"-"`
	Region []*pb.NodeProto `json:"-"`
	W      *WeightPlan     `json:"-"`
	TopK   *pb.NodeProto   `json:"-"`

	// TracedExperts, when non-zero, says the block was rebuilt from a trace
	// that unrolled its loop over the experts hit at trace time this many
	// times (fewer than Spec.NumExperts): the fused node runs every expert
	// from the stacked weights, where the original graph dropped the
	// contributions of experts past the first TracedExperts hit.
	TracedExperts int `json:"traced_experts,omitempty"`

	// NullExperts, when non-zero, says that the last NullExperts of the
	// router's Spec.NumExperts outputs are null experts: the graph has no
	// expert for them and their selections contribute nothing, and the
	// fused node holds zero weights for them (see nullexperts.go).
	NullExperts int `json:"null_experts,omitempty"`

	// RouterLogits, when set, names the value of the router's logits that
	// the fused node's optional second output takes over: values computed
	// from them are also read outside the block (see logits.go).
	RouterLogits string `json:"router_logits,omitempty"`

	// regionPos holds the topological positions of Region's nodes, when
	// detection found them by position (nil otherwise).
	regionPos []int32
}

// NearMiss is a candidate (a TopK feeding expert-like compute) that was not
// fused, with the first reason.
type NearMiss struct {
	Node   string `json:"node"`
	Reason string `json:"reason"`
	// Class, when set, names a kind of block no matcher change fuses as it
	// is (ClassCapacity, ClassQuantized); Capacity lists the expert
	// capacities a capacity-limited router was read to have.
	Class    string  `json:"class,omitempty"`
	Capacity []int64 `json:"capacity,omitempty"`
	// Scope says where the candidate lives when not in the main graph (a
	// subgraph or a model-local function), as Block.Scope does.
	Scope string `json:"scope,omitempty"`
}

// Detection is the detector's result for a model.
type Detection struct {
	Blocks   []*Block   `json:"blocks"`
	NearMiss []NearMiss `json:"near_misses"`
	// Warnings name what detection saw and left alone although it is
	// not a refusal: a soft mixture of experts (softdense.go).
	Warnings []string `json:"warnings,omitempty"`
}

// DetectOptions changes what Detect accepts.
type DetectOptions struct {
	// RestoreTracedExperts accepts a TorchScript trace whose loop over the
	// experts hit at trace time was unrolled fewer times than there are
	// experts, when every expert's weights are in stacked initializers: the
	// block is rebuilt with all experts (Block.TracedExperts says so).
	RestoreTracedExperts bool
	// Context is checked before each candidate; nil means
	// context.Background().
	Context context.Context
	// Progress, when set, is called with the candidates examined so far and
	// the number of nodes that may start one.
	Progress func(done, total int)
	// EPTable names the EP collectives to recognise; nil means
	// ep.DefaultTable().
	EPTable *ep.Table
}

// Detect finds every MoE block of m: in its main graph and in its
// subgraphs (If branches, Loop and Scan bodies) at any depth. It never
// edits the model.
func Detect(m *graph.Model) (*Detection, error) { return DetectWith(m, DetectOptions{}) }

// DetectWith is Detect with options.
// Detection runs on a canonical working copy of m (see package canon) when
// canonicalization changes anything; the blocks then name its values.
func DetectWith(m *graph.Model, opt DetectOptions) (*Detection, error) {
	return detectScopes(m, opt, true)
}

// detectedHook, set by tests only, edits each block detectIn found.
var detectedHook func(b *Block)

// detectIn is DetectWith over an index g of m's main graph.
func detectIn(m *graph.Model, g *graph.Graph, opt DetectOptions) (*Detection, error) {
	cx := opt.Context
	if cx == nil {
		cx = context.Background()
	}
	tbl := opt.EPTable
	if tbl == nil {
		tbl = ep.DefaultTable()
	}
	c, err := newCtx(m, g)
	if err != nil {
		return nil, err
	}
	c.restore, c.epTable = opt.RestoreTracedExperts, tbl
	l := &candidateLoop{c: c, det: &Detection{}, claimed: make([]bool, len(c.topo)), cols: c.epOps()}
	total, done := 0, 0
	for _, n := range c.topo {
		if n.GetOpType() == "TopK" || isORTMoE(n) {
			total++
		}
	}
	if l.syn, l.found, err = c.speculate(cx, l.cols); err != nil {
		return nil, err
	}
	l.inner = c.innerSelections(l.syn, l.found)
	for i, n := range c.topo {
		if n.GetOpType() == "TopK" || isORTMoE(n) {
			if err := cx.Err(); err != nil {
				return nil, err
			}
			if done++; opt.Progress != nil {
				opt.Progress(done, total)
			}
		}
		l.candidate(i, n)
	}
	l.finish()
	return l.det, nil
}

// candidateLoop carries the state of detectIn's loop over the graph's
// selections: what was found, which nodes found blocks claim (by position),
// and the speculated analyses the loop applies in order.
type candidateLoop struct {
	c       *ctx
	det     *Detection
	claimed []bool          // by position: nodes of a found block
	missed  []*pb.NodeProto // TopK candidates reported as near-misses
	cols    map[*pb.NodeProto]ep.Op
	syn     map[int]*pb.NodeProto
	found   map[*pb.NodeProto]*topKResult
	inner   map[int32]bool
}

// nearMiss reports n as a near-miss for err.
func (l *candidateLoop) nearMiss(n *pb.NodeProto, err error) {
	l.det.NearMiss = append(l.det.NearMiss, NearMiss{Node: graph.NodeLabel(n), Reason: err.Error()})
}

// candidate detects the block of the i-th node n in topological order, if
// it is a candidate: an ONNX Runtime MoE node, a selection of an EP block,
// or a router TopK (or a sparsemixer's selection standing for one).
func (l *candidateLoop) candidate(i int, n *pb.NodeProto) {
	c, det := l.c, l.det
	if n.GetOpType() == ep.ShardedMoEOp && n.GetDomain() == ep.ShardedMoEDomain || isORTMoE(n) {
		detect := c.detectORT
		if !isORTMoE(n) {
			detect = c.detectShardedMoE
		}
		b, err := detect(n)
		if err != nil {
			l.nearMiss(n, err)
			return
		}
		det.Blocks = append(det.Blocks, b)
		return
	}
	if n.GetOpType() == "ArgMax" && !l.claimed[i] && l.syn[i] != nil {
		n = l.syn[i] // a sparsemixer router's selection, as a TopK
	}
	if n.GetOpType() != "TopK" || n.GetDomain() != "" || l.claimed[i] && n == c.topo[i] || l.inner[int32(i)] {
		return
	}
	if c.isAuxTopK(n) {
		return
	}
	if len(l.cols) > 0 && len(c.reachCollectives(l.cols, n.Output...)) > 0 {
		b, err := c.detectEPAt(n, l.cols)
		if err != nil {
			l.nearMiss(n, err)
			c.claimEPLocal(n, l.cols, l.claimed)
			return
		}
		c.claim(l.claimed, b)
		det.Blocks = append(det.Blocks, b)
		return
	}
	r := l.found[n]
	if r == nil { // not foreseen by speculate (cannot happen)
		r = c.detectTopK(n)
	}
	if r.err != nil {
		if r.candidate { // else a TopK used for something else entirely
			l.nearMiss(n, r.err)
			l.missed = append(l.missed, n)
		}
		return
	}
	c.claim(l.claimed, r.b)
	det.Blocks = append(det.Blocks, r.b)
}

// finish drops overlapping blocks and side selections, reports routerless
// experts, refuses capacity-limited and quantized blocks and those whose
// I/O type cannot be set, and names the blocks.
func (l *candidateLoop) finish() {
	c, det := l.c, l.det
	c.dropOverlaps(det)
	c.dropSideSelections(det, l.missed) // logits.go
	// Expert compute selected by a TopK that was reported already is not
	// routerless: only what no TopK reaches is reported by routerlessExperts.
	covered := l.claimed
	if len(l.missed) > 0 {
		covered = slices.Clone(l.claimed)
		for _, tk := range l.missed {
			for _, p := range c.selectedPos(tk) {
				covered[p] = true
			}
		}
	}
	det.NearMiss = append(det.NearMiss, c.routerlessExperts(covered)...)
	det.NearMiss = append(det.NearMiss, c.unreadArgMaxes(covered, l.syn)...)
	det.NearMiss = append(det.NearMiss, c.fixedRoutedExperts(covered)...)
	det.NearMiss = append(det.NearMiss, c.fixedDenseExperts(covered)...)
	det.Warnings = append(det.Warnings, c.softDenseExperts(covered)...)
	c.refuseCapacity(det)  // capacity.go
	c.refuseQuantized(det) // quantized.go
	kept := det.Blocks[:0]
	for _, b := range det.Blocks {
		if err := attempt(func() error { return c.setIOType(b) }); err != nil {
			l.nearMiss(b.TopK, err)
			continue
		}
		kept = append(kept, b)
	}
	det.Blocks = kept
	for i, b := range det.Blocks {
		if b.Name == "" {
			b.Name = fmt.Sprintf("moe_%d", i)
		}
	}
	uniqueBlockNames(det.Blocks)
	if detectedHook != nil {
		for _, b := range det.Blocks {
			detectedHook(b)
		}
	}
}

// newCtx indexes g, the main graph of m, for detection.
func newCtx(m *graph.Model, g *graph.Graph) (*ctx, error) {
	c := &ctx{m: m, g: g}
	topo, err := c.g.TopoSort()
	if err != nil {
		return nil, &graph.InputError{File: m.Name(), Msg: err.Error(), Err: err}
	}
	c.topo = topo
	c.byNode = &nodePositions{}
	c.d = newDense(g, topo)
	c.mk = &marks{at: make([]uint32, len(topo))}
	return c, nil
}

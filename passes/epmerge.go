package passes

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"math"
	"slices"
	"strconv"

	"github.com/mokopt/mokopt/graph"
	"github.com/mokopt/mokopt/graph/eval"
	pb "github.com/mokopt/mokopt/graph/onnxpb"
	"github.com/mokopt/mokopt/internal/ep"
	"github.com/mokopt/mokopt/moe"
	"google.golang.org/protobuf/proto"
)

// expertInputs are the fused node's inputs stacked over experts, the ones
// merge concatenates and split slices along axis 0.
var expertInputs = []int{moe.InGate, moe.InUp, moe.InDown, moe.InGateBias, moe.InUpBias, moe.InDownBias}

// fusedNodes lists a model's ai.mok::MoE nodes in graph order with their specs.
func fusedNodes(m *graph.Model) ([]*pb.NodeProto, []*moe.Spec, error) {
	g := m.Graph()
	var ns []*pb.NodeProto
	var ss []*moe.Spec
	for _, n := range m.Proto.Graph.Node {
		if n.GetDomain() != moe.Domain || n.GetOpType() != moe.OpType {
			continue
		}
		s, err := moe.SpecFromNode(n, func(pos int) []int64 {
			if pos >= len(n.Input) || n.Input[pos] == "" {
				return nil
			}
			if t := g.Initializer(n.Input[pos]); t != nil {
				return t.GetDims()
			}
			return nil
		})
		if err != nil {
			return nil, nil, fmt.Errorf("%s: node %q: %w", m.Name(), graph.NodeLabel(n), err)
		}
		ns = append(ns, n)
		ss = append(ss, s)
	}
	return ns, ss, nil
}

// tensorFloats reads an initializer of m as float32.
func tensorFloats(m *graph.Model, name string) (*pb.TensorProto, []float32, error) {
	t := m.Graph().Initializer(name)
	if t == nil {
		return nil, nil, fmt.Errorf("%s: %q is not an initializer", m.Name(), name)
	}
	b, err := m.TensorBytes(t)
	if err != nil {
		return nil, nil, err
	}
	f, err := graph.DecodeFloat32(graph.DataType(t), b)
	if err != nil {
		return nil, nil, fmt.Errorf("%s: initializer %q: %w", m.Name(), name, err)
	}
	return t, f, nil
}

// cloneInline deep-copies m with every initializer's bytes inline, so the
// copy does not depend on m's side files.
func cloneInline(m *graph.Model) (*graph.Model, error) {
	mp := proto.Clone(m.Proto).(*pb.ModelProto)
	src := m.Proto.Graph.Initializer
	for i, t := range mp.Graph.Initializer {
		// Bytes in a side file, or produced at save time (the fused
		// weights of a rewrite not yet saved), become raw data.
		if _, deferred := m.Deferred(src[i]); !deferred && !graph.IsExternal(t) {
			continue
		}
		b, err := m.TensorBytes(src[i])
		if err != nil {
			return nil, err
		}
		t.RawData = append([]byte(nil), b...)
		t.ExternalData = nil
		t.DataLocation = nil
	}
	return &graph.Model{Proto: mp, Path: "", Dir: m.Dir}, nil
}

// setIntAttr sets (or adds) an integer attribute.
func setIntAttr(n *pb.NodeProto, name string, v int64) {
	for _, a := range n.Attribute {
		if a.GetName() == name {
			a.I = proto.Int64(v)
			return
		}
	}
	n.Attribute = append(n.Attribute, graph.IntAttr(name, v))
}

// MergeReport describes a merge of EP rank models.
type MergeReport struct {
	Ranks int `json:"ranks"`
	// Nodes lists, per fused node of the merged model, its name, E, E/EP, k.
	Nodes []MergedNode `json:"nodes"`
	// MaxAbsErr is the largest |merged − ranks in lockstep| of the group
	// check (CheckGroup), and Checked whether that check ran.
	MaxAbsErr float64 `json:"max_abs_err"`
	Checked   bool    `json:"checked"`
	// Notes says what else the merge changed (static token dims scaled).
	Notes []string `json:"notes,omitempty"`
}

// MergedNode is one fused node of a merged model.
type MergedNode struct {
	Node         string `json:"node"`
	NumExperts   int    `json:"num_experts"`
	LocalExperts int    `json:"local_experts"`
	TopK         int    `json:"top_k"`
	EPSize       int    `json:"ep_size"`
}

// MergeRanks joins the fused rank models of one EP group (any order; each
// node's expert_offset places its experts) into one global model: every
// ai.mok::MoE shard becomes one node holding all E experts, its ep_size
// kept and expert_offset 0, with its function body. Everything else must
// be the same on every rank (the graph, the router and shared-expert
// weights, other initializers); the first difference is an error naming
// the file, node or tensor.
func MergeRanks(ranks []*graph.Model) (*graph.Model, *MergeReport, error) {
	G := len(ranks)
	if G == 0 {
		return nil, nil, fmt.Errorf("no rank models to merge")
	}
	nodes, specs, err := rankFusedNodes(ranks)
	if err != nil {
		return nil, nil, err
	}
	// The graphs must agree outside the expert weights.
	expertW := expertWeightNames(nodes[0])
	for r := 1; r < G; r++ {
		if err := sameOutsideExperts(ranks[0], ranks[r], expertW); err != nil {
			return nil, nil, err
		}
	}
	out, err := cloneInline(ranks[0])
	if err != nil {
		return nil, nil, err
	}
	g := out.Graph()
	rep := &MergeReport{Ranks: G}
	funcs := map[string]bool{}
	for _, f := range out.Proto.Functions {
		if f.GetDomain() == moe.Domain && f.GetName() == moe.OpType {
			funcs[f.GetOverload()] = true
		}
	}
	for i := range nodes[0] {
		mn, err := mergeFusedNode(out, g, ranks, nodes, specs, i, funcs)
		if err != nil {
			return nil, nil, err
		}
		rep.Nodes = append(rep.Nodes, mn)
	}
	dropMetadata(out, MetaEPRank)
	out.SetMetadata(MetaEPSize, strconv.Itoa(G))
	g.Reindex()
	return out, rep, nil
}

// rankFusedNodes lists the fused nodes and specs of every rank model
// (fusedNodes), which must all hold the same number of them, at least one.
func rankFusedNodes(ranks []*graph.Model) ([][]*pb.NodeProto, [][]*moe.Spec, error) {
	nodes := make([][]*pb.NodeProto, len(ranks))
	specs := make([][]*moe.Spec, len(ranks))
	for r, m := range ranks {
		var err error
		if nodes[r], specs[r], err = fusedNodes(m); err != nil {
			return nil, nil, err
		}
		if len(nodes[r]) != len(nodes[0]) {
			return nil, nil, fmt.Errorf("%s has %d fused MoE nodes, %s has %d", m.Name(), len(nodes[r]), ranks[0].Name(), len(nodes[0]))
		}
	}
	if len(nodes[0]) == 0 {
		return nil, nil, fmt.Errorf("%s has no fused ai.mok::MoE node (rewrite the ranks first)", ranks[0].Name())
	}
	return nodes, specs, nil
}

// expertWeightNames is the set of tensors the fused nodes ns take as
// expert weights (expertInputs), which differ from rank to rank.
func expertWeightNames(ns []*pb.NodeProto) map[string]bool {
	expertW := map[string]bool{}
	for _, n := range ns {
		for _, pos := range expertInputs {
			if pos < len(n.Input) && n.Input[pos] != "" {
				expertW[n.Input[pos]] = true
			}
		}
	}
	return expertW
}

// sameOutsideExperts checks that rank model o has base's graph: the same
// nodes (fused nodes may differ in expert_offset and overload) and the same
// initializers but the expert weights expertW; the first difference is the
// error.
func sameOutsideExperts(base, o *graph.Model, expertW map[string]bool) error {
	bg, og := base.Proto.Graph, o.Proto.Graph
	if len(og.Node) != len(bg.Node) {
		return fmt.Errorf("%s has %d nodes, %s %d: the rank graphs differ", o.Name(), len(og.Node), base.Name(), len(bg.Node))
	}
	for i, n := range bg.Node {
		if !proto.Equal(n, og.Node[i]) {
			if n.GetDomain() == moe.Domain && n.GetOpType() == moe.OpType && sameExceptOffset(n, og.Node[i]) {
				continue
			}
			return fmt.Errorf("node %d (%q) differs between %s and %s", i, graph.NodeLabel(n), base.Name(), o.Name())
		}
	}
	for _, t := range bg.Initializer {
		if expertW[t.GetName()] {
			continue
		}
		a, err := base.TensorBytes(t)
		if err != nil {
			return err
		}
		ot := o.Graph().Initializer(t.GetName())
		if ot == nil {
			return fmt.Errorf("%s lacks initializer %q of %s", o.Name(), t.GetName(), base.Name())
		}
		b, err := o.TensorBytes(ot)
		if err != nil {
			return err
		}
		if !slices.Equal(ot.GetDims(), t.GetDims()) || !bytes.Equal(a, b) {
			return fmt.Errorf("initializer %q differs between %s and %s (the router, shared expert and every non-expert tensor must be replicated)", t.GetName(), base.Name(), o.Name())
		}
	}
	return nil
}

// mergeFusedNode turns the i-th fused node of out (a copy of the first
// rank, g its graph) into the global node: every expert weight stacks the shards of all
// ranks in expert order, expert_offset becomes 0 and the node gets the
// global spec's overload, whose function body is added to out unless funcs
// (the overloads out has) holds it already.
func mergeFusedNode(out *graph.Model, g *graph.Graph, ranks []*graph.Model, nodes [][]*pb.NodeProto, specs [][]*moe.Spec, i int, funcs map[string]bool) (MergedNode, error) {
	G := len(ranks)
	n0, s0 := nodes[0][i], specs[0][i]
	if !s0.Shard() || s0.EPSize != G {
		return MergedNode{}, fmt.Errorf("%s: node %q is not a shard of an EP group of %d (ep_size %d, holds %d of %d experts)", ranks[0].Name(), graph.NodeLabel(n0), G, s0.EPSize, s0.StoredExperts(), s0.NumExperts)
	}
	L := s0.LocalExperts
	owner, err := shardOwners(ranks, specs, i, graph.NodeLabel(n0))
	if err != nil {
		return MergedNode{}, err
	}
	outNode := g.Producer(n0.Output[0])
	for _, pos := range expertInputs {
		if pos >= len(n0.Input) || n0.Input[pos] == "" {
			continue
		}
		var all []float32
		var dims []int64
		for slot := 0; slot < G; slot++ {
			r := owner[slot] - 1
			t, f, err := tensorFloats(ranks[r], nodes[r][i].Input[pos])
			if err != nil {
				return MergedNode{}, err
			}
			dims = slices.Clone(t.GetDims())
			all = append(all, f...)
		}
		dims[0] = int64(s0.NumExperts)
		old := g.Initializer(n0.Input[pos])
		*old = *moe.FloatTensorAs(old.GetName(), dims, all, graph.DataType(old))
	}
	gs := *s0
	gs.LocalExperts, gs.ExpertOffset = 0, 0
	setIntAttr(outNode, "expert_offset", 0)
	outNode.Overload = proto.String(gs.Overload())
	if !funcs[gs.Overload()] {
		f, err := moe.Function(&gs, out.Opset(""))
		if err != nil {
			return MergedNode{}, err
		}
		out.Proto.Functions = append(out.Proto.Functions, f)
		funcs[gs.Overload()] = true
	}
	updateProvenance(out, graph.NodeLabel(outNode), gs)
	return MergedNode{Node: graph.NodeLabel(outNode), NumExperts: gs.NumExperts, LocalExperts: L, TopK: gs.TopK, EPSize: G}, nil
}

// shardOwners checks that the ranks' i-th fused nodes (label names them
// in errors) have the same
// semantics but for expert_offset and that no two hold the same experts,
// and returns, per slot of LocalExperts experts, the rank holding it plus
// one.
func shardOwners(ranks []*graph.Model, specs [][]*moe.Spec, i int, label string) ([]int, error) {
	G := len(ranks)
	s0 := specs[0][i]
	L := s0.LocalExperts
	owner := make([]int, G) // owner[slot] = rank+1
	for r := 0; r < G; r++ {
		s := specs[r][i]
		a, b := *s, *s0
		a.ExpertOffset, b.ExpertOffset = 0, 0
		if a != b {
			return nil, fmt.Errorf("node %q: %s and %s have different semantics", label, ranks[r].Name(), ranks[0].Name())
		}
		slot := s.ExpertOffset / L
		if owner[slot] != 0 {
			return nil, fmt.Errorf("node %q: %s and %s both hold experts %d..%d", label, ranks[owner[slot]-1].Name(), ranks[r].Name(), s.ExpertOffset, s.ExpertOffset+L-1)
		}
		owner[slot] = r + 1
	}
	return owner, nil
}

// sameExceptOffset reports whether two fused nodes differ only in
// expert_offset and overload.
func sameExceptOffset(a, b *pb.NodeProto) bool {
	a2, b2 := proto.Clone(a).(*pb.NodeProto), proto.Clone(b).(*pb.NodeProto)
	for _, n := range []*pb.NodeProto{a2, b2} {
		setIntAttr(n, "expert_offset", 0)
	}
	return proto.Equal(a2, b2)
}

func updateProvenance(m *graph.Model, node string, s moe.Spec) {
	key := ProvenanceKey + node
	v, ok := m.Metadata(key)
	if !ok {
		return
	}
	var p Provenance
	if json.Unmarshal([]byte(v), &p) != nil {
		return
	}
	p.Spec = s
	js, _ := json.Marshal(p)
	m.SetMetadata(key, string(js))
}

func dropMetadata(m *graph.Model, key string) {
	kept := m.Proto.MetadataProps[:0]
	for _, p := range m.Proto.MetadataProps {
		if p.GetKey() != key {
			kept = append(kept, p)
		}
	}
	m.Proto.MetadataProps = kept
}

// SplitRanks is the reverse of MergeRanks: it cuts a fused global model
// into G rank models, rank r holding experts [r·E/G, (r+1)·E/G) of every
// ai.mok::MoE node (ep_size G, expert_offset r·E/G, no function body: a
// shard runs only with its group), with MetaEPRank/MetaEPSize set. A node
// whose ep_size is neither 1 nor G is refused.
func SplitRanks(m *graph.Model, G int) ([]*graph.Model, error) {
	ns, ss, err := fusedNodes(m)
	if err != nil {
		return nil, err
	}
	if len(ns) == 0 {
		return nil, fmt.Errorf("%s has no fused ai.mok::MoE node to split", m.Name())
	}
	for i, s := range ss {
		if s.Shard() {
			return nil, fmt.Errorf("%s: node %q is already an EP shard", m.Name(), graph.NodeLabel(ns[i]))
		}
		if s.EPSize != 1 && s.EPSize != G {
			return nil, fmt.Errorf("%s: node %q has ep_size %d, cannot split it %d ways", m.Name(), graph.NodeLabel(ns[i]), s.EPSize, G)
		}
		if G < 1 || s.NumExperts%G != 0 {
			return nil, fmt.Errorf("%s: node %q has %d experts, not divisible into %d ranks", m.Name(), graph.NodeLabel(ns[i]), s.NumExperts, G)
		}
	}
	out := make([]*graph.Model, G)
	for r := 0; r < G; r++ {
		rm, err := cloneInline(m)
		if err != nil {
			return nil, err
		}
		g := rm.Graph()
		used := map[string]bool{}
		for i, n0 := range ns {
			s := *ss[i]
			L := s.NumExperts / G
			n := g.Producer(n0.Output[0])
			for _, pos := range expertInputs {
				if pos >= len(n.Input) || n.Input[pos] == "" {
					continue
				}
				t, f, err := tensorFloats(m, n0.Input[pos])
				if err != nil {
					return nil, err
				}
				per := len(f) / s.NumExperts
				dims := slices.Clone(t.GetDims())
				dims[0] = int64(L)
				old := g.Initializer(n.Input[pos])
				*old = *moe.FloatTensorAs(old.GetName(), dims, slices.Clone(f[r*L*per:(r+1)*L*per]), graph.DataType(old))
			}
			s.EPSize, s.ExpertOffset, s.LocalExperts = G, r*L, L
			setIntAttr(n, "ep_size", int64(G))
			setIntAttr(n, "expert_offset", int64(r*L))
			n.Overload = proto.String(s.Overload())
			updateProvenance(rm, graph.NodeLabel(n), s)
		}
		for _, n := range rm.Proto.Graph.Node {
			if n.GetDomain() == moe.Domain && n.GetOpType() == moe.OpType {
				used[n.GetOverload()] = true
			}
		}
		fs := rm.Proto.Functions[:0]
		for _, f := range rm.Proto.Functions {
			if f.GetDomain() != moe.Domain || f.GetName() != moe.OpType || used[f.GetOverload()] {
				fs = append(fs, f)
			}
		}
		rm.Proto.Functions = fs
		rm.SetMetadata(MetaEPRank, strconv.Itoa(r))
		rm.SetMetadata(MetaEPSize, strconv.Itoa(G))
		divideTokenDims(rm, G)
		g.Reindex()
		out[r] = rm
	}
	return out, nil
}

// CheckGroup runs the rank models of an EP group in lockstep (collectives
// simulated with table tbl; nil: the default table) and the global model
// on the same tokens, on random inputs with tokensPerRank tokens per rank
// (every graph input is split along axis 0, rank r taking the r-th
// block), and returns the largest absolute difference over all outputs.
// With replicated, every rank gets all the tokens and each rank's outputs
// are compared with the global model's whole outputs (ShardedMoE).
func CheckGroup(ctx context.Context, tbl *ep.Table, ranks []*graph.Model, global *graph.Model, tokensPerRank int, seed uint64, replicated bool) (float64, error) {
	G := len(ranks)
	feeds, err := RandomFeeds(global, seed, G*tokensPerRank)
	if err != nil {
		return 0, err
	}
	want, err := eval.Run(ctx, global, feeds, eval.Options{Kernels: evalKernels()})
	if err != nil {
		return 0, fmt.Errorf("global model: %w", err)
	}
	rf := make([]map[string]*eval.Tensor, G)
	for r := range rf {
		rf[r] = map[string]*eval.Tensor{}
	}
	for name, t := range feeds {
		if replicated {
			for r := range rf {
				rf[r][name] = t
			}
			continue
		}
		if len(t.Shape) == 0 || t.Shape[0]%G != 0 {
			return 0, fmt.Errorf("input %q of shape %v cannot be split over %d ranks", name, t.Shape, G)
		}
		per := t.Len() / G
		for r := 0; r < G; r++ {
			shape := append([]int{t.Shape[0] / G}, t.Shape[1:]...)
			switch {
			case t.F32 != nil:
				x := eval.NewFloat32(shape, slices.Clone(t.F32[r*per:(r+1)*per]))
				x.DType = t.DType
				rf[r][name] = x
			case t.I64 != nil:
				x := eval.NewInt64(shape, slices.Clone(t.I64[r*per:(r+1)*per]))
				x.DType = t.DType
				rf[r][name] = x
			default:
				return 0, fmt.Errorf("input %q: only float and integer inputs are split", name)
			}
		}
	}
	got, err := ep.RunRanks(ctx, tbl, ranks, rf, eval.Options{Kernels: evalKernels()})
	if err != nil {
		return 0, err
	}
	worst, bad := 0.0, ""
	for _, o := range global.Proto.Graph.Output {
		name := o.GetName()
		w := want[name]
		var cats [][]float32
		var cat []float32
		for r := range got {
			t := got[r][name]
			if t == nil || t.F32 == nil {
				return 0, fmt.Errorf("rank %d did not compute output %q as float", r, name)
			}
			if replicated {
				cats = append(cats, t.F32)
				continue
			}
			cat = append(cat, t.F32...)
		}
		if !replicated {
			cats = [][]float32{cat}
		}
		for _, cat := range cats {
			if w == nil || len(w.F32) != len(cat) {
				return 0, fmt.Errorf("output %q: the global model gives %d values, the ranks %d", name, len(w.F32), len(cat))
			}
			for i := range cat {
				d := math.Abs(float64(cat[i]) - float64(w.F32[i]))
				if math.IsNaN(d) {
					d = math.Inf(1)
				}
				worst = max(worst, d)
				if d > CheckTolerance.ATol+CheckTolerance.RTol*math.Abs(float64(w.F32[i])) && bad == "" {
					bad = fmt.Sprintf("output %q element %d: ranks %g, global %g", name, i, cat[i], w.F32[i])
				}
			}
		}
	}
	if bad != "" {
		return worst, fmt.Errorf("the EP group and the global model differ (largest |error| %.3g): %s", worst, bad)
	}
	return worst, nil
}

// RewriteRanks fuses the rank models of one EP group and merges them:
// each rank without MetaEPRank metadata is taken to be its position in
// ranks; each is rewritten (its EP blocks become shards); MergeRanks joins
// them; and, with opt.Check, CheckGroup compares the original ranks run in
// lockstep with the merged model on random inputs (two seeds,
// tokensPerRank tokens per rank). The rank models are edited in place.
func RewriteRanks(ranks []*graph.Model, opt Options, tokensPerRank int) (*graph.Model, *MergeReport, []*Report, error) {
	var orig []*graph.Model
	reps := make([]*Report, len(ranks))
	for r, m := range ranks {
		if _, ok := m.Metadata(MetaEPRank); !ok {
			m.SetMetadata(MetaEPRank, strconv.Itoa(r))
		}
		if opt.Check {
			o, err := cloneInline(m)
			if err != nil {
				return nil, nil, nil, err
			}
			orig = append(orig, o)
		}
		ro := opt
		ro.Check = false // one rank alone cannot run its collectives
		rep, err := Rewrite(m, ro)
		reps[r] = rep
		if err != nil {
			return nil, nil, reps, fmt.Errorf("%s: %w", m.Name(), err)
		}
	}
	merged, mrep, err := MergeRanks(ranks)
	if err != nil {
		return nil, nil, reps, err
	}
	replicated, err := replicatedTokens(reps)
	if err != nil {
		return nil, mrep, reps, err
	}
	if !replicated {
		mrep.Notes = append(mrep.Notes, scaleTokenDims(merged, len(ranks))...)
	}
	if opt.Check {
		ctx := opt.Context
		if ctx == nil {
			ctx = context.Background()
		}
		for seed := uint64(1); seed <= 2; seed++ {
			d, err := CheckGroup(ctx, opt.EPTable, orig, merged, tokensPerRank, seed, replicated)
			mrep.MaxAbsErr = max(mrep.MaxAbsErr, d)
			if err != nil {
				return nil, mrep, reps, err
			}
		}
		mrep.Checked = true
	}
	return merged, mrep, reps, nil
}

// replicatedTokens reports whether the group's ranks all see every token
// (ShardedMoE blocks) rather than their own share; a mix is an error.
func replicatedTokens(reps []*Report) (bool, error) {
	n, total := 0, 0
	for _, r := range reps {
		for _, f := range r.Fused {
			total++
			if f.Block.Kind == KindEPShardedMoE {
				n++
			}
		}
	}
	if n > 0 && n != total {
		return false, fmt.Errorf("%d of %d fused blocks are ShardedMoE (every rank sees all tokens) and the others split the tokens over the ranks: the group check cannot feed both", n, total)
	}
	return n > 0, nil
}

// scaleTokenDims multiplies a static leading (token) dim of the merged
// model's graph inputs and outputs by the group size: each rank held T
// tokens, the global model takes the G·T tokens of the group. Symbolic dims
// are left alone. It returns a note per changed value.
func scaleTokenDims(m *graph.Model, G int) []string {
	var notes []string
	for _, list := range [][]*pb.ValueInfoProto{m.Proto.Graph.Input, m.Proto.Graph.Output} {
		for _, v := range list {
			sh := v.GetType().GetTensorType().GetShape()
			if sh == nil || len(sh.Dim) == 0 || m.Graph().Initializer(v.GetName()) != nil {
				continue
			}
			d, ok := sh.Dim[0].Value.(*pb.TensorShapeProto_Dimension_DimValue)
			if !ok {
				continue
			}
			notes = append(notes, fmt.Sprintf("%q: static token dim %d per rank -> %d for the group", v.GetName(), d.DimValue, d.DimValue*int64(G)))
			d.DimValue *= int64(G)
		}
	}
	return notes
}

// divideTokenDims is the inverse of scaleTokenDims for SplitRanks: a static
// leading dim divisible by G becomes the per-rank token count.
func divideTokenDims(m *graph.Model, G int) {
	for _, list := range [][]*pb.ValueInfoProto{m.Proto.Graph.Input, m.Proto.Graph.Output} {
		for _, v := range list {
			sh := v.GetType().GetTensorType().GetShape()
			if sh == nil || len(sh.Dim) == 0 || m.Graph().Initializer(v.GetName()) != nil {
				continue
			}
			if d, ok := sh.Dim[0].Value.(*pb.TensorShapeProto_Dimension_DimValue); ok && d.DimValue%int64(G) == 0 {
				d.DimValue /= int64(G)
			}
		}
	}
}

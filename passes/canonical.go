package passes

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"

	"github.com/mokopt/mokopt/graph"
	"github.com/mokopt/mokopt/graph/eval"
	pb "github.com/mokopt/mokopt/graph/onnxpb"
	"github.com/mokopt/mokopt/moe"
	"github.com/mokopt/mokopt/passes/internal/canon"
	"google.golang.org/protobuf/proto"
)

// canonicalView returns the canonical working copy detection runs on (see
// package canon) and what canonicalization did. A model canonicalization
// cannot handle is detected as it is, with the reason as a note.
func canonicalView(ctx context.Context, m *graph.Model) (*graph.Model, *canon.Result, string) {
	wc, res, err := canon.Canonicalize(ctx, m, canon.Options{KeepFunctionDomains: []string{moe.Domain}})
	if err != nil {
		return nil, nil, fmt.Sprintf("canonicalization skipped: %v", err)
	}
	if !res.Changed() {
		return nil, res, ""
	}
	return wc, res, ""
}

// Evaluable returns a model that computes what m computes, for the
// reference interpreter (graph/eval): m itself when the interpreter runs
// every op m uses, otherwise m's canonical working copy, whose ONNX
// Runtime contrib ops are decomposed into standard ops and whose sequence
// ops with static splits are tensor ops (see package canon). The copy may
// still hold ops the interpreter lacks; running it then names them. m is
// not edited.
func Evaluable(ctx context.Context, m *graph.Model) *graph.Model {
	if len(eval.UnsupportedOps(m)) == 0 {
		return m
	}
	if wc, _, _ := canonicalView(ctx, m); wc != nil {
		return wc
	}
	return m
}

// detectCanonical is detectIn over the canonical working copy of m when
// canonicalization changed anything; the blocks then name values and nodes
// of the working copy.
func detectCanonical(m *graph.Model, opt DetectOptions) (*Detection, error) {
	ctx := opt.Context
	if ctx == nil {
		ctx = context.Background()
	}
	wc, _, _ := canonicalView(ctx, m)
	if wc == nil {
		return detectIn(m, m.Graph(), opt)
	}
	return detectIn(wc, wc.Graph(), opt)
}

// rewriteCanonical runs rewriteIn on the canonical working copy of m and
// splices the fused nodes into m (see splice). When canonicalization
// changes nothing, it is rewriteIn on m itself. m is not edited unless a
// block fuses.
func rewriteCanonical(m *graph.Model, opt Options) (*Report, error) {
	ctx := opt.Context
	if ctx == nil {
		ctx = context.Background()
	}
	wc, res, skipped := canonicalView(ctx, m)
	return rewriteOn(m, wc, res, skipped, opt)
}

// rewriteOn is rewriteCanonical given canonicalView's results for m: wc
// (nil when m is its own canonical form), res, and skipped (why
// canonicalization was skipped, if it was).
func rewriteOn(m, wc *graph.Model, res *canon.Result, skipped string, opt Options) (*Report, error) {
	target := m
	if wc != nil {
		target = wc
	}
	rep, err := rewriteIn(target, opt)
	rep, err = viewed(rep, err, wc, res, skipped)
	if wc == nil || err != nil || rep == nil || len(rep.Fused) == 0 {
		return rep, err
	}
	if err := splice(m, wc, rep, res); err != nil {
		return rep, fmt.Errorf("splicing the fused nodes into the model: %w", err)
	}
	rep.Warnings = append(rep.Warnings, res.Notes...)
	return rep, nil
}

// viewed adds to rewriteIn's result what canonicalView's outcome says: why
// canonicalization was skipped (a warning), or, for an error on the
// working copy wc, why the opset was not raised.
func viewed(rep *Report, err error, wc *graph.Model, res *canon.Result, skipped string) (*Report, error) {
	if skipped != "" && rep != nil {
		rep.Warnings = append(rep.Warnings, skipped)
	}
	if wc != nil && err != nil && res.OpsetRefused != "" {
		err = fmt.Errorf("%w; the opset was not raised: %s", err, res.OpsetRefused)
	}
	return rep, err
}

// splicer carries the state of one splice (see splice): the model m, the
// working copy wc, and what the copy added, detached and removed per fused
// node.
type splicer struct {
	m, wc        *graph.Model
	mg, wg       *graph.Graph
	rep          *Report
	callsBefore  map[string]bool          // functions m's nodes called before
	rename       map[string]string        // wc value name -> name in m, for values m lacks
	copied       map[*pb.NodeProto]bool   // nodes of wc already copied
	detached     [][]*pb.NodeProto        // per fused node: old producers of values it took over
	added        []*pb.NodeProto          // the copies, added to m together
	domains      map[string]bool          // domains of the copies
	dead         map[*pb.NodeProto]bool   // nodes of m that feed no graph output
	owner        map[*pb.NodeProto]int    // dead node -> the fused node it is attributed to
	removedNodes [][]string               // per fused node: the nodes removed
	removedInits [][]string               // per fused node: the initializers removed
	initOwner    map[string]int           // initializer dead nodes read -> fused node
	byName       map[string]*pb.NodeProto // fused nodes of wc by name
}

// splice copies the fused nodes of the working copy wc into m, which
// computes the same values under the same names wherever wc kept them.
//
// For each fused node F: the nodes of wc from F forward to the first values
// that m also has (none when F's output is such a value), and backward from
// those nodes to values m has (the new weight initializers, or nodes of an
// inlined function when a block boundary lies inside one) are copied into
// m; each value m has that a copied node computes is taken from its old
// producer in m. Then the nodes of m that feed no graph output are removed
// (as rewriteIn does: those the fused nodes replaced, and dead code that was
// there before), with the initializers only they read and the model-local
// functions no node calls any more. Nothing else in m changes.
func splice(m, wc *graph.Model, rep *Report, res *canon.Result) error {
	if res.OpsetTo > m.Opset("") {
		if _, err := canon.RaiseOpset(canon.NewWork(m, canon.Options{}), res.OpsetTo); err != nil {
			return err
		}
	}
	sp := &splicer{m: m, wc: wc, mg: m.Graph(), wg: wc.Graph(), rep: rep,
		rename: map[string]string{}, copied: map[*pb.NodeProto]bool{}, detached: make([][]*pb.NodeProto, len(rep.Fused)),
		domains: map[string]bool{}, byName: map[string]*pb.NodeProto{}}
	if len(m.Proto.Functions) > 0 {
		sp.callsBefore = calledFunctions(sp.mg.P.Node)
	}
	for _, n := range sp.wg.P.Node {
		if n.GetDomain() == moe.Domain && n.GetOpType() == moe.OpType {
			sp.byName[n.GetName()] = n
		}
	}
	if calls, err := sp.sharedCalls(); err != nil {
		return err
	} else if len(calls) > 0 {
		if err := canon.InlineCalls(m, calls); err != nil {
			return err
		}
		sp.mg = m.Graph()
	}
	for i := range rep.Fused {
		if err := sp.copyFused(i); err != nil {
			return err
		}
	}
	for _, c := range sp.added {
		sp.mg.AddNode(c) // now the producer of the values it takes over
	}
	sp.addDeclarations()
	sp.findDead()
	sp.attributeDead()
	sp.removeDead()
	if err := sp.mg.Sort(); err != nil {
		return err
	}
	sp.recordProvenance()
	if errs := sp.mg.Validate(); len(errs) > 0 {
		return errors.Join(errs...)
	}
	return nil
}

// sharedCalls lists the calls of model-local functions in m one of whose
// outputs a fused node takes over while another of them stays in use (a
// function that computes an MoE block and something from its output): the
// fused node replaces part of the body, so the call must be inlined in m
// first, or it would keep computing the block unfused.
func (sp *splicer) sharedCalls() ([]*pb.NodeProto, error) {
	if len(sp.m.Proto.Functions) == 0 {
		return nil, nil
	}
	var calls []*pb.NodeProto
	seen := map[*pb.NodeProto]bool{}
	for i := range sp.rep.Fused {
		F := sp.byName[sp.rep.Fused[i].Node]
		if F == nil {
			continue
		}
		set, _, err := sp.forwardSet(F)
		if err != nil {
			return nil, err
		}
		for _, n := range set {
			for _, o := range n.Output {
				p := sp.mg.Producer(o)
				if o == "" || p == nil || seen[p] || !canon.IsLocalCall(sp.m, p) {
					continue
				}
				for _, other := range p.Output {
					if other != o && other != "" && (sp.mg.IsOutput(other) || len(sp.mg.Consumers(other)) > 0) {
						seen[p] = true
						calls = append(calls, p)
						break
					}
				}
			}
		}
	}
	return calls, nil
}

// has reports whether m has value v (the empty name stands for a missing
// optional input).
func (sp *splicer) has(v string) bool {
	return v == "" || sp.mg.Producer(v) != nil || sp.mg.Initializer(v) != nil || sp.mg.IsInput(v)
}

// nameIn is the name in m of wc's value v: its own when m has it, else a
// new unique one.
func (sp *splicer) nameIn(v string) string {
	if sp.has(v) {
		return v
	}
	if r, ok := sp.rename[v]; ok {
		return r
	}
	r := sp.mg.UniqueName(v)
	sp.rename[v] = r
	return r
}

// copyFused copies the i-th fused node of wc, and what lies between it and
// values m has, into m.
func (sp *splicer) copyFused(i int) error {
	f := &sp.rep.Fused[i]
	F := sp.byName[f.Node]
	if F == nil {
		return fmt.Errorf("fused node %s not found in the working copy", f.Node)
	}
	set, seen, err := sp.forwardSet(F)
	if err != nil {
		return err
	}
	if set, err = sp.backwardSet(set, seen); err != nil {
		return err
	}
	for _, n := range set {
		if sp.copied[n] {
			continue
		}
		sp.copied[n] = true
		if err := sp.copyNode(i, n, F, f); err != nil {
			return err
		}
	}
	return nil
}

// forwardSet lists F and the nodes of wc from F forward to the values m has.
func (sp *splicer) forwardSet(F *pb.NodeProto) ([]*pb.NodeProto, map[*pb.NodeProto]bool, error) {
	set := []*pb.NodeProto{F}
	seen := map[*pb.NodeProto]bool{F: true}
	queue := slices.Clone(F.Output)
	for len(queue) > 0 {
		v := queue[0]
		queue = queue[1:]
		if v == "" || sp.has(v) {
			continue
		}
		if sp.wg.IsOutput(v) {
			return nil, nil, fmt.Errorf("graph output %q exists only in the canonical form", v)
		}
		for _, c := range sp.wg.Consumers(v) {
			if !seen[c] {
				seen[c] = true
				set = append(set, c)
				queue = append(queue, c.Output...)
			}
		}
	}
	return set, seen, nil
}

// backwardSet adds to set what its nodes read that m lacks: wc's
// initializers are added to m, their producers to set.
func (sp *splicer) backwardSet(set []*pb.NodeProto, seen map[*pb.NodeProto]bool) ([]*pb.NodeProto, error) {
	for j := 0; j < len(set); j++ {
		for _, v := range graph.NodeInputs(set[j]) {
			if sp.has(v) {
				continue
			}
			if t := sp.wg.Initializer(v); t != nil {
				if sp.mg.Initializer(sp.nameIn(v)) == nil {
					nt := proto.Clone(t).(*pb.TensorProto)
					nt.Name = proto.String(sp.nameIn(v))
					if d, ok := sp.wc.Deferred(t); ok {
						sp.m.SetDeferred(nt, d)
					}
					sp.mg.AddInitializer(nt)
				}
				continue
			}
			p := sp.wg.Producer(v)
			if p == nil {
				return nil, fmt.Errorf("value %q of the canonical form has no producer", v)
			}
			if !seen[p] {
				seen[p] = true
				set = append(set, p)
			}
		}
	}
	return set, nil
}

// copyNode copies wc's node n for the i-th fused node f (whose node in wc
// is F): its inputs renamed into m, and each output m has taken from its old
// producer, which is detached.
func (sp *splicer) copyNode(i int, n, F *pb.NodeProto, f *Fused) error {
	mg := sp.mg
	c := graph.CopyNode(n)
	for k, v := range c.Input {
		c.Input[k] = sp.nameIn(v)
	}
	for k, o := range c.Output {
		if o != "" && sp.has(o) {
			old := mg.Producer(o)
			if old == nil {
				return fmt.Errorf("value %q is not computed by a node in the model", o)
			}
			d := mg.UniqueName(o + "__unfused")
			for x := range old.Output {
				if old.Output[x] == o {
					old.Output[x] = d
				}
			}
			sp.detached[i] = append(sp.detached[i], old)
			continue
		}
		c.Output[k] = sp.nameIn(o)
	}
	if c.GetName() != "" {
		c.Name = proto.String(mg.UniqueName(c.GetName()))
		if n == F {
			f.Node = c.GetName()
		}
	}
	sp.domains[c.GetDomain()] = true
	sp.added = append(sp.added, c)
	return nil
}

// addDeclarations adds the domains, functions and versions the copied
// nodes need.
func (sp *splicer) addDeclarations() {
	m, wc := sp.m, sp.wc
	domains := make([]string, 0, len(sp.domains))
	for d := range sp.domains {
		domains = append(domains, d)
	}
	slices.Sort(domains)
	for _, d := range domains {
		if m.Opset(d) == 0 {
			if v := wc.Opset(d); v != 0 {
				m.SetOpset(d, v)
			}
		}
	}
	have := map[*pb.FunctionProto]bool{}
	for _, f := range m.Proto.Functions {
		have[f] = true
	}
	for _, f := range wc.Proto.Functions {
		if !have[f] {
			m.Proto.Functions = append(m.Proto.Functions, f)
		}
	}
	m.SetOpset(moe.Domain, moe.Version)
	if m.Proto.GetIrVersion() < 10 {
		m.Proto.IrVersion = proto.Int64(10) // function overloads need IR 10
	}
}

// findDead marks what became dead. As rewriteIn does, dead code that was
// there before goes too (it is attributed to the first fused node).
func (sp *splicer) findDead() {
	mg := sp.mg
	liveAfter := liveNodes(mg)
	sp.dead = make(map[*pb.NodeProto]bool, len(mg.P.Node)-len(liveAfter))
	for _, n := range mg.P.Node {
		if !liveAfter[n] {
			sp.dead[n] = true
		}
	}
}

// attributeDead attributes the dead nodes to the fused node whose detached
// producers they fed (the first one for the others), and each initializer
// they read to the last fused node among its readers' owners.
func (sp *splicer) attributeDead() {
	mg := sp.mg
	sp.owner = map[*pb.NodeProto]int{}
	for i, ds := range sp.detached {
		stack := slices.Clone(ds)
		for len(stack) > 0 {
			p := stack[len(stack)-1]
			stack = stack[:len(stack)-1]
			if p == nil || !sp.dead[p] {
				continue
			}
			if _, ok := sp.owner[p]; ok {
				continue
			}
			sp.owner[p] = i
			for _, v := range graph.NodeInputs(p) {
				stack = append(stack, mg.Producer(v))
			}
		}
	}
	nf := len(sp.rep.Fused)
	sp.removedNodes, sp.removedInits = make([][]string, nf), make([][]string, nf)
	sp.initOwner = map[string]int{}
	for _, n := range mg.P.Node {
		if !sp.dead[n] {
			continue
		}
		if _, ok := sp.owner[n]; !ok {
			sp.owner[n] = 0
		}
		i := sp.owner[n]
		sp.removedNodes[i] = append(sp.removedNodes[i], graph.NodeLabel(n))
		for _, v := range graph.NodeInputs(n) {
			if mg.Initializer(v) == nil {
				continue
			}
			// As in block-by-block removal, an initializer several
			// blocks read goes with the last of them: the one whose
			// removal leaves it without readers.
			if j, ok := sp.initOwner[v]; !ok || i > j {
				sp.initOwner[v] = i
			}
		}
	}
}

// removeDead removes the dead nodes, the initializers only they read (with
// their graph inputs, when they are ones: see deadCode.removeDeadIn), and
// the model-local functions no node calls any more.
func (sp *splicer) removeDead() {
	m, mg := sp.m, sp.mg
	keptInits := mg.P.Initializer[:0]
	goneInputs := map[string]bool{}
	for _, t := range mg.P.Initializer {
		v := t.GetName()
		if i, ok := sp.initOwner[v]; ok && !mg.IsOutput(v) && !slices.ContainsFunc(mg.Consumers(v), func(c *pb.NodeProto) bool { return !sp.dead[c] }) {
			sp.removedInits[i] = append(sp.removedInits[i], v)
			goneInputs[v] = mg.IsInput(v)
			continue
		}
		keptInits = append(keptInits, t)
	}
	mg.P.Initializer = keptInits
	mg.P.Input = slices.DeleteFunc(mg.P.Input, func(in *pb.ValueInfoProto) bool { return goneInputs[in.GetName()] })
	mg.RemoveNodes(sp.dead) // reindexes, initializers included
	var callsAfter map[string]bool
	if len(m.Proto.Functions) > 0 {
		callsAfter = calledFunctions(mg.P.Node)
	}
	keptFuncs := m.Proto.Functions[:0]
	for _, f := range m.Proto.Functions {
		k := funcKey(f.GetDomain(), f.GetName(), f.GetOverload())
		if sp.callsBefore[k] && !callsAfter[k] && f.GetDomain() != moe.Domain {
			continue
		}
		keptFuncs = append(keptFuncs, f)
	}
	m.Proto.Functions = keptFuncs
}

// recordProvenance writes each fused node's provenance and removal counts.
func (sp *splicer) recordProvenance() {
	for i := range sp.rep.Fused {
		f := &sp.rep.Fused[i]
		b := f.Block
		nodes, inits := sp.removedNodes[i], sp.removedInits[i]
		prov := Provenance{Node: f.Node, Kind: b.Kind, Nodes: nodes, Initializers: inits, Spec: b.Spec, TracedExperts: b.TracedExperts, SourceType: sourceType(b)}
		js, _ := json.Marshal(prov)
		sp.m.SetMetadata(ProvenanceKey+f.Node, string(js))
		f.NodesRemoved, f.InitsRemoved = len(nodes), len(inits)
	}
}

// liveNodes returns the nodes of g whose outputs reach a graph output.
func liveNodes(g *graph.Graph) map[*pb.NodeProto]bool {
	live := make(map[*pb.NodeProto]bool, len(g.P.Node))
	var stack []string
	for _, v := range g.P.Output {
		stack = append(stack, v.GetName())
	}
	for len(stack) > 0 {
		v := stack[len(stack)-1]
		stack = stack[:len(stack)-1]
		p := g.Producer(v)
		if p == nil || live[p] {
			continue
		}
		live[p] = true
		stack = append(stack, graph.NodeInputs(p)...)
	}
	return live
}

func funcKey(domain, name, overload string) string { return domain + "\x00" + name + "\x00" + overload }

// calledFunctions lists the (domain, op, overload) keys the nodes call,
// and those their subgraphs' nodes call, at any depth.
func calledFunctions(ns []*pb.NodeProto) map[string]bool {
	out := map[string]bool{}
	usesOf(&pb.GraphProto{Node: ns}, map[string]bool{}, out)
	return out
}

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

// hasScopes reports whether m holds something the main graph's rewrite
// does not search: a subgraph that may hold a block, or a model-local
// function that is not inlined and holds a router (see unsearchedFunctions).
func hasScopes(m *graph.Model) bool {
	for _, s := range scopeSites(m.Proto.GetGraph()) {
		if holdsSelection(m, s.g) {
			return true
		}
	}
	return len(subgraphCalls(m, m.Proto.GetGraph())) > 0 || len(unsearchedFunctions(m)) > 0
}

// rewriteScopes is rewriteCanonical that also searches subgraphs (see
// subgraph.go) and reports the routers of functions it cannot search.
// With Partial off, nothing is edited unless every candidate of every
// scope fuses.
func rewriteScopes(m *graph.Model, opt Options) (*Report, error) {
	if !hasScopes(m) {
		return rewriteCanonical(m, opt)
	}
	ctx := opt.Context
	if ctx == nil {
		ctx = context.Background()
	}
	env := &scopeEnv{names: map[string]bool{}, captured: map[*pb.TensorProto]bool{}}
	graph.AllNames(m.Proto.GetGraph(), env.names)
	calledBefore := modelCalls(m)
	target := m
	if len(subgraphCalls(m, m.Proto.GetGraph())) > 0 {
		target = editableCopy(m) // calls are inlined there (see subgraph_inline.go)
		if _, err := inlineSubgraphCalls(target, env.names); err != nil {
			return nil, err
		}
	}
	if opt.Check {
		env.binds, env.bindErr = collectBindings(ctx, target, opt)
	}
	rep, err := rewriteScoped(target, opt, env, unsearchedFunctions(m))
	if err != nil || len(rep.Fused) == 0 {
		return rep, err
	}
	if target != m {
		adopt(m, target)
	}
	dropUnused(m, env.captured, calledBefore)
	if errs := m.Graph().Validate(); len(errs) > 0 {
		return rep, fmt.Errorf("the rewritten model: %v", errs[0])
	}
	return rep, nil
}

// siteResult is one subgraph rewritten as a scope model.
type siteResult struct {
	site  scopeSite
	sm    *graph.Model
	outer map[*pb.TensorProto]bool
	rep   *Report
}

// rewriteScoped rewrites m's subgraphs as scope models, then m's main
// graph (told of the scopes' refusals, so that with Partial off it edits
// nothing when any failed), then puts what fused in the subgraphs back.
// pending are refusals found before (functions not searched). m must be
// a model the rewrite may edit: calls of functions whose bodies hold
// subgraphs are inlined into it first.
func rewriteScoped(m *graph.Model, opt Options, env *scopeEnv, pending []NearMiss) (*Report, error) {
	if _, err := inlineSubgraphCalls(m, env.names); err != nil {
		return nil, err
	}
	g := m.Graph()
	pend := &Report{NearMiss: pending}
	var subs []siteResult
	var sites []scopeSite
	searched := map[*pb.GraphProto]bool{} // rewritten at the scope model's opset when they fuse
	for _, s := range scopeSites(m.Proto.GetGraph()) {
		if holdsSelection(m, s.g) {
			sites = append(sites, s)
			searched[s.g] = true
		}
	}
	for _, s := range sites {
		if err := contextOf(opt).Err(); err != nil {
			return nil, err
		}
		r := rewriteSite(m, g, s, opt, env, searched)
		pend.NearMiss = append(pend.NearMiss, r.rep.NearMiss...)
		pend.Refused = append(pend.Refused, r.rep.Refused...)
		pend.Warnings = append(pend.Warnings, r.rep.Warnings...)
		if len(r.rep.Fused) > 0 {
			subs = append(subs, r)
		}
	}
	mo := opt
	mo.pending = pend
	mo.checkAhead = nil
	rep, err := rewriteCanonical(m, mo)
	if err != nil || rep == nil {
		return rep, err
	}
	rep.Warnings = append(rep.Warnings, pend.Warnings...)
	for _, r := range subs {
		fused, err := commitScope(m, r, env)
		if err != nil {
			return rep, fmt.Errorf("putting the fused nodes of %s back: %w", r.site.where(), err)
		}
		rep.Fused = append(rep.Fused, fused...)
		for t := range r.outer {
			env.captured[t] = true
		}
	}
	if len(subs) > 0 {
		pruneDead(m, env)
	}
	return rep, raiseAfterScopes(m, subs)
}

// raiseAfterScopes raises m's default opset to the highest one a fused
// scope model was rewritten at (an old-opset export fused inside an If
// branch), converting the main graph and the subgraphs that were not
// rewritten; rewriteSite checked that it can.
func raiseAfterScopes(m *graph.Model, subs []siteResult) error {
	to := m.Opset("")
	done := map[*pb.GraphProto]bool{}
	for _, r := range subs {
		to = max(to, r.sm.Opset(""))
		done[r.sm.Proto.Graph] = true
	}
	if to <= m.Opset("") {
		return nil
	}
	if _, err := canon.RaiseOpsetWithSubgraphs(canon.NewWork(m, canon.Options{}), to, done); err != nil {
		return fmt.Errorf("raising the default opset from %d to %d for the fused subgraphs: %w", m.Opset(""), to, err)
	}
	return nil
}

// contextOf is opt's context, or the background one.
func contextOf(opt Options) context.Context {
	if opt.Context != nil {
		return opt.Context
	}
	return context.Background()
}

// rewriteSite rewrites subgraph s of m as a scope model (Partial on: the
// caller decides). Its report names every entry with the scope; a scope
// that cannot be rewritten refuses each of its routers with the reason.
//
// A scope model rewritten at a newer default opset than m's (canonicalization
// raises old opsets) fuses only when the rest of m can be raised to it:
// the main graph and every subgraph but those in searched, which are
// rewritten at that opset too when they fuse.
func rewriteSite(m *graph.Model, g *graph.Graph, s scopeSite, opt Options, env *scopeEnv, searched map[*pb.GraphProto]bool) siteResult {
	where := s.where()
	if env.depth >= maxScopeDepth {
		return siteResult{site: s, rep: &Report{Refused: unsearched(s.g, where, fmt.Sprintf("subgraphs nest deeper than %d (a recursive function?)", maxScopeDepth))}}
	}
	env.depth++
	defer func() { env.depth-- }()
	bind := env.binds[s.g]
	sm, outer := standalone(m, g, s, bind)
	so := opt
	so.Partial, so.checkAhead, so.beforeEdit, so.Progress, so.pending = true, nil, nil, nil, nil
	so.CheckData = nil
	if data := bindFeeds(sm, bind); data != nil {
		so.CheckData = []map[string]*eval.Tensor{data}
	}
	rep, err := rewriteScoped(sm, so, env, nil)
	if err == nil && len(rep.Fused) > 0 && sm.Opset("") > m.Opset("") {
		if cerr := canon.CheckRaiseOpset(m, sm.Opset(""), searched); cerr != nil {
			err = fmt.Errorf("fusing it needs the default opset raised from %d to %d (a subgraph shares the model's opset), and %w", m.Opset(""), sm.Opset(""), cerr)
		}
	}
	if err != nil {
		why := "the subgraph could not be rewritten: " + err.Error()
		switch {
		case env.bindErr != nil:
			why += fmt.Sprintf("; the values it was checked on come from a run of the model on random inputs of its declared dims, which fails (%v): %s", env.bindErr, declaredDimsAdvice)
		case len(opt.CheckData) == 0 && errors.Is(err, errOriginalFails):
			why += "; the values it was checked on come from a run of the model on random inputs of its declared dims, and the subgraph does not run on them: " + declaredDimsAdvice
		}
		return siteResult{site: s, rep: &Report{Refused: unsearched(s.g, where, why)}}
	}
	out := &Report{}
	for _, n := range rep.NearMiss {
		out.NearMiss = append(out.NearMiss, scopedMiss(n, where))
	}
	for _, n := range rep.Refused {
		out.Refused = append(out.Refused, scopedMiss(n, where))
	}
	for _, w := range rep.Warnings {
		out.Warnings = append(out.Warnings, fmt.Sprintf("%s: %s", where, w))
	}
	for _, f := range rep.Fused {
		b := *f.Block
		b.Scope = inScope(where, b.Scope)
		f.Block = &b
		out.Fused = append(out.Fused, f)
	}
	return siteResult{site: s, sm: sm, outer: outer, rep: out}
}

// declaredDimsAdvice ends a refusal whose check ran on values of other
// shapes than the model declares.
const declaredDimsAdvice = "the graph's shapes do not follow its declared input dims (a trace with static shapes inside?); pass inputs like the export's with --check-data (an ONNX test data folder)"

// bindFeeds returns the check's input set for scope model sm from the
// values its subgraph read when the model ran (bind), or nil when bind
// lacks one of sm's graph inputs.
func bindFeeds(sm *graph.Model, bind map[string]*eval.Tensor) map[string]*eval.Tensor {
	if bind == nil {
		return nil
	}
	feeds := map[string]*eval.Tensor{}
	inits := map[string]bool{}
	for _, t := range sm.Proto.Graph.Initializer {
		inits[t.GetName()] = true
	}
	for _, v := range sm.Proto.Graph.Input {
		if inits[v.GetName()] {
			continue
		}
		t := bind[v.GetName()]
		if t == nil {
			return nil
		}
		feeds[v.GetName()] = t
	}
	return feeds
}

// commitScope puts the rewritten scope model r.sm back into m at r.site:
// its graph becomes the attribute (with the subgraph's own inputs, and
// without the outer initializers it shared), the initializers it added
// move to m's main graph, new names are made unique in the model, and the
// functions, opsets and provenance it added go to m. It returns r's fused
// entries with the nodes' final names.
func commitScope(m *graph.Model, r siteResult, env *scopeEnv) ([]Fused, error) {
	gp := r.sm.Proto.Graph
	own := map[string]bool{}
	graph.AllNames(r.site.g, own)
	for _, v := range graph.FreeVars(r.site.g) {
		own[v] = true
	}
	rename := map[string]string{}
	newName := func(v string) string {
		if v == "" || own[v] {
			return v
		}
		if x, ok := rename[v]; ok {
			return x
		}
		x := fresh(env.names, v)
		rename[v] = x
		return x
	}
	origInit := map[*pb.TensorProto]bool{}
	for _, t := range r.site.g.Initializer {
		origInit[t] = true
	}
	var kept []*pb.TensorProto
	for _, t := range gp.Initializer {
		switch {
		case r.outer[t]:
		case origInit[t]:
			kept = append(kept, t)
		default:
			nt := t
			if x := newName(t.GetName()); x != t.GetName() {
				nt = proto.Clone(t).(*pb.TensorProto)
				nt.Name = proto.String(x)
			}
			if d, ok := r.sm.Deferred(t); ok {
				m.SetDeferred(nt, d)
			}
			m.Proto.Graph.Initializer = append(m.Proto.Graph.Initializer, nt)
		}
	}
	gp.Initializer = kept
	nodeNames := map[string]string{}
	for _, n := range gp.Node {
		for i, o := range n.Output {
			n.Output[i] = newName(o)
		}
		if n.GetName() != "" && !own[n.GetName()] {
			x := fresh(env.names, n.GetName())
			nodeNames[n.GetName()] = x
			n.Name = proto.String(x)
		}
	}
	renameRefs(gp, rename)
	gp.Input = r.site.g.Input
	setSubgraph(r.site, gp)
	mergeHeader(m, r.sm)
	var out []Fused
	for _, f := range r.rep.Fused {
		old := f.Node
		if x, ok := nodeNames[old]; ok {
			f.Node = x
		}
		if js, ok := r.sm.Metadata(ProvenanceKey + old); ok {
			var p Provenance
			if err := json.Unmarshal([]byte(js), &p); err != nil {
				return nil, err
			}
			p.Node = f.Node
			b, _ := json.Marshal(p)
			m.SetMetadata(ProvenanceKey+f.Node, string(b))
		}
		out = append(out, f)
	}
	return out, nil
}

// setSubgraph makes gp the subgraph at site s, on an attribute and an
// attribute list of the holder's own (attributes may be shared with other
// copies of the node).
func setSubgraph(s scopeSite, gp *pb.GraphProto) {
	attrs := slices.Clone(s.holder.Attribute)
	for i, a := range attrs {
		if a.GetName() != s.attr {
			continue
		}
		if s.idx < 0 {
			attrs[i] = graph.AttrWithGraphs(a, gp, a.Graphs)
		} else {
			gs := slices.Clone(a.Graphs)
			gs[s.idx] = gp
			attrs[i] = graph.AttrWithGraphs(a, a.G, gs)
		}
	}
	s.holder.Attribute = attrs
}

// mergeHeader gives m the functions, opsets and IR version scope model sm
// gained.
func mergeHeader(m, sm *graph.Model) {
	have := map[string]bool{}
	for _, f := range m.Proto.Functions {
		have[funcKey(f.GetDomain(), f.GetName(), f.GetOverload())] = true
	}
	for _, f := range sm.Proto.Functions {
		if k := funcKey(f.GetDomain(), f.GetName(), f.GetOverload()); !have[k] {
			have[k] = true
			m.Proto.Functions = append(m.Proto.Functions, f)
		}
	}
	for _, o := range sm.Proto.OpsetImport {
		if m.Opset(o.GetDomain()) == 0 {
			m.SetOpset(o.GetDomain(), o.GetVersion())
		}
	}
	if sm.Proto.GetIrVersion() > m.Proto.GetIrVersion() {
		m.Proto.IrVersion = proto.Int64(sm.Proto.GetIrVersion())
	}
	m.SetOpset(moe.Domain, moe.Version)
}

// dropUnused removes, after a scoped rewrite, the outer initializers the
// fused scopes read (captured) that no node of any scope reads any more
// (but graph inputs and outputs), and the model-local functions that were
// called before (calledBefore) and are not any more (but the fused op's).
func dropUnused(m *graph.Model, captured map[*pb.TensorProto]bool, calledBefore map[string]bool) {
	gp := m.Proto.Graph
	read, calls := map[string]bool{}, map[string]bool{}
	usesOf(gp, read, calls)
	for _, f := range m.Proto.Functions {
		usesOf(&pb.GraphProto{Node: f.Node}, map[string]bool{}, calls)
	}
	g := m.Graph()
	gp.Initializer = slices.DeleteFunc(gp.Initializer, func(t *pb.TensorProto) bool {
		v := t.GetName()
		return captured[t] && !read[v] && !g.IsInput(v) && !g.IsOutput(v)
	})
	m.Proto.Functions = slices.DeleteFunc(m.Proto.Functions, func(f *pb.FunctionProto) bool {
		k := funcKey(f.GetDomain(), f.GetName(), f.GetOverload())
		return f.GetDomain() != moe.Domain && calledBefore[k] && !calls[k]
	})
}

// pruneDead removes the nodes of m's main graph that no longer feed a
// graph output once fused subgraphs were put back (an outer computation
// only a replaced block read), and marks the initializers they read as
// captured, for dropUnused.
func pruneDead(m *graph.Model, env *scopeEnv) {
	mg := m.Graph()
	live := liveNodes(mg)
	dead := map[*pb.NodeProto]bool{}
	for _, n := range mg.P.Node {
		if !live[n] {
			dead[n] = true
			for _, v := range n.Input {
				if t := mg.Initializer(v); t != nil {
					env.captured[t] = true
				}
			}
		}
	}
	if len(dead) > 0 {
		mg.RemoveNodes(dead)
	}
}

// modelCalls lists the ops m's nodes call, every scope and function body.
func modelCalls(m *graph.Model) map[string]bool {
	calls := map[string]bool{}
	usesOf(m.Proto.GetGraph(), map[string]bool{}, calls)
	for _, f := range m.Proto.Functions {
		usesOf(&pb.GraphProto{Node: f.Node}, map[string]bool{}, calls)
	}
	return calls
}

// usesOf marks the values gp's nodes read and the ops they call, at any
// depth.
func usesOf(gp *pb.GraphProto, read, calls map[string]bool) {
	for _, n := range gp.GetNode() {
		calls[funcKey(n.GetDomain(), n.GetOpType(), n.GetOverload())] = true
		for _, v := range n.Input {
			read[v] = true
		}
		for _, s := range scopeSites(&pb.GraphProto{Node: []*pb.NodeProto{n}}) {
			usesOf(s.g, read, calls)
		}
	}
}

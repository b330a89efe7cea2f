package passes

import (
	"fmt"

	"github.com/mokopt/mokopt/graph"
	pb "github.com/mokopt/mokopt/graph/onnxpb"
	"github.com/mokopt/mokopt/moe"
)

// detectScopes is detectCanonical over m's main graph and, as scope models
// (see subgraph.go), over every subgraph that may hold a block, at any
// depth; with top set it also reports the routers of functions that are
// not searched (unsearchedFunctions). Blocks and near-misses of a subgraph
// carry its Scope.
func detectScopes(m *graph.Model, opt DetectOptions, top bool) (*Detection, error) {
	return detectScopesAt(m, opt, top, 0)
}

// detectScopesAt is detectScopes depth scope models down.
func detectScopesAt(m *graph.Model, opt DetectOptions, top bool, depth int) (*Detection, error) {
	if len(subgraphCalls(m, m.Proto.GetGraph())) > 0 {
		if top {
			m = editableCopy(m)
		}
		names := map[string]bool{}
		graph.AllNames(m.Proto.GetGraph(), names)
		if _, err := inlineSubgraphCalls(m, names); err != nil {
			return nil, err
		}
	}
	det, err := detectCanonical(m, opt)
	if err != nil {
		return det, err
	}
	if top {
		det.NearMiss = append(det.NearMiss, unsearchedFunctions(m)...)
	}
	sites := scopeSites(m.Proto.GetGraph())
	if len(sites) == 0 {
		return det, nil
	}
	g := m.Graph()
	for _, s := range sites {
		if !holdsSelection(m, s.g) {
			continue
		}
		where := s.where()
		sm, _ := standalone(m, g, s, nil)
		if depth >= maxScopeDepth {
			det.NearMiss = append(det.NearMiss, unsearched(s.g, where, fmt.Sprintf("subgraphs nest deeper than %d (a recursive function?)", maxScopeDepth))...)
			continue
		}
		d, err := detectScopesAt(sm, opt, false, depth+1)
		if err != nil {
			det.NearMiss = append(det.NearMiss, unsearched(s.g, where, "the subgraph could not be searched: "+err.Error())...)
			continue
		}
		for _, b := range d.Blocks {
			b.Scope = inScope(where, b.Scope)
			det.Blocks = append(det.Blocks, b)
		}
		for _, n := range d.NearMiss {
			det.NearMiss = append(det.NearMiss, scopedMiss(n, where))
		}
		for _, w := range d.Warnings {
			det.Warnings = append(det.Warnings, where+": "+w)
		}
	}
	return det, nil
}

// unsearchedFunctions reports each router-like TopK (see routerTopKs) in
// the body of a model-local function that some node calls but that
// neither canonicalization nor a scoped rewrite inlines, so that no scope
// searches it: one importing a domain at another version than the model
// (its ops could mean something else there). The reason names the
// function and why.
func unsearchedFunctions(m *graph.Model) []NearMiss {
	if len(m.Proto.Functions) == 0 {
		return nil
	}
	var calls map[string]bool
	var out []NearMiss
	for _, f := range m.Proto.Functions {
		if f.GetDomain() == moe.Domain {
			continue
		}
		why := versionMismatch(m, f)
		if why == "" {
			continue
		}
		body := &pb.GraphProto{Node: f.Node}
		for _, o := range f.Output {
			body.Output = append(body.Output, &pb.ValueInfoProto{Name: &o})
		}
		where := fmt.Sprintf("function %s::%s", domainLabel(f.GetDomain()), f.GetName())
		tks := routerTopKs(body, where)
		if len(tks) == 0 {
			continue
		}
		if calls == nil {
			calls = modelCalls(m)
		}
		if !calls[funcKey(f.GetDomain(), f.GetName(), f.GetOverload())] {
			continue
		}
		for _, n := range tks {
			out = append(out, scopedMiss(NearMiss{Node: n.Node, Reason: "a router in a model-local function that is not inlined, where blocks are not searched: " + why}, n.Scope))
		}
	}
	return out
}

// versionMismatch says why no rewrite inlines calls of f, when f imports
// a domain at another version than m (see canon.Inline), or "".
func versionMismatch(m *graph.Model, f *pb.FunctionProto) string {
	for _, o := range f.OpsetImport {
		if have := m.Opset(o.GetDomain()); have != 0 && have != o.GetVersion() {
			return fmt.Sprintf("it imports %s at version %d, the model at %d", domainLabel(o.GetDomain()), o.GetVersion(), have)
		}
	}
	return ""
}

// domainLabel names a domain for messages ("ai.onnx" for the default).
func domainLabel(d string) string {
	if d == "" {
		return "ai.onnx"
	}
	return d
}

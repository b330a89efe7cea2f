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
	mg := m.Graph()
	wg := wc.Graph()
	has := func(v string) bool {
		return v == "" || mg.Producer(v) != nil || mg.Initializer(v) != nil || mg.IsInput(v)
	}
	var callsBefore map[string]bool
	if len(m.Proto.Functions) > 0 {
		callsBefore = calledFunctions(mg.P.Node)
	}

	byName := map[string]*pb.NodeProto{}
	for _, n := range wg.P.Node {
		if n.GetDomain() == moe.Domain && n.GetOpType() == moe.OpType {
			byName[n.GetName()] = n
		}
	}
	rename := map[string]string{} // wc value name -> name in m, for values m lacks
	nameIn := func(v string) string {
		if has(v) {
			return v
		}
		if r, ok := rename[v]; ok {
			return r
		}
		r := mg.UniqueName(v)
		rename[v] = r
		return r
	}
	copied := map[*pb.NodeProto]bool{}
	detached := make([][]*pb.NodeProto, len(rep.Fused))
	var added []*pb.NodeProto
	usedDomains := map[string]bool{}
	for i := range rep.Fused {
		f := &rep.Fused[i]
		F := byName[f.Node]
		if F == nil {
			return fmt.Errorf("fused node %s not found in the working copy", f.Node)
		}
		// Forward: from F to the values m has.
		set := []*pb.NodeProto{F}
		seen := map[*pb.NodeProto]bool{F: true}
		queue := slices.Clone(F.Output)
		for len(queue) > 0 {
			v := queue[0]
			queue = queue[1:]
			if v == "" || has(v) {
				continue
			}
			if wg.IsOutput(v) {
				return fmt.Errorf("graph output %q exists only in the canonical form", v)
			}
			for _, c := range wg.Consumers(v) {
				if !seen[c] {
					seen[c] = true
					set = append(set, c)
					queue = append(queue, c.Output...)
				}
			}
		}
		// Backward: what the copied nodes read that m lacks.
		for j := 0; j < len(set); j++ {
			for _, v := range graph.NodeInputs(set[j]) {
				if has(v) {
					continue
				}
				if t := wg.Initializer(v); t != nil {
					if mg.Initializer(nameIn(v)) == nil {
						nt := proto.Clone(t).(*pb.TensorProto)
						nt.Name = proto.String(nameIn(v))
						if d, ok := wc.Deferred(t); ok {
							m.SetDeferred(nt, d)
						}
						mg.AddInitializer(nt)
					}
					continue
				}
				p := wg.Producer(v)
				if p == nil {
					return fmt.Errorf("value %q of the canonical form has no producer", v)
				}
				if !seen[p] {
					seen[p] = true
					set = append(set, p)
				}
			}
		}
		for _, n := range set {
			if copied[n] {
				continue
			}
			copied[n] = true
			c := graph.CopyNode(n)
			for k, v := range c.Input {
				c.Input[k] = nameIn(v)
			}
			for k, o := range c.Output {
				if o != "" && has(o) {
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
					detached[i] = append(detached[i], old)
					continue
				}
				c.Output[k] = nameIn(o)
			}
			if c.GetName() != "" {
				c.Name = proto.String(mg.UniqueName(c.GetName()))
				if n == F {
					f.Node = c.GetName()
				}
			}
			usedDomains[c.GetDomain()] = true
			added = append(added, c)
		}
	}
	for _, c := range added {
		mg.AddNode(c) // now the producer of the values it takes over
	}
	// Domains, functions and versions the copied nodes need.
	domains := make([]string, 0, len(usedDomains))
	for d := range usedDomains {
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
	// Remove what became dead.
	// As rewriteIn does, dead code that was there before goes too (it is
	// attributed to the first fused node).
	liveAfter := liveNodes(mg)
	dead := make(map[*pb.NodeProto]bool, len(mg.P.Node)-len(liveAfter))
	for _, n := range mg.P.Node {
		if !liveAfter[n] {
			dead[n] = true
		}
	}
	// Attribute the dead nodes to the fused node whose detached producers
	// they fed.
	owner := map[*pb.NodeProto]int{}
	for i, ds := range detached {
		stack := slices.Clone(ds)
		for len(stack) > 0 {
			p := stack[len(stack)-1]
			stack = stack[:len(stack)-1]
			if p == nil || !dead[p] {
				continue
			}
			if _, ok := owner[p]; ok {
				continue
			}
			owner[p] = i
			for _, v := range graph.NodeInputs(p) {
				stack = append(stack, mg.Producer(v))
			}
		}
	}
	removedNodes := make([][]string, len(rep.Fused))
	removedInits := make([][]string, len(rep.Fused))
	initOwner := map[string]int{}
	for _, n := range mg.P.Node {
		if !dead[n] {
			continue
		}
		if _, ok := owner[n]; !ok {
			owner[n] = 0
		}
		i := owner[n]
		removedNodes[i] = append(removedNodes[i], graph.NodeLabel(n))
		for _, v := range graph.NodeInputs(n) {
			if mg.Initializer(v) == nil {
				continue
			}
			// As in block-by-block removal, an initializer several
			// blocks read goes with the last of them: the one whose
			// removal leaves it without readers.
			if j, ok := initOwner[v]; !ok || i > j {
				initOwner[v] = i
			}
		}
	}
	// An initializer goes when dead nodes read it and no other node does
	// (with its graph input, when it is one: see deadCode.removeDeadIn).
	keptInits := mg.P.Initializer[:0]
	goneInputs := map[string]bool{}
	for _, t := range mg.P.Initializer {
		v := t.GetName()
		if i, ok := initOwner[v]; ok && !mg.IsOutput(v) && !slices.ContainsFunc(mg.Consumers(v), func(c *pb.NodeProto) bool { return !dead[c] }) {
			removedInits[i] = append(removedInits[i], v)
			goneInputs[v] = mg.IsInput(v)
			continue
		}
		keptInits = append(keptInits, t)
	}
	mg.P.Initializer = keptInits
	mg.P.Input = slices.DeleteFunc(mg.P.Input, func(in *pb.ValueInfoProto) bool { return goneInputs[in.GetName()] })
	mg.RemoveNodes(dead) // reindexes, initializers included
	var callsAfter map[string]bool
	if len(m.Proto.Functions) > 0 {
		callsAfter = calledFunctions(mg.P.Node)
	}
	keptFuncs := m.Proto.Functions[:0]
	for _, f := range m.Proto.Functions {
		k := funcKey(f.GetDomain(), f.GetName(), f.GetOverload())
		if callsBefore[k] && !callsAfter[k] && f.GetDomain() != moe.Domain {
			continue
		}
		keptFuncs = append(keptFuncs, f)
	}
	m.Proto.Functions = keptFuncs
	if err := mg.Sort(); err != nil {
		return err
	}
	for i := range rep.Fused {
		f := &rep.Fused[i]
		b := f.Block
		prov := Provenance{Node: f.Node, Kind: b.Kind, Nodes: removedNodes[i], Initializers: removedInits[i], Spec: b.Spec, TracedExperts: b.TracedExperts, SourceType: sourceType(b)}
		js, _ := json.Marshal(prov)
		m.SetMetadata(ProvenanceKey+f.Node, string(js))
		f.NodesRemoved, f.InitsRemoved = len(removedNodes[i]), len(removedInits[i])
	}
	if errs := mg.Validate(); len(errs) > 0 {
		return errors.Join(errs...)
	}
	return nil
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

package passes

import (
	"fmt"
	"slices"

	"github.com/mokopt/mokopt/graph"
	pb "github.com/mokopt/mokopt/graph/onnxpb"
	"github.com/mokopt/mokopt/moe"
	"google.golang.org/protobuf/proto"
)

// Functions whose bodies hold subgraphs. Canonicalization does not inline
// them (renaming inside subgraphs is not its business), so a block in such
// a body would not be searched. A scoped rewrite inlines the calls of
// those that may hold a block (holdsSelection) itself, into a copy of the
// graph, before its subgraphs are searched: the body's subgraphs are then
// subgraphs of the graph, searched as any other.

// bodyWithSubgraph reports whether f's body holds a subgraph.
func bodyWithSubgraph(f *pb.FunctionProto) bool {
	for _, n := range f.Node {
		for _, a := range n.Attribute {
			if a.G != nil || len(a.Graphs) > 0 {
				return true
			}
		}
	}
	return false
}

// subgraphCalls lists the positions of gp's nodes that call a function
// of m whose body holds a subgraph, or calls such a function (at any
// depth), may hold a block, and imports its domains at m's versions.
func subgraphCalls(m *graph.Model, gp *pb.GraphProto) map[int]*pb.FunctionProto {
	if len(m.Proto.Functions) == 0 {
		return nil
	}
	fs := map[string]*pb.FunctionProto{}
	for _, f := range m.Proto.Functions {
		fs[funcKey(f.GetDomain(), f.GetName(), f.GetOverload())] = f
	}
	memo := map[*pb.FunctionProto]bool{}
	var reaches func(f *pb.FunctionProto) bool
	reaches = func(f *pb.FunctionProto) bool {
		if r, ok := memo[f]; ok {
			return r
		}
		memo[f] = false // a recursive function ends the walk
		r := bodyWithSubgraph(f)
		for _, n := range f.Node {
			if g := fs[funcKey(n.GetDomain(), n.GetOpType(), n.GetOverload())]; g != nil && !r {
				r = reaches(g)
			}
		}
		memo[f] = r
		return r
	}
	out := map[int]*pb.FunctionProto{}
	for i, n := range gp.GetNode() {
		f := fs[funcKey(n.GetDomain(), n.GetOpType(), n.GetOverload())]
		if f != nil && f.GetDomain() != moe.Domain && versionMismatch(m, f) == "" && reaches(f) && holdsSelection(m, &pb.GraphProto{Node: f.Node}) {
			out[i] = f
		}
	}
	return out
}

// inlineSubgraphCalls replaces, in m's main graph (which must be a copy
// the caller may edit: its node list and the nodes' lists its own), each
// call that subgraphCalls lists by the function's body (see inlineBody).
// Calls in the inlined bodies unfold on later sweeps. It reports whether
// it inlined any.
func inlineSubgraphCalls(m *graph.Model, names map[string]bool) (bool, error) {
	inlined := false
	for round := 0; round < maxInlineRounds; round++ {
		done, err := inlineRound(m, names)
		if err != nil || !done {
			return inlined, err
		}
		inlined = true
	}
	return inlined, nil
}

// maxInlineRounds bounds how deep inlineSubgraphCalls unfolds calls of
// functions that call functions.
const maxInlineRounds = 16

// inlineRound is one sweep of inlineSubgraphCalls over m's main graph.
func inlineRound(m *graph.Model, names map[string]bool) (bool, error) {
	gp := m.Proto.GetGraph()
	calls := subgraphCalls(m, gp)
	if len(calls) == 0 {
		return false, nil
	}
	var ns []*pb.NodeProto
	for i, n := range gp.Node {
		f := calls[i]
		if f == nil {
			ns = append(ns, n)
			continue
		}
		body, err := inlineBody(n, f, names)
		if err != nil {
			return false, err
		}
		ns = append(ns, body...)
		for _, o := range f.OpsetImport {
			if m.Opset(o.GetDomain()) == 0 {
				m.SetOpset(o.GetDomain(), o.GetVersion())
			}
		}
	}
	gp.Node = ns
	return true, nil
}

// inlineBody returns the nodes of f's body for call: formal inputs and
// outputs become the call's, every other value and node, in the body and
// in its subgraphs, gets a name new in the model (names), attributes
// referenced with ref_attr_name take the call's value or f's default.
func inlineBody(call *pb.NodeProto, f *pb.FunctionProto, names map[string]bool) ([]*pb.NodeProto, error) {
	rename := map[string]string{"": ""}
	for i, v := range f.Input {
		rename[v] = ""
		if i < len(call.Input) {
			rename[v] = call.Input[i]
		}
	}
	for i, v := range f.Output {
		if _, isIn := rename[v]; !isIn && i < len(call.Output) && call.Output[i] != "" {
			rename[v] = call.Output[i]
		}
	}
	attrs := map[string]*pb.AttributeProto{}
	for _, a := range f.AttributeProto {
		attrs[a.GetName()] = a
	}
	for _, a := range call.Attribute {
		attrs[a.GetName()] = a
	}
	base := graph.NodeLabel(call)
	body, err := renameNodes(f.Node, rename, attrs, names, base)
	if err != nil {
		return nil, fmt.Errorf("inlining function %s::%s at node %s: %w", domainLabel(f.GetDomain()), f.GetName(), base, err)
	}
	produced := map[string]bool{}
	for _, n := range body {
		for _, o := range n.Output {
			produced[o] = true
		}
	}
	for i, v := range f.Output {
		if i < len(call.Output) && call.Output[i] != "" && !produced[call.Output[i]] {
			src := rename[v]
			if src == "" {
				return nil, fmt.Errorf("function %s::%s: output %q is not computed", domainLabel(f.GetDomain()), f.GetName(), v)
			}
			body = append(body, graph.NewNode("Identity", "", fresh(names, base+"/Identity"), []string{src}, []string{call.Output[i]}))
		}
	}
	return body, nil
}

// renameNodes copies ns with every value ns define named anew (fresh under
// base) unless rename already maps it, every value they read mapped
// through rename (a read rename lacks is an error), references to the
// caller's attributes bound from attrs, and their subgraphs renamed the
// same way, in a scope of their own.
func renameNodes(ns []*pb.NodeProto, rename map[string]string, attrs map[string]*pb.AttributeProto, names map[string]bool, base string) ([]*pb.NodeProto, error) {
	var out []*pb.NodeProto
	for _, n := range ns {
		c := &pb.NodeProto{OpType: n.OpType, Domain: n.Domain, Overload: n.Overload, DocString: n.DocString,
			Name: proto.String(fresh(names, base+"/"+graph.NodeLabel(n)))}
		for _, v := range n.Input {
			r, ok := rename[v]
			if !ok {
				return nil, fmt.Errorf("node %s reads %q, which is neither a formal input nor computed before it", graph.NodeLabel(n), v)
			}
			c.Input = append(c.Input, r)
		}
		for _, a := range n.Attribute {
			b, err := bindAttr(a, rename, attrs, names, base)
			if err != nil {
				return nil, err
			}
			if b != nil {
				c.Attribute = append(c.Attribute, b)
			}
		}
		for _, v := range n.Output {
			if _, ok := rename[v]; !ok {
				rename[v] = fresh(names, base+"/"+v)
			}
			c.Output = append(c.Output, rename[v])
		}
		out = append(out, c)
	}
	return out, nil
}

// bindAttr is attribute a of an inlined node: bound from attrs when it
// references the caller's (nil when unbound), its subgraphs renamed (see
// renameGraph), else a itself.
func bindAttr(a *pb.AttributeProto, rename map[string]string, attrs map[string]*pb.AttributeProto, names map[string]bool, base string) (*pb.AttributeProto, error) {
	if ref := a.GetRefAttrName(); ref != "" {
		v := attrs[ref]
		if v == nil {
			return nil, nil
		}
		r := proto.Clone(v).(*pb.AttributeProto)
		r.Name, r.RefAttrName = proto.String(a.GetName()), nil
		return r, nil
	}
	if a.G == nil && len(a.Graphs) == 0 {
		return a, nil
	}
	c := &pb.AttributeProto{Name: a.Name, Type: a.Type, DocString: a.DocString}
	var err error
	if a.G != nil {
		if c.G, err = renameGraph(a.G, rename, attrs, names, base); err != nil {
			return nil, err
		}
	}
	for _, g := range a.Graphs {
		r, err := renameGraph(g, rename, attrs, names, base)
		if err != nil {
			return nil, err
		}
		c.Graphs = append(c.Graphs, r)
	}
	return c, nil
}

// renameGraph copies subgraph g of an inlined body: what it defines is
// named anew, what it reads from the body is mapped through rename (its
// own scope extends a copy of rename).
func renameGraph(g *pb.GraphProto, rename map[string]string, attrs map[string]*pb.AttributeProto, names map[string]bool, base string) (*pb.GraphProto, error) {
	local := make(map[string]string, len(rename))
	for k, v := range rename {
		local[k] = v
	}
	c := &pb.GraphProto{Name: g.Name, DocString: g.DocString}
	vi := func(v *pb.ValueInfoProto) *pb.ValueInfoProto {
		r := proto.Clone(v).(*pb.ValueInfoProto)
		if _, ok := local[v.GetName()]; !ok {
			local[v.GetName()] = fresh(names, base+"/"+v.GetName())
		}
		r.Name = proto.String(local[v.GetName()])
		return r
	}
	for _, v := range g.Input {
		c.Input = append(c.Input, vi(v))
	}
	for _, t := range g.Initializer {
		local[t.GetName()] = fresh(names, base+"/"+t.GetName())
		r := proto.Clone(t).(*pb.TensorProto)
		r.Name = proto.String(local[t.GetName()])
		c.Initializer = append(c.Initializer, r)
	}
	ns, err := renameNodes(g.Node, local, attrs, names, base)
	if err != nil {
		return nil, err
	}
	c.Node = ns
	for _, v := range g.Output {
		r, ok := local[v.GetName()]
		if !ok {
			return nil, fmt.Errorf("subgraph %s returns %q, which it does not compute", g.GetName(), v.GetName())
		}
		o := proto.Clone(v).(*pb.ValueInfoProto)
		o.Name = proto.String(r)
		c.Output = append(c.Output, o)
	}
	for _, v := range g.ValueInfo {
		if r, ok := local[v.GetName()]; ok {
			o := proto.Clone(v).(*pb.ValueInfoProto)
			o.Name = proto.String(r)
			c.ValueInfo = append(c.ValueInfo, o)
		}
	}
	return c, nil
}

// editableCopy returns a model of m whose main graph is a copy a scoped
// rewrite may edit (node list and nodes' input and output lists its own,
// attributes shared), with m's header and tensor sources, and its own
// function, opset and metadata lists (see adopt).
func editableCopy(m *graph.Model) *graph.Model {
	g := m.Proto.Graph
	gp := &pb.GraphProto{Name: g.Name, DocString: g.DocString, Initializer: slices.Clone(g.Initializer), SparseInitializer: g.SparseInitializer,
		ValueInfo: slices.Clone(g.ValueInfo), QuantizationAnnotation: g.QuantizationAnnotation, MetadataProps: g.MetadataProps,
		Input: slices.Clone(g.Input), Output: slices.Clone(g.Output)}
	for _, n := range g.Node {
		gp.Node = append(gp.Node, shallowNode(n))
	}
	c := m.WithGraph(gp)
	mp := proto.Clone(&pb.ModelProto{IrVersion: m.Proto.IrVersion, ProducerName: m.Proto.ProducerName, ProducerVersion: m.Proto.ProducerVersion,
		Domain: m.Proto.Domain, ModelVersion: m.Proto.ModelVersion, DocString: m.Proto.DocString, OpsetImport: m.Proto.OpsetImport,
		MetadataProps: m.Proto.MetadataProps}).(*pb.ModelProto)
	mp.Graph, mp.Functions = gp, slices.Clone(m.Proto.Functions)
	mp.TrainingInfo = m.Proto.TrainingInfo
	c.Proto = mp
	return c
}

// shallowNode is n with input and output lists of its own.
func shallowNode(n *pb.NodeProto) *pb.NodeProto {
	return &pb.NodeProto{Input: slices.Clone(n.Input), Output: slices.Clone(n.Output), Name: n.Name, OpType: n.OpType,
		Domain: n.Domain, Overload: n.Overload, Attribute: n.Attribute, DocString: n.DocString,
		MetadataProps: n.MetadataProps, DeviceConfigurations: n.DeviceConfigurations}
}

// adopt makes m what its editable copy c became: c's graph, functions,
// opsets, metadata and IR version, and the deferred tensors c registered.
func adopt(m, c *graph.Model) {
	for _, t := range c.Proto.Graph.Initializer {
		if d, ok := c.Deferred(t); ok {
			m.SetDeferred(t, d)
		}
	}
	m.Proto.Graph = c.Proto.Graph
	m.Proto.Functions = c.Proto.Functions
	m.Proto.OpsetImport = c.Proto.OpsetImport
	m.Proto.MetadataProps = c.Proto.MetadataProps
	m.Proto.IrVersion = c.Proto.IrVersion
}

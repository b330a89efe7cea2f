package passes

import (
	"context"
	"fmt"
	"slices"
	"strings"

	"github.com/mokopt/mokopt/graph"
	"github.com/mokopt/mokopt/graph/eval"
	pb "github.com/mokopt/mokopt/graph/onnxpb"
	"google.golang.org/protobuf/proto"
)

// Blocks inside control flow. An If branch, a Loop or Scan body (any
// graph-valued attribute) is searched as a model of its own, its scope
// model: the subgraph is its main graph, the values it reads from
// enclosing scopes are its initializers (outer initializers, the same
// tensors) or its graph inputs (outer graph inputs and computed values),
// and the model's functions and opsets are its own. The whole rewrite
// (canonicalization, detection, the numerical check, the fused node)
// runs on it, recursively for the subgraphs it holds; the check feeds it
// the values the subgraph saw when the original model ran (see
// collectBindings). What fused is then put back: the scope model's graph
// becomes the attribute, its new initializers (the fused weights) move to
// the main graph, which the subgraph reads by name, its functions and
// provenance go to the model.

// scopeSite is one subgraph of a graph: attribute attr of node holder (at
// position idx of a GRAPHS attribute, -1 for a GRAPH one).
type scopeSite struct {
	holder *pb.NodeProto
	attr   string
	idx    int
	g      *pb.GraphProto
}

// where names the site for messages, e.g. `If node "cond"'s then_branch`.
func (s scopeSite) where() string {
	a := s.attr
	if s.idx >= 0 {
		a = fmt.Sprintf("%s[%d]", a, s.idx)
	}
	return fmt.Sprintf("%s node %q's %s", s.holder.GetOpType(), graph.NodeLabel(s.holder), a)
}

// scopeSites lists the subgraphs gp's nodes hold (one level deep).
func scopeSites(gp *pb.GraphProto) []scopeSite {
	var out []scopeSite
	for _, n := range gp.GetNode() {
		for _, a := range n.Attribute {
			if a.G != nil {
				out = append(out, scopeSite{n, a.GetName(), -1, a.G})
			}
			for i, g := range a.Graphs {
				out = append(out, scopeSite{n, a.GetName(), i, g})
			}
		}
	}
	return out
}

// inScope prefixes scope with where (scopes nest outermost first).
func inScope(where, scope string) string {
	if scope == "" {
		return where
	}
	return where + " > " + scope
}

// scopeEnv is what every level of a scoped rewrite shares.
type scopeEnv struct {
	// binds holds, per subgraph, the values it read from outside the first
	// time the original model ran it (nil when the check is off).
	binds map[*pb.GraphProto]map[string]*eval.Tensor
	// bindErr is why the run that bound them failed on every random input
	// it tried (nil when one ran, or the user gave check data): the
	// subgraphs then saw values the model cannot compute.
	bindErr error
	// names holds every value and node name of the model, all scopes, and
	// those the scoped rewrite added: new names are made unique against it.
	names map[string]bool
	// captured holds the outer initializers that fused scopes read: those
	// nothing reads after the rewrite are removed.
	captured map[*pb.TensorProto]bool
	// depth is how many scope models enclose the one being rewritten.
	depth int
}

// maxScopeDepth bounds how deep subgraphs are searched: a function that
// calls itself inside a subgraph would unfold without end.
const maxScopeDepth = 32

// standalone builds the scope model of site s of pm (whose main graph is
// indexed by pg): see the package comment above. bind, when set, gives the
// types of captured values the model declares nowhere. It also returns the
// outer initializers it shares, which stay where they are. pm is not
// edited.
func standalone(pm *graph.Model, pg *graph.Graph, s scopeSite, bind map[string]*eval.Tensor) (*graph.Model, map[*pb.TensorProto]bool) {
	g := s.g
	gp := &pb.GraphProto{Name: g.Name, DocString: g.DocString, Initializer: slices.Clone(g.Initializer),
		SparseInitializer: g.SparseInitializer, ValueInfo: slices.Clone(g.ValueInfo),
		QuantizationAnnotation: g.QuantizationAnnotation, MetadataProps: g.MetadataProps}
	gp.Node = make([]*pb.NodeProto, len(g.Node))
	for i, n := range g.Node {
		// Own input and output lists (passes rename them in place); the
		// attributes, nested subgraphs included, are shared.
		gp.Node[i] = &pb.NodeProto{Input: slices.Clone(n.Input), Output: slices.Clone(n.Output), Name: n.Name, OpType: n.OpType,
			Domain: n.Domain, Overload: n.Overload, Attribute: n.Attribute, DocString: n.DocString,
			MetadataProps: n.MetadataProps, DeviceConfigurations: n.DeviceConfigurations}
	}
	for _, v := range g.Input {
		vi := proto.Clone(v).(*pb.ValueInfoProto)
		if t := bind[v.GetName()]; t != nil {
			vi.Type = withRankOf(vi.Type, t)
		}
		gp.Input = append(gp.Input, vi)
	}
	for _, v := range g.Output {
		gp.Output = append(gp.Output, proto.Clone(v).(*pb.ValueInfoProto))
	}
	outer := map[*pb.TensorProto]bool{}
	declared := declaredValues(pg.P)
	free := graph.FreeVars(g)
	consts := constOuter(pm, pg, free)
	for _, v := range free {
		t := pg.Initializer(v)
		if t == nil {
			t = consts[v]
		}
		if t != nil {
			gp.Initializer = append(gp.Initializer, t)
			outer[t] = true
			continue
		}
		vi := &pb.ValueInfoProto{Name: proto.String(v)}
		if d := declared[v]; d != nil && d.Type != nil {
			vi.Type = d.Type
		} else if t := bind[v]; t != nil {
			vi.Type = tensorTypeOf(t)
		}
		gp.Input = append(gp.Input, vi)
	}
	sm := pm.WithGraph(gp)
	sm.Proto.Functions = slices.Clone(pm.Proto.Functions)
	sm.Proto.OpsetImport = nil
	for _, o := range pm.Proto.OpsetImport {
		sm.Proto.OpsetImport = append(sm.Proto.OpsetImport, proto.Clone(o).(*pb.OperatorSetIdProto))
	}
	if pm.Proto.IrVersion != nil {
		sm.Proto.IrVersion = proto.Int64(pm.Proto.GetIrVersion())
	}
	return sm, outer
}

// maxConstOuter bounds the bytes of the outer computed constants one
// scope model takes (see constOuter).
const maxConstOuter = 1 << 30

// constOuter computes those of the values vs that pg computes from
// initializers and Constant nodes alone (a weight transposed, sliced or
// cast in the main graph before a subgraph reads it), as initializers of
// the same names: in a scope model they are constants, as weights must
// be. Values that depend on a graph input, and a set that fails to run or
// exceeds maxConstOuter bytes, are left out.
func constOuter(pm *graph.Model, pg *graph.Graph, vs []string) map[string]*pb.TensorProto {
	memo := map[string]bool{}
	var isConst func(v string, depth int) bool
	isConst = func(v string, depth int) bool {
		if c, ok := memo[v]; ok {
			return c
		}
		memo[v] = false
		p := pg.Producer(v)
		switch {
		case v == "":
			memo[v] = true
		case pg.Initializer(v) != nil:
			memo[v] = !pg.IsInput(v)
		case p == nil || depth > 64 || len(graph.NodeInputs(p)) != len(p.Input) || strings.HasPrefix(p.GetOpType(), "Random") ||
			p.GetOpType() == "Multinomial" || p.GetOpType() == "Bernoulli":
			// a graph input, too deep, a node with subgraphs, or random
		default:
			c := true
			for _, in := range p.Input {
				c = c && isConst(in, depth+1)
			}
			memo[v] = c
		}
		return memo[v]
	}
	var outs []string
	for _, v := range vs {
		if pg.Initializer(v) == nil && pg.Producer(v) != nil && isConst(v, 0) {
			outs = append(outs, v)
		}
	}
	if len(outs) == 0 {
		return nil
	}
	sub := &pb.GraphProto{Name: proto.String("outer_constants")}
	seen := map[*pb.NodeProto]bool{}
	var add func(v string)
	add = func(v string) {
		if t := pg.Initializer(v); t != nil {
			if !slices.Contains(sub.Initializer, t) {
				sub.Initializer = append(sub.Initializer, t)
			}
			return
		}
		p := pg.Producer(v)
		if p == nil || seen[p] {
			return
		}
		seen[p] = true
		for _, in := range p.Input {
			add(in)
		}
		sub.Node = append(sub.Node, p)
	}
	for _, v := range outs {
		add(v)
		sub.Output = append(sub.Output, &pb.ValueInfoProto{Name: proto.String(v)})
	}
	vals, err := eval.Run(context.Background(), pm.WithGraph(sub), nil, eval.Options{MemLimit: maxConstOuter, Kernels: evalKernels()})
	if err != nil {
		return nil
	}
	out := map[string]*pb.TensorProto{}
	for _, v := range outs {
		if t, err := eval.ToProto(vals[v], v); err == nil {
			out[v] = t
		}
	}
	return out
}

// declaredValues maps the names gp declares a type for (inputs, outputs,
// value infos) to the declaration.
func declaredValues(gp *pb.GraphProto) map[string]*pb.ValueInfoProto {
	out := map[string]*pb.ValueInfoProto{}
	for _, l := range [][]*pb.ValueInfoProto{gp.GetValueInfo(), gp.GetOutput(), gp.GetInput()} {
		for _, v := range l {
			out[v.GetName()] = v
		}
	}
	return out
}

// withRankOf returns typ, or t's type where typ is nil, with a shape of t's
// rank where typ declares none: dims without sizes (a body input sliced by
// a Scan, a loop-carried value, may change its sizes between iterations,
// not its rank), so that detection in the body knows the rank of what it
// reads, as it does at the top level.
func withRankOf(typ *pb.TypeProto, t *eval.Tensor) *pb.TypeProto {
	if typ == nil {
		return tensorTypeOf(t)
	}
	tt := typ.GetTensorType()
	if tt == nil || tt.Shape != nil {
		return typ
	}
	typ = proto.Clone(typ).(*pb.TypeProto)
	sh := &pb.TensorShapeProto{}
	for range t.Shape {
		sh.Dim = append(sh.Dim, &pb.TensorShapeProto_Dimension{})
	}
	typ.GetTensorType().Shape = sh
	return typ
}

// tensorTypeOf is the type of t, with its static shape.
func tensorTypeOf(t *eval.Tensor) *pb.TypeProto {
	sh := &pb.TensorShapeProto{}
	for _, d := range t.Shape {
		sh.Dim = append(sh.Dim, &pb.TensorShapeProto_Dimension{Value: &pb.TensorShapeProto_Dimension_DimValue{DimValue: int64(d)}})
	}
	return &pb.TypeProto{Value: &pb.TypeProto_TensorType{TensorType: &pb.TypeProto_Tensor{ElemType: proto.Int32(int32(t.DType)), Shape: sh}}}
}

// collectBindings runs m in the interpreter (on the check's first data
// set, else on random inputs as the check makes them, trying further
// seeds while a run fails, as the check does) and returns, per subgraph,
// the values it read from outside the first time it ran (an If's branch
// not taken included). A subgraph missing from the result (none of the
// runs reached it) is checked on random inputs. The error is the last
// run's when every random input failed (the bindings are then that run's,
// as far as it got).
func collectBindings(ctx context.Context, m *graph.Model, opt Options) (map[*pb.GraphProto]map[string]*eval.Tensor, error) {
	em := Evaluable(ctx, m)
	for seed := uint64(1); seed <= 12; seed++ {
		var feeds map[string]*eval.Tensor
		if len(opt.CheckData) > 0 {
			feeds = opt.CheckData[0]
		} else {
			f, err := checkFeeds(m, seed, scopeCheckTokens, opt.MemLimit)
			if err != nil {
				return nil, nil
			}
			feeds = f
		}
		binds := map[*pb.GraphProto]map[string]*eval.Tensor{}
		hook := func(g *pb.GraphProto, vals map[string]*eval.Tensor) {
			if _, ok := binds[g]; !ok {
				binds[g] = vals
			}
		}
		_, err := eval.Run(ctx, em, feeds, eval.Options{MemLimit: opt.MemLimit, Kernels: evalKernels(), OnSubgraph: hook})
		if err == nil || len(opt.CheckData) > 0 || ctx.Err() != nil {
			return binds, nil
		}
		if seed == 12 {
			return binds, err
		}
	}
	return nil, nil
}

// scopeCheckTokens is the distinct tokens of the run that binds
// subgraphs' values (symbolic token dims take it).
const scopeCheckTokens = 32

// holdsSelection reports whether gp (or a subgraph of it, at any depth,
// or the body of a model-local function of m it calls) holds a node that
// may start a block: a TopK, an ArgMax (a sparsemixer router), an ONNX
// Runtime MoE node.
func holdsSelection(m *graph.Model, gp *pb.GraphProto) bool {
	var funcs map[string]*pb.FunctionProto
	if len(m.Proto.Functions) > 0 {
		funcs = map[string]*pb.FunctionProto{}
		for _, f := range m.Proto.Functions {
			funcs[funcKey(f.GetDomain(), f.GetName(), f.GetOverload())] = f
		}
	}
	return selects(funcs, gp.GetNode(), map[*pb.FunctionProto]bool{})
}

// selects is holdsSelection over nodes ns; seen holds the functions
// entered (so that a recursive function ends the walk).
func selects(funcs map[string]*pb.FunctionProto, ns []*pb.NodeProto, seen map[*pb.FunctionProto]bool) bool {
	matmuls := 0
	for _, n := range ns {
		if n.GetOpType() == "TopK" || n.GetOpType() == "ArgMax" || isORTMoE(n) {
			return true
		}
		// Experts without a selection (a fixed routing table, dense
		// experts mixed by constants or by a soft router) are named by the
		// detection too: two projections may be two experts.
		if isProjection(n) {
			if matmuls++; matmuls >= 2 {
				return true
			}
		}
		if f := funcs[funcKey(n.GetDomain(), n.GetOpType(), n.GetOverload())]; f != nil && !seen[f] {
			seen[f] = true
			if selects(funcs, f.Node, seen) {
				return true
			}
		}
		for _, a := range n.Attribute {
			if a.G != nil && selects(funcs, a.G.Node, seen) {
				return true
			}
			for _, g := range a.Graphs {
				if selects(funcs, g.Node, seen) {
					return true
				}
			}
		}
	}
	return false
}

// isLinear reports whether n is a MatMul or Gemm: where the walks back
// from a router's TopK stop (the router linear, or an earlier layer's).
func isLinear(n *pb.NodeProto) bool { return n.GetOpType() == "MatMul" || n.GetOpType() == "Gemm" }

// isProjection reports whether n is a matrix product an expert may be made
// of.
func isProjection(n *pb.NodeProto) bool {
	switch n.GetOpType() {
	case "MatMul", "Gemm", "Einsum", "MatMulInteger", "FusedMatMul", "MatMulNBits", "QLinearMatMul":
		return true
	}
	return false
}

// scopedMiss is a near-miss of scope where, its node named with it.
func scopedMiss(n NearMiss, where string) NearMiss {
	n.Node = fmt.Sprintf("%s in %s", n.Node, where)
	n.Scope = inScope(where, n.Scope)
	return n
}

// routerTopKs lists the TopKs of gp (and of its subgraphs, at any depth)
// that look like routers: their scores come, through elementwise and
// shape ops, from a linear layer (MatMul, Gemm, Einsum), and their
// indices are used. It names what a scope that could not be searched
// leaves unfused. where is gp's scope, each entry's own.
func routerTopKs(gp *pb.GraphProto, where string) []NearMiss {
	prod := map[string]*pb.NodeProto{}
	used := map[string]bool{}
	for _, n := range gp.GetNode() {
		for _, o := range n.Output {
			prod[o] = n
		}
		for _, in := range graph.NodeInputs(n) {
			used[in] = true
		}
	}
	for _, v := range gp.GetOutput() {
		used[v.GetName()] = true
	}
	var out []NearMiss
	for _, n := range gp.GetNode() {
		if n.GetOpType() == "TopK" && n.GetDomain() == "" && len(n.Input) > 0 && len(n.Output) > 1 && used[n.Output[1]] && fromLinear(prod, n.Input[0]) {
			out = append(out, NearMiss{Node: graph.NodeLabel(n), Scope: where})
		}
		for _, s := range scopeSites(&pb.GraphProto{Node: []*pb.NodeProto{n}}) {
			out = append(out, routerTopKs(s.g, inScope(where, s.where()))...)
		}
	}
	return out
}

// fromLinear reports whether v is computed, through at most a few
// elementwise, normalisation and shape ops, by a MatMul, Gemm or Einsum of
// the graph prod indexes (a value read from an outer scope counts: its
// producer is not known here).
func fromLinear(prod map[string]*pb.NodeProto, v string) bool {
	for step := 0; step < 12; step++ {
		p := prod[v]
		if p == nil {
			return true
		}
		switch p.GetOpType() {
		case "MatMul", "Gemm", "Einsum", "FusedMatMul", "FusedGemm":
			return true
		case "Softmax", "Sigmoid", "LogSoftmax", "Exp", "Add", "Sub", "Mul", "Div", "Neg", "Cast", "Reshape", "Transpose",
			"Squeeze", "Unsqueeze", "Flatten", "Identity", "Where", "Slice", "Relu", "Tanh", "Clip":
			if len(p.Input) == 0 {
				return false
			}
			v = p.Input[0]
		default:
			return false
		}
	}
	return false
}

// unsearched reports, for each router-like TopK of gp (see routerTopKs),
// that the scope could not be searched, and why; where gp has none (its
// selection is an ArgMax), it names the scope itself.
func unsearched(gp *pb.GraphProto, where, why string) []NearMiss {
	var out []NearMiss
	for _, n := range routerTopKs(gp, where) {
		n.Reason = why
		out = append(out, scopedMiss(NearMiss{Node: n.Node, Reason: why}, n.Scope))
	}
	if len(out) == 0 { // its selection is no TopK (an ArgMax, ...): the scope is named
		out = append(out, NearMiss{Node: where, Reason: why, Scope: where})
	}
	return out
}

// fresh returns name, or name with a suffix, unused in names, and marks it.
func fresh(names map[string]bool, name string) string {
	r := name
	for i := 1; names[r]; i++ {
		r = fmt.Sprintf("%s_%d", name, i)
	}
	names[r] = true
	return r
}

// renameRefs renames the values gp's nodes (and, at any depth, its
// subgraphs' nodes) read, and gp's outputs, as rename says.
func renameRefs(gp *pb.GraphProto, rename map[string]string) {
	for _, n := range gp.GetNode() {
		for i, v := range n.Input {
			if r, ok := rename[v]; ok {
				n.Input[i] = r
			}
		}
		for _, s := range scopeSites(&pb.GraphProto{Node: []*pb.NodeProto{n}}) {
			renameRefs(s.g, rename)
		}
	}
	for _, v := range gp.GetOutput() {
		if r, ok := rename[v.GetName()]; ok {
			v.Name = proto.String(r)
		}
	}
}

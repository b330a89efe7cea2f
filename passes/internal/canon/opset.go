package canon

import (
	"context"
	"fmt"
	"slices"

	"github.com/mokopt/mokopt/graph"
	pb "github.com/mokopt/mokopt/graph/onnxpb"
	"google.golang.org/protobuf/proto"
)

// minRaisable is the oldest default-domain opset RaiseOpset converts from:
// before 7, Add, Mul, Gemm and others broadcast only on an attribute.
const minRaisable = 7

// RaiseOpset raises w's default-domain opset to to (at most 13) and
// converts the nodes whose spelling changed on the way, so that every op
// keeps its meaning: Split, Squeeze, Unsqueeze and ReduceSum take their
// split or axes as an input instead of an attribute (13); Softmax,
// LogSoftmax and Hardmax reduce one axis instead of flattening at it (13),
// which is the same only on the last axis; TopK takes k as an input (10);
// Clip takes min and max as inputs (11); Slice takes starts, ends and axes
// as inputs (10); Dropout takes its ratio as an input (12). An op whose
// meaning would change (or that no longer exists) refuses the raise, named
// in the error; w is then not edited. A node inside a subgraph that would
// need converting refuses it too (see RaiseOpsetWithSubgraphs). It returns
// the number of nodes converted.
func RaiseOpset(w *Work, to int64) (int, error) {
	return raiseOpset(w, to, false, nil)
}

// RaiseOpsetWithSubgraphs is RaiseOpset that also converts the nodes of
// subgraphs (If branches, Loop and Scan bodies, nested), but those of the
// graphs in keep (already spelled for the new opset: a subgraph that was
// rewritten at it). A node whose subgraph changes is replaced by a copy
// holding a converted copy of the subgraph; nothing shared is edited. The
// constants a converted node needs are main-graph initializers, which
// subgraphs read from their outer scope.
func RaiseOpsetWithSubgraphs(w *Work, to int64, keep map[*pb.GraphProto]bool) (int, error) {
	return raiseOpset(w, to, true, keep)
}

// CheckRaiseOpset reports why RaiseOpsetWithSubgraphs(m, to, keep) would
// refuse, or nil when it would not; m is not edited.
func CheckRaiseOpset(m *graph.Model, to int64, keep map[*pb.GraphProto]bool) error {
	w := newWork(m, Options{})
	w.dry = true
	_, err := raiseOpset(w, to, true, keep)
	return err
}

func raiseOpset(w *Work, to int64, subs bool, keep map[*pb.GraphProto]bool) (int, error) {
	from := w.Opset()
	if from >= to {
		return 0, nil
	}
	if to > MinOpset {
		return 0, fmt.Errorf("raising the opset beyond %d is not supported", MinOpset)
	}
	if from < minRaisable {
		return 0, fmt.Errorf("default-domain opset %d is older than %d: too many ops changed their meaning since", from, minRaisable)
	}
	r := &raiser{w: w, from: from, subs: subs, keep: keep}
	if err := r.inlineOlder(to); err != nil {
		return 0, err
	}
	for _, n := range w.G.P.Node { // first only checked: w is not edited unless all can be
		if _, err := r.node(n, false); err != nil {
			return 0, err
		}
	}
	if w.dry {
		return r.count, nil
	}
	if r.count > 0 && subs {
		r.reserveSubgraphNames(w.G.P)
	}
	r.build, r.count = true, 0
	var olds, news []*pb.NodeProto
	for _, n := range w.G.P.Node {
		c, err := r.node(n, false)
		if err != nil {
			return 0, err
		}
		if c != nil {
			olds, news = append(olds, n), append(news, c)
		}
	}
	for i, n := range olds {
		w.Replace(n, news[i])
	}
	w.flush()
	w.M.SetOpset("", to)
	if w.M.Proto.GetIrVersion() < 7 {
		w.M.Proto.IrVersion = proto.Int64(7) // opset 13 needs IR 7
	}
	return r.count, nil
}

// inlineOlder inlines the calls of model-local functions that import the
// default domain at a version below to, so that their nodes are raised with
// the graph's (a function keeps the opset it imports, which the model's
// raised opset would no longer match). A dry run only checks that their
// nodes can be raised. A function that cannot be inlined (its body has
// subgraphs) refuses the raise, named.
func (r *raiser) inlineOlder(to int64) error {
	w := r.w
	older := map[*pb.FunctionProto]int64{} // function -> the default opset it imports
	for _, f := range w.M.Proto.Functions {
		for _, o := range f.OpsetImport {
			if (o.GetDomain() == "" || o.GetDomain() == "ai.onnx") && o.GetVersion() < to && w.functionUsed(f, r.keep) {
				older[f] = o.GetVersion()
			}
		}
	}
	if len(older) == 0 {
		return nil
	}
	if w.dry {
		for _, f := range w.M.Proto.Functions {
			if older[f] == 0 {
				continue
			}
			for _, n := range f.Node {
				if _, err := r.node(n, false); err != nil {
					return fmt.Errorf("model-local function %s::%s: %w", f.GetDomain(), f.GetName(), err)
				}
			}
		}
		return nil
	}
	only := Rule{Name: Inline.Name, Apply: func(w *Work, n *pb.NodeProto) (bool, error) {
		if f := w.function(n); f == nil || older[f] == 0 {
			return false, nil
		}
		return Inline.Apply(w, n)
	}}
	if err := Apply(context.Background(), w, []Rule{only}, &Result{Applied: map[string]int{}}); err != nil {
		return err
	}
	for _, f := range w.M.Proto.Functions {
		if v := older[f]; v != 0 && w.functionUsed(f, r.keep) {
			return fmt.Errorf("model-local function %s::%s imports opset %d and cannot be inlined", f.GetDomain(), f.GetName(), v)
		}
	}
	return nil
}

// raiser walks a graph for raiseOpset: checking first, then (build)
// making the converted copies.
type raiser struct {
	w     *Work
	from  int64
	subs  bool
	keep  map[*pb.GraphProto]bool
	build bool
	count int
}

// node returns n's replacement (built only when r.build; nil when n needs
// none) and counts the nodes converted in it and its subgraphs.
func (r *raiser) node(n *pb.NodeProto, sub bool) (*pb.NodeProto, error) {
	var attrs []*pb.AttributeProto // n's attributes, where a subgraph changed
	for i, a := range n.Attribute {
		na, err := r.attr(a)
		if err != nil {
			return nil, err
		}
		if na != nil {
			if attrs == nil {
				attrs = slices.Clone(n.Attribute)
			}
			attrs[i] = na
		}
	}
	conv := false
	if d := n.GetDomain(); d == "" || d == "ai.onnx" {
		var err error
		if conv, err = r.w.upgradeCheck(n, r.from); err != nil {
			return nil, err
		}
		if conv && sub && !r.subs {
			return nil, fmt.Errorf("node %s (%s) inside a subgraph would need converting from opset %d", graph.NodeLabel(n), n.GetOpType(), r.from)
		}
	}
	if conv {
		r.count++
	}
	if !r.build || !conv && attrs == nil {
		return nil, nil
	}
	if attrs == nil { // the converted ops hold no subgraph
		c := proto.Clone(n).(*pb.NodeProto)
		return c, r.w.upgrade(c, r.from)
	}
	c := cloneWithout(n, func(x *pb.NodeProto) *[]*pb.AttributeProto { return &x.Attribute })
	c.Attribute = attrs
	if conv {
		return c, r.w.upgrade(c, r.from)
	}
	return c, nil
}

// attr returns a copy of a holding its converted subgraphs (nil when none
// changed; built only when r.build).
func (r *raiser) attr(a *pb.AttributeProto) (*pb.AttributeProto, error) {
	if a.G == nil && len(a.Graphs) == 0 {
		return nil, nil
	}
	g, err := r.graph(a.G)
	if err != nil {
		return nil, err
	}
	var gs []*pb.GraphProto
	for i, x := range a.Graphs {
		ng, err := r.graph(x)
		if err != nil {
			return nil, err
		}
		if ng != nil {
			if gs == nil {
				gs = slices.Clone(a.Graphs)
			}
			gs[i] = ng
		}
	}
	if g == nil && gs == nil {
		return nil, nil
	}
	if g == nil {
		g = a.G
	}
	if gs == nil {
		gs = a.Graphs
	}
	return graph.AttrWithGraphs(a, g, gs), nil
}

// graph returns a converted copy of g (nil when g is nil, kept or
// unchanged; built only when r.build), sharing g's initializers.
func (r *raiser) graph(g *pb.GraphProto) (*pb.GraphProto, error) {
	if g == nil || r.keep[g] {
		return nil, nil
	}
	var nodes []*pb.NodeProto
	for i, n := range g.Node {
		c, err := r.node(n, true)
		if err != nil {
			return nil, err
		}
		if c != nil {
			if nodes == nil {
				nodes = slices.Clone(g.Node)
			}
			nodes[i] = c
		}
	}
	if nodes == nil {
		return nil, nil
	}
	ng := cloneWithout(g, func(x *pb.GraphProto) *[]*pb.NodeProto { return &x.Node })
	ng.Node = nodes
	return ng, nil
}

// cloneWithout is a deep copy of x but for the list field names, which
// the caller sets (x's own list is shared, not copied). Initializers of a
// graph are shared too: they are read only.
func cloneWithout[T proto.Message, E any](x T, field func(T) *[]E) T {
	f := field(x)
	keep := *f
	*f = nil
	var inits []*pb.TensorProto
	g, isGraph := any(x).(*pb.GraphProto)
	if isGraph {
		inits, g.Initializer = g.Initializer, nil
	}
	c := proto.Clone(x).(T)
	*f = keep
	if isGraph {
		g.Initializer = inits
		any(c).(*pb.GraphProto).Initializer = inits
	}
	return c
}

// reserveSubgraphNames reserves in w's index every name of g's
// subgraphs, so that the constants added for converted nodes (main-graph
// initializers) shadow none of them.
func (r *raiser) reserveSubgraphNames(g *pb.GraphProto) {
	names := map[string]bool{}
	for _, n := range g.Node {
		for _, a := range n.Attribute {
			for _, sg := range append([]*pb.GraphProto{a.G}, a.Graphs...) {
				if sg != nil {
					graph.AllNames(sg, names)
				}
			}
		}
	}
	for v := range names {
		r.w.G.Reserve(v) // order-free: nothing is renamed
	}
}

// functionUsed reports whether a node of the main graph, or of a subgraph
// at any depth but those in skip (rewritten at the new opset, to replace
// their originals), calls f.
func (w *Work) functionUsed(f *pb.FunctionProto, skip map[*pb.GraphProto]bool) bool {
	calls := func(n *pb.NodeProto) bool {
		return n.GetDomain() == f.GetDomain() && n.GetOpType() == f.GetName() && n.GetOverload() == f.GetOverload()
	}
	var inSub func(a []*pb.AttributeProto) bool
	inSub = func(as []*pb.AttributeProto) bool {
		for _, a := range as {
			for _, g := range append([]*pb.GraphProto{a.G}, a.Graphs...) {
				if skip[g] {
					continue
				}
				for _, n := range g.GetNode() {
					if calls(n) || inSub(n.Attribute) {
						return true
					}
				}
			}
		}
		return false
	}
	for _, n := range w.G.P.Node {
		if !w.removed[n] && (calls(n) || inSub(n.Attribute)) {
			return true
		}
	}
	return false
}

// upgradeCheck reports whether n needs converting to keep its meaning at
// opset 13, or an error naming it when it cannot keep it.
func (w *Work) upgradeCheck(n *pb.NodeProto, from int64) (bool, error) {
	op := n.GetOpType()
	refuse := func(why string) (bool, error) {
		return false, fmt.Errorf("cannot raise the opset from %d to %d: node %s (%s) %s", from, MinOpset, graph.NodeLabel(n), op, why)
	}
	switch op {
	case "Split":
		return graph.Attr(n, "split") != nil, nil
	case "Squeeze", "Unsqueeze", "ReduceSum":
		return graph.Attr(n, "axes") != nil, nil
	case "Softmax", "LogSoftmax", "Hardmax":
		axis := graph.AttrInt(n, "axis", 1)
		r, ok := w.Rank(n.Input[0])
		if axis == -1 {
			return true, nil
		}
		if !ok {
			return refuse(fmt.Sprintf("flattens its input at axis %d before opset 13 and reduces only that axis from 13; the input's rank is unknown", axis))
		}
		if axis < 0 {
			axis += int64(r)
		}
		if axis != int64(r-1) {
			return refuse(fmt.Sprintf("flattens its rank-%d input at axis %d before opset 13 and reduces only that axis from 13", r, axis))
		}
		return true, nil
	case "TopK":
		if from < 10 && graph.Attr(n, "k") == nil {
			return refuse("has no k")
		}
		return from < 10, nil
	case "Clip":
		if from < 11 && (graph.Attr(n, "min") != nil || graph.Attr(n, "max") != nil) && w.ElemType(n.Input[0]) == 0 {
			return refuse("takes min and max as attributes before opset 11, and its element type is unknown")
		}
		return from < 11, nil
	case "Slice":
		return from < 10, nil
	case "Dropout":
		return from < 12, nil
	case "Pad":
		if from < 11 {
			return refuse("takes its pads as an attribute before opset 11")
		}
	case "Resize":
		if from < 11 {
			return refuse("changed its coordinate semantics at opset 11")
		}
	case "Upsample", "Scatter":
		return refuse("is deprecated by opset 13")
	case "Scan":
		if from < 9 {
			return refuse("changed its signature at opset 9")
		}
	}
	return false, nil
}

// upgrade rewrites n, a node of w's own, in place to its opset-13
// spelling (see upgradeCheck).
func (w *Work) upgrade(n *pb.NodeProto, from int64) error {
	take := func(name string) *pb.AttributeProto {
		for i, a := range n.Attribute {
			if a.GetName() == name {
				n.Attribute = append(n.Attribute[:i], n.Attribute[i+1:]...)
				return a
			}
		}
		return nil
	}
	label := n.GetName()
	if label == "" {
		label = n.Output[0]
	}
	ints := func(name string) string {
		a := take(name)
		if a == nil {
			return ""
		}
		return w.Int64s(label+"/"+name, false, a.GetInts()...)
	}
	setInput := func(i int, v string) {
		for len(n.Input) <= i {
			n.Input = append(n.Input, "")
		}
		n.Input[i] = v
	}
	switch n.GetOpType() {
	case "Split":
		setInput(1, ints("split"))
	case "Squeeze", "Unsqueeze", "ReduceSum":
		setInput(1, ints("axes"))
	case "Softmax", "LogSoftmax", "Hardmax":
		take("axis")
		n.Attribute = append(n.Attribute, graph.IntAttr("axis", -1))
	case "TopK":
		k := take("k")
		if k == nil {
			return fmt.Errorf("node %s (TopK) has no k", graph.NodeLabel(n))
		}
		setInput(1, w.Int64s(label+"/k", false, k.GetI()))
	case "Slice":
		starts, ends, axes := ints("starts"), ints("ends"), ints("axes")
		setInput(1, starts)
		setInput(2, ends)
		if axes != "" {
			setInput(3, axes)
		}
	case "Clip":
		lo, hi := take("min"), take("max")
		dt := w.ElemType(n.Input[0])
		if dt == 0 {
			return fmt.Errorf("node %s (Clip): element type unknown, cannot turn min/max into inputs", graph.NodeLabel(n))
		}
		for i, a := range []*pb.AttributeProto{lo, hi} {
			if a == nil {
				continue
			}
			s, err := w.Scalar(label+"/bound", dt, float64(a.GetF()))
			if err != nil {
				return fmt.Errorf("node %s (Clip): %w", graph.NodeLabel(n), err)
			}
			setInput(i+1, s)
		}
	case "Dropout":
		ratio := take("ratio")
		take("is_test")
		if ratio != nil {
			dt := w.ElemType(n.Input[0])
			if dt == 0 {
				dt = int32(pb.TensorProto_FLOAT)
			}
			s, err := w.Scalar(label+"/ratio", dt, float64(ratio.GetF()))
			if err != nil {
				return err
			}
			setInput(1, s)
		}
	}
	return nil
}

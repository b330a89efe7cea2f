package canon

import (
	"fmt"
	"slices"

	"github.com/mokopt/mokopt/graph"
	"github.com/mokopt/mokopt/graph/eval"
	pb "github.com/mokopt/mokopt/graph/onnxpb"
	"google.golang.org/protobuf/proto"
)

// maxConstElems bounds the constants a rule reads or folds: shape
// arithmetic is small, and weights are never copied.
const maxConstElems = 1 << 16

// Work is the working copy a rule edits: the model, an index over its main
// graph, and helpers that keep the index right while a sweep runs. Nodes a
// rule removes leave the graph at the end of the sweep. Nodes are shared
// with the original model (see graph.Model.WorkingCopy): a rule never edits
// one in place, it replaces it (Replace) by new or cloned nodes.
type Work struct {
	// M is the working copy.
	M *graph.Model
	// G indexes M's main graph.
	G *graph.Graph

	opt   Options
	notes []string
	// dry: nothing is edited; the first rule that would change the graph
	// ends the run (see Canonicalize).
	dry bool
	// orig indexes the original model, whose value names NewName never
	// hands out (a name the working copy dropped still means the
	// original's value there); gone lists the outputs of removed nodes.
	orig *graph.Graph
	gone []string
	// touch, set while Apply runs, queues a node for another look; added
	// counts the nodes Replace added.
	touch   func(n *pb.NodeProto)
	added   int
	removed map[*pb.NodeProto]bool
	types   map[string]*pb.TypeProto_Tensor // declared tensor types by value name
	consts  map[string]*eval.Tensor
	// ranks caches the ranks inferRank found (a value keeps its rank under
	// every rule, which preserves meaning), so that inference stays linear
	// in the graph however often values are shared.
	ranks map[string]int
}

func newWork(m *graph.Model, opt Options) *Work {
	gp := m.Proto.GetGraph()
	types := make(map[string]*pb.TypeProto_Tensor, len(gp.GetInput())+len(gp.GetOutput())+len(gp.GetValueInfo()))
	w := &Work{M: m, opt: opt, G: m.Graph(), removed: map[*pb.NodeProto]bool{}, types: types, consts: map[string]*eval.Tensor{}, ranks: map[string]int{}}
	for _, l := range [][]*pb.ValueInfoProto{gp.GetInput(), gp.GetOutput(), gp.GetValueInfo()} {
		for _, v := range l {
			if tt := v.GetType().GetTensorType(); tt != nil {
				w.types[v.GetName()] = tt
			}
		}
	}
	return w
}

// NewWork returns a Work over m's main graph (m is edited in place).
func NewWork(m *graph.Model, opt Options) *Work { return newWork(m, opt) }

// note records a remark for Result.Notes (once per text).
func (w *Work) note(s string) {
	for _, x := range w.notes {
		if x == s {
			return
		}
	}
	w.notes = append(w.notes, s)
}

// flush drops the nodes removed during the sweep from the graph.
func (w *Work) flush() {
	if len(w.removed) == 0 {
		return
	}
	w.G.RemoveNodes(w.removed)
	w.removed = map[*pb.NodeProto]bool{}
}

// Flush drops the nodes removed so far from the graph (the driver does this
// after each sweep).
func (w *Work) Flush() { w.flush() }

// Opset returns the working copy's default-domain opset.
func (w *Work) Opset() int64 { return w.M.Opset("") }

// touched queues, after n was removed or replaced, the nodes that may
// match a rule now: the consumers of its outputs, the producers and other
// consumers of its inputs, and the nodes that replace it with their
// consumers.
func (w *Work) touched(n *pb.NodeProto, added []*pb.NodeProto) {
	if w.touch == nil {
		return
	}
	// Rules look up to two producers back from the node they match (a
	// Where of an Equal of a constant, a Squeeze of a Split of a OneHot):
	// the readers of what an added node's readers compute are touched too.
	for _, a := range added {
		w.touch(a)
		for _, o := range a.Output {
			for _, c := range w.G.Consumers(o) {
				w.touch(c)
				for _, co := range c.Output {
					for _, cc := range w.G.Consumers(co) {
						w.touch(cc)
					}
				}
			}
		}
	}
	for _, o := range n.Output {
		for _, c := range w.G.Consumers(o) {
			w.touch(c)
		}
	}
	for _, v := range graph.NodeInputs(n) {
		w.touch(w.Producer(v))
		for _, c := range w.G.Consumers(v) {
			w.touch(c)
		}
	}
}

// Remove takes n out of the graph (at the end of the sweep).
func (w *Work) Remove(n *pb.NodeProto) {
	if !w.dry {
		w.removed[n] = true
		w.gone = append(w.gone, n.Output...)
		w.touched(n, nil)
	}
}

// Replace takes n out and adds nodes in its place. The nodes must produce
// every output of n that is read, under the same names; the one that
// produces n's first output takes n's device configurations and metadata
// when it has none of its own.
func (w *Work) Replace(n *pb.NodeProto, nodes ...*pb.NodeProto) {
	if w.dry {
		return
	}
	w.removed[n] = true
	w.gone = append(w.gone, n.Output...)
	for _, r := range nodes {
		if len(n.Output) > 0 && slices.Contains(r.Output, n.Output[0]) && len(r.DeviceConfigurations) == 0 && len(r.MetadataProps) == 0 {
			// the node computing n's value keeps n's annotations (a
			// sharding of the weight it reads, say)
			r.DeviceConfigurations, r.MetadataProps = n.DeviceConfigurations, n.MetadataProps
		}
		w.G.AddNode(r)
	}
	w.added += len(nodes)
	for _, o := range n.Output {
		delete(w.consts, o)
	}
	w.touched(n, nodes)
}

// Consumers returns the nodes that read v and are not removed, each once
// (a node that reads v twice, as Mul(v, v) does, is listed once: a rule
// that replaces each consumer must not replace one twice).
func (w *Work) Consumers(v string) []*pb.NodeProto {
	all := w.G.Consumers(v)
	var seen map[*pb.NodeProto]bool
	if len(all) > 16 {
		seen = make(map[*pb.NodeProto]bool, len(all))
	}
	var out []*pb.NodeProto
	for _, c := range all {
		switch {
		case w.removed[c]:
		case seen != nil:
			if !seen[c] {
				seen[c] = true
				out = append(out, c)
			}
		case !slices.Contains(out, c):
			out = append(out, c)
		}
	}
	return out
}

// read reports whether a node that is not removed reads v.
func (w *Work) read(v string) bool {
	for _, c := range w.G.Consumers(v) {
		if !w.removed[c] {
			return true
		}
	}
	return false
}

// Producer returns the node producing v, or nil.
func (w *Work) Producer(v string) *pb.NodeProto {
	p := w.G.Producer(v)
	if p == nil || w.removed[p] {
		return nil
	}
	return p
}

// CanAlias reports whether the consumers of old can read repl instead:
// old is not a graph output and no subgraph reads it from the outer scope.
func (w *Work) CanAlias(old string) bool {
	if w.G.IsOutput(old) {
		return false
	}
	for _, c := range w.Consumers(old) {
		if !slices_contains(c.Input, old) {
			return false // read inside a subgraph
		}
	}
	return true
}

func slices_contains(l []string, s string) bool {
	for _, x := range l {
		if x == s {
			return true
		}
	}
	return false
}

// Drop removes n, a node whose only output equals its input in, and makes
// its consumers read in; false (nothing done) when that is not possible
// (see CanAlias).
func (w *Work) Drop(n *pb.NodeProto, in string) bool {
	if len(n.Output) != 1 || in == "" || !w.CanAlias(n.Output[0]) {
		return false
	}
	out := n.Output[0]
	if w.dry {
		return true
	}
	w.removed[n] = true
	w.gone = append(w.gone, out)
	w.touched(n, nil)
	for _, c := range w.Consumers(out) {
		// Nodes may be shared with the original model: edit a clone.
		r := proto.Clone(c).(*pb.NodeProto)
		for i, v := range r.Input {
			if v == out {
				r.Input[i] = in
			}
		}
		w.Replace(c, r)
	}
	return true
}

// NewName returns a value or node name starting with prefix that the graph
// does not use yet.
func (w *Work) NewName(prefix string) string {
	if w.dry {
		return prefix
	}
	name := w.G.UniqueName(prefix)
	for w.orig != nil && w.orig.ValueID(name) >= 0 {
		name = w.G.UniqueName(prefix) // the last one is reserved now
	}
	return name
}

// reserveGone reserves, in the working copy's index, the names of the
// values removed nodes produced that nothing produces any more, so that
// names handed out later (by the matcher's rewrite) never reuse one: every
// name of the working copy then either means what it means in the
// original or is new to both.
func (w *Work) reserveGone() {
	for _, o := range w.gone {
		if o != "" && w.G.Producer(o) == nil && w.G.Initializer(o) == nil {
			w.G.UniqueName(o)
		}
	}
}

// SetOpset imports domain at version into the working copy.
func (w *Work) SetOpset(domain string, version int64) {
	if !w.dry {
		w.M.SetOpset(domain, version)
	}
}

// Type returns v's declared tensor type (element type and shape), or nil.
func (w *Work) Type(v string) *pb.TypeProto_Tensor {
	if t := w.G.Initializer(v); t != nil {
		shape := &pb.TensorShapeProto{}
		for _, d := range t.GetDims() {
			shape.Dim = append(shape.Dim, &pb.TensorShapeProto_Dimension{Value: &pb.TensorShapeProto_Dimension_DimValue{DimValue: d}})
		}
		return &pb.TypeProto_Tensor{ElemType: proto.Int32(t.GetDataType()), Shape: shape}
	}
	return w.types[v]
}

// ElemType returns v's element type: declared, or followed back through
// producers that keep their input's type; 0 when unknown.
func (w *Work) ElemType(v string) int32 { return w.inferElemType(v, 0) }

// StaticShape returns v's declared shape when every dimension is a known
// number, and whether it is.
func (w *Work) StaticShape(v string) ([]int64, bool) {
	if c, ok := w.Const(v); ok {
		out := make([]int64, len(c.Shape))
		for i, d := range c.Shape {
			out[i] = int64(d)
		}
		return out, true
	}
	t := w.Type(v)
	if t == nil || t.GetShape() == nil {
		return nil, false
	}
	out := make([]int64, 0, len(t.GetShape().GetDim()))
	for _, d := range t.GetShape().GetDim() {
		dv, ok := d.GetValue().(*pb.TensorShapeProto_Dimension_DimValue)
		if !ok || dv.DimValue < 0 {
			return nil, false
		}
		out = append(out, dv.DimValue)
	}
	return out, true
}

// Const returns v's value when v is a small constant: an initializer that
// is not a graph input, or the output of a Constant node.
func (w *Work) Const(v string) (*eval.Tensor, bool) {
	if v == "" {
		return nil, false
	}
	if c, ok := w.consts[v]; ok {
		return c, c != nil
	}
	c := w.readConst(v)
	w.consts[v] = c
	return c, c != nil
}

func (w *Work) readConst(v string) *eval.Tensor {
	if t := w.G.Initializer(v); t != nil {
		if w.G.IsInput(v) {
			return nil // overridable by a feed
		}
		n := int64(1)
		for _, d := range t.GetDims() {
			n *= d
		}
		if n > maxConstElems || !eval.SupportedDType(pb.TensorProto_DataType(t.GetDataType())) {
			return nil
		}
		c, err := eval.FromProto(t, w.M.TensorBytes)
		if err != nil {
			return nil
		}
		return c
	}
	p := w.Producer(v)
	if p == nil || p.GetOpType() != "Constant" || p.GetDomain() != "" || len(p.Attribute) != 1 {
		return nil
	}
	a := p.Attribute[0]
	switch a.GetName() {
	case "value":
		t := a.GetT()
		if t == nil || !eval.SupportedDType(pb.TensorProto_DataType(t.GetDataType())) {
			return nil
		}
		c, err := eval.FromProto(t, nil)
		if err != nil || c.Len() > maxConstElems {
			return nil
		}
		return c
	case "value_int":
		return eval.ScalarInt64(a.GetI())
	case "value_ints":
		return eval.NewInt64([]int{len(a.GetInts())}, append([]int64(nil), a.GetInts()...))
	case "value_float":
		return eval.ScalarFloat32(a.GetF())
	case "value_floats":
		return eval.NewFloat32([]int{len(a.GetFloats())}, append([]float32(nil), a.GetFloats()...))
	}
	return nil
}

// ConstInts returns v's value as int64s when it is a small integer constant.
func (w *Work) ConstInts(v string) ([]int64, bool) {
	c, ok := w.Const(v)
	if !ok || (c.DType != pb.TensorProto_INT64 && c.DType != pb.TensorProto_INT32) {
		return nil, false
	}
	return c.Int64s(), true
}

// ConstScalar returns v's value as a float64 when it is a one-element
// numeric constant.
func (w *Work) ConstScalar(v string) (float64, bool) {
	c, ok := w.Const(v)
	if !ok || c.Len() != 1 || c.DType == pb.TensorProto_STRING {
		return 0, false
	}
	return c.Float64At(0), true
}

// AddConst adds t as an initializer named name (which must be new or the
// output of a node being replaced) and returns name.
func (w *Work) AddConst(name string, t *eval.Tensor) (string, error) {
	tp, err := eval.ToProto(t, name)
	if err != nil {
		return "", fmt.Errorf("constant %q: %w", name, err)
	}
	if w.dry {
		return name, nil
	}
	w.G.AddInitializer(tp)
	w.consts[name] = t
	if w.touch != nil {
		for _, c := range w.G.Consumers(name) {
			w.touch(c)
		}
	}
	return name, nil
}

// AddView adds an initializer named name that holds t's data under other
// dims with as many elements (raw or typed data shared, a side file's
// location copied) and returns name. t must not be deferred.
func (w *Work) AddView(name string, t *pb.TensorProto, dims []int64) string {
	if w.dry {
		return name
	}
	v := &pb.TensorProto{Name: proto.String(name), Dims: slices.Clone(dims), DataType: t.DataType, RawData: t.RawData,
		FloatData: t.FloatData, Int32Data: t.Int32Data, Int64Data: t.Int64Data, DoubleData: t.DoubleData, Uint64Data: t.Uint64Data,
		StringData: t.StringData, DataLocation: t.DataLocation}
	for _, e := range t.ExternalData {
		v.ExternalData = append(v.ExternalData, proto.Clone(e).(*pb.StringStringEntryProto))
	}
	w.G.AddInitializer(v)
	if w.touch != nil {
		for _, c := range w.G.Consumers(name) {
			w.touch(c)
		}
	}
	return name
}

// Int64s adds a new int64 initializer (a 1-D tensor of vals, or a scalar
// when scalar is set) with a name from prefix, and returns its name.
func (w *Work) Int64s(prefix string, scalar bool, vals ...int64) string {
	shape := []int{len(vals)}
	if scalar {
		shape = nil
	}
	name, _ := w.AddConst(w.NewName(prefix), eval.NewInt64(shape, vals))
	return name
}

// Scalar adds a new scalar initializer of element type dt holding v, with a
// name from prefix, and returns its name.
func (w *Work) Scalar(prefix string, dt int32, v float64) (string, error) {
	var t *eval.Tensor
	switch pb.TensorProto_DataType(dt) {
	case pb.TensorProto_FLOAT, pb.TensorProto_FLOAT16, pb.TensorProto_BFLOAT16:
		t = eval.NewFloatAs(pb.TensorProto_DataType(dt), nil, []float32{float32(v)})
	case pb.TensorProto_DOUBLE:
		t = eval.NewFloat64(nil, []float64{v})
	default:
		return "", fmt.Errorf("scalar of element type %s is not supported", pb.TensorProto_DataType(dt))
	}
	return w.AddConst(w.NewName(prefix), t)
}

// Scale returns a Mul node named from n computing out = x·v, v a new
// scalar constant of like's element type (what names both), or false when
// that type is unknown or not a float type; nothing is added then.
func (w *Work) Scale(n *pb.NodeProto, like, x, out string, v float64, what string) (*pb.NodeProto, bool) {
	dt := w.ElemType(like)
	if dt == 0 {
		return nil, false
	}
	s, err := w.Scalar(n.GetName()+"/"+what, dt, v)
	if err != nil {
		return nil, false
	}
	return w.Node("Mul", "", n.GetName()+"/Mul_"+what, []string{x, s}, []string{out}), true
}

// attrsNamed returns n's attributes of the given names, in n's order (the
// ones a replacement keeps).
func attrsNamed(n *pb.NodeProto, names ...string) []*pb.AttributeProto {
	var out []*pb.AttributeProto
	for _, a := range n.Attribute {
		if slices.Contains(names, a.GetName()) {
			out = append(out, a)
		}
	}
	return out
}

// Node builds a node named from prefix (made unique).
func (w *Work) Node(op, domain, prefix string, in, out []string, attrs ...*pb.AttributeProto) *pb.NodeProto {
	return graph.NewNode(op, domain, w.NewName(prefix), in, out, attrs...)
}

// InPlaceOf builds the one node that replaces n with its outputs, under
// n's own name (n leaves the graph as it comes in): a node respelled one
// for one (a Where with its branches swapped) is still the node the model
// names, and a message about it names a node of the model.
func (w *Work) InPlaceOf(n *pb.NodeProto, op string, in []string, attrs ...*pb.AttributeProto) *pb.NodeProto {
	return graph.NewNode(op, n.GetDomain(), n.GetName(), in, slices.Clone(n.Output), attrs...)
}

// Temp returns a new value name for an intermediate of a replacement.
func (w *Work) Temp(n *pb.NodeProto, what string) string {
	base := n.GetName()
	if base == "" && len(n.Output) > 0 {
		base = n.Output[0]
	}
	return w.NewName(base + "/" + what)
}

// Rank returns v's rank when its type declares a shape (symbolic
// dimensions allowed), when v is a constant, or when it follows from the
// ranks of its producer's inputs (graph.InferRank). Ranks found are kept: a
// value keeps its rank under every rule.
func (w *Work) Rank(v string) (int, bool) {
	if r, ok := w.ranks[v]; ok {
		return r, true
	}
	memo := map[string]int{}
	r, ok := graph.InferRank(workRanks{w}, v, memo)
	for k, x := range memo {
		if x >= 0 {
			w.ranks[k] = x
		}
	}
	return r, ok
}

// workRanks answers graph.InferRank from a Work.
type workRanks struct{ w *Work }

func (s workRanks) Producer(v string) *pb.NodeProto { return s.w.Producer(v) }

func (s workRanks) StaticDim(v string, i, r int) (int64, bool) { return staticDim(s.w, v, i, r, 0) }

func (s workRanks) KnownRank(v string) (int, bool) {
	if r, ok := s.w.ranks[v]; ok {
		return r, true
	}
	if c, ok := s.w.Const(v); ok {
		return len(c.Shape), true
	}
	if t := s.w.Type(v); t != nil && t.GetShape() != nil {
		return len(t.GetShape().GetDim()), true
	}
	return 0, false
}

func (s workRanks) ConstInts(v string) ([]int64, bool) { return s.w.ConstInts(v) }

func inputOr(n *pb.NodeProto, i int) string {
	if i < len(n.Input) {
		return n.Input[i]
	}
	return ""
}

// sameTypeOps lists ops whose output element type is their first input's.
var sameTypeOps = map[string]bool{
	"Add": true, "Sub": true, "Mul": true, "Div": true, "Neg": true, "Abs": true, "Sigmoid": true, "Tanh": true,
	"Relu": true, "Erf": true, "Exp": true, "Sqrt": true, "Pow": true, "Softmax": true, "LogSoftmax": true,
	"MatMul": true, "Gemm": true, "Identity": true, "Reshape": true, "Transpose": true, "Squeeze": true,
	"Unsqueeze": true, "Flatten": true, "Slice": true, "Gather": true, "GatherElements": true, "GatherND": true,
	"Concat": true, "Expand": true, "Tile": true, "Split": true, "Max": true, "Min": true, "Sum": true, "Mean": true,
	"ReduceSum": true, "ReduceMean": true, "ReduceMax": true, "Where": false, "TopK": true, "Clip": true,
	"LeakyRelu": true, "HardSigmoid": true, "Elu": true, "Softplus": true, "Gelu": true, "ScatterND": true, "ScatterElements": true,
	"com.microsoft::QuickGelu": true, "com.microsoft::FusedGemm": true, "com.microsoft::FusedMatMul": true,
	"com.microsoft::Gelu": true, "com.microsoft::BiasGelu": true, "com.microsoft::FastGelu": true,
	"Log": true, "Reciprocal": true, "Softsign": true, "Mish": true, "Celu": true, "Selu": true, "ThresholdedRelu": true,
	"HardSwish": true, "PRelu": true, "Sign": true, "Floor": true, "Ceil": true, "Round": true, "Sin": true, "Cos": true,
}

// inferElemType follows producers back (a few steps) to the element type of
// v when no type is declared.
func (w *Work) inferElemType(v string, depth int) int32 {
	if t := w.Type(v); t != nil && t.GetElemType() != 0 {
		return t.GetElemType()
	}
	if c, ok := w.Const(v); ok {
		return int32(c.DType)
	}
	if t := w.G.Initializer(v); t != nil {
		return t.GetDataType()
	}
	p := w.Producer(v)
	if p == nil || depth > 16 {
		return 0
	}
	key := graph.OpKey(p)
	switch {
	case key == "Cast":
		return int32(graph.AttrInt(p, "to", 0))
	case key == "Where" && len(p.Input) == 3:
		return w.inferElemType(p.Input[1], depth+1)
	case key == "TopK" && len(p.Output) > 1 && v == p.Output[1], key == "ArgMax", key == "ArgMin", key == "Shape", key == "Size":
		return int32(pb.TensorProto_INT64)
	case sameTypeOps[key] && len(p.Input) > 0:
		return w.inferElemType(p.Input[0], depth+1)
	}
	return 0
}

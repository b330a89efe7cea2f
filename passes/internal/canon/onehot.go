package canon

import (
	"github.com/mokopt/mokopt/graph"
	pb "github.com/mokopt/mokopt/graph/onnxpb"
)

// OneHotOfEqual turns an expert mask written as a comparison with the
// expert ids — Equal(Unsqueeze(i, -1), [0, 1, ..., d-1]), selected with
// Where(mask, on, off) by scalar constants or cast to a number type — into
// OneHot(i, d, [off, on]) on the last axis, which the matchers read as the
// expert one-hot it is (`idx[..., None] == arange(E)` in hand-written
// dispatch). The constant is decided by its values (0 to d-1 in order,
// along the last axis), not by how it was made. Exactly equal where i is
// not negative, which the rule requires: i comes from a TopK's or an
// ArgMax's indices, through ops that move values only.
var OneHotOfEqual = Rule{
	Name:  "onehot-of-equal",
	Ops:   []string{"Where", "Cast"},
	Apply: func(w *Work, n *pb.NodeProto) (bool, error) { return oneHotOfEqual(w, n), nil },
}

// oneHotOfEqual applies OneHotOfEqual to a Where or Cast n.
func oneHotOfEqual(w *Work, n *pb.NodeProto) bool {
	if len(n.Input) == 0 || len(n.Output) != 1 {
		return false
	}
	eq := w.Producer(n.Input[0])
	if eq == nil || eq.GetOpType() != "Equal" || eq.GetDomain() != "" || len(eq.Input) != 2 {
		return false
	}
	idx, depth, ok := expertIDCompare(w, eq)
	if !ok {
		return false
	}
	p := n.GetName() + "/onehot"
	var values []*pb.NodeProto
	vals := w.Temp(n, "onehot_values")
	switch n.GetOpType() {
	case "Where":
		if len(n.Input) != 3 || !scalarConst(w, n.Input[1]) || !scalarConst(w, n.Input[2]) || w.ElemType(n.Input[1]) != w.ElemType(n.Input[2]) {
			return false
		}
		one := w.Int64s(p+"/one", false, 1)
		off, on := w.Temp(n, "off"), w.Temp(n, "on")
		values = []*pb.NodeProto{
			w.Node("Reshape", "", p+"/off", []string{n.Input[2], one}, []string{off}),
			w.Node("Reshape", "", p+"/on", []string{n.Input[1], one}, []string{on}),
			w.Node("Concat", "", p+"/values", []string{off, on}, []string{vals}, graph.IntAttr("axis", 0))}
	case "Cast":
		to := graph.AttrInt(n, "to", 0)
		if to == int64(pb.TensorProto_BOOL) || to == int64(pb.TensorProto_STRING) || to == 0 {
			return false
		}
		values = []*pb.NodeProto{w.Node("Cast", "", p+"/values", []string{w.Int64s(p+"/offon", false, 0, 1)}, []string{vals}, graph.IntAttr("to", to))}
	}
	d := w.Int64s(p+"/depth", false, depth)
	w.Replace(n, append(values, graph.NewNode("OneHot", "", n.GetName(), []string{idx, d, vals}, n.Output, graph.IntAttr("axis", -1)))...)
	return true
}

// expertIDCompare reads Equal eq as Unsqueeze(i, last axis) compared with
// the constant 0..d-1 along the last axis (either side), i being selected
// expert ids: it returns i and d.
func expertIDCompare(w *Work, eq *pb.NodeProto) (string, int64, bool) {
	for side := 0; side < 2; side++ {
		u, k := w.Producer(eq.Input[side]), eq.Input[1-side]
		if u == nil || u.GetOpType() != "Unsqueeze" || u.GetDomain() != "" || len(u.Input) == 0 {
			continue
		}
		axes := graph.AttrInts(u, "axes")
		if len(u.Input) > 1 {
			axes, _ = w.ConstInts(u.Input[1])
		}
		r, ok := w.Rank(u.Input[0])
		if !ok || len(axes) != 1 || (axes[0] != -1 && axes[0] != int64(r)) || !selectedIDs(w, u.Input[0]) {
			continue
		}
		c, ok := w.Const(k)
		if !ok || c.Len() < 1 || c.DType != pb.TensorProto_INT64 && c.DType != pb.TensorProto_INT32 || len(c.Shape) > r+1 {
			continue
		}
		for i, s := range c.Shape {
			if i < len(c.Shape)-1 && s != 1 {
				ok = false
			}
		}
		for j := 0; ok && j < c.Len(); j++ {
			ok = c.Float64At(j) == float64(j)
		}
		if ok {
			return u.Input[0], int64(c.Len()), true
		}
	}
	return "", 0, false
}

// selectedIDs reports whether integer v is the indices output of a TopK or
// an ArgMax, through ops that move or reshape values only.
func selectedIDs(w *Work, v string) bool {
	for step := 0; step < 8; step++ {
		p := w.Producer(v)
		if p == nil || p.GetDomain() != "" {
			return false
		}
		switch p.GetOpType() {
		case "TopK":
			return len(p.Output) == 2 && p.Output[1] == v
		case "ArgMax":
			return true
		case "Reshape", "Squeeze", "Unsqueeze", "Flatten", "Transpose", "Identity":
			v = p.Input[0]
		default:
			return false
		}
	}
	return false
}

// scalarConst reports whether v is a constant of one value.
func scalarConst(w *Work, v string) bool {
	c, ok := w.Const(v)
	return ok && c.Len() == 1
}

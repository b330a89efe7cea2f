package canon

import (
	"fmt"

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
// in the error; w is then not edited. It returns the number of nodes
// converted.
func RaiseOpset(w *Work, to int64) (int, error) {
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
	var nodes []*pb.NodeProto
	var walk func(ns []*pb.NodeProto, sub bool) error
	walk = func(ns []*pb.NodeProto, sub bool) error {
		for _, n := range ns {
			for _, a := range n.Attribute {
				if a.G != nil {
					if err := walk(a.G.Node, true); err != nil {
						return err
					}
				}
				for _, g := range a.Graphs {
					if err := walk(g.Node, true); err != nil {
						return err
					}
				}
			}
			if n.GetDomain() != "" && n.GetDomain() != "ai.onnx" {
				continue
			}
			conv, err := w.upgradeCheck(n, from)
			if err != nil {
				return err
			}
			if conv {
				if sub {
					return fmt.Errorf("node %s (%s) inside a subgraph would need converting from opset %d", graph.NodeLabel(n), n.GetOpType(), from)
				}
				nodes = append(nodes, n)
			}
		}
		return nil
	}
	if err := walk(w.G.P.Node, false); err != nil {
		return 0, err
	}
	for _, f := range w.M.Proto.Functions {
		for _, o := range f.OpsetImport {
			if (o.GetDomain() == "" || o.GetDomain() == "ai.onnx") && o.GetVersion() < to && w.functionUsed(f) {
				return 0, fmt.Errorf("model-local function %s::%s imports opset %d", f.GetDomain(), f.GetName(), o.GetVersion())
			}
		}
	}
	if w.dry {
		return len(nodes), nil
	}
	for _, n := range nodes {
		c := proto.Clone(n).(*pb.NodeProto) // n may be shared with the original
		if err := w.upgrade(c, from); err != nil {
			return 0, err
		}
		w.Replace(n, c)
	}
	w.flush()
	w.M.SetOpset("", to)
	if w.M.Proto.GetIrVersion() < 7 {
		w.M.Proto.IrVersion = proto.Int64(7) // opset 13 needs IR 7
	}
	return len(nodes), nil
}

// functionUsed reports whether a node of the main graph calls f.
func (w *Work) functionUsed(f *pb.FunctionProto) bool {
	for _, n := range w.G.P.Node {
		if !w.removed[n] && n.GetDomain() == f.GetDomain() && n.GetOpType() == f.GetName() && n.GetOverload() == f.GetOverload() {
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

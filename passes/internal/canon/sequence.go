package canon

import (
	"slices"

	"github.com/mokopt/mokopt/graph"
	pb "github.com/mokopt/mokopt/graph/onnxpb"
)

// SequenceToSplit turns a SplitToSequence whose every consumer is a
// SequenceAt at a constant position into one Split: the piece SequenceAt
// reads at position i keeps SequenceAt's output name. The pieces must be
// known statically: a constant 1-D split, or a constant chunk size (or
// none: pieces of one) over an axis of static length. keepdims=0 without a
// split squeezes each piece, as SplitToSequence does.
var SequenceToSplit = Rule{
	Name: "sequence-to-split",
	Ops:  []string{"SplitToSequence"},
	Apply: func(w *Work, n *pb.NodeProto) (bool, error) {
		if len(n.Input) < 1 || len(n.Output) != 1 || w.G.IsOutput(n.Output[0]) {
			return false, nil
		}
		x := n.Input[0]
		axis := graph.AttrInt(n, "axis", 0)
		if axis < 0 {
			r, ok := w.Rank(x)
			if !ok {
				return false, nil
			}
			axis += int64(r)
		}
		squeeze := false
		var sizes []int64
		computed := "" // a computed 1-D split, given to the Split as it is
		if len(n.Input) > 1 && n.Input[1] != "" {
			c, ok := w.Const(n.Input[1])
			if !ok {
				var pieces int64
				if computed, pieces, ok = computedSplit(w, n.Input[1]); !ok {
					return false, nil
				}
				sizes = make([]int64, pieces)
			} else if c.DType != pb.TensorProto_INT64 && c.DType != pb.TensorProto_INT32 {
				return false, nil
			} else if len(c.Shape) == 1 {
				sizes = c.Int64s()
			} else {
				chunk := c.Int64s()[0]
				dim, ok := w.dim(x, axis)
				if !ok || chunk <= 0 {
					return false, nil
				}
				for left := dim; left > 0; left -= chunk {
					sizes = append(sizes, min(chunk, left))
				}
			}
		} else {
			dim, ok := w.dim(x, axis)
			if !ok {
				return false, nil
			}
			for range dim {
				sizes = append(sizes, 1)
			}
			squeeze = graph.AttrInt(n, "keepdims", 1) == 0
		}
		if len(sizes) == 0 {
			return false, nil
		}
		uses := w.Consumers(n.Output[0])
		if len(uses) == 0 {
			return false, nil
		}
		at := make([][]*pb.NodeProto, len(sizes))
		for _, u := range uses {
			if u.GetOpType() != "SequenceAt" || u.GetDomain() != "" || len(u.Input) != 2 || u.Input[0] != n.Output[0] || len(u.Output) != 1 {
				return false, nil
			}
			pos, ok := w.ConstInts(u.Input[1])
			if !ok || len(pos) != 1 {
				return false, nil
			}
			p := pos[0]
			if p < 0 {
				p += int64(len(sizes))
			}
			if p < 0 || p >= int64(len(sizes)) {
				return false, nil
			}
			at[p] = append(at[p], u)
		}
		outs := make([]string, len(sizes))
		var extra []*pb.NodeProto
		for i, us := range at {
			if len(us) == 0 {
				outs[i] = w.Temp(n, "piece")
				continue
			}
			name := us[0].Output[0]
			if squeeze {
				outs[i] = w.Temp(n, "piece")
				extra = append(extra, w.squeeze(n, outs[i], name, axis))
			} else {
				outs[i] = name
			}
			for _, u := range us[1:] {
				extra = append(extra, w.Node("Identity", "", u.GetName()+"/Identity", []string{name}, u.Output))
			}
		}
		var split *pb.NodeProto
		switch {
		case computed != "":
			split = w.Node("Split", "", n.GetName()+"/Split", []string{x, computed}, outs, graph.IntAttr("axis", axis))
		case w.Opset() >= 13:
			split = w.Node("Split", "", n.GetName()+"/Split", []string{x, w.Int64s(n.GetName()+"/split", false, sizes...)}, outs, graph.IntAttr("axis", axis))
		default:
			split = w.Node("Split", "", n.GetName()+"/Split", []string{x}, outs, graph.IntAttr("axis", axis), graph.IntsAttr("split", sizes...))
		}
		for _, us := range at {
			for _, u := range us {
				w.Remove(u)
			}
		}
		w.Replace(n, append([]*pb.NodeProto{split}, extra...)...)
		return true, nil
	},
}

// computedSplit returns v and its length when v, a split computed at run
// time, can be a Split's split input: 1-D int64 of a static length, in an
// opset whose Split takes the sizes as an input (13 on).
func computedSplit(w *Work, v string) (string, int64, bool) {
	if w.Opset() < 13 || w.ElemType(v) != int32(pb.TensorProto_INT64) {
		return "", 0, false
	}
	if r, ok := w.Rank(v); !ok || r != 1 {
		return "", 0, false
	}
	d, ok := w.dim(v, 0)
	return v, d, ok && d > 0
}

// ConstructToConcat turns ConcatFromSequence(SequenceConstruct(a, b, ...))
// into Concat(a, b, ...) on the same axis, keeping the ConcatFromSequence's
// output name; with new_axis=1 each piece is first unsqueezed at the axis
// (a stack). A torch.cat or torch.stack of a list written through
// sequences then reads as the Concat that matching knows. DropDead removes
// the SequenceConstruct once nothing else reads it.
var ConstructToConcat = Rule{
	Name: "construct-to-concat",
	Ops:  []string{"ConcatFromSequence"},
	Apply: func(w *Work, n *pb.NodeProto) (bool, error) {
		if len(n.Input) != 1 || len(n.Output) != 1 {
			return false, nil
		}
		sc := w.Producer(n.Input[0])
		if sc == nil || sc.GetOpType() != "SequenceConstruct" || sc.GetDomain() != "" || len(sc.Input) == 0 {
			return false, nil
		}
		axis, stack := graph.AttrInt(n, "axis", 0), graph.AttrInt(n, "new_axis", 0) == 1
		pieces := slices.Clone(sc.Input)
		var nodes []*pb.NodeProto
		if stack {
			if axis < 0 {
				// an axis of the output, one longer than the pieces' rank
				r, ok := w.Rank(pieces[0])
				if !ok {
					return false, nil
				}
				axis += int64(r) + 1
			}
			for i, p := range pieces {
				pieces[i] = w.Temp(n, "piece")
				nodes = append(nodes, w.unsqueeze(n, p, pieces[i], axis))
			}
		}
		nodes = append(nodes, w.InPlaceOf(n, "Concat", pieces, graph.IntAttr("axis", axis)))
		w.Replace(n, nodes...)
		return true, nil
	},
}

// dim returns dimension axis of v when v's shape declares it as a number,
// or when v is a OneHot along axis of a constant depth.
func (w *Work) dim(v string, axis int64) (int64, bool) {
	t := w.Type(v)
	if c, ok := w.Const(v); ok && axis < int64(len(c.Shape)) {
		return int64(c.Shape[axis]), true
	}
	if p := w.Producer(v); p != nil && p.GetOpType() == "OneHot" && p.GetDomain() == "" && len(p.Input) == 3 {
		a := graph.AttrInt(p, "axis", -1)
		if r, ok := w.Rank(v); ok && a < 0 {
			a += int64(r)
		}
		if depth, ok := w.ConstInts(p.Input[1]); ok && len(depth) == 1 && a == axis {
			return depth[0], true
		}
		if depth, ok := w.ConstScalar(p.Input[1]); ok && a == axis {
			return int64(depth), true
		}
	}
	if t != nil && t.GetShape() != nil && axis < int64(len(t.GetShape().GetDim())) {
		if dv, ok := t.GetShape().GetDim()[axis].GetValue().(*pb.TensorShapeProto_Dimension_DimValue); ok && dv.DimValue >= 0 {
			return dv.DimValue, true
		}
	}
	// undeclared (shapes stripped, an Identity in between): followed back
	// to a projection's weight or a constant
	if r, ok := w.Rank(v); ok && axis < int64(r) {
		return staticDim(w, v, int(axis), r, 0)
	}
	return 0, false
}

// unsqueeze builds an Unsqueeze of axis from in to out.
func (w *Work) unsqueeze(n *pb.NodeProto, in, out string, axis int64) *pb.NodeProto {
	return w.axesOp("Unsqueeze", n, in, out, axis)
}

// squeeze builds a Squeeze of axis from in to out.
func (w *Work) squeeze(n *pb.NodeProto, in, out string, axis int64) *pb.NodeProto {
	return w.axesOp("Squeeze", n, in, out, axis)
}

// axesOp builds op (Squeeze or Unsqueeze) of axis from in to out, named
// after n, in the form the opset wants (axes input from 13, attribute
// before).
func (w *Work) axesOp(op string, n *pb.NodeProto, in, out string, axis int64) *pb.NodeProto {
	if w.Opset() >= 13 {
		return w.Node(op, "", n.GetName()+"/"+op, []string{in, w.Int64s(n.GetName()+"/axes", false, axis)}, []string{out})
	}
	return w.Node(op, "", n.GetName()+"/"+op, []string{in}, []string{out}, graph.IntsAttr("axes", axis))
}

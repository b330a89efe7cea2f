package canon

import (
	"slices"

	"github.com/mokopt/mokopt/graph"
	pb "github.com/mokopt/mokopt/graph/onnxpb"
)

// SqueezeOfUnsqueeze removes a Squeeze that takes away exactly the axes an
// Unsqueeze just added (unoptimized dynamo output wraps batched matmuls in
// such pairs): its consumers read the Unsqueeze's input.
var SqueezeOfUnsqueeze = Rule{
	Name: "squeeze-of-unsqueeze",
	Ops:  []string{"Squeeze"},
	Apply: func(w *Work, n *pb.NodeProto) (bool, error) {
		if len(n.Input) == 0 || len(n.Output) != 1 {
			return false, nil
		}
		u := w.Producer(n.Input[0])
		if u == nil || graph.OpKey(u) != "Unsqueeze" || len(u.Input) == 0 || len(u.Output) != 1 {
			return false, nil
		}
		sq, ok := w.squeezeAxes(n)
		if !ok {
			return false, nil
		}
		un, ok := w.squeezeAxes(u)
		if !ok {
			return false, nil
		}
		// Both lists count axes of the Unsqueeze's output: make them
		// non-negative against its rank where one is negative.
		if slices.ContainsFunc(sq, neg) || slices.ContainsFunc(un, neg) {
			r, ok := w.Rank(u.Input[0])
			if !ok {
				return false, nil
			}
			r += len(un)
			sq, un = normAxes(sq, r), normAxes(un, r)
		}
		slices.Sort(sq)
		slices.Sort(un)
		if !slices.Equal(sq, un) {
			return false, nil
		}
		return w.Drop(n, u.Input[0]), nil
	},
}

// squeezeAxes returns the constant axes of a Squeeze or Unsqueeze (its
// attribute before opset 13, its second input from 13); false when they
// are not known or absent (a Squeeze of every unit axis).
func (w *Work) squeezeAxes(n *pb.NodeProto) ([]int64, bool) {
	if a := graph.Attr(n, "axes"); a != nil {
		return slices.Clone(a.GetInts()), len(a.GetInts()) > 0
	}
	if len(n.Input) < 2 || n.Input[1] == "" {
		return nil, false
	}
	ax, ok := w.ConstInts(n.Input[1])
	return ax, ok && len(ax) > 0
}

func neg(a int64) bool { return a < 0 }

// normAxes returns axes made non-negative against rank r.
func normAxes(axes []int64, r int) []int64 {
	out := make([]int64, len(axes))
	for i, a := range axes {
		if a < 0 {
			a += int64(r)
		}
		out[i] = a
	}
	return out
}

// ExpandToOwnShape removes an Expand of a value to its own shape
// (Expand(x, Shape(x))), which unoptimized exports write when they
// broadcast a value to the shape of something that is the value itself.
var ExpandToOwnShape = Rule{
	Name: "expand-to-own-shape",
	Ops:  []string{"Expand"},
	Apply: func(w *Work, n *pb.NodeProto) (bool, error) {
		if len(n.Input) != 2 || len(n.Output) != 1 {
			return false, nil
		}
		s := w.Producer(n.Input[1])
		if s == nil || graph.OpKey(s) != "Shape" || len(s.Input) != 1 || s.Input[0] != n.Input[0] {
			return false, nil
		}
		if start := graph.Attr(s, "start"); start != nil && start.GetI() != 0 || graph.Attr(s, "end") != nil {
			return false, nil
		}
		return w.Drop(n, n.Input[0]), nil
	},
}

// ExpandToOperand turns op(x, Expand(c, Shape(x))), for an elementwise
// binary op and a constant c of one value whose rank is at most x's, into
// op(x, c): the broadcast already gives c x's shape, so both compute the
// same values in the same shape (`x * torch.full_like(x, s)` as an exporter
// writes it). A scale, a bias or a clamp bound then reads as the constant it
// is.
var ExpandToOperand = Rule{
	Name: "expand-to-operand",
	Ops:  []string{"Add", "Sub", "Mul", "Div", "Pow", "Max", "Min"},
	Apply: func(w *Work, n *pb.NodeProto) (bool, error) {
		if len(n.Input) != 2 || len(n.Output) != 1 {
			return false, nil
		}
		for side := 0; side < 2; side++ {
			x, e := n.Input[1-side], w.Producer(n.Input[side])
			if e == nil || graph.OpKey(e) != "Expand" || len(e.Input) != 2 {
				continue
			}
			s := w.Producer(e.Input[1])
			if s == nil || graph.OpKey(s) != "Shape" || len(s.Input) != 1 || s.Input[0] != x || graph.Attr(s, "start") != nil || graph.Attr(s, "end") != nil {
				continue
			}
			c, ok := w.Const(e.Input[0])
			r, rok := w.Rank(x)
			if !ok || c.Len() != 1 || !rok || len(c.Shape) > r {
				continue
			}
			in := slices.Clone(n.Input)
			in[side] = e.Input[0]
			w.Replace(n, graph.NewNode(n.GetOpType(), n.GetDomain(), n.GetName(), in, n.Output, n.Attribute...))
			return true, nil
		}
		return false, nil
	},
}

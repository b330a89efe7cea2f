package canon

import (
	"slices"

	"github.com/mokopt/mokopt/graph"
	pb "github.com/mokopt/mokopt/graph/onnxpb"
)

// axisOps are the ops that compute along one axis attribute of their
// single input, and unaryOps those that compute elementwise on it: both
// commute with a Transpose (the axis moved with it).
var (
	axisOps  = map[string]bool{"Softmax": true, "LogSoftmax": true, "Hardmax": true}
	unaryOps = map[string]bool{"Exp": true, "Sigmoid": true, "Neg": true, "Relu": true, "Tanh": true, "Abs": true, "Log": true}
)

// TransposedAxisOp turns Transpose(f(Transpose(x, p)), q), where q undoes
// p, into f(x): a softmax (or another op along one axis, or an elementwise
// op) taken over a transposed copy and transposed back, as a router that
// normalises its [E, T] scores over axis 0 writes it, computed in place on
// x's axis p[a]. The same values in the same order along the axis, so the
// same bits.
var TransposedAxisOp = Rule{
	Name: "transposed-axis-op",
	Ops:  []string{"Transpose"},
	Apply: func(w *Work, n *pb.NodeProto) (bool, error) {
		if n.GetDomain() != "" || len(n.Input) != 1 || len(n.Output) != 1 || w.Opset() < 13 {
			return false, nil
		}
		f := w.Producer(n.Input[0])
		if f == nil || f.GetDomain() != "" || len(f.Input) != 1 || len(f.Output) != 1 || !axisOps[f.GetOpType()] && !unaryOps[f.GetOpType()] {
			return false, nil
		}
		t := w.Producer(f.Input[0])
		if t == nil || t.GetOpType() != "Transpose" || t.GetDomain() != "" || len(t.Input) != 1 {
			return false, nil
		}
		r, ok := w.Rank(t.Input[0])
		if !ok {
			return false, nil
		}
		p, q := transposePerm(t, r), transposePerm(n, r)
		if len(p) != r || len(q) != r {
			return false, nil
		}
		for j := range q {
			if q[j] < 0 || q[j] >= int64(r) || p[q[j]] != int64(j) {
				return false, nil
			}
		}
		var attrs []*pb.AttributeProto
		if axisOps[f.GetOpType()] {
			a := graph.AttrInt(f, "axis", -1)
			if a < 0 {
				a += int64(r)
			}
			if a < 0 || a >= int64(r) {
				return false, nil
			}
			attrs = append(attrs, graph.IntAttr("axis", p[a]))
		}
		w.Replace(n, w.Node(f.GetOpType(), "", f.GetName(), []string{t.Input[0]}, slices.Clone(n.Output), attrs...))
		return true, nil
	},
}

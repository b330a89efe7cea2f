package canon

import (
	"github.com/mokopt/mokopt/graph"
	pb "github.com/mokopt/mokopt/graph/onnxpb"
)

// SpelledSoftmax turns a softmax written out over one axis a,
//
//	e = Exp(x)  or  e = Exp(x - ReduceMax(x, a))
//	y = e / ReduceSum(e, a)  or  y = e * Reciprocal(ReduceSum(e, a))
//
// (both reductions keeping the axis), into y = Softmax(x, axis=a). The
// numbers are the softmax's up to float rounding, and the same where the
// unshifted form does not overflow; detection reads the working copy, and
// the numerical check compares the fused block with the graph as it was
// written. Matchers that recognise a router's Softmax (PhiMoE's
// sparsemixer picks each weight from a masked one) then read a spelled
// one too. Needs opset 13 (Softmax over one axis).
var SpelledSoftmax = Rule{
	Name: "spelled-softmax",
	Ops:  []string{"Div", "Mul"},
	Apply: func(w *Work, n *pb.NodeProto) (bool, error) {
		if len(n.Input) != 2 || len(n.Output) != 1 || w.Opset() < 13 {
			return false, nil
		}
		e, s := n.Input[0], n.Input[1]
		if n.GetOpType() == "Mul" {
			r := w.Producer(s)
			if r == nil || r.GetOpType() != "Reciprocal" || r.GetDomain() != "" || len(r.Input) != 1 {
				e, s = s, e
				if r = w.Producer(s); r == nil || r.GetOpType() != "Reciprocal" || r.GetDomain() != "" || len(r.Input) != 1 {
					return false, nil
				}
			}
			s = r.Input[0]
		}
		ex, sum := w.Producer(e), w.Producer(s)
		if ex == nil || ex.GetOpType() != "Exp" || ex.GetDomain() != "" || len(ex.Input) != 1 ||
			sum == nil || !keptReduce(sum, "ReduceSum") || sum.Input[0] != e {
			return false, nil
		}
		axes := reduceAxes(w, sum)
		if len(axes) != 1 {
			return false, nil
		}
		x := unshifted(w, ex.Input[0], axes[0])
		w.Replace(n, graph.NewNode("Softmax", "", n.GetName(), []string{x}, []string{n.Output[0]}, graph.IntAttr("axis", axes[0])))
		return true, nil
	},
}

// keptReduce reports whether n is a default-domain reduction of type op
// that keeps the reduced axes and reduces over its axes (not a no-op on
// empty axes).
func keptReduce(n *pb.NodeProto, op string) bool {
	return n.GetOpType() == op && n.GetDomain() == "" && len(n.Input) >= 1 &&
		graph.AttrInt(n, "keepdims", 1) == 1 && graph.AttrInt(n, "noop_with_empty_axes", 0) == 0
}

// ExpOfLogSoftmax turns Exp(LogSoftmax(x, axis)) into Softmax(x, axis): the
// same function, equal up to float rounding (opset 13 and later, where both
// ops normalise over one axis).
var ExpOfLogSoftmax = Rule{
	Name: "exp-of-log-softmax",
	Ops:  []string{"Exp"},
	Apply: func(w *Work, n *pb.NodeProto) (bool, error) {
		if n.GetDomain() != "" || len(n.Input) != 1 || len(n.Output) != 1 || w.Opset() < 13 {
			return false, nil
		}
		p := w.Producer(n.Input[0])
		if p == nil || p.GetOpType() != "LogSoftmax" || p.GetDomain() != "" || len(p.Input) != 1 {
			return false, nil
		}
		w.Replace(n, graph.NewNode("Softmax", "", n.GetName(), []string{p.Input[0]}, []string{n.Output[0]},
			graph.IntAttr("axis", graph.AttrInt(p, "axis", -1))))
		return true, nil
	},
}

// SpelledLogSoftmax turns a log-softmax written out over one axis a,
//
//	y = x - ReduceLogSumExp(x, a)
//	y = s - Log(ReduceSum(Exp(s), a)),  s = x  or  s = x - ReduceMax(x, a)
//
// (the reductions keeping the axis), into y = LogSoftmax(x, axis=a): the
// same function, equal up to float rounding where the unshifted form does
// not overflow. A router's softmax spelled Exp of one of these then reads
// as Softmax (exp-of-log-softmax). Needs opset 13.
var SpelledLogSoftmax = Rule{
	Name: "spelled-log-softmax",
	Ops:  []string{"Sub"},
	Apply: func(w *Work, n *pb.NodeProto) (bool, error) {
		if n.GetDomain() != "" || len(n.Input) != 2 || len(n.Output) != 1 || w.Opset() < 13 {
			return false, nil
		}
		x, axis, ok := logSumExpOf(w, n.Input[0], n.Input[1])
		if !ok {
			return false, nil
		}
		w.Replace(n, graph.NewNode("LogSoftmax", "", n.GetName(), []string{x}, []string{n.Output[0]}, graph.IntAttr("axis", axis)))
		return true, nil
	},
}

// logSumExpOf reports whether v is log Σ exp over one axis of s (a kept
// ReduceLogSumExp of s, or Log of a kept ReduceSum of Exp(s)), and returns
// the value whose log-softmax s - v is (s, or x where s = x - ReduceMax(x)
// over the same axis) and the axis.
func logSumExpOf(w *Work, s, v string) (string, int64, bool) {
	var axes []int64
	switch p := w.Producer(v); {
	case p != nil && keptReduce(p, "ReduceLogSumExp") && p.Input[0] == s:
		axes = reduceAxes(w, p)
	case p != nil && p.GetOpType() == "Log" && p.GetDomain() == "" && len(p.Input) == 1:
		sum := w.Producer(p.Input[0])
		if sum == nil || !keptReduce(sum, "ReduceSum") {
			return "", 0, false
		}
		ex := w.Producer(sum.Input[0])
		if ex == nil || ex.GetOpType() != "Exp" || ex.GetDomain() != "" || len(ex.Input) != 1 || ex.Input[0] != s {
			return "", 0, false
		}
		axes = reduceAxes(w, sum)
	default:
		return "", 0, false
	}
	if len(axes) != 1 {
		return "", 0, false
	}
	return unshifted(w, s, axes[0]), axes[0], true
}

// unshifted returns x when s is x - ReduceMax(x) over axis (kept), the
// shift that softmax and log-softmax are invariant to, and s otherwise.
func unshifted(w *Work, s string, axis int64) string {
	if sub := w.Producer(s); sub != nil && sub.GetOpType() == "Sub" && sub.GetDomain() == "" && len(sub.Input) == 2 {
		if mx := w.Producer(sub.Input[1]); mx != nil && keptReduce(mx, "ReduceMax") && mx.Input[0] == sub.Input[0] &&
			sameAxis(w, sub.Input[0], reduceAxes(w, mx), axis) {
			return sub.Input[0]
		}
	}
	return s
}

package canon

import (
	"github.com/mokopt/mokopt/graph"
	"github.com/mokopt/mokopt/graph/eval"
	pb "github.com/mokopt/mokopt/graph/onnxpb"
)

// RowSplitMatMul turns x[..., a:b] @ W0 + x[..., b:c] @ W1, by constant
// 2-D weights with b − a and c − b rows, into x[..., a:c] @ [W0; W1], the
// weights stacked by rows, and into x @ [W0; W1] when a:c is the whole
// last axis: a projection split along its input features (a row-parallel
// layer written out, each shard's product summed) reads as the one
// projection it is. Three or more shards are merged two at a time. Each
// product must be read by the Add alone. Up to float rounding of the
// sum's order the value is the same.
var RowSplitMatMul = Rule{
	Name: "row-split-matmul",
	Ops:  []string{"Add"},
	Apply: func(w *Work, n *pb.NodeProto) (bool, error) {
		if n.GetDomain() != "" || len(n.Input) != 2 || len(n.Output) != 1 {
			return false, nil
		}
		p, okP := rowShard(w, n.Input[0])
		q, okQ := rowShard(w, n.Input[1])
		if !okP || !okQ || p.x != q.x {
			return false, nil
		}
		if q.end == p.start {
			p, q = q, p
		}
		if p.end != q.start || p.w.Shape[1] != q.w.Shape[1] {
			return false, nil
		}
		outs, err := evalNodes([]*pb.NodeProto{graph.NewNode("Concat", "", "", []string{"a", "b"}, []string{"c"}, graph.IntAttr("axis", 0))},
			map[string]*eval.Tensor{"a": p.w, "b": q.w}, []string{"c"}, w.Opset())
		if err != nil {
			return false, nil
		}
		wc, err := w.AddConst(w.NewName(n.GetName()+"/weight"), outs[0])
		if err != nil {
			return false, err
		}
		in := p.x
		if d, ok := w.dim(p.x, int64(p.rank-1)); p.start != 0 || !ok || q.end < d {
			in = w.Temp(n, "rows")
			sl := w.Node("Slice", "", n.GetName()+"/Slice", []string{p.x, w.Int64s(n.GetName()+"/starts", false, p.start),
				w.Int64s(n.GetName()+"/ends", false, q.end), w.Int64s(n.GetName()+"/axes", false, -1)}, []string{in})
			w.Replace(n, sl, w.InPlaceOf(n, "MatMul", []string{in, wc}))
			return true, nil
		}
		w.Replace(n, w.InPlaceOf(n, "MatMul", []string{in, wc}))
		return true, nil
	},
}

// rowSlice is one shard of a row-split projection: x[..., start:end] @ w.
type rowSlice struct {
	x          string
	rank       int
	start, end int64
	w          *eval.Tensor
}

// rowShard reads v as MatMul(Slice(x, start, end, last axis), W) of a
// constant 2-D W of end − start rows, v read by one node.
func rowShard(w *Work, v string) (rowSlice, bool) {
	mm := w.Producer(v)
	if mm == nil || mm.GetOpType() != "MatMul" || mm.GetDomain() != "" || len(mm.Input) != 2 || len(w.Consumers(v)) != 1 || w.G.IsOutput(v) {
		return rowSlice{}, false
	}
	wt, ok := w.Const(mm.Input[1])
	s := w.Producer(mm.Input[0])
	if !ok || len(wt.Shape) != 2 || s == nil || w.Opset() < 10 {
		return rowSlice{}, false
	}
	sl, ok := sliceOfOneAxis(w, s)
	r, okR := w.Rank(s.Input[0])
	if !ok || !okR || r < 1 || sl.step != 1 || !sameAxis(w, s.Input[0], []int64{sl.axis}, int64(r-1)) {
		return rowSlice{}, false
	}
	if d, ok := w.dim(s.Input[0], int64(r-1)); ok {
		// positions from the end, and an end past the axis, as Slice clamps them
		sl.start, sl.end = clampPos(sl.start, d), clampPos(sl.end, d)
	}
	if sl.start < 0 || int64(wt.Shape[0]) != sl.end-sl.start {
		return rowSlice{}, false
	}
	return rowSlice{x: s.Input[0], rank: r, start: sl.start, end: sl.end, w: wt}, true
}

// clampPos is Slice's reading of position p on an axis of length d:
// negative counts from the end, clamped to [0, d].
func clampPos(p, d int64) int64 {
	if p < 0 {
		p += d
	}
	return max(0, min(p, d))
}

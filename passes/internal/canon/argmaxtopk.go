package canon

import (
	"github.com/mokopt/mokopt/graph"
	pb "github.com/mokopt/mokopt/graph/onnxpb"
)

// ArgMaxToTopK turns a top-1 selection written as ArgMax(x, axis) — the
// index of the largest score, the first one among equal scores
// (select_last_index=0) — into TopK(x, k=1, axis, largest=1): the same
// index (ONNX TopK puts the lower index first among equal values), with a
// Squeeze of the axis when the ArgMax drops it (keepdims=0). A ReduceMax of
// the same x over the same one axis (the selected score, the top-1 router's
// weight) and a GatherElements of x at the ArgMax's indices become the
// TopK's values, which are the same numbers. Routers written as ArgMax
// (Switch-Transformer-style top-1) then read as the top-k they are.
//
// Not rewritten: select_last_index=1 (the last of equal scores, which no
// TopK selects); and an ArgMax that is one pick of an iterative selection
// (its scores come from a Scatter, or are scattered at its indices for the
// next pick, as PhiMoE's sparsemixer does): that chain is read as a whole
// by the matcher.
var ArgMaxToTopK = Rule{
	Name: "argmax-to-topk",
	Ops:  []string{"ArgMax"},
	Apply: func(w *Work, n *pb.NodeProto) (bool, error) {
		if len(n.Input) != 1 || len(n.Output) != 1 || n.Output[0] == "" || w.Opset() < 13 ||
			graph.AttrInt(n, "select_last_index", 0) != 0 {
			return false, nil
		}
		x, idx := n.Input[0], n.Output[0]
		if iterativePick(w, x, idx) {
			return false, nil
		}
		axis := graph.AttrInt(n, "axis", 0)
		keep := graph.AttrInt(n, "keepdims", 1) != 0
		k := w.Int64s(n.GetName()+"/k", false, 1)
		vals := w.Temp(n, "top1_values")
		ind := idx
		if !keep {
			ind = w.Temp(n, "top1_indices")
		}
		// The TopK keeps the ArgMax's name, which refusals then name.
		nodes := []*pb.NodeProto{graph.NewNode("TopK", "", n.GetName(), []string{x, k}, []string{vals, ind},
			graph.IntAttr("axis", axis), graph.IntAttr("largest", 1), graph.IntAttr("sorted", 1))}
		axes := w.Int64s(n.GetName()+"/axis", false, axis)
		if !keep {
			nodes = append(nodes, w.Node("Squeeze", "", n.GetName()+"/squeeze", []string{ind, axes}, []string{idx}))
		}
		w.Replace(n, nodes...)
		// The selected score, read as a ReduceMax or a gather at the index.
		for _, c := range w.Consumers(x) {
			if c == n || c.GetDomain() != "" {
				continue
			}
			switch {
			case c.GetOpType() == "ReduceMax" && sameAxis(w, x, reduceAxes(w, c), axis):
				if graph.AttrInt(c, "keepdims", 1) != 0 {
					w.Replace(c, w.Node("Identity", "", c.GetName()+"/top1", []string{vals}, []string{c.Output[0]}))
				} else {
					w.Replace(c, w.Node("Squeeze", "", c.GetName()+"/top1", []string{vals, axes}, []string{c.Output[0]}))
				}
			case c.GetOpType() == "GatherElements" && len(c.Input) == 2 && c.Input[0] == x && c.Input[1] == idx && keep &&
				sameAxis(w, x, []int64{graph.AttrInt(c, "axis", 0)}, axis):
				w.Replace(c, w.Node("Identity", "", c.GetName()+"/top1", []string{vals}, []string{c.Output[0]}))
			}
		}
		return true, nil
	},
}

// iterativePick reports whether the ArgMax of x with indices idx is one
// pick of a chain: x is a Scatter's output, or what is scattered into at
// idx is computed from x's values (the scores with the pick masked, for the
// next pick). A scatter at idx into a tensor made from x's shape only (the
// selected weight written into a -inf or zero tensor, as a top-1 router
// does) is no chain.
func iterativePick(w *Work, x, idx string) bool {
	if p := w.Producer(x); p != nil && isScatter(p) {
		return true
	}
	for _, c := range w.Consumers(idx) {
		if isScatter(c) && len(c.Input) == 3 && readsValuesOf(w, c.Input[0], x, 16) {
			return true
		}
	}
	return false
}

// readsValuesOf reports whether v is x or is computed from x's values
// within budget producers, not counting what reads x's shape only (Shape,
// Size) and so what is made from its shape.
func readsValuesOf(w *Work, v, x string, budget int) bool {
	seen := map[string]bool{}
	var walk func(v string) bool
	walk = func(v string) bool {
		if v == x {
			return true
		}
		if v == "" || seen[v] || len(seen) >= budget {
			return false
		}
		seen[v] = true
		p := w.Producer(v)
		if p == nil {
			return false
		}
		switch p.GetOpType() {
		case "Shape", "Size":
			return false
		}
		for _, in := range p.Input {
			if walk(in) {
				return true
			}
		}
		return false
	}
	return walk(v)
}

func isScatter(n *pb.NodeProto) bool {
	switch n.GetOpType() {
	case "ScatterElements", "Scatter", "ScatterND":
		return n.GetDomain() == ""
	}
	return false
}

// reduceAxes returns a reduction's axes (attribute before opset 18, input
// from 18), or nil when they are not one constant axis.
func reduceAxes(w *Work, n *pb.NodeProto) []int64 {
	if len(n.Input) > 1 && n.Input[1] != "" {
		a, ok := w.ConstInts(n.Input[1])
		if !ok {
			return nil
		}
		return a
	}
	return graph.AttrInts(n, "axes")
}

// sameAxis reports whether axes is exactly the one axis of x, comparing
// negative and positive spellings where x's rank is known.
func sameAxis(w *Work, x string, axes []int64, axis int64) bool {
	if len(axes) != 1 {
		return false
	}
	a := axes[0]
	if a == axis {
		return true
	}
	r, ok := w.Rank(x)
	if !ok {
		return false
	}
	norm := func(v int64) int64 {
		if v < 0 {
			return v + int64(r)
		}
		return v
	}
	return norm(a) == norm(axis)
}

package canon

import (
	"github.com/mokopt/mokopt/graph"
	pb "github.com/mokopt/mokopt/graph/onnxpb"
	"google.golang.org/protobuf/proto"
)

// GatherOfTopK turns GatherElements(x, i) — x's scores at the indices i
// that a TopK of the same x along the same axis selected — into that TopK's
// values, which are those numbers exactly. Routers that keep only the
// TopK's indices and read the selected scores back with a gather (whether
// or not the TopK's values are used elsewhere) then read as the top-k they
// are. A gather of another tensor at the indices (a bias-corrected
// selection that weights by the uncorrected scores) is a different
// computation and is left alone.
var GatherOfTopK = Rule{
	Name: "gather-of-topk",
	Ops:  []string{"GatherElements"},
	Apply: func(w *Work, n *pb.NodeProto) (bool, error) {
		if len(n.Input) != 2 || len(n.Output) != 1 {
			return false, nil
		}
		x, idx := n.Input[0], n.Input[1]
		tk := w.Producer(idx)
		if tk == nil || tk.GetOpType() != "TopK" || tk.GetDomain() != "" || len(tk.Input) < 2 || len(tk.Output) != 2 ||
			tk.Output[1] != idx || tk.Input[0] != x || !sameAxis(w, x, []int64{graph.AttrInt(n, "axis", 0)}, graph.AttrInt(tk, "axis", -1)) {
			return false, nil
		}
		vals := tk.Output[0]
		if vals == "" {
			vals = w.Temp(tk, "values")
			c := proto.Clone(tk).(*pb.NodeProto)
			c.Output[0] = vals
			w.Replace(tk, c)
		}
		w.Replace(n, w.Node("Identity", "", n.GetName()+"/topk_values", []string{vals}, n.Output))
		return true, nil
	},
}

// SliceOfGatherElements turns Slice(GatherElements(x, i, axis=a)) over
// axis a alone into GatherElements(x, Slice(i)) with the same slice: the
// gather's output has its indices' shape and takes each entry's other
// coordinates from its own position, so the entries a slice along a keeps
// are exactly those gathered by the sliced indices. A router that sorts
// its logits, reads the probabilities back in that order and keeps the
// first k then gathers by the first k indices of the sort, which
// topk-slice reads as a top-k.
var SliceOfGatherElements = Rule{
	Name: "slice-of-gather-elements",
	Ops:  []string{"Slice"},
	Apply: func(w *Work, n *pb.NodeProto) (bool, error) {
		if n.GetDomain() != "" || len(n.Input) < 4 || len(n.Output) != 1 || w.Opset() < 10 {
			return false, nil
		}
		g := w.Producer(n.Input[0])
		if g == nil || g.GetOpType() != "GatherElements" || g.GetDomain() != "" || len(g.Input) != 2 || len(g.Output) != 1 {
			return false, nil
		}
		axes, ok := w.ConstInts(n.Input[3])
		if !ok || !sameAxis(w, g.Input[1], axes, graph.AttrInt(g, "axis", 0)) {
			return false, nil
		}
		idx := w.Temp(n, "indices")
		in := append([]string{g.Input[1]}, n.Input[1:]...)
		w.Replace(n, w.Node("Slice", "", n.GetName(), in, []string{idx}),
			w.Node("GatherElements", "", n.GetName()+"/gather", []string{g.Input[0], idx}, n.Output, graph.IntAttr("axis", graph.AttrInt(g, "axis", 0))))
		return true, nil
	},
}

package canon

import (
	"github.com/mokopt/mokopt/graph"
	pb "github.com/mokopt/mokopt/graph/onnxpb"
	"google.golang.org/protobuf/proto"
)

// TopKSlice turns the first k' of a sorted top-k — TopK(x, k) (a full
// sort when k is the axis' size) whose values and indices are each read
// only through one Slice of its axis from 0 to k' ≤ k with step 1 — into
// TopK(x, k'): a sorted TopK lists the largest (or smallest) first, so its
// first k' entries are exactly the top k', ties included (lower index
// first either way). Routers written as a sort followed by taking the
// first k then read as the top-k they are.
var TopKSlice = Rule{
	Name: "topk-slice",
	Ops:  []string{"TopK"},
	Apply: func(w *Work, n *pb.NodeProto) (bool, error) {
		if len(n.Input) != 2 || len(n.Output) != 2 || graph.AttrInt(n, "sorted", 1) == 0 {
			return false, nil
		}
		ks, ok := w.ConstInts(n.Input[1])
		if !ok || len(ks) != 1 {
			return false, nil
		}
		axis := graph.AttrInt(n, "axis", -1)
		var slices [2][]*pb.NodeProto // per output, the slices that read it
		kk := int64(-1)
		for i, o := range n.Output {
			if o == "" || w.G.IsOutput(o) {
				if o != "" {
					return false, nil
				}
				continue
			}
			for _, c := range w.Consumers(o) {
				e, ok := headSlice(w, c, o, n.Input[0], axis)
				if !ok || e > ks[0] || (kk >= 0 && e != kk) {
					return false, nil
				}
				kk = e
				slices[i] = append(slices[i], c)
			}
		}
		if kk < 1 || kk == ks[0] {
			return false, nil
		}
		attrs := make([]*pb.AttributeProto, len(n.Attribute))
		for i, a := range n.Attribute {
			attrs[i] = proto.Clone(a).(*pb.AttributeProto)
		}
		// The first slice of each output names it; another slice of the
		// same output (two readers of the first k) is a copy of it.
		outs := []string{"", ""}
		for i, ss := range slices {
			if len(ss) > 0 {
				outs[i] = ss[0].Output[0]
				w.Remove(ss[0])
			}
		}
		k := w.Int64s(n.GetName()+"/k", false, kk)
		w.Replace(n, graph.NewNode("TopK", "", n.GetName(), []string{n.Input[0], k}, outs, attrs...))
		for i, ss := range slices {
			for j := 1; j < len(ss); j++ {
				w.Replace(ss[j], w.Node("Identity", "", ss[j].GetName(), []string{outs[i]}, ss[j].Output))
			}
		}
		return true, nil
	},
}

// headSlice returns k' when s is Slice(v, [0], [k'], [axis], [1]) over the
// TopK's axis of x.
func headSlice(w *Work, s *pb.NodeProto, v, x string, axis int64) (int64, bool) {
	sl, ok := sliceOfOneAxis(w, s)
	if !ok || s.Input[0] != v || sl.start != 0 || sl.step != 1 || sl.end < 1 || !sameAxis(w, x, []int64{sl.axis}, axis) {
		return 0, false
	}
	return sl.end, true
}

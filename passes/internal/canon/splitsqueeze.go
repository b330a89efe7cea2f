package canon

import (
	"slices"

	"github.com/mokopt/mokopt/graph"
	pb "github.com/mokopt/mokopt/graph/onnxpb"
)

// SplitSqueezeToGather turns Squeeze(piece j of a Split, the split axis),
// where piece j is one element wide, into Gather(the Split's input, the
// piece's offset, that axis), keeping the Squeeze's output name: the
// spelling ONNX Runtime's GatherSliceToSplitFusion replaces, which names the
// index (an expert's id, say) as a constant. The split axis must be static
// and as long as the pieces together. Only Splits into more than two
// pieces are rewritten: a split into two is how exporters unpack a pair
// (NonZero's coordinates, say), and that spelling is the canonical one for
// it. DropDead removes the Split once no piece is read.
var SplitSqueezeToGather = Rule{
	Name:  "split-squeeze-to-gather",
	Ops:   []string{"Squeeze"},
	Apply: func(w *Work, n *pb.NodeProto) (bool, error) { return splitSqueezeToGather(w, n), nil },
}

// splitSqueezeToGather applies SplitSqueezeToGather to the Squeeze n.
func splitSqueezeToGather(w *Work, n *pb.NodeProto) bool {
	if len(n.Input) == 0 || len(n.Output) != 1 {
		return false
	}
	p := w.Producer(n.Input[0])
	if p == nil || p.GetOpType() != "Split" || p.GetDomain() != "" || len(p.Input) == 0 {
		return false
	}
	j := slices.Index(p.Output, n.Input[0])
	if len(p.Output) <= 2 {
		return false
	}
	axis := graph.AttrInt(p, "axis", 0)
	axes := graph.AttrInts(n, "axes")
	if graph.Attr(n, "axes") == nil {
		a, ok := w.ConstInts(inputOr(n, 1))
		if !ok {
			return false
		}
		axes = a
	}
	if len(axes) != 1 {
		return false
	}
	if axis < 0 || axes[0] < 0 {
		r, ok := w.Rank(p.Input[0])
		if !ok {
			return false
		}
		if axis < 0 {
			axis += int64(r)
		}
		if axes[0] < 0 {
			axes[0] += int64(r)
		}
	}
	if axes[0] != axis {
		return false
	}
	sizes := graph.AttrInts(p, "split")
	if len(p.Input) > 1 && p.Input[1] != "" {
		s, ok := w.ConstInts(p.Input[1])
		if !ok {
			return false
		}
		sizes = s
	}
	if sizes == nil {
		d, ok := w.dim(p.Input[0], axis)
		if !ok || d != int64(len(p.Output)) {
			return false
		}
		sizes = make([]int64, len(p.Output))
		for i := range sizes {
			sizes[i] = 1
		}
	}
	if len(sizes) != len(p.Output) || sizes[j] != 1 {
		return false
	}
	// A Split fails where its pieces do not add up to the axis; a
	// Gather would not: the axis must be static and match.
	total := int64(0)
	for _, s := range sizes {
		total += s
	}
	if d, ok := w.dim(p.Input[0], axis); !ok || d != total {
		return false
	}
	off := int64(0)
	for _, s := range sizes[:j] {
		off += s
	}
	idx := w.Int64s(n.GetName()+"/index", true, off)
	w.Replace(n, w.Node("Gather", "", n.GetName()+"/Gather", []string{p.Input[0], idx}, n.Output, graph.IntAttr("axis", axis)))
	return true
}

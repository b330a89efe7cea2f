package canon

import (
	"math"

	"github.com/mokopt/mokopt/graph"
	pb "github.com/mokopt/mokopt/graph/onnxpb"
)

// oneAxisSlice is a Slice of one axis by constants.
type oneAxisSlice struct {
	start, end, step int64
	// axis is as written: negative axes count from the end.
	axis int64
}

// sliceOfOneAxis reads Slice s of one axis whose starts, ends, axes and
// steps are constants (inputs from opset 10, attributes before).
func sliceOfOneAxis(w *Work, s *pb.NodeProto) (oneAxisSlice, bool) {
	if s.GetOpType() != "Slice" || s.GetDomain() != "" || len(s.Input) == 0 || len(s.Output) != 1 {
		return oneAxisSlice{}, false
	}
	one := func(i int, attr string, def int64) (int64, bool) {
		if w.Opset() < 10 {
			if graph.Attr(s, attr) == nil {
				return def, def != math.MinInt64
			}
			v := graph.AttrInts(s, attr)
			return firstOf(v), len(v) == 1
		}
		if len(s.Input) <= i || s.Input[i] == "" {
			return def, def != math.MinInt64
		}
		c, ok := w.ConstInts(s.Input[i])
		return firstOf(c), ok && len(c) == 1
	}
	var r oneAxisSlice
	var ok [4]bool
	r.start, ok[0] = one(1, "starts", math.MinInt64)
	r.end, ok[1] = one(2, "ends", math.MinInt64)
	r.axis, ok[2] = one(3, "axes", 0)
	r.step, ok[3] = one(4, "", 1)
	return r, ok[0] && ok[1] && ok[2] && ok[3]
}

// firstOf is v[0], or 0 for an empty v.
func firstOf(v []int64) int64 {
	if len(v) == 0 {
		return 0
	}
	return v[0]
}

// SqueezeOfSliceToGather turns Squeeze(Slice(x, [i], [i+1], [a]), [a])
// into Gather(x, i, axis a), keeping the Squeeze's output name: one
// position of an axis picked by slicing it one wide and dropping the axis,
// as a hand-written or rewritten graph may spell the Gather an exporter
// writes (an expert's id, a column of the routing weights). The Slice's
// step must be 1 and its one axis the Squeeze's; a start of -1 may end
// anywhere past the last position. DropDead removes the Slice once
// nothing else reads it.
var SqueezeOfSliceToGather = Rule{
	Name: "squeeze-of-slice-to-gather",
	Ops:  []string{"Squeeze"},
	Apply: func(w *Work, n *pb.NodeProto) (bool, error) {
		if len(n.Input) == 0 || len(n.Output) != 1 {
			return false, nil
		}
		s := w.Producer(n.Input[0])
		if s == nil {
			return false, nil
		}
		sl, ok := sliceOfOneAxis(w, s)
		if !ok || sl.step != 1 {
			return false, nil
		}
		one := sl.end == sl.start+1 && sl.start != -1
		if sl.start == -1 {
			one = sl.end >= math.MaxInt32
		}
		axes, ok := w.squeezeAxes(n)
		if !one || !ok || len(axes) != 1 || !sameAxis(w, s.Input[0], []int64{sl.axis}, axes[0]) {
			return false, nil
		}
		i := w.Int64s(n.GetName()+"/index", true, sl.start)
		w.Replace(n, w.Node("Gather", "", n.GetName(), []string{s.Input[0], i}, n.Output, graph.IntAttr("axis", sl.axis)))
		return true, nil
	},
}

package canon

import (
	"github.com/mokopt/mokopt/graph"
	pb "github.com/mokopt/mokopt/graph/onnxpb"
)

// GatherNDOfOne turns GatherND(x, i) whose index tuples are one long
// (i's last dim 1, batch_dims 0) into Gather(x, i without that axis, axis
// 0): the same rows picked, negative indices included. Where i is an
// Unsqueeze of its last axis the Gather reads the Unsqueeze's input;
// otherwise a Squeeze of the last axis is added. Shape arithmetic and
// token selection then read as the Gathers that folding and matching
// know.
var GatherNDOfOne = Rule{
	Name: "gathernd-of-one",
	Ops:  []string{"GatherND"},
	Apply: func(w *Work, n *pb.NodeProto) (bool, error) {
		if n.GetDomain() != "" || len(n.Input) != 2 || len(n.Output) != 1 || graph.AttrInt(n, "batch_dims", 0) != 0 {
			return false, nil
		}
		idx := n.Input[1]
		r, ok := w.Rank(idx)
		if !ok || r < 1 {
			return false, nil
		}
		rows := ""
		if u := w.Producer(idx); u != nil && u.GetOpType() == "Unsqueeze" && u.GetDomain() == "" {
			if ax, ok := w.squeezeAxes(u); ok && len(ax) == 1 && (ax[0] == -1 || ax[0] == int64(r-1)) {
				rows = u.Input[0]
			}
		}
		var nodes []*pb.NodeProto
		if rows == "" {
			if d, ok := w.dim(idx, int64(r-1)); !ok || d != 1 {
				return false, nil
			}
			rows = w.Temp(n, "rows")
			nodes = append(nodes, w.squeeze(n, idx, rows, int64(r-1)))
		}
		nodes = append(nodes, w.Node("Gather", "", n.GetName(), []string{n.Input[0], rows}, n.Output, graph.IntAttr("axis", 0)))
		w.Replace(n, nodes...)
		return true, nil
	},
}

package canon

import (
	"slices"

	pb "github.com/mokopt/mokopt/graph/onnxpb"
	"google.golang.org/protobuf/proto"
)

// UnitBatchWeight turns MatMul(x, W) by an initializer W of dims
// [1, …, 1, K, N], where x has at least W's rank, into MatMul(x, W') by
// the [K, N] matrix W holds: unit batch axes broadcast to x's, so the
// product is the same, exactly, and of the same shape. W' shares W's bytes
// (its raw data or its place in the side file). A linear layer exported
// with its weight unsqueezed for a batched product then reads as the
// linear layer it is.
var UnitBatchWeight = Rule{
	Name: "unit-batch-weight",
	Ops:  []string{"MatMul"},
	Apply: func(w *Work, n *pb.NodeProto) (bool, error) {
		if n.GetDomain() != "" || len(n.Input) != 2 || len(n.Output) != 1 {
			return false, nil
		}
		t := w.G.Initializer(n.Input[1])
		if t == nil {
			return false, nil
		}
		d := t.GetDims()
		if len(d) < 3 || slices.ContainsFunc(d[:len(d)-2], func(v int64) bool { return v != 1 }) {
			return false, nil
		}
		if _, deferred := w.M.Deferred(t); deferred {
			return false, nil
		}
		r, ok := w.Rank(n.Input[0])
		if !ok || r < len(d) {
			return false, nil
		}
		view := w.AddView(w.NewName(n.Input[1]+"/matrix"), t, d[len(d)-2:])
		c := proto.Clone(n).(*pb.NodeProto)
		c.Input[1] = view
		w.Replace(n, c)
		return true, nil
	},
}

package canon

import (
	"slices"

	"github.com/mokopt/mokopt/graph"
	pb "github.com/mokopt/mokopt/graph/onnxpb"
)

// DropNoOpReshape removes a Reshape to the shape its input already has: the
// input's shape is static and the constant target resolves (0 copies a
// dimension unless allowzero, -1 takes the rest) to the same dimensions.
var DropNoOpReshape = Rule{
	Name: "drop-noop-reshape",
	Ops:  []string{"Reshape"},
	Apply: func(w *Work, n *pb.NodeProto) (bool, error) {
		if len(n.Input) != 2 {
			return false, nil
		}
		in, ok := w.StaticShape(n.Input[0])
		if !ok {
			return false, nil
		}
		target, ok := w.ConstInts(n.Input[1])
		if !ok || len(target) != len(in) {
			return false, nil
		}
		allowZero := graph.AttrInt(n, "allowzero", 0) != 0
		out := slices.Clone(target)
		neg := -1
		for i, d := range out {
			switch {
			case d == 0 && !allowZero:
				out[i] = in[i]
			case d == -1:
				if neg >= 0 {
					return false, nil
				}
				neg = i
			}
		}
		if neg >= 0 {
			total, rest := int64(1), int64(1)
			for i, d := range in {
				total *= d
				if i != neg {
					rest *= out[i]
				}
			}
			if rest == 0 || total%rest != 0 {
				return false, nil
			}
			out[neg] = total / rest
		}
		if !slices.Equal(out, in) {
			return false, nil
		}
		return w.Drop(n, n.Input[0]), nil
	},
}

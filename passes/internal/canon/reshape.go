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
		out, ok := resolveReshape(in, target, graph.AttrInt(n, "allowzero", 0) != 0)
		if !ok {
			return false, nil
		}
		if !slices.Equal(out, in) {
			return false, nil
		}
		return w.Drop(n, n.Input[0]), nil
	},
}

// resolveReshape is the shape a Reshape of an input of shape in to target
// gives: 0 copies the input's dimension (unless allowZero), -1 takes what
// the others leave; false when that is not a valid reshape.
func resolveReshape(in, target []int64, allowZero bool) ([]int64, bool) {
	out := slices.Clone(target)
	neg := -1
	for i, d := range out {
		switch {
		case d == 0 && !allowZero:
			if i >= len(in) {
				return nil, false
			}
			out[i] = in[i]
		case d == -1:
			if neg >= 0 {
				return nil, false
			}
			neg = i
		case d < 0:
			return nil, false
		}
	}
	if neg >= 0 {
		total, rest := int64(1), int64(1)
		for _, d := range in {
			total *= d
		}
		for i, d := range out {
			if i != neg {
				rest *= d
			}
		}
		if rest == 0 || total%rest != 0 {
			return nil, false
		}
		out[neg] = total / rest
	}
	return out, true
}

package canon

import (
	"github.com/mokopt/mokopt/graph"
	"github.com/mokopt/mokopt/graph/eval"
	pb "github.com/mokopt/mokopt/graph/onnxpb"
)

// StaticDim folds Gather(Shape(v), i) — one dimension of a computed value
// — to a constant when that dimension is static although v's whole shape
// is not: its declared dimension, or one that the ops producing v keep
// from a constant (the columns of a MatMul or Gemm by a constant weight,
// kept through elementwise ops and softmaxes over the same shape). A
// router that takes the top k of a full sort, with k read as the number of
// its scores (TopK(p, Shape(p)[1])), then has a constant k. A dimension
// that depends on the input's (dynamic) size stays as it is.
var StaticDim = Rule{
	Name: "static-dim",
	Ops:  []string{"Gather"},
	Apply: func(w *Work, n *pb.NodeProto) (bool, error) {
		if len(n.Input) != 2 || len(n.Output) != 1 || w.G.IsOutput(n.Output[0]) || graph.AttrInt(n, "axis", 0) != 0 {
			return false, nil
		}
		sh := w.Producer(n.Input[0])
		if sh == nil || sh.GetOpType() != "Shape" || sh.GetDomain() != "" || len(sh.Input) != 1 || len(sh.Attribute) > 0 {
			return false, nil
		}
		idx, ok := w.Const(n.Input[1])
		if !ok || idx.Len() != 1 || len(idx.Shape) > 1 {
			return false, nil
		}
		r, ok := w.Rank(sh.Input[0])
		if !ok {
			return false, nil
		}
		i := idx.Int64s()[0]
		if i < 0 {
			i += int64(r)
		}
		if i < 0 || i >= int64(r) {
			return false, nil
		}
		d, ok := staticDim(w, sh.Input[0], int(i), r, 0)
		if !ok {
			return false, nil
		}
		w.Replace(n)
		_, err := w.AddConst(n.Output[0], eval.NewInt64(idx.Shape, []int64{d}))
		return err == nil, err
	},
}

// dimKeepers keep their (first) input's shape.
var dimKeepers = map[string]bool{
	"Softmax": true, "LogSoftmax": true, "Sigmoid": true, "Exp": true, "Neg": true, "Tanh": true, "Relu": true,
	"Cast": true, "Identity": true, "Abs": true, "Log": true, "Sqrt": true, "Reciprocal": true, "Erf": true, "Clip": true,
	"Softplus": true, "Softsign": true, "Mish": true, "Elu": true, "Celu": true, "Selu": true, "LeakyRelu": true,
	"ThresholdedRelu": true, "HardSigmoid": true, "HardSwish": true, "Gelu": true, "Sign": true, "Floor": true, "Ceil": true,
	"Round": true, "Sin": true, "Cos": true,
}

// staticDim returns dimension i of v (rank r) when it is static: declared,
// a constant's, or followed back through the ops that move dimensions
// without computing them (see dimThrough).
func staticDim(w *Work, v string, i, r, depth int) (int64, bool) {
	if i < 0 || i >= r {
		return 0, false
	}
	if t := w.Type(v); t != nil && t.GetShape() != nil && len(t.GetShape().GetDim()) == r {
		if dv, ok := t.GetShape().GetDim()[i].GetValue().(*pb.TensorShapeProto_Dimension_DimValue); ok && dv.DimValue >= 0 {
			return dv.DimValue, true
		}
	}
	if c, ok := w.Const(v); ok && len(c.Shape) == r {
		return int64(c.Shape[i]), true
	}
	p := w.Producer(v)
	if p == nil || p.GetDomain() != "" || depth > 16 || len(p.Input) == 0 {
		return 0, false
	}
	if dimKeepers[p.GetOpType()] {
		return staticDim(w, p.Input[0], i, r, depth+1)
	}
	if p.GetOpType() == "Concat" {
		return concatDim(w, p, i, r, depth)
	}
	if graph.Broadcasting(p.GetOpType()) {
		return broadcastDim(w, p, i, r, depth)
	}
	in, j, ok := dimThrough(w, p, i, r)
	if !ok {
		return 0, false
	}
	if in == "" {
		return int64(j), true // the op fixes it (an inserted axis, a reshape's constant)
	}
	rin, ok := w.Rank(in)
	if !ok {
		return 0, false
	}
	return staticDim(w, in, j, rin, depth+1)
}

// concatDim is staticDim of a Concat's output: the sum of its inputs'
// dimensions along its axis, any input's across it.
func concatDim(w *Work, p *pb.NodeProto, i, r, depth int) (int64, bool) {
	a := int(graph.AttrInt(p, "axis", 0))
	if a < 0 {
		a += r
	}
	var sum int64
	for _, in := range p.Input {
		d, ok := staticDim(w, in, i, r, depth+1)
		if !ok {
			return 0, false
		}
		if i != a {
			return d, true
		}
		sum += d
	}
	return sum, i == a && len(p.Input) > 0
}

// broadcastDim is staticDim of a broadcasting op's output: an input's
// dimension there that is not 1 (the others are 1 or equal to it), or 1
// when every input's is 1 (or the input has fewer dimensions).
func broadcastDim(w *Work, p *pb.NodeProto, i, r, depth int) (int64, bool) {
	all := true
	for _, in := range p.Input {
		ri, ok := w.Rank(in)
		if !ok || ri > r {
			return 0, false
		}
		j := i - (r - ri)
		if j < 0 {
			continue
		}
		d, ok := staticDim(w, in, j, ri, depth+1)
		switch {
		case ok && d != 1:
			return d, true
		case !ok:
			all = false
		}
	}
	return 1, all
}

// dimThrough says where dimension i of p's output (rank r) comes from:
// dimension j of input in, or (in empty) the constant j that p fixes it to.
// It covers the ops that move dimensions without computing them: matrix
// products (rows from the first operand, columns from the second),
// Transpose, Squeeze, Unsqueeze, Gather, GatherND and Reshape to a
// constant shape.
func dimThrough(w *Work, p *pb.NodeProto, i, r int) (string, int, bool) {
	rank := func(v string) int {
		if x, ok := w.Rank(v); ok {
			return x
		}
		return -1
	}
	switch p.GetOpType() {
	case "MatMul":
		if len(p.Input) != 2 || r < 2 || rank(p.Input[0]) < 2 || rank(p.Input[1]) < 2 {
			return "", 0, false
		}
		if i == r-1 {
			return p.Input[1], rank(p.Input[1]) - 1, true
		}
		if i == r-2 {
			return p.Input[0], rank(p.Input[0]) - 2, true
		}
	case "Gemm":
		if len(p.Input) < 2 || r != 2 {
			return "", 0, false
		}
		flip := func(t string) int {
			if graph.AttrInt(p, t, 0) != 0 {
				return 1 - i
			}
			return i
		}
		if i == 1 {
			return p.Input[1], flip("transB"), true
		}
		return p.Input[0], flip("transA"), true
	case "Transpose":
		perm := graph.AttrInts(p, "perm")
		if perm == nil {
			return p.Input[0], r - 1 - i, true
		}
		if len(perm) == r {
			return p.Input[0], int(perm[i]), true
		}
	case "Squeeze", "Unsqueeze":
		return dimAxes(w, p, i, r, rank(p.Input[0]))
	case "Gather":
		rd := rank(p.Input[0])
		q := r - rd + 1 // the indices' rank
		a := int(graph.AttrInt(p, "axis", 0))
		if a < 0 {
			a += rd
		}
		switch {
		case len(p.Input) != 2 || rd < 1 || q < 0 || a < 0:
		case i < a:
			return p.Input[0], i, true
		case i >= a+q:
			return p.Input[0], i - q + 1, true
		default:
			return p.Input[1], i - a, true
		}
	case "GatherND":
		qi := rank(p.Input[1])
		if len(p.Input) != 2 || graph.AttrInt(p, "batch_dims", 0) != 0 || qi < 1 {
			return "", 0, false
		}
		if i < qi-1 {
			return p.Input[1], i, true
		}
		m, ok := staticDim(w, p.Input[1], qi-1, qi, 0)
		if ok {
			return p.Input[0], int(m) + i - (qi - 1), true
		}
	case "Reshape":
		s, ok := w.ConstInts(p.Input[len(p.Input)-1])
		if len(p.Input) != 2 || !ok || len(s) != r {
			return "", 0, false
		}
		switch {
		case s[i] > 0:
			return "", int(s[i]), true
		case s[i] == 0 && graph.AttrInt(p, "allowzero", 0) == 0:
			return p.Input[0], i, true
		}
	}
	return "", 0, false
}

// dimAxes is dimThrough for Squeeze and Unsqueeze (rin: the input's rank).
func dimAxes(w *Work, p *pb.NodeProto, i, r, rin int) (string, int, bool) {
	axes, ok := w.squeezeAxes(p)
	big := r // the rank the axes index
	if p.GetOpType() == "Squeeze" {
		big = rin
	}
	if !ok || big < 0 {
		return "", 0, false
	}
	set := map[int]bool{}
	for _, a := range normAxes(axes, big) {
		set[int(a)] = true
	}
	if p.GetOpType() == "Unsqueeze" {
		if set[i] {
			return "", 1, true
		}
		j := i
		for a := range set {
			if a < i {
				j--
			}
		}
		return p.Input[0], j, true
	}
	j := -1
	for k := 0; k < big; k++ { // the i-th kept axis of the input
		if !set[k] {
			if j++; j == i {
				return p.Input[0], k, true
			}
		}
	}
	return "", 0, false
}

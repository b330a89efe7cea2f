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

// staticDim returns dimension i of v (rank r) when it is static.
func staticDim(w *Work, v string, i, r, depth int) (int64, bool) {
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
	switch op := p.GetOpType(); {
	case dimKeepers[op]:
		return staticDim(w, p.Input[0], i, r, depth+1)
	case (op == "MatMul" || op == "Gemm") && i == r-1 && len(p.Input) >= 2:
		b, ok := w.StaticShape(p.Input[1])
		if !ok || len(b) != 2 || op == "Gemm" && r != 2 {
			return 0, false
		}
		if op == "Gemm" && graph.AttrInt(p, "transB", 0) != 0 {
			return b[0], true
		}
		return b[1], true
	}
	return 0, false
}

package canon

import (
	"slices"

	"github.com/mokopt/mokopt/graph"
	"github.com/mokopt/mokopt/graph/eval"
	pb "github.com/mokopt/mokopt/graph/onnxpb"
)

// ReshapeOfOwnShape decides what a Reshape of x to a shape computed from
// Shape(x) does by evaluating that computation on a generic shape: distinct
// primes stand for x's dimensions (x's rank must be known), and the target
// they give, resolved as Reshape resolves it, is compared with them (a
// constant target is compared with x's static shape). The same dimensions
// → the Reshape is dropped; the same with ones inserted → Unsqueeze at
// those axes (exactly equal: a Reshape moves no data). Anything else (a merge, a split, a reorder) is
// left. An Unsqueeze written as a Reshape to Concat(Shape(x)[:a], [1],
// Shape(x)[a:]) then cancels with the Squeeze after it as the plain
// spelling does.
var ReshapeOfOwnShape = Rule{
	Name: "reshape-of-own-shape",
	Ops:  []string{"Reshape"},
	Apply: func(w *Work, n *pb.NodeProto) (bool, error) {
		if n.GetDomain() != "" || len(n.Input) != 2 || len(n.Output) != 1 || w.Opset() < 13 {
			return false, nil
		}
		x := n.Input[0]
		if _, ok := w.Const(x); ok {
			return false, nil // folded as it is
		}
		dims, target, ok := reshapeOperands(w, n)
		if !ok {
			return false, nil
		}
		r := len(dims)
		out, ok := resolveReshape(dims, target, graph.AttrInt(n, "allowzero", 0) != 0)
		if !ok {
			return false, nil
		}
		var axes []int64
		j := 0
		for i, d := range out {
			switch {
			case j < r && d == dims[j]:
				j++
			case d == 1:
				axes = append(axes, int64(i))
			default:
				return false, nil
			}
		}
		if j != r {
			return false, nil
		}
		if len(axes) == 0 {
			return w.Drop(n, x), nil
		}
		w.Replace(n, w.Node("Unsqueeze", "", n.GetName()+"/unsqueeze", []string{x, w.Int64s("axes", false, axes...)}, []string{n.Output[0]}))
		return true, nil
	},
}

// reshapeOperands returns the input dimensions and the target of Reshape n:
// for a constant target, the input's static shape; for a target computed
// from Shape(x), generic dimensions and the target computed from them.
func reshapeOperands(w *Work, n *pb.NodeProto) (dims, target []int64, ok bool) {
	x := n.Input[0]
	if target, ok := w.ConstInts(n.Input[1]); ok {
		dims, ok := w.StaticShape(x)
		return dims, target, ok
	}
	r, ok := w.Rank(x)
	if !ok || r > len(genericDims) {
		return nil, nil, false
	}
	dims = genericDims[:r]
	target, ok = shapeOfGeneric(w, n.Input[1], x, dims)
	return dims, target, ok
}

// genericDims are the dimensions a generic shape is made of: primes, so no
// product of some equals another and none is 1.
var genericDims = []int64{1009, 1013, 1019, 1021, 1031, 1033}

// maxShapeRegion bounds the nodes of a shape computation evaluated.
const maxShapeRegion = 16

// shapeOfGeneric evaluates the computation of v from Shape(x) (any start and
// end) and constants, with x's shape taken as dims; false when v reads
// anything else or the computation is larger than maxShapeRegion.
func shapeOfGeneric(w *Work, v, x string, dims []int64) ([]int64, bool) {
	feeds := map[string]*eval.Tensor{}
	var nodes []*pb.NodeProto
	seen := map[string]bool{}
	stack := []string{v}
	for len(stack) > 0 {
		u := stack[len(stack)-1]
		stack = stack[:len(stack)-1]
		if seen[u] || u == "" {
			continue
		}
		seen[u] = true
		if c, ok := w.Const(u); ok {
			feeds[u] = c
			continue
		}
		p := w.Producer(u)
		if p == nil || p.GetDomain() != "" || len(nodes) >= maxShapeRegion {
			return nil, false
		}
		if p.GetOpType() == "Shape" && len(p.Input) == 1 && p.Input[0] == x {
			s := shapeSlice(dims, graph.AttrInt(p, "start", 0), graph.AttrInt(p, "end", int64(len(dims))))
			feeds[u] = eval.NewInt64([]int{len(s)}, s)
			continue
		}
		for _, a := range p.GetAttribute() {
			if a.G != nil || len(a.Graphs) > 0 {
				return nil, false
			}
		}
		nodes = append(nodes, p)
		stack = append(stack, p.Input...)
	}
	if len(nodes) == 0 { // v is Shape(x) itself
		t, ok := feeds[v]
		if _, isConst := w.Const(v); !ok || isConst {
			return nil, false
		}
		return t.Int64s(), true
	}
	res, err := evalNodes(nodes, feeds, []string{v}, w.Opset())
	if err != nil || res[0].DType != pb.TensorProto_INT64 || len(res[0].Shape) != 1 {
		return nil, false
	}
	return res[0].Int64s(), true
}

// shapeSlice is Shape's output for a tensor of dims with start and end
// (negative ones counted from the end, both clamped).
func shapeSlice(dims []int64, start, end int64) []int64 {
	r := int64(len(dims))
	clamp := func(i int64) int64 {
		if i < 0 {
			i += r
		}
		return min(max(i, 0), r)
	}
	s, e := clamp(start), clamp(end)
	if s >= e {
		return []int64{}
	}
	return slices.Clone(dims[s:e])
}

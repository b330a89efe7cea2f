package graph

import (
	"strings"

	pb "github.com/mokopt/mokopt/graph/onnxpb"
)

// RankSource is what InferRank needs to know about a graph's values.
type RankSource interface {
	// Producer returns the node computing v, or nil (a graph input, an
	// initializer, an unknown name).
	Producer(v string) *pb.NodeProto
	// KnownRank returns v's rank when its type declares a shape (symbolic
	// dims allowed) or v is a constant.
	KnownRank(v string) (int, bool)
	// ConstInts returns the elements of v when it is an integer constant.
	ConstInts(v string) ([]int64, bool)
}

// maxRankDepth bounds how far InferRank follows producers back, so that a
// long chain of elementwise ops costs a bounded walk.
const maxRankDepth = 64

// DimSource is a RankSource that can also tell a static dimension of a
// value (dimension i of a value of rank r); InferRank uses it where a rank
// depends on a dimension (GatherND's index depth).
type DimSource interface {
	RankSource
	StaticDim(v string, i, r int) (int64, bool)
}

// InferRank returns v's rank: the known one, or one worked out from its
// producer's op and the ranks of that producer's inputs (shape ops with
// constant or measured shapes, elementwise ops, reductions, matmuls,
// gathers, scatters, normalizations), or false when it cannot be told.
// memo, when not nil, remembers the answers (-1 for unknown) across calls
// on the same unchanged graph.
func InferRank(src RankSource, v string, memo map[string]int) (int, bool) {
	if memo == nil {
		memo = map[string]int{}
	}
	r := inferRank(src, v, memo, 0)
	return r, r >= 0
}

func inferRank(src RankSource, v string, memo map[string]int, depth int) int {
	if v == "" || depth > maxRankDepth {
		return -1
	}
	if r, ok := src.KnownRank(v); ok {
		return r
	}
	if r, ok := memo[v]; ok {
		return r
	}
	memo[v] = -1 // a cycle reads as unknown
	r := rankFromProducer(src, v, memo, depth)
	memo[v] = r
	return r
}

// rankPreserving lists the ops whose first output has the rank of their
// first input.
var rankPreserving = map[string]bool{
	"Softmax": true, "LogSoftmax": true, "Sigmoid": true, "Relu": true, "Tanh": true, "Exp": true, "Neg": true,
	"Abs": true, "Erf": true, "Sqrt": true, "Cast": true, "Identity": true, "Transpose": true, "Slice": true,
	"Concat": true, "Split": true, "Clip": true, "LeakyRelu": true, "Dropout": true, "CastLike": true, "Tile": true,
	"TopK": true, "Not": true, "IsNaN": true, "Floor": true, "Ceil": true, "Round": true, "Reciprocal": true,
	"Log": true, "ScatterElements": true, "ScatterND": true, "GatherElements": true, "CumSum": true,
	"Softplus": true, "HardSigmoid": true, "Elu": true, "Gelu": true, "Sin": true, "Cos": true,
	"LayerNormalization": true, "RMSNormalization": true, "SimplifiedLayerNormalization": true,
	"SkipSimplifiedLayerNormalization": true, "SkipLayerNormalization": true, "QuickGelu": true, "FastGelu": true,
	"BiasGelu": true, "Celu": true, "Selu": true, "Mish": true, "Softsign": true, "HardSwish": true,
	"ThresholdedRelu": true, "Shrink": true, "Sign": true, "Tan": true, "Atan": true, "Asin": true, "Acos": true,
	"Sinh": true, "Cosh": true, "Asinh": true, "Acosh": true, "Atanh": true, "IsInf": true, "Hardmax": true,
}

// broadcasting lists the ops whose output has the largest rank of their
// inputs.
var broadcasting = map[string]bool{
	"Add": true, "Sub": true, "Mul": true, "Div": true, "Pow": true, "Where": true, "Max": true, "Min": true,
	"Sum": true, "Mean": true, "Equal": true, "Less": true, "Greater": true, "LessOrEqual": true,
	"GreaterOrEqual": true, "And": true, "Or": true, "Xor": true, "Mod": true, "PRelu": true, "BitShift": true,
}

// Broadcasting reports whether the default-domain op is elementwise with
// numpy-style broadcasting of its inputs (Add, Equal, Where, ...).
func Broadcasting(op string) bool { return broadcasting[op] }

func rankFromProducer(src RankSource, v string, memo map[string]int, depth int) int {
	p := src.Producer(v)
	if p == nil {
		return -1
	}
	op := p.GetOpType()
	if d := p.GetDomain(); d != "" && d != "ai.onnx" && !(d == "com.microsoft" && rankPreserving[op]) {
		return -1
	}
	if op == "Constant" {
		if t := AttrTensor(p, "value"); t != nil {
			return len(t.GetDims())
		}
		return -1
	}
	if len(p.Input) == 0 || v != p.Output[0] && op != "Split" && op != "TopK" {
		return -1
	}
	in := func(i int) int {
		if i >= len(p.Input) {
			return -1
		}
		return inferRank(src, p.Input[i], memo, depth+1)
	}
	axes := func() ([]int64, bool) { // from the attribute or the constant second input
		if Attr(p, "axes") != nil || len(p.Input) < 2 || p.Input[1] == "" {
			return AttrInts(p, "axes"), true
		}
		return src.ConstInts(p.Input[1])
	}
	switch {
	case op == "Gemm" || op == "Flatten" || op == "NonZero":
		return 2
	case op == "Shape" || op == "Range":
		return 1
	case op == "Size":
		return 0
	case op == "OneHot":
		if r := in(0); r >= 0 {
			return r + 1
		}
	case op == "ArgMax" || op == "ArgMin":
		r := in(0)
		if r >= 0 && AttrInt(p, "keepdims", 1) == 0 {
			r--
		}
		return r
	case op == "Reshape":
		if len(p.Input) > 1 {
			return shapeLen(src, p.Input[1], memo, depth+1)
		}
	case op == "ConstantOfShape":
		return shapeLen(src, p.Input[0], memo, depth+1)
	case op == "Expand":
		a, b := in(0), -1
		if len(p.Input) > 1 {
			b = shapeLen(src, p.Input[1], memo, depth+1)
		}
		if a >= 0 && b >= 0 {
			return max(a, b)
		}
	case op == "Unsqueeze" || op == "Squeeze":
		r := in(0)
		ax, ok := axes()
		if r < 0 || !ok || op == "Squeeze" && len(ax) == 0 {
			return -1
		}
		if op == "Unsqueeze" {
			return r + len(ax)
		}
		return r - len(ax)
	case op == "Gather":
		if r, q := in(0), in(1); r >= 1 && q >= 0 {
			return r - 1 + q
		}
	case op == "GatherND":
		r, q := in(0), in(1)
		ds, ok := src.(DimSource)
		if r < 1 || q < 1 || !ok {
			return -1
		}
		if m, ok := ds.StaticDim(p.Input[1], q-1, q); ok {
			return q - 1 + r - int(m) - int(AttrInt(p, "batch_dims", 0))
		}
	case op == "MatMul":
		if a, b := in(0), in(1); a >= 2 && b >= 2 {
			return max(a, b)
		}
	case op == "Einsum":
		return einsumRank(AttrString(p, "equation", ""), in)
	case broadcasting[op]:
		r := -1
		for i := range p.Input {
			ri := in(i)
			if ri < 0 {
				return -1
			}
			r = max(r, ri)
		}
		return r
	case strings.HasPrefix(op, "Reduce"):
		r := in(0)
		if r < 0 || AttrInt(p, "keepdims", 1) == 1 {
			return r
		}
		ax, ok := axes()
		switch {
		case !ok:
			return -1
		case len(ax) > 0:
			return r - len(ax)
		case AttrInt(p, "noop_with_empty_axes", 0) == 1:
			return r
		}
		return 0
	case rankPreserving[op]:
		return in(0)
	}
	return -1
}

// shapeLen returns the number of elements of a 1-D shape value: a
// constant's, a Shape's (the rank of what it measures), a Concat's (the sum
// of its parts'), or -1.
func shapeLen(src RankSource, v string, memo map[string]int, depth int) int {
	if depth > maxRankDepth {
		return -1
	}
	if s, ok := src.ConstInts(v); ok {
		return len(s)
	}
	p := src.Producer(v)
	if p == nil || len(p.Input) == 0 || p.GetDomain() != "" {
		return -1
	}
	switch p.GetOpType() {
	case "Shape":
		r := inferRank(src, p.Input[0], memo, depth+1)
		if r < 0 {
			return -1
		}
		clamp := func(a int64) int64 { // Shape's start and end, as Slice reads them
			if a < 0 {
				a += int64(r)
			}
			return min(max(a, 0), int64(r))
		}
		start, end := clamp(AttrInt(p, "start", 0)), clamp(AttrInt(p, "end", int64(r)))
		return int(max(end-start, 0))
	case "Concat":
		n := 0
		for _, in := range p.Input {
			k := shapeLen(src, in, memo, depth+1)
			if k < 0 {
				return -1
			}
			n += k
		}
		return n
	case "Unsqueeze":
		if inferRank(src, p.Input[0], memo, depth+1) == 0 {
			return 1
		}
	case "Cast", "Identity":
		return shapeLen(src, p.Input[0], memo, depth+1)
	}
	return -1
}

// einsumRank is the rank of an Einsum's output with an explicit output
// term: its letters, plus the axes an ellipsis stands for (an operand's
// rank less its own letters); -1 when that cannot be told.
func einsumRank(eq string, in func(int) int) int {
	eq = strings.ReplaceAll(eq, " ", "")
	lhs, out, ok := strings.Cut(eq, "->")
	if !ok {
		return -1
	}
	r := len(strings.ReplaceAll(out, "...", ""))
	if !strings.Contains(out, "...") {
		return r
	}
	for i, term := range strings.Split(lhs, ",") {
		if strings.Contains(term, "...") {
			if ri := in(i); ri >= 0 {
				return r + ri - len(strings.ReplaceAll(term, "...", ""))
			}
		}
	}
	return -1
}

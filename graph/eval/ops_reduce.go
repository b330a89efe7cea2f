package eval

import (
	"math"

	pb "github.com/mokopt/mokopt/graph/onnxpb"
)

// reducePlan describes a reduction over some axes of a shape.
type reducePlan struct {
	outShape  []int // with kept (size-1) reduced dims
	finalDims []int // output shape honouring keepdims
	outIdx    []int // for each input element, its output position
	count     int   // elements folded into each output
	shape     []int // the input's shape
	red       []bool
	ps        []int // per input dim, its stride in the output (0 when reduced)
}

func planReduce(shape []int, axes []int, keep bool) reducePlan {
	p := planShape(shape, axes, keep)
	p.outIdx = p.index()
	return p
}

// planShape is planReduce without the index array (outIdx nil).
func planShape(shape []int, axes []int, keep bool) reducePlan {
	red := make([]bool, len(shape))
	for _, a := range axes {
		red[a] = true
	}
	out := make([]int, len(shape))
	var final []int
	count := 1
	for i, d := range shape {
		if red[i] {
			out[i] = 1
			count *= d
			if keep {
				final = append(final, 1)
			}
		} else {
			out[i] = d
			final = append(final, d)
		}
	}
	os := Strides(out)
	ps := make([]int, len(shape))
	for i := range shape {
		if !red[i] {
			ps[i] = os[i]
		}
	}
	return reducePlan{outShape: out, finalDims: final, count: count, shape: shape, red: red, ps: ps}
}

// index returns, for each input element, its output position.
func (p *reducePlan) index() []int { return stridedIndex(p.shape, 0, p.ps) }

// blocks reports whether the reduced dims are consecutive: the input is
// then [a, r, b] (dims before, reduced, after) and element (i, j, k) folds
// into output i*b + k.
func (p *reducePlan) blocks() (a, r, b int, ok bool) {
	first, last := -1, -1
	for i, red := range p.red {
		if red {
			if first < 0 {
				first = i
			}
			last = i
		}
	}
	if first < 0 {
		return 0, 0, 0, false
	}
	for i := first; i <= last; i++ {
		if !p.red[i] {
			return 0, 0, 0, false
		}
	}
	return numel(p.shape[:first]), numel(p.shape[first : last+1]), numel(p.shape[last+1:]), true
}

// reduceAxes reads the axes of a Reduce* node: from input 1 when the opset
// takes them as an input, else the attribute. It returns nil axes for "all"
// and noop=true when the reduction is the identity.
func reduceAxes(c *OpContext, n *pb.NodeProto, in []*Tensor, rank int, inputFrom int64) ([]int, bool, error) {
	var axes []int64
	fromInput := c.Opset("") >= inputFrom
	axes, ok, err := axesArg(c, n, in, 1, fromInput)
	if err != nil {
		return nil, false, err
	}
	if !ok || len(axes) == 0 {
		if attrInt(n, "noop_with_empty_axes", 0) == 1 {
			return nil, true, nil
		}
		all := make([]int, rank)
		for i := range all {
			all[i] = i
		}
		return all, false, nil
	}
	ax, err := normAxes(axes, rank)
	return ax, false, err
}

func kReduce(op string) KernelFunc {
	inputFrom := int64(18)
	if op == "ReduceSum" {
		inputFrom = 13
	}
	return func(c *OpContext, n *pb.NodeProto, in []*Tensor) ([]*Tensor, error) {
		x, err := need(in, 0)
		if err != nil {
			return nil, err
		}
		axes, noop, err := reduceAxes(c, n, in, x.Rank(), inputFrom)
		if err != nil {
			return nil, err
		}
		if noop {
			return []*Tensor{x}, nil
		}
		p := planShape(x.Shape, axes, attrInt(n, "keepdims", 1) == 1)
		m := numel(p.outShape)
		out := New(x.DType, p.finalDims)
		if a, r, b, ok := p.blocks(); !ok || x.kind() != kF32 {
			p.outIdx = p.index()
		} else {
			// Consecutive reduced dims of a float32 input: folded block by
			// block, each output's elements in the same (ascending) order
			// as the element loop below, without an index array.
			acc := make([]float64, m)
			init, fold, fin := floatReducer(op, p.count)
			for i := range acc {
				acc[i] = init
			}
			for i := 0; i < a; i++ {
				row := acc[i*b : (i+1)*b]
				for j := 0; j < r; j++ {
					src := x.F32[(i*r+j)*b : (i*r+j+1)*b]
					for k, v := range src {
						row[k] = fold(row[k], float64(v))
					}
				}
			}
			for i, v := range acc {
				out.F32[i] = float32(fin(v))
			}
			return []*Tensor{out}, nil
		}
		switch x.kind() {
		case kF32, kF64:
			acc := make([]float64, m)
			init, fold, fin := floatReducer(op, p.count)
			for i := range acc {
				acc[i] = init
			}
			if x.kind() == kF32 {
				for i, v := range x.F32 {
					o := p.outIdx[i]
					acc[o] = fold(acc[o], float64(v))
				}
			} else {
				for i, v := range x.F64 {
					o := p.outIdx[i]
					acc[o] = fold(acc[o], v)
				}
			}
			for i, v := range acc {
				v = fin(v)
				if out.kind() == kF32 {
					out.F32[i] = float32(v)
				} else {
					out.F64[i] = v
				}
			}
		case kI64:
			var init int64
			var fold func(a, b int64) int64
			switch op {
			case "ReduceSum", "ReduceMean":
				fold = func(a, b int64) int64 { return a + b }
			case "ReduceProd":
				init, fold = 1, func(a, b int64) int64 { return a * b }
			case "ReduceMax":
				init, fold = math.MinInt64, func(a, b int64) int64 { return max(a, b) }
			case "ReduceMin":
				init, fold = math.MaxInt64, func(a, b int64) int64 { return min(a, b) }
			case "ReduceL1":
				fold = func(a, b int64) int64 { return a + max(b, -b) }
			case "ReduceSumSquare":
				fold = func(a, b int64) int64 { return a + b*b }
			default:
				return nil, errf("%s is not defined for %s", op, x.DType)
			}
			for i := range out.I64 {
				out.I64[i] = init
			}
			for i, v := range x.I64 {
				o := p.outIdx[i]
				out.I64[o] = fold(out.I64[o], v)
			}
			if op == "ReduceMean" && p.count > 0 {
				for i := range out.I64 {
					out.I64[i] /= int64(p.count)
				}
			}
		case kBool:
			if op != "ReduceMax" && op != "ReduceMin" {
				return nil, errf("%s is not defined for bool", op)
			}
			for i := range out.Bool {
				out.Bool[i] = op == "ReduceMin"
			}
			for i, v := range x.Bool {
				o := p.outIdx[i]
				if op == "ReduceMax" {
					out.Bool[o] = out.Bool[o] || v
				} else {
					out.Bool[o] = out.Bool[o] && v
				}
			}
		default:
			return nil, errf("%s is not defined for %s", op, x.DType)
		}
		return []*Tensor{out}, nil
	}
}

func floatReducer(op string, count int) (float64, func(a, b float64) float64, func(float64) float64) {
	id := func(v float64) float64 { return v }
	add := func(a, b float64) float64 { return a + b }
	switch op {
	case "ReduceSum":
		return 0, add, id
	case "ReduceMean":
		return 0, add, func(v float64) float64 { return v / float64(count) }
	case "ReduceProd":
		return 1, func(a, b float64) float64 { return a * b }, id
	case "ReduceMax":
		return math.Inf(-1), nanMax, id
	case "ReduceMin":
		return math.Inf(1), nanMin, id
	case "ReduceL1":
		return 0, func(a, b float64) float64 { return a + math.Abs(b) }, id
	case "ReduceL2":
		return 0, func(a, b float64) float64 { return a + b*b }, math.Sqrt
	case "ReduceSumSquare":
		return 0, func(a, b float64) float64 { return a + b*b }, id
	case "ReduceLogSum":
		return 0, add, math.Log
	case "ReduceLogSumExp":
		// accumulate exp sums; fine for the magnitudes of test data.
		return 0, func(a, b float64) float64 { return a + math.Exp(b) }, math.Log
	}
	return 0, add, id
}

// softmaxLike applies f to each row of length dim (stride inner) along axis.
func rowsAlong(x *Tensor, c *OpContext, n *pb.NodeProto) (outer, dim, inner int, err error) {
	r := x.Rank()
	if c.Opset("") < 13 {
		a, err := normAxis(attrInt(n, "axis", 1), max(r, 1))
		if err != nil {
			return 0, 0, 0, err
		}
		return numel(x.Shape[:a]), numel(x.Shape[a:]), 1, nil
	}
	a, err := normAxis(attrInt(n, "axis", -1), max(r, 1))
	if err != nil {
		return 0, 0, 0, err
	}
	if r == 0 {
		return 1, 1, 1, nil
	}
	return numel(x.Shape[:a]), x.Shape[a], numel(x.Shape[a+1:]), nil
}

func kSoftmax(op string) KernelFunc {
	return func(c *OpContext, n *pb.NodeProto, in []*Tensor) ([]*Tensor, error) {
		x, err := need(in, 0)
		if err != nil {
			return nil, err
		}
		if !isFloat(x.DType) {
			return nil, errf("%s needs a float input", op)
		}
		outer, dim, inner, err := rowsAlong(x, c, n)
		if err != nil {
			return nil, err
		}
		out := New(x.DType, x.Shape)
		row := make([]float64, dim)
		get := valueAt(x)
		for o := 0; o < outer; o++ {
			for j := 0; j < inner; j++ {
				base := o*dim*inner + j
				mx := math.Inf(-1)
				for i := range row {
					row[i] = get(base + i*inner)
					mx = max(mx, row[i])
				}
				switch op {
				case "Hardmax":
					best := 0
					for i := range row {
						if row[i] > row[best] {
							best = i
						}
					}
					for i := range row {
						row[i] = 0
					}
					if dim > 0 {
						row[best] = 1
					}
				default:
					sum := 0.0
					for i, v := range row {
						row[i] = math.Exp(v - mx)
						sum += row[i]
					}
					for i := range row {
						if op == "LogSoftmax" {
							row[i] = (get(base+i*inner) - mx) - math.Log(sum)
						} else {
							row[i] /= sum
						}
					}
				}
				for i, v := range row {
					if out.kind() == kF32 {
						out.F32[base+i*inner] = float32(v)
					} else {
						out.F64[base+i*inner] = v
					}
				}
			}
		}
		return []*Tensor{out}, nil
	}
}

// kLpNormalization divides x by its Lp norm (p 1 or 2) along one axis
// (default the last); a row of norm zero stays zero.
func kLpNormalization(c *OpContext, n *pb.NodeProto, in []*Tensor) ([]*Tensor, error) {
	x, err := need(in, 0)
	if err != nil {
		return nil, err
	}
	if !isFloat(x.DType) {
		return nil, errf("LpNormalization needs a float input")
	}
	p := attrInt(n, "p", 2)
	if p != 1 && p != 2 {
		return nil, errf("LpNormalization p=%d: only 1 and 2 are defined", p)
	}
	r := x.Rank()
	a, err := normAxis(attrInt(n, "axis", -1), max(r, 1))
	if err != nil {
		return nil, err
	}
	outer, dim, inner := 1, 1, 1
	if r > 0 {
		outer, dim, inner = numel(x.Shape[:a]), x.Shape[a], numel(x.Shape[a+1:])
	}
	out := New(x.DType, x.Shape)
	get := valueAt(x)
	for o := 0; o < outer; o++ {
		for j := 0; j < inner; j++ {
			base := o*dim*inner + j
			norm := 0.0
			for i := 0; i < dim; i++ {
				v := get(base + i*inner)
				if p == 1 {
					norm += math.Abs(v)
				} else {
					norm += v * v
				}
			}
			if p == 2 {
				norm = math.Sqrt(norm)
			}
			for i := 0; i < dim; i++ {
				if norm != 0 {
					setF(out, base+i*inner, get(base+i*inner)/norm)
				}
			}
		}
	}
	return []*Tensor{out}, nil
}

// setF stores v at i of a float tensor.
func setF(t *Tensor, i int, v float64) {
	if t.kind() == kF32 {
		t.F32[i] = float32(v)
	} else {
		t.F64[i] = v
	}
}

// normRows normalizes x over its trailing dims from axis, returning Y and
// per-row mean and inverse std dev. rms skips mean removal.
func normRows(c *OpContext, x, scale, bias *Tensor, axis int, eps float64, rms bool) (*Tensor, *Tensor, *Tensor, error) {
	if !isFloat(x.DType) {
		return nil, nil, nil, errf("normalization needs a float input")
	}
	rows := numel(x.Shape[:axis])
	cols := numel(x.Shape[axis:])
	norm := x.Shape[axis:]
	var si, bi []int
	if scale != nil {
		if _, err := BroadcastShapes(scale.Shape, norm); err != nil {
			return nil, nil, nil, errf("scale %v does not broadcast to %v", scale.Shape, norm)
		}
		si = bcastIndex(scale.Shape, norm)
	}
	if bias != nil {
		if _, err := BroadcastShapes(bias.Shape, norm); err != nil {
			return nil, nil, nil, errf("bias %v does not broadcast to %v", bias.Shape, norm)
		}
		bi = bcastIndex(bias.Shape, norm)
	}
	at := func(idx []int, i int) int {
		if idx == nil {
			return i
		}
		return idx[i]
	}
	y := New(x.DType, x.Shape)
	statShape := append([]int{}, x.Shape...)
	for i := axis; i < len(statShape); i++ {
		statShape[i] = 1
	}
	mean := New(pb.TensorProto_FLOAT, statShape)
	inv := New(pb.TensorProto_FLOAT, statShape)
	get := valueAt(x)
	for r := 0; r < rows; r++ {
		base := r * cols
		mu := 0.0
		if !rms {
			for j := 0; j < cols; j++ {
				mu += get(base + j)
			}
			mu /= float64(cols)
		}
		v := 0.0
		for j := 0; j < cols; j++ {
			d := get(base+j) - mu
			v += d * d
		}
		v /= float64(cols)
		is := 1 / math.Sqrt(v+eps)
		mean.F32[r] = float32(mu)
		inv.F32[r] = float32(is)
		for j := 0; j < cols; j++ {
			o := (get(base+j) - mu) * is
			if scale != nil {
				o *= scale.Float64At(at(si, j))
			}
			if bias != nil {
				o += bias.Float64At(at(bi, j))
			}
			setF(y, base+j, o)
		}
	}
	return y, mean, inv, nil
}

func kLayerNorm(rms bool) KernelFunc {
	return func(c *OpContext, n *pb.NodeProto, in []*Tensor) ([]*Tensor, error) {
		x, err := need(in, 0)
		if err != nil {
			return nil, err
		}
		axis, err := normAxis(attrInt(n, "axis", -1), x.Rank())
		if err != nil {
			return nil, err
		}
		y, mean, inv, err := normRows(c, x, opt(in, 1), opt(in, 2), axis, float64(attrFloat(n, "epsilon", 1e-5)), rms)
		if err != nil {
			return nil, err
		}
		if rms {
			return []*Tensor{y, inv}, nil
		}
		return []*Tensor{y, mean, inv}, nil
	}
}

// kSkipNorm is com.microsoft Skip(Simplified)LayerNormalization: the
// normalization of input + skip (+ bias), also returning that sum.
func kSkipNorm(rms bool) KernelFunc {
	return func(c *OpContext, n *pb.NodeProto, in []*Tensor) ([]*Tensor, error) {
		x, skip, err := need2(in)
		if err != nil {
			return nil, err
		}
		sum, err := applyArith(arithOps["Add"], x, skip)
		if err != nil {
			return nil, err
		}
		gamma := opt(in, 2)
		var beta, bias *Tensor
		if rms {
			bias = opt(in, 3)
		} else {
			beta, bias = opt(in, 3), opt(in, 4)
		}
		if bias != nil {
			if sum, err = applyArith(arithOps["Add"], sum, bias); err != nil {
				return nil, err
			}
		}
		y, mean, inv, err := normRows(c, sum, gamma, beta, sum.Rank()-1, float64(attrFloat(n, "epsilon", 1e-12)), rms)
		if err != nil {
			return nil, err
		}
		return []*Tensor{y, mean, inv, sum}, nil
	}
}

func kBatchNorm(c *OpContext, n *pb.NodeProto, in []*Tensor) ([]*Tensor, error) {
	var t [5]*Tensor
	for i := range t {
		v, err := need(in, i)
		if err != nil {
			return nil, err
		}
		t[i] = v
	}
	x := t[0]
	if x.Rank() < 2 || !isFloat(x.DType) {
		return nil, errf("BatchNormalization needs a float input of rank >= 2")
	}
	if attrInt(n, "training_mode", 0) == 1 {
		return nil, errf("training-mode BatchNormalization is not supported")
	}
	eps := float64(attrFloat(n, "epsilon", 1e-5))
	C := x.Shape[1]
	inner := numel(x.Shape[2:])
	out := New(x.DType, x.Shape)
	get := valueAt(x)
	for i := 0; i < x.Len(); i++ {
		ch := (i / inner) % C
		v := (get(i)-t[3].Float64At(ch))/math.Sqrt(t[4].Float64At(ch)+eps)*t[1].Float64At(ch) + t[2].Float64At(ch)
		setF(out, i, v)
	}
	return []*Tensor{out}, nil
}

func kInstanceNorm(c *OpContext, n *pb.NodeProto, in []*Tensor) ([]*Tensor, error) {
	x, s, err := need2(in)
	if err != nil {
		return nil, err
	}
	b, err := need(in, 2)
	if err != nil {
		return nil, err
	}
	if x.Rank() < 3 {
		return nil, errf("InstanceNormalization needs rank >= 3")
	}
	y, _, _, err := normRows(c, x, nil, nil, 2, float64(attrFloat(n, "epsilon", 1e-5)), false)
	if err != nil {
		return nil, err
	}
	C := x.Shape[1]
	inner := numel(x.Shape[2:])
	for i := 0; i < y.Len(); i++ {
		ch := (i / inner) % C
		setF(y, i, y.Float64At(i)*s.Float64At(ch)+b.Float64At(ch))
	}
	return []*Tensor{y}, nil
}

func kMVN(c *OpContext, n *pb.NodeProto, in []*Tensor) ([]*Tensor, error) {
	x, err := need(in, 0)
	if err != nil {
		return nil, err
	}
	axes := attrInts(n, "axes")
	if axes == nil {
		axes = []int64{0, 2, 3}
	}
	ax, err := normAxes(axes, x.Rank())
	if err != nil {
		return nil, err
	}
	p := planReduce(x.Shape, ax, true)
	m := numel(p.outShape)
	mean := make([]float64, m)
	sq := make([]float64, m)
	for i := 0; i < x.Len(); i++ {
		v := x.Float64At(i)
		mean[p.outIdx[i]] += v
		sq[p.outIdx[i]] += v * v
	}
	for i := range mean {
		mean[i] /= float64(p.count)
		sq[i] = math.Sqrt(sq[i]/float64(p.count) - mean[i]*mean[i])
	}
	out := New(x.DType, x.Shape)
	for i := 0; i < x.Len(); i++ {
		o := p.outIdx[i]
		setF(out, i, (x.Float64At(i)-mean[o])/(sq[o]+1e-9))
	}
	return []*Tensor{out}, nil
}

func kGlobalPool(op string) KernelFunc {
	return func(c *OpContext, n *pb.NodeProto, in []*Tensor) ([]*Tensor, error) {
		x, err := need(in, 0)
		if err != nil {
			return nil, err
		}
		if x.Rank() < 3 || !isFloat(x.DType) {
			return nil, errf("%s needs a float input of rank >= 3", op)
		}
		var axes []int
		for i := 2; i < x.Rank(); i++ {
			axes = append(axes, i)
		}
		red := "ReduceMean"
		if op == "GlobalMaxPool" {
			red = "ReduceMax"
		}
		p := planReduce(x.Shape, axes, true)
		init, fold, fin := floatReducer(red, p.count)
		acc := make([]float64, numel(p.outShape))
		for i := range acc {
			acc[i] = init
		}
		for i := 0; i < x.Len(); i++ {
			acc[p.outIdx[i]] = fold(acc[p.outIdx[i]], x.Float64At(i))
		}
		out := New(x.DType, p.finalDims)
		for i, v := range acc {
			setF(out, i, fin(v))
		}
		return []*Tensor{out}, nil
	}
}

func init() {
	for _, op := range []string{"ReduceSum", "ReduceMean", "ReduceMax", "ReduceMin", "ReduceProd", "ReduceL1",
		"ReduceL2", "ReduceSumSquare", "ReduceLogSum", "ReduceLogSumExp"} {
		builtin("", kReduce(op), op)
	}
	builtin("", kSoftmax("Softmax"), "Softmax")
	builtin("", kSoftmax("LogSoftmax"), "LogSoftmax")
	builtin("", kSoftmax("Hardmax"), "Hardmax")
	builtin("", kLpNormalization, "LpNormalization")
	builtin("", kLayerNorm(false), "LayerNormalization")
	builtin("", kLayerNorm(true), "SimplifiedLayerNormalization", "RMSNormalization")
	builtin("com.microsoft", kLayerNorm(true), "SimplifiedLayerNormalization")
	builtin("com.microsoft", kSkipNorm(false), "SkipLayerNormalization")
	builtin("com.microsoft", kSkipNorm(true), "SkipSimplifiedLayerNormalization")
	builtin("", kBatchNorm, "BatchNormalization")
	builtin("", kInstanceNorm, "InstanceNormalization")
	builtin("", kMVN, "MeanVarianceNormalization")
	builtin("", kGlobalPool("GlobalAveragePool"), "GlobalAveragePool")
	builtin("", kGlobalPool("GlobalMaxPool"), "GlobalMaxPool")
}

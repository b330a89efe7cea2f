package eval

import (
	"math"
	"slices"
	"sort"

	pb "github.com/mokopt/mokopt/graph/onnxpb"
)

// gatherAxis picks positions idx (already in range) along axis; the picked
// axis is replaced by idxShape.
func gatherAxis(x *Tensor, axis int, idx []int, idxShape []int) *Tensor {
	outer := numel(x.Shape[:axis])
	inner := numel(x.Shape[axis+1:])
	dim := x.Shape[axis]
	shape := append(append(append([]int{}, x.Shape[:axis]...), idxShape...), x.Shape[axis+1:]...)
	out := New(x.DType, shape)
	k := len(idx)
	for o := 0; o < outer; o++ {
		for j, v := range idx {
			copyRange(out, (o*k+j)*inner, x, (o*dim+v)*inner, inner)
		}
	}
	return out
}

// indexList converts an integer index tensor to in-range ints for a dim.
func indexList(t *Tensor, dim int) ([]int, error) {
	if t.kind() != kI64 {
		return nil, errf("indices must be integers, got %s", t.DType)
	}
	out := make([]int, len(t.I64))
	for i, v := range t.I64 {
		if v < 0 {
			v += int64(dim)
		}
		if v < 0 || v >= int64(dim) {
			return nil, errf("index %d out of range for dim %d", t.I64[i], dim)
		}
		out[i] = int(v)
	}
	return out, nil
}

func kGather(c *OpContext, n *pb.NodeProto, in []*Tensor) ([]*Tensor, error) {
	x, it, err := need2(in)
	if err != nil {
		return nil, err
	}
	axis, err := normAxis(attrInt(n, "axis", 0), x.Rank())
	if err != nil {
		return nil, err
	}
	idx, err := indexList(it, x.Shape[axis])
	if err != nil {
		return nil, err
	}
	shape := append(append(append([]int{}, x.Shape[:axis]...), it.Shape...), x.Shape[axis+1:]...)
	if _, err := checkedNumel(shape); err != nil {
		return nil, err
	}
	if axis == 0 && x.Rank() > 1 {
		inner := numel(x.Shape[1:])
		offs := make([]int, len(idx))
		for i, v := range idx {
			offs[i] = v * inner
		}
		if t := lazyGather(x, offs, inner, shape); t != nil {
			return []*Tensor{t}, c.checkLazy(t)
		}
	}
	if x, err = c.load(x); err != nil {
		return nil, err
	}
	if err := c.checkAlloc(x.DType, shape); err != nil {
		return nil, err
	}
	return []*Tensor{gatherAxis(x, axis, idx, it.Shape)}, nil
}

// elementIndex maps each element of an index tensor (shape ishape) to the
// flat position in a tensor of shape xshape, with axis replaced by the index.
func elementIndex(it *Tensor, xshape []int, axis int) ([]int, error) {
	if it.kind() != kI64 {
		return nil, errf("indices must be integers")
	}
	if len(it.Shape) != len(xshape) {
		return nil, errf("indices rank %d differs from data rank %d", len(it.Shape), len(xshape))
	}
	xs := Strides(xshape)
	// base offset of every index position with the axis coordinate zeroed.
	ps := append([]int{}, xs...)
	ps[axis] = 0
	for d := range xshape {
		if d != axis && it.Shape[d] > xshape[d] {
			return nil, errf("indices shape %v exceeds data shape %v", it.Shape, xshape)
		}
	}
	base := stridedIndex(it.Shape, 0, ps)
	dim := xshape[axis]
	for i, v := range it.I64 {
		if v < 0 {
			v += int64(dim)
		}
		if v < 0 || v >= int64(dim) {
			return nil, errf("index %d out of range for dim %d", it.I64[i], dim)
		}
		base[i] += int(v) * xs[axis]
	}
	return base, nil
}

func kGatherElements(c *OpContext, n *pb.NodeProto, in []*Tensor) ([]*Tensor, error) {
	x, it, err := need2(in)
	if err != nil {
		return nil, err
	}
	axis, err := normAxis(attrInt(n, "axis", 0), x.Rank())
	if err != nil {
		return nil, err
	}
	idx, err := elementIndex(it, x.Shape, axis)
	if err != nil {
		return nil, err
	}
	return []*Tensor{take(x, idx, it.Shape)}, nil
}

// ndIndex resolves GatherND/ScatterND index tuples: for each of the
// leading index positions, the flat offset (in units of slice elements) into
// data, for batch b.
func ndOffsets(data []int, it *Tensor, batchDims int) (offs []int, sliceShape []int, err error) {
	if it.kind() != kI64 {
		return nil, nil, errf("indices must be integers")
	}
	q := it.Rank()
	if q < 1 {
		return nil, nil, errf("indices must have rank >= 1")
	}
	k := it.Shape[q-1]
	if batchDims+k > len(data) {
		return nil, nil, errf("index tuples of length %d exceed data rank %d", k, len(data))
	}
	for d := 0; d < batchDims; d++ {
		if it.Shape[d] != data[d] {
			return nil, nil, errf("batch dims differ: indices %v, data %v", it.Shape, data)
		}
	}
	sliceShape = data[batchDims+k:]
	slice := numel(sliceShape)
	st := Strides(data)
	batch := numel(data[:batchDims])
	perBatch := numel(it.Shape[batchDims : q-1])
	offs = make([]int, batch*perBatch)
	for b := 0; b < batch; b++ {
		bbase := 0
		if batchDims > 0 {
			bbase = b * st[batchDims-1]
		}
		for j := 0; j < perBatch; j++ {
			tup := it.I64[(b*perBatch+j)*k : (b*perBatch+j+1)*k]
			f := bbase
			for d, v := range tup {
				dim := data[batchDims+d]
				if v < 0 {
					v += int64(dim)
				}
				if v < 0 || v >= int64(dim) {
					return nil, nil, errf("index %d out of range for dim %d", tup[d], dim)
				}
				f += int(v) * st[batchDims+d]
			}
			offs[b*perBatch+j] = f
		}
	}
	_ = slice
	return offs, sliceShape, nil
}

func kGatherND(c *OpContext, n *pb.NodeProto, in []*Tensor) ([]*Tensor, error) {
	x, it, err := need2(in)
	if err != nil {
		return nil, err
	}
	bd := int(attrInt(n, "batch_dims", 0))
	offs, sliceShape, err := ndOffsets(x.Shape, it, bd)
	if err != nil {
		return nil, err
	}
	shape := append(append([]int{}, it.Shape[:it.Rank()-1]...), sliceShape...)
	if _, err := checkedNumel(shape); err != nil {
		return nil, err
	}
	if t := lazyGather(x, offs, numel(sliceShape), shape); t != nil {
		return []*Tensor{t}, c.checkLazy(t)
	}
	if x, err = c.load(x); err != nil {
		return nil, err
	}
	if err := c.checkAlloc(x.DType, shape); err != nil {
		return nil, err
	}
	out := New(x.DType, shape)
	s := numel(sliceShape)
	for i, f := range offs {
		copyRange(out, i*s, x, f, s)
	}
	return []*Tensor{out}, nil
}

// combine applies a scatter reduction dst[di] = red(dst[di], src[si]).
func combine(dst *Tensor, di int, src *Tensor, si int, red string) {
	if red == "" || red == "none" {
		setElem(dst, di, src, si)
		return
	}
	switch dst.kind() {
	case kF32:
		dst.F32[di] = reduceF(red, dst.F32[di], src.F32[si])
	case kF64:
		dst.F64[di] = reduceF(red, dst.F64[di], src.F64[si])
	case kI64:
		dst.I64[di] = reduceF(red, dst.I64[di], src.I64[si])
	case kBool:
		a, b := dst.Bool[di], src.Bool[si]
		switch red {
		case "add", "max":
			dst.Bool[di] = a || b
		case "mul", "min":
			dst.Bool[di] = a && b
		}
	}
}

func reduceF[T float32 | float64 | int64](red string, a, b T) T {
	switch red {
	case "add":
		return a + b
	case "mul":
		return a * b
	case "max":
		return max(a, b)
	case "min":
		return min(a, b)
	}
	return b
}

func checkReduction(red string) error {
	switch red {
	case "none", "add", "mul", "max", "min":
		return nil
	}
	return errf("unknown reduction %q", red)
}

func kScatterND(c *OpContext, n *pb.NodeProto, in []*Tensor) ([]*Tensor, error) {
	x, it, err := need2(in)
	if err != nil {
		return nil, err
	}
	up, err := need(in, 2)
	if err != nil {
		return nil, err
	}
	red := attrString(n, "reduction", "none")
	if err := checkReduction(red); err != nil {
		return nil, err
	}
	offs, sliceShape, err := ndOffsets(x.Shape, it, 0)
	if err != nil {
		return nil, err
	}
	s := numel(sliceShape)
	if up.kind() != x.kind() || up.Len() != len(offs)*s {
		return nil, errf("updates %v do not match indices %v and data %v", up.Shape, it.Shape, x.Shape)
	}
	out := x.Clone()
	for i, f := range offs {
		for j := 0; j < s; j++ {
			combine(out, f+j, up, i*s+j, red)
		}
	}
	return []*Tensor{out}, nil
}

func kScatterElements(c *OpContext, n *pb.NodeProto, in []*Tensor) ([]*Tensor, error) {
	x, it, err := need2(in)
	if err != nil {
		return nil, err
	}
	up, err := need(in, 2)
	if err != nil {
		return nil, err
	}
	red := attrString(n, "reduction", "none")
	if err := checkReduction(red); err != nil {
		return nil, err
	}
	axis, err := normAxis(attrInt(n, "axis", 0), x.Rank())
	if err != nil {
		return nil, err
	}
	if !slices.Equal(it.Shape, up.Shape) || up.kind() != x.kind() {
		return nil, errf("updates %v must match indices %v", up.Shape, it.Shape)
	}
	idx, err := elementIndex(it, x.Shape, axis)
	if err != nil {
		return nil, err
	}
	out := x.Clone()
	for i, f := range idx {
		combine(out, f, up, i, red)
	}
	return []*Tensor{out}, nil
}

func kNonZero(c *OpContext, n *pb.NodeProto, in []*Tensor) ([]*Tensor, error) {
	x, err := need(in, 0)
	if err != nil {
		return nil, err
	}
	var hits []int
	for i := 0; i < x.Len(); i++ {
		var nz bool
		switch x.kind() {
		case kBool:
			nz = x.Bool[i]
		case kI64:
			nz = x.I64[i] != 0
		case kF32:
			nz = x.F32[i] != 0
		case kF64:
			nz = x.F64[i] != 0
		case kStr:
			nz = x.Str[i] != ""
		}
		if nz {
			hits = append(hits, i)
		}
	}
	r := x.Rank()
	out := New(pb.TensorProto_INT64, []int{r, len(hits)})
	if r == 0 {
		// numpy semantics for a scalar: one row with index 0 per hit
		out = New(pb.TensorProto_INT64, []int{1, len(hits)})
		return []*Tensor{out}, nil
	}
	st := Strides(x.Shape)
	for j, h := range hits {
		for d := 0; d < r; d++ {
			out.I64[d*len(hits)+j] = int64(h / st[d] % x.Shape[d])
		}
	}
	return []*Tensor{out}, nil
}

func kOneHot(c *OpContext, n *pb.NodeProto, in []*Tensor) ([]*Tensor, error) {
	it, dt, err := need2(in)
	if err != nil {
		return nil, err
	}
	vals, err := need(in, 2)
	if err != nil {
		return nil, err
	}
	if dt.Len() != 1 || vals.Len() != 2 {
		return nil, errf("depth must be a scalar and values hold 2 elements")
	}
	depth := int(dt.Float64At(0))
	if depth <= 0 {
		return nil, errf("depth %d must be positive", depth)
	}
	r := it.Rank() + 1
	axis, err := normAxis(attrInt(n, "axis", -1), r)
	if err != nil {
		return nil, err
	}
	shape := append(append(append([]int{}, it.Shape[:axis]...), depth), it.Shape[axis:]...)
	out, err := c.alloc(vals.DType, shape)
	if err != nil {
		return nil, err
	}
	for i := 0; i < out.Len(); i++ {
		setElem(out, i, vals, 0)
	}
	outer := numel(it.Shape[:axis])
	inner := numel(it.Shape[axis:])
	for o := 0; o < outer; o++ {
		for j := 0; j < inner; j++ {
			v := int64(it.Float64At(o*inner + j))
			if v < 0 {
				v += int64(depth)
			}
			if v < 0 || v >= int64(depth) {
				continue
			}
			setElem(out, (o*depth+int(v))*inner+j, vals, 1)
		}
	}
	return []*Tensor{out}, nil
}

// lessFunc returns an ordering on element positions of x for TopK/ArgMax:
// "a before b" in the requested direction, NaN treated as largest.
func valueAt(x *Tensor) func(i int) float64 {
	switch x.kind() {
	case kF32:
		return func(i int) float64 { return float64(x.F32[i]) }
	case kF64:
		return func(i int) float64 { return x.F64[i] }
	}
	return x.Float64At
}

func kTopK(c *OpContext, n *pb.NodeProto, in []*Tensor) ([]*Tensor, error) {
	x, err := need(in, 0)
	if err != nil {
		return nil, err
	}
	var k int64
	if c.Opset("") < 10 {
		k = attrInt(n, "k", 0)
	} else {
		kt, err := need(in, 1)
		if err != nil {
			return nil, err
		}
		if k, err = scalarInt(kt); err != nil {
			return nil, err
		}
	}
	axis, err := normAxis(attrInt(n, "axis", -1), x.Rank())
	if err != nil {
		return nil, err
	}
	largest := attrInt(n, "largest", 1) == 1
	dim := x.Shape[axis]
	if k < 0 || k > int64(dim) {
		return nil, errf("k=%d out of range for dim %d", k, dim)
	}
	K := int(k)
	outer := numel(x.Shape[:axis])
	inner := numel(x.Shape[axis+1:])
	shape := append([]int{}, x.Shape...)
	shape[axis] = K
	vals := New(x.DType, shape)
	idxs := New(pb.TensorProto_INT64, shape)
	val := valueAt(x)
	isI := x.kind() == kI64
	pos := make([]int, dim)
	top := make([]int, 0, K+1)
	for o := 0; o < outer; o++ {
		for j := 0; j < inner; j++ {
			base := o*dim*inner + j
			// before orders positions along the axis: a strict total order
			// (ties and NaNs by position), so its first K are unique.
			before := func(a, b int) bool {
				pa, pb := base+a*inner, base+b*inner
				if isI {
					va, vb := x.I64[pa], x.I64[pb]
					if va != vb {
						return (va > vb) == largest
					}
					return a < b
				}
				va, vb := val(pa), val(pb)
				na, nb := math.IsNaN(va), math.IsNaN(vb)
				switch {
				case na && nb:
					return a < b
				case na:
					return largest
				case nb:
					return !largest
				case va != vb:
					return (va > vb) == largest
				}
				return a < b
			}
			sel := pos[:K]
			if K <= 32 {
				// A few of many: keep the best K so far, in order (one
				// comparison for most positions, no sort of the row).
				top = top[:0]
				for i := 0; i < dim; i++ {
					if len(top) == K && (K == 0 || !before(i, top[K-1])) {
						continue
					}
					p := len(top)
					for p > 0 && before(i, top[p-1]) {
						p--
					}
					top = append(top, 0)
					copy(top[p+1:], top[p:])
					top[p] = i
					if len(top) > K {
						top = top[:K]
					}
				}
				sel = top
			} else {
				for i := range pos {
					pos[i] = i
				}
				sort.Slice(pos, func(a, b int) bool { return before(pos[a], pos[b]) })
			}
			for t := 0; t < K; t++ {
				di := (o*K+t)*inner + j
				setElem(vals, di, x, base+sel[t]*inner)
				idxs.I64[di] = int64(sel[t])
			}
		}
	}
	return []*Tensor{vals, idxs}, nil
}

func kArg(op string) KernelFunc {
	return func(c *OpContext, n *pb.NodeProto, in []*Tensor) ([]*Tensor, error) {
		x, err := need(in, 0)
		if err != nil {
			return nil, err
		}
		axis, err := normAxis(attrInt(n, "axis", 0), max(x.Rank(), 1))
		if err != nil {
			return nil, err
		}
		if x.Rank() == 0 {
			return []*Tensor{ScalarInt64(0)}, nil
		}
		keep := attrInt(n, "keepdims", 1) == 1
		lastIdx := attrInt(n, "select_last_index", 0) == 1
		dim := x.Shape[axis]
		if dim == 0 {
			return nil, errf("%s over an empty axis", op)
		}
		outer := numel(x.Shape[:axis])
		inner := numel(x.Shape[axis+1:])
		shape := append([]int{}, x.Shape...)
		shape[axis] = 1
		out := New(pb.TensorProto_INT64, shape)
		val := valueAt(x)
		for o := 0; o < outer; o++ {
			for j := 0; j < inner; j++ {
				base := o*dim*inner + j
				best := 0
				bv := val(base)
				for i := 1; i < dim; i++ {
					v := val(base + i*inner)
					better := v > bv
					if op == "ArgMin" {
						better = v < bv
					}
					if better || (lastIdx && v == bv) {
						best, bv = i, v
					}
				}
				out.I64[o*inner+j] = int64(best)
			}
		}
		if !keep {
			shape = append(shape[:axis], shape[axis+1:]...)
			out = out.view(shape)
		}
		return []*Tensor{out}, nil
	}
}

func kCumSum(c *OpContext, n *pb.NodeProto, in []*Tensor) ([]*Tensor, error) {
	x, at, err := need2(in)
	if err != nil {
		return nil, err
	}
	a, err := scalarInt(at)
	if err != nil {
		return nil, err
	}
	axis, err := normAxis(a, x.Rank())
	if err != nil {
		return nil, err
	}
	excl := attrInt(n, "exclusive", 0) == 1
	rev := attrInt(n, "reverse", 0) == 1
	out := New(x.DType, x.Shape)
	dim := x.Shape[axis]
	outer := numel(x.Shape[:axis])
	inner := numel(x.Shape[axis+1:])
	for o := 0; o < outer; o++ {
		for j := 0; j < inner; j++ {
			var accF float64
			var accI int64
			for s := 0; s < dim; s++ {
				i := s
				if rev {
					i = dim - 1 - s
				}
				p := (o*dim+i)*inner + j
				switch x.kind() {
				case kF32:
					if excl {
						out.F32[p] = float32(accF)
					}
					accF += float64(x.F32[p])
					if !excl {
						out.F32[p] = float32(accF)
					}
				case kF64:
					if excl {
						out.F64[p] = accF
					}
					accF += x.F64[p]
					if !excl {
						out.F64[p] = accF
					}
				case kI64:
					if excl {
						out.I64[p] = accI
					}
					accI += x.I64[p]
					if !excl {
						out.I64[p] = accI
					}
				default:
					return nil, errf("CumSum is not defined for %s", x.DType)
				}
			}
		}
	}
	return []*Tensor{out}, nil
}

func init() {
	builtin("", kGather, "Gather")
	builtin("", kGatherElements, "GatherElements")
	builtin("", kGatherND, "GatherND")
	builtin("", kScatterND, "ScatterND")
	builtin("", kScatterElements, "ScatterElements", "Scatter")
	builtin("", kNonZero, "NonZero")
	builtin("", kOneHot, "OneHot")
	builtin("", kTopK, "TopK")
	builtin("", kArg("ArgMax"), "ArgMax")
	builtin("", kArg("ArgMin"), "ArgMin")
	builtin("", kCumSum, "CumSum")
}

package eval

import (
	"math"

	pb "github.com/mokopt/mokopt/graph/onnxpb"
)

func kIdentity(c *OpContext, n *pb.NodeProto, in []*Tensor) ([]*Tensor, error) {
	x, err := need(in, 0)
	if err != nil {
		return nil, err
	}
	return []*Tensor{x}, nil
}

// kDropout is inference-mode Dropout: the input passes through and the mask
// is all true.
func kDropout(c *OpContext, n *pb.NodeProto, in []*Tensor) ([]*Tensor, error) {
	x, err := need(in, 0)
	if err != nil {
		return nil, err
	}
	if t := opt(in, 2); t != nil && t.Len() == 1 && t.kind() == kBool && t.Bool[0] {
		if r := opt(in, 1); r == nil || r.Float64At(0) != 0 {
			return nil, errf("training-mode Dropout is not supported")
		}
	}
	mask := New(pb.TensorProto_BOOL, x.Shape)
	for i := range mask.Bool {
		mask.Bool[i] = true
	}
	return []*Tensor{x, mask}, nil
}

func kConstant(c *OpContext, n *pb.NodeProto, in []*Tensor) ([]*Tensor, error) {
	for _, a := range n.Attribute {
		switch a.GetName() {
		case "value":
			bytesFn := BytesFunc(nil)
			if c != nil && c.r != nil {
				bytesFn = c.r.m.TensorBytes
			}
			return one(FromProto(a.GetT(), bytesFn))
		case "value_float":
			return []*Tensor{ScalarFloat32(a.GetF())}, nil
		case "value_floats":
			return []*Tensor{NewFloat32([]int{len(a.Floats)}, append([]float32{}, a.Floats...))}, nil
		case "value_int":
			return []*Tensor{ScalarInt64(a.GetI())}, nil
		case "value_ints":
			return []*Tensor{NewInt64([]int{len(a.Ints)}, append([]int64{}, a.Ints...))}, nil
		case "value_string":
			return []*Tensor{{DType: pb.TensorProto_STRING, Str: []string{string(a.GetS())}}}, nil
		case "value_strings":
			t := &Tensor{DType: pb.TensorProto_STRING, Shape: []int{len(a.Strings)}}
			for _, s := range a.Strings {
				t.Str = append(t.Str, string(s))
			}
			return []*Tensor{t}, nil
		case "sparse_value":
			return nil, errf("sparse Constant is not supported")
		}
	}
	return nil, errf("Constant has no value attribute")
}

func kReshape(c *OpContext, n *pb.NodeProto, in []*Tensor) ([]*Tensor, error) {
	x, err := need(in, 0)
	if err != nil {
		return nil, err
	}
	var spec []int64
	if c.Opset("") < 5 {
		spec = attrInts(n, "shape")
	} else {
		s, err := need(in, 1)
		if err != nil {
			return nil, err
		}
		if spec, err = intsOf(s); err != nil {
			return nil, err
		}
	}
	shape, err := reshapeTo(x.Shape, spec, attrInt(n, "allowzero", 0) == 1)
	if err != nil {
		return nil, err
	}
	return []*Tensor{x.view(shape)}, nil
}

// reshapeTo resolves a Reshape shape spec (0 copies, -1 infers).
func reshapeTo(in []int, spec []int64, allowZero bool) ([]int, error) {
	out := make([]int, len(spec))
	infer := -1
	known := 1
	for i, d := range spec {
		switch {
		case d == -1:
			if infer >= 0 {
				return nil, errf("shape %v has more than one -1", spec)
			}
			infer = i
			continue
		case d == 0 && !allowZero:
			if i >= len(in) {
				return nil, errf("shape %v copies dim %d of a rank-%d input", spec, i, len(in))
			}
			out[i] = in[i]
		case d < 0:
			return nil, errf("bad dim %d in shape %v", d, spec)
		default:
			out[i] = int(d)
		}
		known *= out[i]
	}
	total := numel(in)
	if infer >= 0 {
		if known == 0 {
			if total != 0 {
				return nil, errf("cannot infer -1 in %v for %d elements", spec, total)
			}
			out[infer] = 0
		} else {
			if total%known != 0 {
				return nil, errf("cannot reshape %v to %v", in, spec)
			}
			out[infer] = total / known
		}
	}
	// Checked: huge dims can wrap the product around to the input's count.
	if n, err := checkedNumel(out); err != nil || n != total {
		return nil, errf("cannot reshape %v (%d elements) to %v", in, total, spec)
	}
	return out, nil
}

func kExpand(c *OpContext, n *pb.NodeProto, in []*Tensor) ([]*Tensor, error) {
	x, s, err := need2(in)
	if err != nil {
		return nil, err
	}
	spec, err := intsOf(s)
	if err != nil {
		return nil, err
	}
	shape, err := BroadcastShapes(x.Shape, toInts(spec))
	if err != nil {
		return nil, err
	}
	if err := c.checkAlloc(x.DType, shape); err != nil {
		return nil, err
	}
	return []*Tensor{expandTo(x, shape)}, nil
}

func kTile(c *OpContext, n *pb.NodeProto, in []*Tensor) ([]*Tensor, error) {
	x, r, err := need2(in)
	if err != nil {
		return nil, err
	}
	reps, err := intsOf(r)
	if err != nil {
		return nil, err
	}
	if len(reps) != x.Rank() {
		return nil, errf("repeats %v do not match rank %d", reps, x.Rank())
	}
	shape := make([]int, x.Rank())
	for i, d := range x.Shape {
		if reps[i] < 0 {
			return nil, errf("negative repeat %d", reps[i])
		}
		if _, err := checkedNumel([]int{d, int(reps[i])}); err != nil || int64(int(reps[i])) != reps[i] {
			return nil, errf("repeat %d of dim %d (%d) is too large", reps[i], i, d)
		}
		shape[i] = d * int(reps[i])
	}
	if _, err := checkedNumel(shape); err != nil {
		return nil, errf("repeats %v: %v", reps, err)
	}
	if err := c.checkAlloc(x.DType, shape); err != nil {
		return nil, err
	}
	// view x as [1, d0, 1, d1, ...] and broadcast to [r0, d0, r1, d1, ...].
	inter := make([]int, 0, 2*x.Rank())
	big := make([]int, 0, 2*x.Rank())
	for i, d := range x.Shape {
		inter = append(inter, 1, d)
		big = append(big, int(reps[i]), d)
	}
	return []*Tensor{expandTo(x.view(inter), big).view(shape)}, nil
}

func kTranspose(c *OpContext, n *pb.NodeProto, in []*Tensor) ([]*Tensor, error) {
	x, err := need(in, 0)
	if err != nil {
		return nil, err
	}
	perm := toInts(attrInts(n, "perm"))
	if !hasAttr(n, "perm") {
		perm = make([]int, x.Rank())
		for i := range perm {
			perm[i] = x.Rank() - 1 - i
		}
	}
	if len(perm) != x.Rank() {
		return nil, errf("perm %v does not match rank %d", perm, x.Rank())
	}
	seen := make([]bool, len(perm))
	for _, p := range perm {
		if p < 0 || p >= len(perm) || seen[p] {
			return nil, errf("bad perm %v", perm)
		}
		seen[p] = true
	}
	return []*Tensor{transpose(x, perm)}, nil
}

// sliceAxis copies the [start, start+size) range of axis from x.
func sliceAxis(x *Tensor, axis, start, size int) *Tensor {
	shape := append([]int{}, x.Shape...)
	shape[axis] = size
	out := New(x.DType, shape)
	outer := numel(x.Shape[:axis])
	inner := numel(x.Shape[axis+1:])
	for o := 0; o < outer; o++ {
		copyRange(out, o*size*inner, x, (o*x.Shape[axis]+start)*inner, size*inner)
	}
	return out
}

func kSplit(c *OpContext, n *pb.NodeProto, in []*Tensor) ([]*Tensor, error) {
	x, err := need(in, 0)
	if err != nil {
		return nil, err
	}
	axis, err := normAxis(attrInt(n, "axis", 0), x.Rank())
	if err != nil {
		return nil, err
	}
	var split []int64
	if c.Opset("") >= 13 {
		if s := opt(in, 1); s != nil {
			if split, err = intsOf(s); err != nil {
				return nil, err
			}
		}
	} else if hasAttr(n, "split") {
		split = attrInts(n, "split")
	} else if s := opt(in, 1); s != nil {
		if split, err = intsOf(s); err != nil {
			return nil, err
		}
	}
	dim := x.Shape[axis]
	if split == nil {
		parts := len(n.Output)
		if hasAttr(n, "num_outputs") {
			parts = int(attrInt(n, "num_outputs", 0))
		}
		if parts <= 0 {
			return nil, errf("Split has no outputs")
		}
		if hasAttr(n, "num_outputs") {
			chunk := (dim + parts - 1) / parts
			for rem := dim; rem > 0; rem -= chunk {
				split = append(split, int64(min(chunk, rem)))
			}
			for len(split) < parts {
				split = append(split, 0)
			}
		} else {
			if dim%parts != 0 {
				return nil, errf("dim %d does not split evenly into %d parts", dim, parts)
			}
			for i := 0; i < parts; i++ {
				split = append(split, int64(dim/parts))
			}
		}
	}
	total := 0
	for _, s := range split {
		if s < 0 {
			return nil, errf("negative split %v", split)
		}
		total += int(s)
	}
	if total != dim {
		return nil, errf("split %v does not sum to dim %d", split, dim)
	}
	out := make([]*Tensor, len(split))
	start := 0
	for i, s := range split {
		out[i] = sliceAxis(x, axis, start, int(s))
		start += int(s)
	}
	return out, nil
}

// sliceParams holds one axis of a Slice.
func clampSlice(start, end, step int64, dim int) (int, int) {
	d := int64(dim)
	if start < 0 {
		start += d
	}
	if end < 0 {
		end += d
	}
	if step > 0 {
		start = max(0, min(start, d))
		end = max(0, min(end, d))
	} else {
		start = max(-1, min(start, d-1))
		end = max(-1, min(end, d-1))
	}
	return int(start), int(end)
}

func kSlice(c *OpContext, n *pb.NodeProto, in []*Tensor) ([]*Tensor, error) {
	x, err := need(in, 0)
	if err != nil {
		return nil, err
	}
	var starts, ends, axes, steps []int64
	if c.Opset("") < 10 {
		starts, ends, axes = attrInts(n, "starts"), attrInts(n, "ends"), attrInts(n, "axes")
	} else {
		s, err := need(in, 1)
		if err != nil {
			return nil, err
		}
		e, err := need(in, 2)
		if err != nil {
			return nil, err
		}
		if starts, err = intsOf(s); err != nil {
			return nil, err
		}
		if ends, err = intsOf(e); err != nil {
			return nil, err
		}
		if a := opt(in, 3); a != nil {
			if axes, err = intsOf(a); err != nil {
				return nil, err
			}
		}
		if st := opt(in, 4); st != nil {
			if steps, err = intsOf(st); err != nil {
				return nil, err
			}
		}
	}
	if len(starts) != len(ends) {
		return nil, errf("starts %v and ends %v differ in length", starts, ends)
	}
	if axes == nil {
		for i := range starts {
			axes = append(axes, int64(i))
		}
	}
	if steps == nil {
		for range starts {
			steps = append(steps, 1)
		}
	}
	if len(axes) != len(starts) || len(steps) != len(starts) {
		return nil, errf("starts, ends, axes and steps differ in length")
	}
	ax, err := normAxes(axes, x.Rank())
	if err != nil {
		return nil, err
	}
	r := x.Rank()
	st := make([]int, r)
	step := make([]int, r)
	shape := append([]int{}, x.Shape...)
	for i := range step {
		step[i] = 1
	}
	for i, a := range ax {
		if steps[i] == 0 {
			return nil, errf("slice step is 0")
		}
		s, e := clampSlice(starts[i], ends[i], steps[i], x.Shape[a])
		st[a], step[a] = s, int(steps[i])
		var cnt int
		if steps[i] > 0 {
			cnt = (e - s + int(steps[i]) - 1) / int(steps[i])
		} else {
			cnt = (s - e + int(-steps[i]) - 1) / int(-steps[i])
		}
		shape[a] = max(cnt, 0)
	}
	xs := Strides(x.Shape)
	base := 0
	ps := make([]int, r)
	for d := range xs {
		base += st[d] * xs[d]
		ps[d] = step[d] * xs[d]
	}
	return []*Tensor{take(x, stridedIndex(shape, base, ps), shape)}, nil
}

func kConcat(c *OpContext, n *pb.NodeProto, in []*Tensor) ([]*Tensor, error) {
	var parts []*Tensor
	for _, t := range in {
		if t != nil {
			parts = append(parts, t)
		}
	}
	if len(parts) == 0 {
		return nil, errf("Concat has no inputs")
	}
	r := parts[0].Rank()
	axis, err := normAxis(attrInt(n, "axis", 0), r)
	if err != nil {
		return nil, err
	}
	shape := append([]int{}, parts[0].Shape...)
	shape[axis] = 0
	for _, p := range parts {
		if p.Rank() != r || p.kind() != parts[0].kind() {
			return nil, errf("Concat inputs differ in rank or type: %v and %v", parts[0].Shape, p.Shape)
		}
		for d := range p.Shape {
			if d != axis && p.Shape[d] != parts[0].Shape[d] {
				return nil, errf("Concat inputs differ off the axis: %v and %v", parts[0].Shape, p.Shape)
			}
		}
		shape[axis] += p.Shape[axis]
	}
	out, err := c.alloc(parts[0].DType, shape)
	if err != nil {
		return nil, err
	}
	outer := numel(shape[:axis])
	inner := numel(shape[axis+1:])
	off := 0
	for _, p := range parts {
		w := p.Shape[axis] * inner
		for o := 0; o < outer; o++ {
			copyRange(out, o*shape[axis]*inner+off, p, o*w, w)
		}
		off += w
	}
	return []*Tensor{out}, nil
}

// axesArg reads axes from the input (opset >= v) or the attribute.
func axesArg(c *OpContext, n *pb.NodeProto, in []*Tensor, idx int, fromInput bool) ([]int64, bool, error) {
	if fromInput {
		if t := opt(in, idx); t != nil {
			v, err := intsOf(t)
			return v, true, err
		}
		return nil, false, nil
	}
	if hasAttr(n, "axes") {
		return attrInts(n, "axes"), true, nil
	}
	return nil, false, nil
}

func kSqueeze(c *OpContext, n *pb.NodeProto, in []*Tensor) ([]*Tensor, error) {
	x, err := need(in, 0)
	if err != nil {
		return nil, err
	}
	axes, ok, err := axesArg(c, n, in, 1, c.Opset("") >= 13)
	if err != nil {
		return nil, err
	}
	drop := make([]bool, x.Rank())
	if ok && len(axes) > 0 {
		ax, err := normAxes(axes, x.Rank())
		if err != nil {
			return nil, err
		}
		for _, a := range ax {
			if x.Shape[a] != 1 {
				return nil, errf("cannot squeeze axis %d of shape %v", a, x.Shape)
			}
			drop[a] = true
		}
	} else {
		for i, d := range x.Shape {
			drop[i] = d == 1
		}
	}
	var shape []int
	for i, d := range x.Shape {
		if !drop[i] {
			shape = append(shape, d)
		}
	}
	return []*Tensor{x.view(shape)}, nil
}

func kUnsqueeze(c *OpContext, n *pb.NodeProto, in []*Tensor) ([]*Tensor, error) {
	x, err := need(in, 0)
	if err != nil {
		return nil, err
	}
	axes, ok, err := axesArg(c, n, in, 1, c.Opset("") >= 13)
	if err != nil {
		return nil, err
	}
	if !ok {
		return nil, errf("Unsqueeze needs axes")
	}
	r := x.Rank() + len(axes)
	ax, err := normAxes(axes, r)
	if err != nil {
		return nil, err
	}
	ins := make([]bool, r)
	for _, a := range ax {
		ins[a] = true
	}
	shape := make([]int, 0, r)
	j := 0
	for i := 0; i < r; i++ {
		if ins[i] {
			shape = append(shape, 1)
		} else {
			shape = append(shape, x.Shape[j])
			j++
		}
	}
	return []*Tensor{x.view(shape)}, nil
}

func kFlatten(c *OpContext, n *pb.NodeProto, in []*Tensor) ([]*Tensor, error) {
	x, err := need(in, 0)
	if err != nil {
		return nil, err
	}
	a := int(attrInt(n, "axis", 1))
	if a < 0 {
		a += x.Rank()
	}
	if a < 0 || a > x.Rank() {
		return nil, errf("axis %d out of range for rank %d", a, x.Rank())
	}
	return []*Tensor{x.view([]int{numel(x.Shape[:a]), numel(x.Shape[a:])})}, nil
}

func kShape(c *OpContext, n *pb.NodeProto, in []*Tensor) ([]*Tensor, error) {
	x, err := need(in, 0)
	if err != nil {
		return nil, err
	}
	r := int64(x.Rank())
	start, end := attrInt(n, "start", 0), attrInt(n, "end", r)
	if start < 0 {
		start += r
	}
	if end < 0 {
		end += r
	}
	start = max(0, min(start, r))
	end = max(start, min(end, r))
	v := make([]int64, 0, end-start)
	for _, d := range x.Shape[start:end] {
		v = append(v, int64(d))
	}
	return []*Tensor{NewInt64([]int{len(v)}, v)}, nil
}

func kSize(c *OpContext, n *pb.NodeProto, in []*Tensor) ([]*Tensor, error) {
	x, err := need(in, 0)
	if err != nil {
		return nil, err
	}
	return []*Tensor{ScalarInt64(int64(numel(x.Shape)))}, nil
}

func kConstantOfShape(c *OpContext, n *pb.NodeProto, in []*Tensor) ([]*Tensor, error) {
	s, err := need(in, 0)
	if err != nil {
		return nil, err
	}
	spec, err := intsOf(s)
	if err != nil {
		return nil, err
	}
	shape := toInts(spec)
	val := ScalarFloat32(0)
	if v := attrTensor(n, "value"); v != nil {
		if val, err = FromProto(v, nil); err != nil {
			return nil, err
		}
		if val.Len() != 1 {
			return nil, errf("value must hold one element")
		}
	}
	out, err := c.alloc(val.DType, shape)
	if err != nil {
		return nil, err
	}
	for i := 0; i < out.Len(); i++ {
		setElem(out, i, val, 0)
	}
	return []*Tensor{out}, nil
}

func kRange(c *OpContext, n *pb.NodeProto, in []*Tensor) ([]*Tensor, error) {
	var v [3]*Tensor
	for i := range v {
		t, err := need(in, i)
		if err != nil {
			return nil, err
		}
		if t.Len() != 1 {
			return nil, errf("Range inputs must be scalars")
		}
		v[i] = t
	}
	dt := v[0].DType
	switch v[0].kind() {
	case kI64:
		start, limit, delta := v[0].I64[0], v[1].I64[0], v[2].I64[0]
		if delta == 0 {
			return nil, errf("Range delta is 0")
		}
		cnt := int64(math.Ceil(float64(limit-start) / float64(delta)))
		cnt = max(cnt, 0)
		out, err := c.alloc(dt, []int{int(cnt)})
		if err != nil {
			return nil, err
		}
		for i := range out.I64 {
			out.I64[i] = start + int64(i)*delta
		}
		return []*Tensor{out}, nil
	case kF32, kF64:
		start, limit, delta := v[0].Float64At(0), v[1].Float64At(0), v[2].Float64At(0)
		if delta == 0 {
			return nil, errf("Range delta is 0")
		}
		cnt := int(max(math.Ceil((limit-start)/delta), 0))
		out, err := c.alloc(dt, []int{cnt})
		if err != nil {
			return nil, err
		}
		if out.kind() == kF32 {
			s, d := float32(start), float32(delta)
			for i := range out.F32 {
				out.F32[i] = s + float32(i)*d
			}
		} else {
			for i := range out.F64 {
				out.F64[i] = start + float64(i)*delta
			}
		}
		return []*Tensor{out}, nil
	}
	return nil, errf("Range is not defined for %s", dt)
}

func kTrilu(c *OpContext, n *pb.NodeProto, in []*Tensor) ([]*Tensor, error) {
	x, err := need(in, 0)
	if err != nil {
		return nil, err
	}
	if x.Rank() < 2 {
		return nil, errf("Trilu needs rank >= 2")
	}
	k := int64(0)
	if t := opt(in, 1); t != nil {
		if k, err = scalarInt(t); err != nil {
			return nil, err
		}
	}
	upper := attrInt(n, "upper", 1) == 1
	out := x.Clone()
	rows, cols := x.Shape[x.Rank()-2], x.Shape[x.Rank()-1]
	zero := New(x.DType, []int{1})
	for i := 0; i < out.Len(); i++ {
		j := int64(i % cols)
		r := int64((i / cols) % rows)
		keep := j-r >= k
		if !upper {
			keep = j-r <= k
		}
		if !keep {
			setElem(out, i, zero, 0)
		}
	}
	return []*Tensor{out}, nil
}

func kEyeLike(c *OpContext, n *pb.NodeProto, in []*Tensor) ([]*Tensor, error) {
	x, err := need(in, 0)
	if err != nil {
		return nil, err
	}
	if x.Rank() != 2 {
		return nil, errf("EyeLike needs rank 2")
	}
	dt := x.DType
	if hasAttr(n, "dtype") {
		dt = pb.TensorProto_DataType(attrInt(n, "dtype", 0))
	}
	if kindOf(dt) == kNone {
		return nil, errf("dtype %s is not supported", dt)
	}
	k := int(attrInt(n, "k", 0))
	out := New(dt, x.Shape)
	oneT, _ := castTensor(ScalarInt64(1), dt)
	for r := 0; r < x.Shape[0]; r++ {
		if col := r + k; col >= 0 && col < x.Shape[1] {
			setElem(out, r*x.Shape[1]+col, oneT, 0)
		}
	}
	return []*Tensor{out}, nil
}

func kPad(c *OpContext, n *pb.NodeProto, in []*Tensor) ([]*Tensor, error) {
	x, err := need(in, 0)
	if err != nil {
		return nil, err
	}
	mode := attrString(n, "mode", "constant")
	var pads []int64
	val := New(x.DType, []int{1})
	if c.Opset("") < 11 {
		pads = attrInts(n, "pads")
		if v := attrFloat(n, "value", 0); v != 0 {
			val, _ = castTensor(ScalarFloat32(v), x.DType)
		}
	} else {
		p, err := need(in, 1)
		if err != nil {
			return nil, err
		}
		if pads, err = intsOf(p); err != nil {
			return nil, err
		}
		if v := opt(in, 2); v != nil && v.Len() == 1 {
			val = v
		}
	}
	r := x.Rank()
	axes := make([]int, r)
	for i := range axes {
		axes[i] = i
	}
	if a := opt(in, 3); a != nil {
		av, err := intsOf(a)
		if err != nil {
			return nil, err
		}
		if axes, err = normAxes(av, r); err != nil {
			return nil, err
		}
	}
	if len(pads) != 2*len(axes) {
		return nil, errf("pads %v do not match %d axes", pads, len(axes))
	}
	before := make([]int, r)
	after := make([]int, r)
	for i, a := range axes {
		before[a], after[a] = int(pads[i]), int(pads[i+len(axes)])
	}
	shape := make([]int, r)
	for i := range shape {
		shape[i] = x.Shape[i] + before[i] + after[i]
		if shape[i] < 0 {
			return nil, errf("pads %v shrink shape %v below zero", pads, x.Shape)
		}
	}
	out, err := c.alloc(x.DType, shape)
	if err != nil {
		return nil, err
	}
	xs := Strides(x.Shape)
	for i := 0; i < out.Len(); i++ {
		mi := Unravel(i, shape)
		f := 0
		inside := true
		for d, v := range mi {
			s := v - before[d]
			dim := x.Shape[d]
			if s < 0 || s >= dim {
				switch mode {
				case "constant":
					inside = false
				case "edge":
					s = max(0, min(s, dim-1))
				case "reflect":
					if dim == 1 {
						s = 0
						break
					}
					p := 2 * (dim - 1)
					s = ((s % p) + p) % p
					if s >= dim {
						s = p - s
					}
				case "wrap":
					s = ((s % dim) + dim) % dim
				default:
					return nil, errf("Pad mode %q is not supported", mode)
				}
			}
			f += s * xs[d]
		}
		if inside {
			setElem(out, i, x, f)
		} else {
			setElem(out, i, val, 0)
		}
	}
	return []*Tensor{out}, nil
}

func kDepthToSpace(c *OpContext, n *pb.NodeProto, in []*Tensor) ([]*Tensor, error) {
	x, err := need(in, 0)
	if err != nil {
		return nil, err
	}
	if x.Rank() != 4 {
		return nil, errf("DepthToSpace needs rank 4")
	}
	b := int(attrInt(n, "blocksize", 0))
	if b <= 0 || x.Shape[1]%(b*b) != 0 {
		return nil, errf("bad blocksize %d for shape %v", b, x.Shape)
	}
	N, C, H, W := x.Shape[0], x.Shape[1], x.Shape[2], x.Shape[3]
	var t *Tensor
	if attrString(n, "mode", "DCR") == "DCR" {
		t = x.view([]int{N, b, b, C / (b * b), H, W})
		t = transpose(t, []int{0, 3, 4, 1, 5, 2})
	} else {
		t = x.view([]int{N, C / (b * b), b, b, H, W})
		t = transpose(t, []int{0, 1, 4, 2, 5, 3})
	}
	return []*Tensor{t.view([]int{N, C / (b * b), H * b, W * b})}, nil
}

func kSpaceToDepth(c *OpContext, n *pb.NodeProto, in []*Tensor) ([]*Tensor, error) {
	x, err := need(in, 0)
	if err != nil {
		return nil, err
	}
	if x.Rank() != 4 {
		return nil, errf("SpaceToDepth needs rank 4")
	}
	b := int(attrInt(n, "blocksize", 0))
	N, C, H, W := x.Shape[0], x.Shape[1], x.Shape[2], x.Shape[3]
	if b <= 0 || H%b != 0 || W%b != 0 {
		return nil, errf("bad blocksize %d for shape %v", b, x.Shape)
	}
	t := x.view([]int{N, C, H / b, b, W / b, b})
	t = transpose(t, []int{0, 3, 5, 1, 2, 4})
	return []*Tensor{t.view([]int{N, C * b * b, H / b, W / b})}, nil
}

func kCompress(c *OpContext, n *pb.NodeProto, in []*Tensor) ([]*Tensor, error) {
	x, cond, err := need2(in)
	if err != nil {
		return nil, err
	}
	if cond.kind() != kBool {
		return nil, errf("condition must be bool")
	}
	src := x
	axis := 0
	if hasAttr(n, "axis") {
		if axis, err = normAxis(attrInt(n, "axis", 0), x.Rank()); err != nil {
			return nil, err
		}
	} else {
		src = x.view([]int{x.Len()})
	}
	var keep []int
	for i, b := range cond.Bool {
		if b && i < src.Shape[axis] {
			keep = append(keep, i)
		}
	}
	return []*Tensor{gatherAxis(src, axis, keep, []int{len(keep)})}, nil
}

func kReverseSequence(c *OpContext, n *pb.NodeProto, in []*Tensor) ([]*Tensor, error) {
	x, l, err := need2(in)
	if err != nil {
		return nil, err
	}
	lens, err := intsOf(l)
	if err != nil {
		return nil, err
	}
	ba, ta := int(attrInt(n, "batch_axis", 1)), int(attrInt(n, "time_axis", 0))
	if x.Rank() < 2 || ba == ta || ba < 0 || ta < 0 || ba >= x.Rank() || ta >= x.Rank() || len(lens) != x.Shape[ba] {
		return nil, errf("bad ReverseSequence axes or lengths")
	}
	st := Strides(x.Shape)
	idx := make([]int, x.Len())
	for i := range idx {
		mi := Unravel(i, x.Shape)
		if L := int(lens[mi[ba]]); mi[ta] < L {
			mi[ta] = L - 1 - mi[ta]
		}
		f := 0
		for d, v := range mi {
			f += v * st[d]
		}
		idx[i] = f
	}
	return []*Tensor{take(x, idx, x.Shape)}, nil
}

func init() {
	builtin("", kIdentity, "Identity")
	builtin("", kDropout, "Dropout")
	builtin("", kConstant, "Constant")
	builtin("", kReshape, "Reshape")
	builtin("", kExpand, "Expand")
	builtin("", kTile, "Tile")
	builtin("", kTranspose, "Transpose")
	builtin("", kSplit, "Split")
	builtin("", kSlice, "Slice")
	builtin("", kConcat, "Concat")
	builtin("", kSqueeze, "Squeeze")
	builtin("", kUnsqueeze, "Unsqueeze")
	builtin("", kFlatten, "Flatten")
	builtin("", kShape, "Shape")
	builtin("", kSize, "Size")
	builtin("", kConstantOfShape, "ConstantOfShape")
	builtin("", kRange, "Range")
	builtin("", kTrilu, "Trilu")
	builtin("", kEyeLike, "EyeLike")
	builtin("", kPad, "Pad")
	builtin("", kDepthToSpace, "DepthToSpace")
	builtin("", kSpaceToDepth, "SpaceToDepth")
	builtin("", kCompress, "Compress")
	builtin("", kReverseSequence, "ReverseSequence")
}

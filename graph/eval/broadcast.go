package eval

import (
	"fmt"
	"slices"
)

// BroadcastShapes returns the shape that numpy-style multidirectional
// broadcasting of the given shapes yields, or an error if two dims differ
// and neither is 1.
func BroadcastShapes(shapes ...[]int) ([]int, error) {
	r := 0
	for _, s := range shapes {
		r = max(r, len(s))
	}
	out := make([]int, r)
	for i := range out {
		out[i] = 1
	}
	for _, s := range shapes {
		off := r - len(s)
		for i, d := range s {
			o := out[off+i]
			switch {
			case d == o || d == 1:
			case o == 1:
				out[off+i] = d
			default:
				return nil, fmt.Errorf("shapes %v cannot be broadcast together", shapes)
			}
		}
	}
	return out, nil
}

// bcastIndex returns, for every element of out (row-major), the flat index of
// the element of a tensor with shape in that broadcasting maps to it. It
// returns nil when in equals out (the identity map). in must broadcast to out.
func bcastIndex(in, out []int) []int {
	if slices.Equal(in, out) {
		return nil
	}
	n := numel(out)
	idx := make([]int, n)
	if numel(in) == 1 {
		return idx // all zero
	}
	r := len(out)
	// strides of in aligned to out, 0 where broadcast.
	st := make([]int, r)
	ist := Strides(in)
	off := r - len(in)
	for i := range in {
		if in[i] != 1 {
			st[off+i] = ist[i]
		}
	}
	if n == 0 {
		return idx
	}
	ctr := make([]int, r)
	cur := 0
	last := r - 1
	inner := out[last]
	ist0 := st[last]
	for i := 0; i < n; {
		for j := 0; j < inner; j++ {
			idx[i] = cur + j*ist0
			i++
		}
		// advance counters above the innermost dim
		k := last - 1
		for ; k >= 0; k-- {
			ctr[k]++
			cur += st[k]
			if ctr[k] < out[k] {
				break
			}
			cur -= st[k] * ctr[k]
			ctr[k] = 0
		}
		if k < 0 {
			break
		}
	}
	return idx
}

// take builds a tensor of the given shape whose element i is src's element
// idx[i] (idx nil: a copy of src).
func take(src *Tensor, idx []int, shape []int) *Tensor {
	out := &Tensor{DType: src.DType, Shape: append([]int{}, shape...)}
	if idx == nil {
		c := src.Clone()
		c.Shape = out.Shape
		return c
	}
	switch src.kind() {
	case kF32:
		out.F32 = takeSlice(src.F32, idx)
	case kF64:
		out.F64 = takeSlice(src.F64, idx)
	case kI64:
		out.I64 = takeSlice(src.I64, idx)
	case kBool:
		out.Bool = takeSlice(src.Bool, idx)
	case kStr:
		out.Str = takeSlice(src.Str, idx)
	}
	return out
}

func takeSlice[T any](src []T, idx []int) []T {
	out := make([]T, len(idx))
	for i, j := range idx {
		out[i] = src[j]
	}
	return out
}

// copyRange copies n elements from src[so:] to dst[do:]; both tensors share a
// storage class.
func copyRange(dst *Tensor, do int, src *Tensor, so, n int) {
	switch dst.kind() {
	case kF32:
		copy(dst.F32[do:do+n], src.F32[so:so+n])
	case kF64:
		copy(dst.F64[do:do+n], src.F64[so:so+n])
	case kI64:
		copy(dst.I64[do:do+n], src.I64[so:so+n])
	case kBool:
		copy(dst.Bool[do:do+n], src.Bool[so:so+n])
	case kStr:
		copy(dst.Str[do:do+n], src.Str[so:so+n])
	}
}

// setElem sets dst[di] = src[si].
func setElem(dst *Tensor, di int, src *Tensor, si int) {
	switch dst.kind() {
	case kF32:
		dst.F32[di] = src.F32[si]
	case kF64:
		dst.F64[di] = src.F64[si]
	case kI64:
		dst.I64[di] = src.I64[si]
	case kBool:
		dst.Bool[di] = src.Bool[si]
	case kStr:
		dst.Str[di] = src.Str[si]
	}
}

// expandTo broadcasts t to shape (which BroadcastShapes accepts for t)
// by block copies: dims t holds are walked, a broadcast dim computes its
// block once and copies it, and trailing dims equal to t's are one copy.
// No index array is built.
func expandTo(t *Tensor, shape []int) *Tensor {
	if len(shape) < len(t.Shape) || numel(shape) == 0 {
		return take(t, bcastIndex(t.Shape, shape), shape)
	}
	in := make([]int, len(shape)) // t's shape aligned to shape's rank
	for i := range in {
		in[i] = 1
	}
	copy(in[len(shape)-len(t.Shape):], t.Shape)
	for i, d := range in {
		if d != shape[i] && d != 1 {
			return take(t, bcastIndex(t.Shape, shape), shape)
		}
	}
	out := &Tensor{DType: t.DType, Shape: append([]int{}, shape...)}
	n := numel(shape)
	switch t.kind() {
	case kF32:
		out.F32 = make([]float32, n)
		expandSlice(out.F32, t.F32, in, shape)
	case kF64:
		out.F64 = make([]float64, n)
		expandSlice(out.F64, t.F64, in, shape)
	case kI64:
		out.I64 = make([]int64, n)
		expandSlice(out.I64, t.I64, in, shape)
	case kBool:
		out.Bool = make([]bool, n)
		expandSlice(out.Bool, t.Bool, in, shape)
	case kStr:
		out.Str = make([]string, n)
		expandSlice(out.Str, t.Str, in, shape)
	default:
		return take(t, bcastIndex(t.Shape, shape), shape)
	}
	return out
}

// expandSlice writes src (shape in, same rank as out, each dim equal to
// out's or 1) broadcast to out into dst.
func expandSlice[T any](dst, src []T, in, out []int) {
	if slices.Equal(in, out) {
		copy(dst, src[:len(dst)])
		return
	}
	if len(out) == 0 {
		dst[0] = src[0]
		return
	}
	innerOut, innerIn := numel(out[1:]), numel(in[1:])
	if in[0] == 1 {
		expandSlice(dst[:innerOut], src[:innerIn], in[1:], out[1:])
		for i := 1; i < out[0]; i++ {
			copy(dst[i*innerOut:(i+1)*innerOut], dst[:innerOut])
		}
		return
	}
	for i := 0; i < out[0]; i++ {
		expandSlice(dst[i*innerOut:(i+1)*innerOut], src[i*innerIn:(i+1)*innerIn], in[1:], out[1:])
	}
}

package eval

import (
	"fmt"
	"runtime"

	"github.com/mokopt/mokopt/graph"
	pb "github.com/mokopt/mokopt/graph/onnxpb"
)

func defaultThreads() int { return runtime.GOMAXPROCS(0) }

// errf builds a kernel error.
func errf(format string, args ...any) error { return fmt.Errorf(format, args...) }

// normAxis maps a possibly negative axis into [0, rank).
func normAxis(axis int64, rank int) (int, error) {
	a := int(axis)
	if a < 0 {
		a += rank
	}
	if a < 0 || a >= rank {
		return 0, errf("axis %d out of range for rank %d", axis, rank)
	}
	return a, nil
}

// normAxes maps axes into [0, rank), rejecting duplicates.
func normAxes(axes []int64, rank int) ([]int, error) {
	out := make([]int, len(axes))
	seen := map[int]bool{}
	for i, a := range axes {
		x, err := normAxis(a, rank)
		if err != nil {
			return nil, err
		}
		if seen[x] {
			return nil, errf("axis %d repeated in %v", a, axes)
		}
		seen[x] = true
		out[i] = x
	}
	return out, nil
}

// need checks that input i is present.
func need(inputs []*Tensor, i int) (*Tensor, error) {
	if i >= len(inputs) || inputs[i] == nil {
		return nil, errf("input %d is required", i)
	}
	return inputs[i], nil
}

// need2 checks that inputs 0 and 1 are present and returns them.
func need2(inputs []*Tensor) (*Tensor, *Tensor, error) {
	a, err := need(inputs, 0)
	if err != nil {
		return nil, nil, err
	}
	b, err := need(inputs, 1)
	return a, b, err
}

// opt returns input i or nil.
func opt(inputs []*Tensor, i int) *Tensor {
	if i >= len(inputs) {
		return nil
	}
	return inputs[i]
}

// intsOf reads an integer tensor's values (int64 copies).
func intsOf(t *Tensor) ([]int64, error) {
	if t.kind() != kI64 {
		return nil, errf("expected an integer tensor, got %s", t.DType)
	}
	return append([]int64{}, t.I64...), nil
}

// scalarInt reads a one-element integer tensor.
func scalarInt(t *Tensor) (int64, error) {
	if t.Len() != 1 {
		return 0, errf("expected a single value, got shape %v", t.Shape)
	}
	if t.kind() == kI64 {
		return t.I64[0], nil
	}
	return int64(t.Float64At(0)), nil
}

// toInts converts int64s to ints.
func toInts(v []int64) []int {
	out := make([]int, len(v))
	for i, x := range v {
		out[i] = int(x)
	}
	return out
}

func attrInt(n *pb.NodeProto, name string, def int64) int64 { return graph.AttrInt(n, name, def) }
func attrFloat(n *pb.NodeProto, name string, def float32) float32 {
	return graph.AttrFloat(n, name, def)
}
func attrString(n *pb.NodeProto, name, def string) string { return graph.AttrString(n, name, def) }
func attrInts(n *pb.NodeProto, name string) []int64       { return graph.AttrInts(n, name) }
func hasAttr(n *pb.NodeProto, name string) bool           { return graph.Attr(n, name) != nil }
func attrTensor(n *pb.NodeProto, name string) *pb.TensorProto {
	return graph.AttrTensor(n, name)
}

// one wraps a single output.
func one(t *Tensor, err error) ([]*Tensor, error) {
	if err != nil {
		return nil, err
	}
	return []*Tensor{t}, nil
}

// permute returns shape permuted by perm.
func permute(shape []int, perm []int) []int {
	out := make([]int, len(perm))
	for i, p := range perm {
		out[i] = shape[p]
	}
	return out
}

// transposeIndex returns the source flat index of every element of
// t transposed by perm.
func transposeIndex(shape []int, perm []int) ([]int, []int) {
	outShape := permute(shape, perm)
	st := Strides(shape)
	pst := make([]int, len(perm))
	for i, p := range perm {
		pst[i] = st[p]
	}
	return stridedIndex(outShape, 0, pst), outShape
}

// stridedIndex returns base + sum(i_d * strides[d]) for every multi-index i
// of outShape, in row-major order.
func stridedIndex(outShape []int, base int, pst []int) []int {
	n := numel(outShape)
	idx := make([]int, n)
	if n == 0 {
		return idx
	}
	r := len(outShape)
	if r == 0 {
		idx[0] = base
		return idx
	}
	ctr := make([]int, r)
	cur := base
	inner := outShape[r-1]
	is := pst[r-1]
	for i := 0; i < n; {
		for j := 0; j < inner; j++ {
			idx[i] = cur + j*is
			i++
		}
		k := r - 2
		for ; k >= 0; k-- {
			ctr[k]++
			cur += pst[k]
			if ctr[k] < outShape[k] {
				break
			}
			cur -= pst[k] * ctr[k]
			ctr[k] = 0
		}
		if k < 0 {
			break
		}
	}
	return idx
}

// transpose permutes t's axes.
func transpose(t *Tensor, perm []int) *Tensor {
	idx, shape := transposeIndex(t.Shape, perm)
	return take(t, idx, shape)
}

package eval

import (
	"bytes"
	"fmt"
	"hash/maphash"
	"math"
	"sync/atomic"

	"github.com/mokopt/mokopt/graph"
	pb "github.com/mokopt/mokopt/graph/onnxpb"
)

// gathered is the lazy form of a Gather or GatherND output that picks whole
// slabs of a float tensor: element j of slab i is src.F32[offs[i]+j]. A
// batched-experts export gathers, per token and chosen expert, the whole
// expert weight ([T·k, 2I, H]: k copies of the weights per token); kept lazy,
// the gather costs one offset per slab and MatMul reads the slabs in place.
// Every other consumer sees the tensor materialized (counted against the
// memory limit).
type gathered struct {
	src  *Tensor
	offs []int
	slab int
}

// minLazySlab is the smallest slab (elements) a gather keeps lazy.
const minLazySlab = 16

// lazyGathers counts the gathers kept lazy (tests check the path is taken).
var lazyGathers atomic.Int64

// lazyGather returns the lazy output of a gather of whole slabs (slab
// elements each, at element offsets offs of x) with the given shape, or nil
// when the gather is better copied: x is not float, the slabs are small, or
// the output is no larger than x (and x is in memory: the slabs of a
// streamed weight are read as they are used, never the whole weight).
func lazyGather(x *Tensor, offs []int, slab int, shape []int) *Tensor {
	if x.kind() != kF32 || x.lazy != nil || slab < minLazySlab || (x.src == nil && len(offs)*slab <= numel(x.Shape)) {
		return nil
	}
	lazyGathers.Add(1)
	return &Tensor{DType: x.DType, Shape: append([]int{}, shape...), lazy: &gathered{src: x, offs: offs, slab: slab}}
}

// slabOf returns the data of slab i of a lazy tensor.
func (g *gathered) slabOf(i int) []float32 { return g.src.F32[g.offs[i] : g.offs[i]+g.slab] }

// materialize returns t with its data in place: t itself unless lazy, else
// a copy of the picked slabs, checked against the run's memory limit.
func (c *OpContext) materialize(t *Tensor) (*Tensor, error) {
	if t == nil || t.lazy == nil {
		return t, nil
	}
	if err := c.checkAlloc(t.DType, t.Shape); err != nil {
		return nil, err
	}
	g := t.lazy
	out := &Tensor{DType: t.DType, Shape: append([]int{}, t.Shape...), F32: make([]float32, len(g.offs)*g.slab)}
	for i := range g.offs {
		if g.src.src != nil {
			if err := g.src.ReadFloat32(out.F32[i*g.slab:(i+1)*g.slab], g.offs[i]); err != nil {
				return nil, err
			}
			continue
		}
		copy(out.F32[i*g.slab:], g.slabOf(i))
	}
	return out, nil
}

// slabClasses numbers the n slabs of size elements of buf by content (bit
// for bit): equal slabs get the same class, classes count from 0 in order of
// first appearance. It returns the classes and how many there are.
func slabClasses(n, size int, slab func(i int) []float32) ([]int, int) {
	cls := make([]int, n)
	first := map[uint64][]int{} // hash -> slabs that opened a class
	seed := maphash.MakeSeed()
	next := 0
	for i := 0; i < n; i++ {
		s := f32Bytes(slab(i))
		h := maphash.Bytes(seed, s)
		found := -1
		for _, j := range first[h] {
			if bytes.Equal(f32Bytes(slab(j)), s) {
				found = cls[j]
				break
			}
		}
		if found < 0 {
			found = next
			next++
			first[h] = append(first[h], i)
		}
		cls[i] = found
	}
	return cls, next
}

// String is the summary of a lazy tensor.
func (g *gathered) String() string {
	return fmt.Sprintf("%d slabs of %d", len(g.offs), g.slab)
}

// checkLazy errors if the offsets of a lazy tensor exceed the memory limit.
func (c *OpContext) checkLazy(t *Tensor) error {
	if c == nil || c.r == nil || c.r.opt.MemLimit <= 0 {
		return nil
	}
	if sz := t.ByteSize(); c.r.live+sz > c.r.opt.MemLimit {
		return fmt.Errorf("%w: output %s%v (lazy, %d bytes of offsets) with %d live (limit %d)", ErrMemLimit, t.DType, t.Shape, sz, c.r.live, c.r.opt.MemLimit)
	}
	return nil
}

// lazyAware reports whether n's kernel reads lazy inputs itself: the
// built-in MatMul (not a custom kernel or a model-local function).
func (r *runner) lazyAware(n *pb.NodeProto) bool {
	if n.GetOpType() != "MatMul" || normDomain(n.GetDomain()) != "" {
		return false
	}
	if _, _, custom := lookupKernel("", "MatMul"); custom {
		return false
	}
	return r.funcs[funcKey{"", "MatMul", n.GetOverload()}] == nil
}

// materialize is OpContext.materialize for the runner; consumer, when
// set, is named in the error.
func (r *runner) materialize(t *Tensor, consumer *pb.NodeProto) (*Tensor, error) {
	if t != nil && t.src != nil {
		if err := r.checkInitializer(t.src.p); err != nil {
			return nil, err
		}
		return initializerTensor(t.src.p, r.m.TensorBytes)
	}
	if t == nil || t.lazy == nil {
		return t, nil
	}
	out, err := (&OpContext{r: r}).materialize(t)
	if err != nil && consumer != nil {
		return nil, fmt.Errorf("%w (a gathered input of node %s (%s) materialized)", err, graph.NodeLabel(consumer), consumer.GetOpType())
	}
	return out, err
}

// checkInitializer errors, before its bytes are read, if an initializer
// would push the run past its memory limit (its size from its dims, which
// a small model may declare over a huge side file).
func (r *runner) checkInitializer(p *pb.TensorProto) error {
	if r.opt.MemLimit <= 0 {
		return nil
	}
	shape := make([]int, len(p.GetDims()))
	for i, d := range p.GetDims() {
		if d < 0 || d > math.MaxInt32 {
			return nil // FromProto names the bad dim
		}
		shape[i] = int(d)
	}
	dt := graph.DataType(p)
	n, err := checkedNumel(shape)
	if err != nil || kindOf(dt) == kNone {
		return nil
	}
	sz := int64(n) * 8
	if kindOf(dt) == kF32 {
		sz = int64(n) * 4
	}
	if r.live+sz > r.opt.MemLimit {
		return fmt.Errorf("%w: initializer %q (%s%v) needs %d bytes with %d live (limit %d)", ErrMemLimit, p.GetName(), dt, shape, sz, r.live, r.opt.MemLimit)
	}
	return nil
}

// NewChecked is New for a shape read from a file: an element count that
// overflows or a negative dim is an error, and so is a tensor whose data
// would take more than memLimit bytes (an error wrapping ErrMemLimit; 0
// means no limit).
func NewChecked(dt pb.TensorProto_DataType, shape []int, memLimit int64) (*Tensor, error) {
	if err := CheckShape(dt, shape, memLimit); err != nil {
		return nil, err
	}
	return New(dt, shape), nil
}

// CheckShape is NewChecked's check, without allocating.
func CheckShape(dt pb.TensorProto_DataType, shape []int, memLimit int64) error {
	if kindOf(dt) == kNone {
		return fmt.Errorf("data type %s is not supported", dt)
	}
	n, err := checkedNumel(shape)
	if err != nil {
		return err
	}
	sz := int64(n) * 8
	if kindOf(dt) == kF32 {
		sz = int64(n) * 4
	}
	if memLimit > 0 && sz > memLimit {
		return fmt.Errorf("%w: a %s%v tensor needs %d bytes (limit %d)", ErrMemLimit, dt, shape, sz, memLimit)
	}
	return nil
}

// LazyGathers returns how many gathers this process has kept lazy (for
// tests that check a path is taken).
func LazyGathers() int64 { return lazyGathers.Load() }

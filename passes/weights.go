package passes

import (
	"fmt"
	"io"
	"slices"
	"unsafe"

	"github.com/mokopt/mokopt/graph"
	"github.com/mokopt/mokopt/graph/eval"
	pb "github.com/mokopt/mokopt/graph/onnxpb"
	"github.com/mokopt/mokopt/moe"
)

// Parts of a projection's output rows taken from a fused gate_up weight.
const (
	PartWhole = iota
	PartFirstHalf
	PartSecondHalf
	PartEven
	PartOdd
)

// Proj says where one expert's matrix (or bias vector) lives in the source
// model: an initializer, the expert's index along its first axis (-1 when
// the initializer holds one expert only), whether it is stored [in, out]
// rather than [out, in], and which rows of the output axis it covers.
type Proj struct {
	Init   *pb.TensorProto
	Expert int
	InOut  bool
	Part   int
}

// ExpertProj are the sources of one routed expert's weights.
type ExpertProj struct {
	Gate, Up, Down    *Proj
	GateB, UpB, DownB *Proj
}

// WeightPlan lists every weight source of a block.
type WeightPlan struct {
	Router        Proj
	RouterB, Corr *Proj
	Experts       []ExpertProj // indexed by expert id
	SharedGate    *Proj
	SharedUp      *Proj
	SharedDown    *Proj
	SharedGateW   *Proj
}

// Inits lists the source initializers the plan reads (for provenance).
func (p *WeightPlan) Inits() []*pb.TensorProto {
	seen := map[*pb.TensorProto]bool{}
	var out []*pb.TensorProto
	add := func(q *Proj) {
		if q != nil && q.Init != nil && !seen[q.Init] {
			seen[q.Init] = true
			out = append(out, q.Init)
		}
	}
	add(&p.Router)
	add(p.RouterB)
	add(p.Corr)
	for i := range p.Experts {
		e := &p.Experts[i]
		for _, q := range []*Proj{e.Gate, e.Up, e.Down, e.GateB, e.UpB, e.DownB} {
			add(q)
		}
	}
	for _, q := range []*Proj{p.SharedGate, p.SharedUp, p.SharedDown, p.SharedGateW} {
		add(q)
	}
	return out
}

// appendCanonical appends the projection's canonical rows (its [out, in]
// matrix with Part's rows, or its bias vector with Part applied) to dst,
// copying straight from the source's values: one copy, no intermediate.
func (q *Proj) appendCanonical(dst []float32, m *graph.Model, cache map[*pb.TensorProto][]float32, isVec bool) ([]float32, error) {
	rows, cols, err := q.shape(isVec)
	if err != nil {
		return nil, err
	}
	if out, ok, err := q.appendRanges(dst, m, cache, rows, cols, isVec); ok || err != nil {
		return out, err
	}
	all, err := floats(m, q.Init, cache)
	if err != nil {
		return nil, err
	}
	d := q.Init.GetDims()
	if isVec {
		n := int(d[len(d)-1])
		off := 0
		if q.Expert >= 0 {
			off = q.Expert * n
		}
		if off+n > len(all) {
			return nil, fmt.Errorf("bias %q has dims %v: no vector for expert %d", q.Init.GetName(), d, q.Expert)
		}
		src := all[off : off+n]
		start, step, k := partRange(q.Part, n)
		for i := 0; i < k; i++ {
			dst = append(dst, src[start+i*step])
		}
		return dst, nil
	}
	var r, cc int
	if q.Expert >= 0 {
		r, cc = int(d[1]), int(d[2])
	} else {
		r, cc = int(d[0]), int(d[1])
	}
	off := max(q.Expert, 0) * r * cc
	if off+r*cc > len(all) {
		return nil, fmt.Errorf("initializer %q has dims %v: no matrix for expert %d", q.Init.GetName(), d, q.Expert)
	}
	return appendRows(dst, all[off:off+r*cc], r, cc, q.InOut, q.Part), nil
}

// appendRanges is appendCanonical for a float32 source in a side file
// whose canonical rows are one byte range (a whole matrix or vector, or a
// half of a fused gate_up, stored [out, in]) on a little-endian host: the
// range is read from the file straight into dst, with no buffer of the
// whole initializer. ok is false (nothing read) for other sources, and for
// one whose initializer an earlier projection already read whole (cache).
func (q *Proj) appendRanges(dst []float32, m *graph.Model, cache map[*pb.TensorProto][]float32, rows, cols int, isVec bool) (out []float32, ok bool, err error) {
	if _, read := cache[q.Init]; read || !graph.IsExternal(q.Init) || graph.DataType(q.Init) != pb.TensorProto_FLOAT || q.InOut || !eval.LittleEndian() {
		return nil, false, nil
	}
	d := q.Init.GetDims()
	r, cc := int64(d[len(d)-1]), int64(1) // a vector: r values
	if !isVec {
		r, cc = d[len(d)-2], d[len(d)-1]
	}
	start, step, k := partRange(q.Part, int(r))
	if step != 1 || k != rows {
		return nil, false, nil
	}
	off := int64(max(q.Expert, 0)) * r * cc
	n := len(dst)
	want := k * max(cols, 1)
	dst = slices.Grow(dst, want)[:n+want]
	w := &sliceWriter{b: f32Bytes(dst[n:])}
	if err := m.CopyTensorRange(w, q.Init, 4*(off+int64(start)*cc), 4*int64(want)); err != nil {
		return nil, true, err
	}
	if len(w.b) != 0 {
		return nil, true, fmt.Errorf("initializer %q: short read of its external data", q.Init.GetName())
	}
	return dst, true, nil
}

// sliceWriter fills b with what is written to it (an io.Writer, and an
// io.ReaderFrom so that a copy from a file reads straight into b).
type sliceWriter struct{ b []byte }

func (w *sliceWriter) Write(p []byte) (int, error) {
	if len(p) > len(w.b) {
		return 0, io.ErrShortWrite
	}
	w.b = w.b[copy(w.b, p):]
	return len(p), nil
}

func (w *sliceWriter) ReadFrom(r io.Reader) (int64, error) {
	k, err := io.ReadFull(r, w.b)
	w.b = w.b[k:]
	if err == io.ErrUnexpectedEOF || err == io.EOF {
		err = nil // the caller checks the count
	}
	return int64(k), err
}

// f32Bytes views a float32 slice's memory as bytes.
func f32Bytes(v []float32) []byte {
	if len(v) == 0 {
		return nil
	}
	return unsafe.Slice((*byte)(unsafe.Pointer(&v[0])), 4*len(v))
}

// appendRows appends to dst the canonical [out, in] rows of the stored
// [r, cc] matrix src (an [in, out] one, inOut, is transposed) that part
// keeps.
func appendRows(dst, src []float32, r, cc int, inOut bool, part int) []float32 {
	if !inOut {
		start, step, k := partRange(part, r)
		if step == 1 {
			return append(dst, src[start*cc:(start+k)*cc]...)
		}
		for i := 0; i < k; i++ {
			row := start + i*step
			dst = append(dst, src[row*cc:(row+1)*cc]...)
		}
		return dst
	}
	// Stored [in, out] = [r, cc]: canonical row j is column j, r values.
	start, step, k := partRange(part, cc)
	n := len(dst)
	dst = slices.Grow(dst, k*r)[:n+k*r]
	out := dst[n:]
	const tile = 32 // transpose in tiles: both sides stay in cache
	for i0 := 0; i0 < r; i0 += tile {
		i1 := min(i0+tile, r)
		for j := 0; j < k; j++ {
			col := start + j*step
			o := out[j*r : (j+1)*r]
			for i := i0; i < i1; i++ {
				o[i] = src[i*cc+col]
			}
		}
	}
	return dst
}

// partRange says which of r rows part keeps: k rows from start, step
// apart.
func partRange(part, r int) (start, step, k int) {
	switch part {
	case PartFirstHalf:
		return 0, 1, r / 2
	case PartSecondHalf:
		return r / 2, 1, r - r/2
	case PartEven:
		return 0, 2, (r + 1) / 2
	case PartOdd:
		return 1, 2, r / 2
	}
	return 0, 1, r
}

// partLen is the number of rows part keeps of r.
func partLen(part, r int) int {
	_, _, k := partRange(part, r)
	return k
}

// floats returns t's values as float32, read-only: a view of its bytes
// where they already are float32 in host order and aligned (raw data
// inside the model, or external data just read into a fresh buffer),
// else a decoded copy. Callers copy what they keep.
func floats(m *graph.Model, t *pb.TensorProto, cache map[*pb.TensorProto][]float32) ([]float32, error) {
	if f, ok := cache[t]; ok {
		return f, nil
	}
	b, err := m.TensorBytes(t)
	if err != nil {
		return nil, err
	}
	if graph.DataType(t) == pb.TensorProto_FLOAT {
		if f, ok := eval.Float32View(b); ok { // only read, never written
			cache[t] = f
			return f, nil
		}
	}
	f, err := graph.DecodeFloat32(graph.DataType(t), b)
	if err != nil {
		return nil, fmt.Errorf("initializer %q: %w", t.GetName(), err)
	}
	cache[t] = f
	return f, nil
}

// values reads a fused tensor's float32 contents into a new slice.
func (ft *fusedTensor) values(m *graph.Model, cache map[*pb.TensorProto][]float32) ([]float32, error) {
	out := make([]float32, 0, ft.size()/4)
	for _, q := range ft.projs {
		var err error
		if out, err = q.appendCanonical(out, m, cache, ft.isVec); err != nil {
			return nil, err
		}
	}
	return out, nil
}

// Materialize reads the plan's sources and returns the block's weights in
// canonical layout.
func (p *WeightPlan) Materialize(m *graph.Model, s *moe.Spec) (*moe.Weights, error) {
	return p.materializeInto(m, s, nil)
}

// materializeInto is Materialize writing into reuse's slices where they
// are large enough (reuse may be nil): a check that reads one block after
// another then allocates the weights once rather than once per block. The
// result shares reuse's memory.
func (p *WeightPlan) materializeInto(m *graph.Model, s *moe.Spec, reuse *moe.Weights) (*moe.Weights, error) {
	return p.materializeParts(m, s, reuse, true)
}

// materializeParts is materializeInto, reading the routed experts' gate, up
// and down matrices only with routed (the numerical check reads those one
// expert at a time instead: planReader).
func (p *WeightPlan) materializeParts(m *graph.Model, s *moe.Spec, reuse *moe.Weights, routed bool) (*moe.Weights, error) {
	if reuse == nil {
		reuse = &moe.Weights{}
	}
	cache := map[*pb.TensorProto][]float32{}
	w := &moe.Weights{}
	// one reads a whole matrix or vector of q into dst's memory.
	one := func(q *Proj, dst []float32, isVec bool) ([]float32, error) {
		if q == nil {
			return nil, nil
		}
		rows, cols, err := q.shape(isVec)
		if err != nil {
			return nil, err
		}
		return q.appendCanonical(scratch(dst, rows*max(cols, 1)), m, cache, isVec)
	}
	var err error
	if w.RouterW, err = one(&p.Router, reuse.RouterW, false); err != nil {
		return nil, err
	}
	if w.RouterB, err = one(p.RouterB, reuse.RouterB, true); err != nil {
		return nil, err
	}
	if w.CorrectionBias, err = one(p.Corr, reuse.CorrectionBias, true); err != nil {
		return nil, err
	}
	if len(p.Experts) != s.StoredExperts() {
		return nil, fmt.Errorf("weight plan has %d experts, spec %d", len(p.Experts), s.StoredExperts())
	}
	if err := p.materializeRouted(m, s, reuse, w, cache, routed); err != nil {
		return nil, err
	}
	if s.SharedInter > 0 {
		if w.SharedGate, err = one(p.SharedGate, reuse.SharedGate, false); err != nil {
			return nil, err
		}
		if w.SharedUp, err = one(p.SharedUp, reuse.SharedUp, false); err != nil {
			return nil, err
		}
		if w.SharedDown, err = one(p.SharedDown, reuse.SharedDown, false); err != nil {
			return nil, err
		}
		if w.SharedGateW, err = one(p.SharedGateW, reuse.SharedGateW, false); err != nil {
			return nil, err
		}
	}
	return w, nil
}

// materializeRouted reads the routed experts' stacked weights of the plan
// into w (reuse's memory where large enough): the biases, and with
// matrices the gate, up and down matrices.
func (p *WeightPlan) materializeRouted(m *graph.Model, s *moe.Spec, reuse, w *moe.Weights, cache map[*pb.TensorProto][]float32, matrices bool) error {
	E, H, I := s.StoredExperts(), s.Hidden, s.Inter
	stack := func(get func(e *ExpertProj) *Proj, dst []float32, rows, cols int, isVec bool) ([]float32, error) {
		if get(&p.Experts[0]) == nil {
			return nil, nil
		}
		out := scratch(dst, E*rows*max(cols, 1))
		for e := range p.Experts {
			q := get(&p.Experts[e])
			if q == nil {
				return nil, fmt.Errorf("expert %d lacks a weight the others have", e)
			}
			r, cc, err := q.shape(isVec)
			if err != nil {
				return nil, err
			}
			switch {
			case isVec && r != rows:
				return nil, fmt.Errorf("expert %d bias %q has %d values, want %d", e, q.Init.GetName(), r, rows)
			case !isVec && (r != rows || cc != cols):
				return nil, fmt.Errorf("expert %d weight %q is [%d, %d] (out, in), want [%d, %d]", e, q.Init.GetName(), r, cc, rows, cols)
			}
			if out, err = q.appendCanonical(out, m, cache, isVec); err != nil {
				return nil, err
			}
		}
		return out, nil
	}
	var err error
	if matrices {
		if w.Gate, err = stack(func(e *ExpertProj) *Proj { return e.Gate }, reuse.Gate, I, H, false); err != nil {
			return err
		}
		if w.Up, err = stack(func(e *ExpertProj) *Proj { return e.Up }, reuse.Up, I, H, false); err != nil {
			return err
		}
		if w.Down, err = stack(func(e *ExpertProj) *Proj { return e.Down }, reuse.Down, H, I, false); err != nil {
			return err
		}
	}
	if w.GateB, err = stack(func(e *ExpertProj) *Proj { return e.GateB }, reuse.GateB, I, 0, true); err != nil {
		return err
	}
	if w.UpB, err = stack(func(e *ExpertProj) *Proj { return e.UpB }, reuse.UpB, I, 0, true); err != nil {
		return err
	}
	w.DownB, err = stack(func(e *ExpertProj) *Proj { return e.DownB }, reuse.DownB, H, 0, true)
	return err
}

// scratch returns buf emptied when it can hold n values, else a new slice
// that can.
func scratch(buf []float32, n int) []float32 {
	if cap(buf) >= n {
		return buf[:0]
	}
	return make([]float32, 0, n)
}

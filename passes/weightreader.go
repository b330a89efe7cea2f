package passes

import (
	"fmt"

	"github.com/mokopt/mokopt/graph"
	"github.com/mokopt/mokopt/graph/eval"
	pb "github.com/mokopt/mokopt/graph/onnxpb"
	"github.com/mokopt/mokopt/moe"
)

// planReader reads a block's routed experts from its weight plan one expert
// at a time (a moe.ExpertSet): each call of Expert reads that expert's
// gate, up and down matrices from their sources, every layout and part the
// plan describes (stacked [E, ...] initializers or one per expert, whole
// matrices, halves or interleaved rows of a fused gate_up, [out, in] or
// [in, out] storage; float32, float16 or bfloat16; inside the model or in
// a side file), decoded to float32 in canonical layout into buffers that
// the next expert, and the next block read through the same reader, reuse.
// A side file is read by range, only the bytes of the expert's rows (or,
// for interleaved rows and [in, out] storage, of its stored matrix);
// inline data is read where it lies. What Expert returns is valid until
// its next call.
type planReader struct {
	m *graph.Model
	b *Block
	// the expert last read, canonical
	gate, up, down []float32
	// raw holds stored bytes read from a side file for decoding.
	raw []byte
	// slab is one stored expert matrix decoded whole (of slabInit, expert
	// slabExpert), for parts that are not one range of canonical rows: the
	// gate and up halves of an interleaved gate_up come from one read.
	slab       []float32
	slabInit   *pb.TensorProto
	slabExpert int
	// inline caches the bytes of sources not in a side file
	// (graph.Model.TensorBytes: raw_data as it is, typed fields converted
	// and deferred producers run once).
	inline map[*pb.TensorProto][]byte
}

// expertRead, set by tests only, is called each time a planReader reads a
// routed expert of b.
var expertRead func(b *Block, e int)

// corruptExpert, set by tests only, edits each routed expert's matrices
// (gate nil where ungated) as a planReader reads them, for a check that
// must fail.
var corruptExpert func(b *Block, e int, gate, up, down []float32)

// reset points r at block b of m, keeping its buffers.
func (r *planReader) reset(m *graph.Model, b *Block) {
	r.m, r.b = m, b
	r.slabInit, r.slabExpert = nil, 0
	clear(r.inline)
}

// Expert reads routed expert e's gate (nil where the plan has none), up and
// down matrices.
func (r *planReader) Expert(e int) (gate, up, down []float32, err error) {
	p, s := r.b.W, &r.b.Spec
	if e < 0 || e >= len(p.Experts) {
		return nil, nil, nil, fmt.Errorf("weight plan has no expert %d (%d experts)", e, len(p.Experts))
	}
	x := &p.Experts[e]
	if x.Up == nil || x.Down == nil || (x.Gate == nil) != (p.Experts[0].Gate == nil) {
		return nil, nil, nil, fmt.Errorf("expert %d lacks a weight the others have", e)
	}
	I, H := s.Inter, s.Hidden
	if x.Gate != nil {
		if r.gate, err = r.matrix(e, x.Gate, r.gate, I, H); err != nil {
			return nil, nil, nil, err
		}
		gate = r.gate
	}
	if r.up, err = r.matrix(e, x.Up, r.up, I, H); err != nil {
		return nil, nil, nil, err
	}
	if r.down, err = r.matrix(e, x.Down, r.down, H, I); err != nil {
		return nil, nil, nil, err
	}
	if expertRead != nil {
		expertRead(r.b, e)
	}
	if corruptExpert != nil {
		corruptExpert(r.b, e, gate, r.up, r.down)
	}
	return gate, r.up, r.down, nil
}

// matrix reads projection q of expert e, which must be [rows, cols] (out,
// in) in canonical layout, into dst's memory.
func (r *planReader) matrix(e int, q *Proj, dst []float32, rows, cols int) ([]float32, error) {
	cr, cc, err := q.shape(false)
	if err != nil {
		return nil, err
	}
	if cr != rows || cc != cols {
		return nil, fmt.Errorf("expert %d weight %q is [%d, %d] (out, in), want [%d, %d]", e, q.Init.GetName(), cr, cc, rows, cols)
	}
	d := q.Init.GetDims()
	sr, sc := d[len(d)-2], d[len(d)-1] // one expert's matrix as stored
	base := int64(max(q.Expert, 0)) * sr * sc
	dst = resized(dst, rows*cols)
	if start, step, k := partRange(q.Part, int(sr)); !q.InOut && step == 1 {
		// The canonical rows are one range of the stored ones.
		if err := r.decode(q.Init, base+int64(start)*sc, dst[:k*int(sc)]); err != nil {
			return nil, err
		}
		return dst, nil
	}
	slab, err := r.storedSlab(q, base, int(sr*sc))
	if err != nil {
		return nil, err
	}
	return appendRows(dst[:0], slab, int(sr), int(sc), q.InOut, q.Part), nil
}

// storedSlab returns the n stored values of q's expert matrix from element
// base on, decoded: read once for the gate and up parts of one expert.
func (r *planReader) storedSlab(q *Proj, base int64, n int) ([]float32, error) {
	if r.slabInit == q.Init && r.slabExpert == q.Expert && len(r.slab) == n {
		return r.slab, nil
	}
	r.slabInit = nil
	r.slab = resized(r.slab, n)
	if err := r.decode(q.Init, base, r.slab); err != nil {
		return nil, err
	}
	r.slabInit, r.slabExpert = q.Init, q.Expert
	return r.slab, nil
}

// decode fills dst with t's stored values from element off on, as float32.
func (r *planReader) decode(t *pb.TensorProto, off int64, dst []float32) error {
	dt := graph.DataType(t)
	size := int64(graph.ElemBits(dt) / 8)
	if size == 0 {
		return fmt.Errorf("initializer %q: cannot decode %s as float32", t.GetName(), dt)
	}
	n := int64(len(dst)) * size
	if dt == pb.TensorProto_FLOAT && eval.LittleEndian() {
		return r.readInto(t, off*size, f32Bytes(dst)) // the stored bytes are the values
	}
	var raw []byte
	if b, ok, err := r.inlineBytes(t); err != nil {
		return err
	} else if ok {
		if off*size+n > int64(len(b)) {
			return fmt.Errorf("initializer %q: range %d+%d past its %d bytes", t.GetName(), off*size, n, len(b))
		}
		raw = b[off*size : off*size+n]
	} else {
		r.raw = resizedBytes(r.raw, int(n))
		if err := r.readInto(t, off*size, r.raw); err != nil {
			return err
		}
		raw = r.raw
	}
	if err := graph.DecodeFloat32Into(dt, raw, dst); err != nil {
		return fmt.Errorf("initializer %q: %w", t.GetName(), err)
	}
	return nil
}

// readInto fills p with t's stored bytes from byte off on: copied from an
// inline tensor's bytes, or a ranged read of its side file straight into
// p.
func (r *planReader) readInto(t *pb.TensorProto, off int64, p []byte) error {
	if b, ok, err := r.inlineBytes(t); err != nil {
		return err
	} else if ok {
		if off+int64(len(p)) > int64(len(b)) {
			return fmt.Errorf("initializer %q: range %d+%d past its %d bytes", t.GetName(), off, len(p), len(b))
		}
		copy(p, b[off:])
		return nil
	}
	w := &sliceWriter{b: p}
	if err := r.m.CopyTensorRange(w, t, off, int64(len(p))); err != nil {
		return err
	}
	if len(w.b) != 0 {
		return fmt.Errorf("initializer %q: short read of its external data", t.GetName())
	}
	return nil
}

// inlineBytes returns the bytes of t when they are not in a side file (ok
// false for a side file's tensor, and for a deferred producer that makes
// ranges, which is read as one): raw_data as it is; typed fields, or the
// bytes of another deferred producer (a model generated in memory, whose
// producer would otherwise run again for every range), made once per block.
func (r *planReader) inlineBytes(t *pb.TensorProto) ([]byte, bool, error) {
	d, deferred := r.m.Deferred(t)
	if deferred && d.Range != nil || graph.IsExternal(t) && !deferred {
		return nil, false, nil
	}
	if b, ok := r.inline[t]; ok {
		return b, true, nil
	}
	b, err := r.m.TensorBytes(t)
	if err != nil {
		return nil, false, err
	}
	if r.inline == nil {
		r.inline = map[*pb.TensorProto][]byte{}
	}
	r.inline[t] = b
	return b, true, nil
}

// resized returns buf with length n, reallocated only when too small.
func resized(buf []float32, n int) []float32 {
	if cap(buf) >= n {
		return buf[:n]
	}
	return make([]float32, n)
}

// resizedBytes is resized for bytes.
func resizedBytes(buf []byte, n int) []byte {
	if cap(buf) >= n {
		return buf[:n]
	}
	return make([]byte, n)
}

// checkScratch is the memory one checking goroutine reuses from block to
// block: the weights a check reads whole, and the reader of the routed
// experts with its buffers.
type checkScratch struct {
	w  moe.Weights
	rd planReader
}

// checkWeights returns the weights the numerical check of b reads: the
// router, the routed biases and the shared expert read whole into sc's
// memory (nil sc: fresh memory), and the routed experts' matrices through
// sc's planReader, one expert at a time (moe.Weights.Experts). The plan is
// validated against the spec from dims alone first.
func (b *Block) checkWeights(m *graph.Model, sc *checkScratch) (*moe.Weights, error) {
	if sc == nil {
		sc = &checkScratch{}
	}
	s := &b.Spec
	if err := b.W.checkExperts(s); err != nil {
		return nil, err
	}
	w, err := b.W.materializeParts(m, s, &sc.w, false)
	if err != nil {
		return nil, err
	}
	sc.w = *w
	sc.rd.reset(m, b)
	w.Experts = &sc.rd
	return w, nil
}

// checkExperts validates the routed experts' matrices of the plan against
// the spec from dims alone: every expert has the projections the first
// has, of the canonical shapes.
func (p *WeightPlan) checkExperts(s *moe.Spec) error {
	if len(p.Experts) != s.StoredExperts() {
		return fmt.Errorf("weight plan has %d experts, spec %d", len(p.Experts), s.StoredExperts())
	}
	I, H := s.Inter, s.Hidden
	for e := range p.Experts {
		x := &p.Experts[e]
		for _, c := range []struct {
			q, first   *Proj
			rows, cols int
		}{{x.Gate, p.Experts[0].Gate, I, H}, {x.Up, p.Experts[0].Up, I, H}, {x.Down, p.Experts[0].Down, H, I}} {
			if (c.q == nil) != (c.first == nil) {
				return fmt.Errorf("expert %d lacks a weight the others have", e)
			}
			if c.q == nil {
				continue
			}
			r, cc, err := c.q.shape(false)
			if err != nil {
				return err
			}
			if r != c.rows || cc != c.cols {
				return fmt.Errorf("expert %d weight %q is [%d, %d] (out, in), want [%d, %d]", e, c.q.Init.GetName(), r, cc, c.rows, c.cols)
			}
		}
	}
	return nil
}

// checkBytes is how many bytes checking a block holds for its weights,
// from dims alone: the weights read whole (router, routed biases, shared
// expert) and the planReader's buffers, which hold about two experts'
// matrices (one expert's canonical gate, up and down, and a stored slab or
// range of one). It is what the check's scheduling counts (forBlocks,
// earlyChecks), 0 when the plan does not fit the spec.
func (p *WeightPlan) checkBytes(s *moe.Spec) int64 {
	ts, err := p.fusedTensors(s)
	if err != nil {
		return 0
	}
	var n int64
	for i := range ts {
		switch ts[i].role {
		case "gate", "up", "down":
		default:
			n += ts[i].size()
		}
	}
	expert := 4 * 3 * int64(s.Hidden) * int64(s.Inter)
	return n + 2*expert
}

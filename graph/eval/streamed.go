package eval

import (
	"fmt"
	"slices"

	"github.com/mokopt/mokopt/graph"
	pb "github.com/mokopt/mokopt/graph/onnxpb"
)

// streamed is the source of a weight that a kernel reads a range at a
// time (Kernels.Streams) instead of the run loading it whole: an
// initializer of FLOAT, FLOAT16 or BFLOAT16 whose bytes lie in a side
// file, or, for the half types, in raw_data (which would otherwise be
// widened to float32 whole); for a declared kernel input also one of a
// one-byte type (the FLOAT8 types, UINT8, INT8), which the run would
// otherwise widen four- or eightfold.
type streamed struct {
	m *graph.Model
	p *pb.TensorProto
}

// minStreamed is the smallest initializer (bytes as stored) that is
// streamed to a kernel that takes it so; smaller ones are loaded.
const minStreamed = 1 << 20

// Streamed reports whether t is a streamed weight: its data is not in
// memory, and ReadFloat32 reads it a range at a time. Only kernels that
// declared the input with Kernels.Streams see such tensors.
func (t *Tensor) Streamed() bool { return t != nil && t.src != nil }

// ReadFloat32 fills dst with t's values from element offset off on,
// widened to float32 (t must be of a float type stored as float32:
// FLOAT, FLOAT16, BFLOAT16, FLOAT8*, or of a one-byte integer type,
// whose values float32 holds exactly). For a streamed tensor only that
// range is read from the model's file.
func (t *Tensor) ReadFloat32(dst []float32, off int) error {
	if t.src == nil {
		return t.readInMemory(dst, off)
	}
	width := graph.ElemBits(t.DType) / 8
	switch t.DType {
	case pb.TensorProto_FLOAT:
		if littleEndian && len(dst) > 0 {
			return t.src.m.ReadTensorAt(t.src.p, f32Bytes(dst), 4*int64(off))
		}
	case pb.TensorProto_FLOAT16, pb.TensorProto_BFLOAT16:
	default:
		if width != 1 {
			return fmt.Errorf("streamed %s tensor", t.DType)
		}
	}
	// Read and widen a bounded chunk at a time, so that reading one
	// expert's matrix does not hold its stored bytes and a widened copy
	// beside dst.
	const chunk = 1 << 18
	raw := make([]byte, width*min(len(dst), chunk))
	for i := 0; i < len(dst); i += chunk {
		n := min(chunk, len(dst)-i)
		b := raw[:width*n]
		if err := t.src.m.ReadTensorAt(t.src.p, b, int64(width)*int64(off+i)); err != nil {
			return err
		}
		v, err := fromRaw(t.DType, []int{n}, b)
		if err != nil {
			return err
		}
		if err := v.readInMemory(dst[i:i+n], 0); err != nil {
			return err
		}
	}
	return nil
}

// readInMemory is ReadFloat32 of a tensor held in memory.
func (t *Tensor) readInMemory(dst []float32, off int) error {
	n := len(t.F32)
	if t.F32 == nil {
		n = len(t.I64)
	}
	if (t.F32 == nil && (t.I64 == nil || graph.ElemBits(t.DType) != 8)) || off < 0 || off > n || len(dst) > n-off {
		return fmt.Errorf("range %d+%d of a %s%v tensor", off, len(dst), t.DType, t.Shape)
	}
	if t.F32 != nil {
		copy(dst, t.F32[off:])
		return nil
	}
	for i, v := range t.I64[off : off+len(dst)] {
		dst[i] = float32(v)
	}
	return nil
}

// streamWidth gives the element width of the types a kernel may stream;
// the one-byte types only to kernels that declared the input (narrow),
// since the built-in gathers' lazy slabs are read as float.
func streamWidth(dt pb.TensorProto_DataType, narrow bool) int64 {
	switch dt {
	case pb.TensorProto_FLOAT:
		return 4
	case pb.TensorProto_FLOAT16, pb.TensorProto_BFLOAT16:
		return 2
	case pb.TensorProto_FLOAT8E4M3FN, pb.TensorProto_FLOAT8E4M3FNUZ, pb.TensorProto_FLOAT8E5M2, pb.TensorProto_FLOAT8E5M2FNUZ,
		pb.TensorProto_UINT8, pb.TensorProto_INT8:
		if narrow {
			return 1
		}
	}
	return 0
}

// streamable returns the streamed form of initializer p for a kernel that
// reads it by ranges, or nil when p is better loaded: small, of another
// type, inline float32 (read in place anyway), or produced at save time.
// narrow admits the one-byte types (streamWidth).
func (r *runner) streamable(p *pb.TensorProto, narrow bool) *Tensor {
	dt := graph.DataType(p)
	width := streamWidth(dt, narrow)
	if width == 0 || p.Segment != nil || r.m == nil {
		return nil
	}
	if _, ok := r.m.Deferred(p); ok {
		return nil
	}
	external := graph.IsExternal(p)
	if !external && (dt == pb.TensorProto_FLOAT || p.RawData == nil) {
		return nil
	}
	shape := make([]int, len(p.GetDims()))
	for i, d := range p.GetDims() {
		if d < 0 || d > 1<<31-1 {
			return nil
		}
		shape[i] = int(d)
	}
	n, err := checkedNumel(shape)
	if err != nil || int64(n)*width < minStreamed {
		return nil
	}
	if !external && int64(len(p.RawData)) != int64(n)*width {
		return nil // loading names the mismatch
	}
	return &Tensor{DType: dt, Shape: shape, src: &streamed{m: r.m, p: p}}
}

// streamsInput reports whether node n's kernel reads input position i as
// a streamed tensor (Kernels.Streams), given that the kernel, not a
// model-local function, will run it; narrow says the reader also takes the one-byte types (streamWidth): a
// declared kernel does, the built-in gathers, whose lazy slabs are read as
// float, do not.
func (r *runner) streamsInput(n *pb.NodeProto, i int) (streams, narrow bool) {
	if i == 0 && normDomain(n.GetDomain()) == "" && (n.GetOpType() == "Gather" || n.GetOpType() == "GatherND") {
		// the built-in gathers keep whole slabs of a weight lazy (lazy.go);
		// over a streamed weight MatMul then reads each slab once.
		_, _, custom := r.lookup("", n.GetOpType())
		return !custom && r.funcs[funcKey{"", n.GetOpType(), n.GetOverload()}] == nil, false
	}
	ks := r.opt.Kernels
	if ks == nil || ks.streams == nil {
		return false, false
	}
	key := opKey{normDomain(n.GetDomain()), n.GetOpType()}
	pos, ok := ks.streams[key]
	if !ok || (r.opt.PreferFunctions && r.funcs[funcKey{key.domain, key.op, n.GetOverload()}] != nil) {
		return false, false
	}
	return slices.Contains(pos, i), true
}

// input returns input i (named name) of node n: a streamed tensor when
// n's kernel reads it so and it is an initializer worth streaming, else
// the value itself, a streamed one loaded whole (and kept so for later
// readers).
func (r *runner) input(sc *scope, n *pb.NodeProto, i int, name string) (*Tensor, error) {
	streams, narrow := r.streamsInput(n, i)
	if streams {
		for s := sc; s != nil; s = s.parent {
			if t, ok := s.vals[name]; ok {
				if t.src == nil || streamWidth(t.DType, narrow) != 0 {
					return t, nil
				}
				break
			}
			if p, ok := s.inits[name]; ok {
				if t := r.streamable(p, narrow); t != nil {
					s.bind(r, name, t)
					return t, nil
				}
				break
			}
		}
	}
	t, err := sc.lookup(r, name)
	if err != nil || t.src == nil || streams && streamWidth(t.DType, narrow) != 0 {
		return t, err
	}
	for s := sc; s != nil; s = s.parent {
		if p, ok := s.inits[name]; ok && s.vals[name] == t {
			if err := r.checkInitializer(p); err != nil {
				return nil, err
			}
			full, err := initializerTensor(p, r.m.TensorBytes)
			if err != nil {
				return nil, err
			}
			s.bind(r, name, full)
			return full, nil
		}
	}
	return nil, fmt.Errorf("value %q: a streamed weight outside its scope", name)
}

// load returns t with its data in memory: t itself unless streamed, else
// the weight read whole (counted against the memory limit).
func (c *OpContext) load(t *Tensor) (*Tensor, error) {
	if t == nil || t.src == nil {
		return t, nil
	}
	if c == nil || c.r == nil {
		return nil, fmt.Errorf("a streamed weight outside a run")
	}
	return c.r.materialize(t, c.Node)
}

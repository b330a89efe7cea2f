package lowering

import (
	"encoding/binary"
	"fmt"
	"io"
	"math"
	"unsafe"

	"github.com/mokopt/mokopt/graph"
	pb "github.com/mokopt/mokopt/graph/onnxpb"
	"github.com/mokopt/mokopt/internal/ortmoe"
	"github.com/mokopt/mokopt/moe"
	"google.golang.org/protobuf/proto"
)

// expertRows reads a source's values by element ranges (moe.ExpertReader):
// a side-file or raw_data weight with ranged reads of just those bytes (a
// float32 one straight into the destination, others through a bounded
// buffer); one whose bytes exist only as typed fields or a deferred
// producer is loaded once, whole (small models built in memory).
type expertRows struct {
	src   source
	raw   []byte
	whole []byte
}

// rowChunk bounds the bytes expertRows decodes at a time.
const rowChunk = 1 << 20

// Len is the number of values of the whole weight.
func (r *expertRows) Len() int { return r.src.E * r.src.N * r.src.K }

// ReadAt fills dst with the values from element offset off on.
func (r *expertRows) ReadAt(dst []float32, off int) error {
	t, m := r.src.t, r.src.m
	dt := graph.DataType(t)
	elem := graph.ElemBits(dt) / 8
	if off < 0 || len(dst) > r.Len()-off {
		return fmt.Errorf("weight %q: range %d+%d past its %d values", t.GetName(), off, len(dst), r.Len())
	}
	at := int64(off) * int64(elem)
	if _, deferred := m.Deferred(t); deferred || !graph.IsExternal(t) && t.RawData == nil {
		if r.whole == nil {
			w, err := m.TensorBytes(t)
			if err != nil {
				return err
			}
			r.whole = w
		}
		v, err := graph.DecodeFloat32(dt, r.whole[at:at+int64(len(dst)*elem)])
		if err != nil {
			return err
		}
		copy(dst, v)
		return nil
	}
	if dt == pb.TensorProto_FLOAT && hostLittleEndian && len(dst) > 0 {
		return m.ReadTensorAt(t, unsafe.Slice((*byte)(unsafe.Pointer(&dst[0])), 4*len(dst)), at)
	}
	step := max(rowChunk/elem, 1)
	for i := 0; i < len(dst); i += step {
		k := min(step, len(dst)-i)
		if cap(r.raw) < k*elem {
			r.raw = make([]byte, k*elem)
		}
		b := r.raw[:k*elem]
		if err := m.ReadTensorAt(t, b, at+int64(i*elem)); err != nil {
			return err
		}
		v, err := graph.DecodeFloat32(dt, b)
		if err != nil {
			return err
		}
		copy(dst[i:], v)
	}
	return nil
}

// hostLittleEndian reports whether float32 values lie in memory as ONNX
// raw data stores them.
var hostLittleEndian = func() bool {
	x := uint16(1)
	return *(*byte)(unsafe.Pointer(&x)) == 1
}()

// ortExperts computes the routed weights of com.microsoft::MoE / QMoE one
// expert at a time from a fused node's stacked gate, up and down
// initializers (float [E, out, in]), exactly as ortFC1 and the scaling of
// fc2 compute them over the whole stack.
type ortExperts struct {
	s              *moe.Spec
	gate, up, down source
	f              int64   // fc1 rows per intermediate unit (2: gate and up interleaved)
	scale          float32 // routed_scaling_factor folded into fc2
}

// reader returns a fresh reader of src (one per save: no state is shared
// between producers that run at once).
func reader(src source) *expertRows { return &expertRows{src: src} }

// fc1 returns a function giving expert e's fc1 [f·I, H] (in a buffer the
// next call reuses).
func (o *ortExperts) fc1() func(e int) ([]float32, error) {
	gr, ur := reader(o.gate), reader(o.up)
	I, H := o.s.Inter, o.s.Hidden
	up := make([]float32, I*H)
	var gate, fc1 []float32
	if o.f == 2 {
		gate, fc1 = make([]float32, I*H), make([]float32, 2*I*H)
	}
	return func(e int) ([]float32, error) {
		if err := ur.ReadAt(up, e*I*H); err != nil {
			return nil, err
		}
		if o.f == 1 {
			return up, nil
		}
		if err := gr.ReadAt(gate, e*I*H); err != nil {
			return nil, err
		}
		interleaveFC1(fc1, gate, up, 1, I, H)
		return fc1, nil
	}
}

// fc2 returns a function giving expert e's fc2 [H, I]: down times the
// routed scaling factor (in a buffer the next call reuses).
func (o *ortExperts) fc2() func(e int) ([]float32, error) {
	dr := reader(o.down)
	H, I := o.s.Hidden, o.s.Inter
	v := make([]float32, H*I)
	return func(e int) ([]float32, error) {
		if err := dr.ReadAt(v, e*H*I); err != nil {
			return nil, err
		}
		if o.scale != 1 {
			for i := range v {
				v[i] *= o.scale
			}
		}
		return v, nil
	}
}

// float32Bytes returns v as little-endian float32 bytes: v's own memory
// where the host stores them so, else buf (grown as needed).
func float32Bytes(buf []byte, v []float32) []byte {
	if hostLittleEndian && len(v) > 0 {
		return unsafe.Slice((*byte)(unsafe.Pointer(&v[0])), 4*len(v))
	}
	if cap(buf) < 4*len(v) {
		buf = make([]byte, 4*len(v))
	}
	buf = buf[:4*len(v)]
	for i, f := range v {
		binary.LittleEndian.PutUint32(buf[4*i:], math.Float32bits(f))
	}
	return buf
}

// deferExperts adds to g, deferred in m, tensor t of size bytes whose
// bytes are E experts' parts, each made by a fresh produce() for that
// save. The tensor goes where the model's weights came from: to the side
// file when they came in external data, inside the model file otherwise,
// as the same tensor built in memory would.
func deferExperts(m *graph.Model, g *graph.Graph, t *pb.TensorProto, size int64, E int, produce func() func(e int) ([]byte, error)) {
	write := func(w io.Writer) error {
		part := produce()
		for e := 0; e < E; e++ {
			b, err := part(e)
			if err != nil {
				return err
			}
			if _, err := w.Write(b); err != nil {
				return err
			}
		}
		return nil
	}
	g.AddInitializer(t)
	m.SetDeferred(t, graph.DeferredData{Size: size, Write: write, Inline: !m.ExternalOrigin()})
}

// deferFloat32 adds a deferred float32 tensor of dims whose expert e is
// expert(e) (a fresh expert per save, from mk).
func deferFloat32(m *graph.Model, g *graph.Graph, name string, dims []int64, mk func() func(e int) ([]float32, error)) {
	t := &pb.TensorProto{Name: proto.String(name), Dims: dims, DataType: proto.Int32(int32(pb.TensorProto_FLOAT))}
	size := int64(4)
	for _, d := range dims {
		size *= d
	}
	deferExperts(m, g, t, size, int(dims[0]), func() func(int) ([]byte, error) {
		expert := mk()
		var buf []byte
		return func(e int) ([]byte, error) {
			v, err := expert(e)
			if err != nil {
				return nil, err
			}
			buf = float32Bytes(buf, v)
			return buf, nil
		}
	})
}

// deferQuantized adds QMoE's packed weights (UINT8 [E, N, K·bits/8]) and
// their scales (float [E, N] or [E, N, K/blockSize]) of the float [E, N, K]
// weight whose expert e is made by mk()(e), quantized expert by expert
// (ortmoe.Quantize groups lie within a row, so this is the stack's
// quantization; the scales' producer computes only the scales), and
// returns the names of both.
func deferQuantized(m *graph.Model, g *graph.Graph, prefix, role string, E, N, K, bits, blockSize int, mk func() func(e int) ([]float32, error)) (string, string) {
	e64, n64 := int64(E), int64(N)
	qName := g.UniqueName(prefix + "/" + role + "_experts_weights")
	qt := &pb.TensorProto{Name: proto.String(qName), Dims: []int64{e64, n64, int64(K * bits / 8)},
		DataType: proto.Int32(int32(pb.TensorProto_UINT8))}
	deferExperts(m, g, qt, e64*n64*int64(K*bits/8), E, func() func(int) ([]byte, error) {
		expert := mk()
		return func(e int) ([]byte, error) {
			v, err := expert(e)
			if err != nil {
				return nil, err
			}
			q, _, err := ortmoe.Quantize(v, 1, N, K, bits, blockSize)
			return q, err
		}
	})
	sd := []int64{e64, n64}
	if blockSize > 0 {
		sd = append(sd, int64(K/blockSize))
	}
	sName := g.UniqueName(prefix + "/" + role + "_scales")
	deferFloat32(m, g, sName, sd, func() func(int) ([]float32, error) {
		expert := mk()
		return func(e int) ([]float32, error) {
			v, err := expert(e)
			if err != nil {
				return nil, err
			}
			return ortmoe.QuantizeScales(v, 1, N, K, bits, blockSize)
		}
	})
	return qName, sName
}

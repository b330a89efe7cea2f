package passes

import (
	"encoding/binary"
	"fmt"
	"io"
	"math"

	"github.com/mokopt/mokopt/graph"
	pb "github.com/mokopt/mokopt/graph/onnxpb"
	"github.com/mokopt/mokopt/internal/ortmoe"
	"google.golang.org/protobuf/proto"
)

// qmoeStack is a QMoE weight, packed codes [E, N, K/pack] with their
// scales and optional zero points, read as the float32 [E, N, K] it
// dequantizes to: a deferred tensor (graph.DeferredData) whose ranges are
// made a bounded number of rows at a time from those rows' codes, scales
// and zero points alone. Reading the stack an expert at a time (the
// numerical check, the writer of the fused weights) then costs one pass
// over the codes, where dequantizing the whole stack for every expert
// would cost E.
type qmoeStack struct {
	m               *graph.Model
	a               *ortmoe.Attrs
	codes, sc, zp   *pb.TensorProto // zp nil: the default zero point
	E, N, K, groups int
	pack, chunkRows int    // codes a byte; rows dequantized at a time
	node, what      string // for errors
}

// qmoeBufs are the buffers of one read of a qmoeStack: each read has its
// own, as two readers (the check ahead of the writer) may read at once.
type qmoeBufs struct {
	code, sc, zp, out []byte
	scales, rows      []float32
}

// qmoeRowsMade, set by tests only, is called with the number of rows each
// time a qmoeStack dequantizes some.
var qmoeRowsMade func(rows int)

// qmoeChunk bounds the values a qmoeStack dequantizes at a time (a
// variable for the tests).
var qmoeChunk = 1 << 20

// newQMoEStack checks a QMoE weight's codes [E, N, K/pack], scales (E·N·
// groups values) and zero points (E·N·groups packed, or nil) from their
// dims and returns its stack, read from m; node and what name it in
// errors.
func newQMoEStack(m *graph.Model, a *ortmoe.Attrs, codes, sc, zp *pb.TensorProto, E, N, K int, node, what string) (*qmoeStack, error) {
	pack := 8 / a.Bits
	if d := codes.GetDims(); len(d) != 3 || d[0] != int64(E) || d[1] != int64(N) || d[2]*int64(pack) != int64(K) {
		return nil, fmt.Errorf("QMoE node %q %s: weights have dims %v, want [%d, %d, %d]", node, what, d, E, N, K/pack)
	}
	if graph.DataType(codes) != pb.TensorProto_UINT8 {
		return nil, fmt.Errorf("QMoE node %q %s: weights are %s, want uint8", node, what, graph.DataType(codes))
	}
	if sc == nil {
		return nil, fmt.Errorf("QMoE node %q %s: expert weights without scales", node, what)
	}
	groups := 1
	if a.BlockSize > 0 {
		if K%a.BlockSize != 0 {
			return nil, fmt.Errorf("QMoE node %q %s: input size K %d is not a multiple of block_size %d", node, what, K, a.BlockSize)
		}
		groups = K / a.BlockSize
	}
	if n, err := graph.NumElements(sc.GetDims()); err != nil || n != int64(E*N*groups) {
		return nil, fmt.Errorf("QMoE node %q %s: scales have %d values (dims %v), want %d", node, what, n, sc.GetDims(), E*N*groups)
	}
	if dt := graph.DataType(sc); !isFloatType(dt) {
		return nil, fmt.Errorf("QMoE node %q %s: scales are %s, want a float type", node, what, dt)
	}
	if n, err := graph.NumElements(zp.GetDims()); zp != nil && (err != nil || graph.DataType(zp) != pb.TensorProto_UINT8 || n*int64(pack) != int64(E*N*groups)) {
		return nil, fmt.Errorf("QMoE node %q %s: zero points are %s %v, want %d uint8", node, what, graph.DataType(zp), zp.GetDims(), E*N*groups/pack)
	}
	return &qmoeStack{m: m, a: a, codes: codes, sc: sc, zp: zp, E: E, N: N, K: K, groups: groups,
		pack: pack, chunkRows: max(1, qmoeChunk/K), node: node, what: what}, nil
}

// deferred registers the stack's float32 tensor, named name, on s.m and
// returns it: the whole tensor and its ranges are made by writeRange.
func (s *qmoeStack) deferred(name string) *pb.TensorProto {
	t := &pb.TensorProto{Name: proto.String(name), Dims: []int64{int64(s.E), int64(s.N), int64(s.K)},
		DataType: proto.Int32(int32(pb.TensorProto_FLOAT))}
	size := int64(4 * s.E * s.N * s.K)
	s.m.SetDeferred(t, graph.DeferredData{Size: size, Inline: !graph.IsExternal(s.codes),
		Write: func(w io.Writer) error { return s.writeRange(w, 0, size) },
		Range: s.writeRange})
	return t
}

// writeRange writes bytes [off, off+n) of the dequantized stack to w.
func (s *qmoeStack) writeRange(w io.Writer, off, n int64) error {
	rowBytes := int64(4 * s.K)
	r1 := (off + n + rowBytes - 1) / rowBytes
	b := &qmoeBufs{}
	for r := off / rowBytes; r < r1; r += int64(s.chunkRows) {
		k := min(int64(s.chunkRows), r1-r)
		out, err := s.rows(b, int(r), int(k))
		if err != nil {
			return fmt.Errorf("QMoE node %q %s: %w", s.node, s.what, err)
		}
		lo, hi := max(off-r*rowBytes, 0), min(off+n-r*rowBytes, k*rowBytes)
		if _, err := w.Write(out[lo:hi]); err != nil {
			return err
		}
	}
	return nil
}

// rows returns rows r .. r+k of the stack (rows of K values, expert e's
// starting at row e·N), dequantized into b, as little-endian float32 bytes.
func (s *qmoeStack) rows(b *qmoeBufs, r, k int) ([]byte, error) {
	rowCodes := s.K / s.pack
	b.code = resizedBytes(b.code, k*rowCodes)
	if err := readStored(s.m, s.codes, b.code, int64(r*rowCodes)); err != nil {
		return nil, err
	}
	dt := graph.DataType(s.sc)
	es := graph.ElemBits(dt) / 8
	b.sc = resizedBytes(b.sc, k*s.groups*es)
	if err := readStored(s.m, s.sc, b.sc, int64(r*s.groups*es)); err != nil {
		return nil, err
	}
	b.scales = resized(b.scales, k*s.groups)
	if err := graph.DecodeFloat32Into(dt, b.sc, b.scales); err != nil {
		return nil, fmt.Errorf("scales %q: %w", s.sc.GetName(), err)
	}
	var zp []byte
	zOff := 0
	if s.zp != nil {
		first, last := r*s.groups, (r+k)*s.groups // zero points of these rows
		lo, hi := first/s.pack, (last+s.pack-1)/s.pack
		b.zp = resizedBytes(b.zp, hi-lo)
		if err := readStored(s.m, s.zp, b.zp, int64(lo)); err != nil {
			return nil, err
		}
		zp, zOff = b.zp, first-lo*s.pack
	}
	b.rows = resized(b.rows, k*s.K)
	if qmoeRowsMade != nil {
		qmoeRowsMade(k)
	}
	s.a.DequantizeRows(b.rows, b.code, b.scales, zp, zOff, s.K, s.groups)
	b.out = resizedBytes(b.out, 4*len(b.rows))
	for i, v := range b.rows {
		binary.LittleEndian.PutUint32(b.out[4*i:], math.Float32bits(v))
	}
	return b.out, nil
}

// readStored fills p with t's stored bytes from byte off on, wherever they
// are (graph.Model.CopyTensorRange).
func readStored(m *graph.Model, t *pb.TensorProto, p []byte, off int64) error {
	w := &sliceWriter{b: p}
	if err := m.CopyTensorRange(w, t, off, int64(len(p))); err != nil {
		return err
	}
	if len(w.b) != 0 {
		return fmt.Errorf("initializer %q: short read", t.GetName())
	}
	return nil
}

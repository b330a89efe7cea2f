package lowering

import (
	"bufio"
	"fmt"
	"io"

	"github.com/mokopt/mokopt/graph"
	pb "github.com/mokopt/mokopt/graph/onnxpb"
	"github.com/mokopt/mokopt/kernel/mxfp8"
	"google.golang.org/protobuf/proto"
)

// source is a float weight initializer of m read as E slabs of [N, K].
type source struct {
	m       *graph.Model
	t       *pb.TensorProto
	E, N, K int
}

func newSource(m *graph.Model, t *pb.TensorProto, dims ...int) (source, error) {
	s := source{m: m, t: t}
	got := t.GetDims()
	if len(got) != len(dims) {
		return s, fmt.Errorf("weight %q has dims %v, want %v", t.GetName(), got, dims)
	}
	for i, d := range dims {
		if got[i] != int64(d) {
			return s, fmt.Errorf("weight %q has dims %v, want %v", t.GetName(), got, dims)
		}
	}
	switch graph.DataType(t) {
	case pb.TensorProto_FLOAT, pb.TensorProto_FLOAT16, pb.TensorProto_BFLOAT16, pb.TensorProto_DOUBLE:
	default:
		return s, fmt.Errorf("weight %q is %s, not a float type", t.GetName(), graph.DataType(t))
	}
	if len(dims) == 3 {
		s.E, s.N, s.K = dims[0], dims[1], dims[2]
	} else {
		s.E, s.N, s.K = 1, dims[0], dims[1]
	}
	return s, nil
}

// slab is one expert's [N, K] matrix, or the error that ended the reading.
type slab struct {
	v   []float32
	err error
}

// slabs reads the source one expert at a time, in order, one slab ahead of
// the consumer, and calls fn for each. Two float32 slabs take turns: the
// one fn has and the one being decoded; v is valid until fn returns.
func (s source) slabs(fn func(e int, v []float32) error) error {
	r, _, err := s.m.TensorReader(s.t)
	if err != nil {
		return err
	}
	dt := graph.DataType(s.t)
	elem := graph.ElemBits(dt) / 8
	ch := make(chan slab, 1)
	free := make(chan []float32, 2)
	free <- make([]float32, s.N*s.K)
	free <- make([]float32, s.N*s.K)
	done := make(chan struct{})
	defer close(done)
	go func() {
		defer close(ch)
		br := bufio.NewReaderSize(r, 1<<20)
		raw := make([]byte, s.N*s.K*elem)
		for e := 0; e < s.E; e++ {
			var sl slab
			select {
			case sl.v = <-free:
			case <-done:
				return
			}
			if _, err := io.ReadFull(br, raw); err != nil {
				sl.err = fmt.Errorf("reading expert %d of %q: %w", e, s.t.GetName(), err)
			} else {
				sl.err = graph.DecodeFloat32Into(dt, raw, sl.v)
			}
			select {
			case ch <- sl:
			case <-done:
				return
			}
			if sl.err != nil {
				return
			}
		}
	}()
	e := 0
	for sl := range ch {
		if sl.err != nil {
			return sl.err
		}
		if err := fn(e, sl.v); err != nil {
			return err
		}
		free <- sl.v
		e++
	}
	if e != s.E {
		return fmt.Errorf("reading %q: got %d of %d experts", s.t.GetName(), e, s.E)
	}
	return nil
}

// mxfp8Part says which half of an MXFP8 pair a deferred tensor holds.
type mxfp8Part int

const (
	partData mxfp8Part = iota
	partScales
)

// deferMXFP8 adds to g, deferred in m, one half of the MXFP8 pair of src:
// E4M3 codes FLOAT8E4M3FN [E, N, K] or UE8M0 scales UINT8
// [E·N/128, K/128, 32, 16]. Its bytes are computed when the model is saved,
// expert by expert, by kernel/mxfp8's quantizer with the given workers.
func deferMXFP8(m *graph.Model, g *graph.Graph, name string, src source, part mxfp8Part, workers int) {
	E, N, K := src.E, src.N, src.K
	t := &pb.TensorProto{Name: proto.String(name)}
	var size int64
	if part == partData {
		t.Dims = []int64{int64(E), int64(N), int64(K)}
		t.DataType = proto.Int32(int32(pb.TensorProto_FLOAT8E4M3FN))
		size = int64(E) * int64(N) * int64(K)
	} else {
		sh := mxfp8.ScaleShape(E, N, K)
		t.Dims = []int64{int64(sh[0]), int64(sh[1]), int64(sh[2]), int64(sh[3])}
		t.DataType = proto.Int32(int32(pb.TensorProto_UINT8))
		size = int64(mxfp8.ScaleLen(E, N, K))
	}
	q := mxfp8.Quantizer{Workers: workers}
	srcName := src.t.GetName()
	write := func(w io.Writer) error {
		data := make([]uint8, N*K)
		scales := make([]uint8, mxfp8.ScaleLen(1, N, K))
		return src.slabs(func(e int, v []float32) error {
			if err := q.QuantizeExpert(srcName, e, v, N, K, data, scales); err != nil {
				return err
			}
			out := data
			if part == partScales {
				out = scales
			}
			_, err := w.Write(out)
			return err
		})
	}
	g.AddInitializer(t)
	m.SetDeferred(t, graph.DeferredData{Size: size, Write: write})
}

// deferBF16 adds to g, deferred in m, src rounded to bfloat16 (nearest even),
// converted slab by slab when the model is saved; a bfloat16 source's bytes
// are copied as they are.
func deferBF16(m *graph.Model, g *graph.Graph, name string, src source) {
	t := &pb.TensorProto{Name: proto.String(name), Dims: append([]int64(nil), src.t.GetDims()...),
		DataType: proto.Int32(int32(pb.TensorProto_BFLOAT16))}
	size := int64(2 * src.E * src.N * src.K)
	write := func(w io.Writer) error {
		if graph.DataType(src.t) == pb.TensorProto_BFLOAT16 {
			r, _, err := src.m.TensorReader(src.t)
			if err != nil {
				return err
			}
			n, err := io.Copy(w, io.LimitReader(r, size))
			if err == nil && n != size {
				err = fmt.Errorf("reading %q: %d of %d bytes", src.t.GetName(), n, size)
			}
			return err
		}
		buf := make([]byte, 2*src.N*src.K)
		return src.slabs(func(_ int, v []float32) error {
			if err := graph.EncodeFloat32Into(pb.TensorProto_BFLOAT16, buf, v); err != nil {
				return err
			}
			_, err := w.Write(buf)
			return err
		})
	}
	g.AddInitializer(t)
	m.SetDeferred(t, graph.DeferredData{Size: size, Write: write})
}

// deferZeroBF16 adds to g, deferred in m, a bfloat16 tensor of zeros.
func deferZeroBF16(m *graph.Model, g *graph.Graph, name string, dims ...int64) {
	t := &pb.TensorProto{Name: proto.String(name), Dims: dims, DataType: proto.Int32(int32(pb.TensorProto_BFLOAT16))}
	n := int64(2)
	for _, d := range dims {
		n *= d
	}
	write := func(w io.Writer) error {
		zero := make([]byte, min(n, 1<<20))
		for left := n; left > 0; {
			k := min(left, int64(len(zero)))
			if _, err := w.Write(zero[:k]); err != nil {
				return err
			}
			left -= k
		}
		return nil
	}
	g.AddInitializer(t)
	m.SetDeferred(t, graph.DeferredData{Size: n, Write: write})
}

package lowering

import (
	"bytes"
	"math/rand/v2"
	"testing"

	"github.com/mokopt/mokopt/graph"
	pb "github.com/mokopt/mokopt/graph/onnxpb"
	"google.golang.org/protobuf/proto"
)

// halfSource returns a model holding one [E, N, K] initializer "w" of type
// dt with random values (exact in dt), its source, and those values as
// float32.
func halfSource(t *testing.T, dt pb.TensorProto_DataType, E, N, K int) (*graph.Model, *pb.TensorProto, source, []float32) {
	t.Helper()
	r := rand.New(rand.NewPCG(7, uint64(dt)))
	v := make([]float32, E*N*K)
	raw := make([]byte, len(v)*graph.ElemBits(dt)/8)
	for i := range v {
		v[i] = float32(r.NormFloat64())
	}
	if err := graph.EncodeFloat32Into(dt, raw, v); err != nil {
		t.Fatal(err)
	}
	if err := graph.DecodeFloat32Into(dt, raw, v); err != nil { // the values dt holds
		t.Fatal(err)
	}
	w := &pb.TensorProto{Name: proto.String("w"), Dims: []int64{int64(E), int64(N), int64(K)},
		DataType: proto.Int32(int32(dt)), RawData: raw}
	m := &graph.Model{Proto: &pb.ModelProto{IrVersion: proto.Int64(10),
		Graph: &pb.GraphProto{Name: proto.String("g"), Initializer: []*pb.TensorProto{w}}}}
	src, err := newSource(m, w, E, N, K)
	if err != nil {
		t.Fatal(err)
	}
	return m, w, src, v
}

func TestSlabsRecycleTwoBuffers(t *testing.T) {
	for _, dt := range []pb.TensorProto_DataType{pb.TensorProto_FLOAT, pb.TensorProto_FLOAT16, pb.TensorProto_BFLOAT16} {
		const E, N, K = 5, 3, 4
		_, _, src, want := halfSource(t, dt, E, N, K)
		backing := map[*float32]bool{}
		n := 0
		err := src.slabs(func(e int, v []float32) error {
			if e != n {
				t.Errorf("%s: slab %d called as %d", dt, n, e)
			}
			n++
			backing[&v[0]] = true
			for i, x := range v {
				if x != want[e*N*K+i] {
					t.Fatalf("%s: expert %d value %d = %g, want %g", dt, e, i, x, want[e*N*K+i])
				}
			}
			return nil
		})
		if err != nil || n != E {
			t.Fatalf("%s: %d slabs, err %v", dt, n, err)
		}
		if len(backing) > 2 {
			t.Errorf("%s: %d slab buffers allocated, want 2 taking turns", dt, len(backing))
		}
	}
}

func TestDeferBF16(t *testing.T) {
	for _, dt := range []pb.TensorProto_DataType{pb.TensorProto_BFLOAT16, pb.TensorProto_FLOAT, pb.TensorProto_FLOAT16} {
		const E, N, K = 3, 2, 8
		m, w, src, v := halfSource(t, dt, E, N, K)
		deferBF16(m, m.Graph(), "w_bf16", src)
		out := m.Graph().Initializer("w_bf16")
		got, err := m.TensorBytes(out)
		if err != nil {
			t.Fatal(err)
		}
		want := make([]byte, 2*len(v))
		if err := graph.EncodeFloat32Into(pb.TensorProto_BFLOAT16, want, v); err != nil {
			t.Fatal(err)
		}
		if dt == pb.TensorProto_BFLOAT16 && !bytes.Equal(w.GetRawData(), want) {
			t.Fatal("test setup: a bfloat16 source does not re-encode to itself")
		}
		if !bytes.Equal(got, want) {
			t.Errorf("%s source: bfloat16 bytes differ from its values rounded to nearest even", dt)
		}
	}
}

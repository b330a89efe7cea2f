package lowering

import (
	"encoding/binary"
	"math"

	"github.com/mokopt/mokopt/graph"
	pb "github.com/mokopt/mokopt/graph/onnxpb"
	"github.com/mokopt/mokopt/kernel/mxfp8"
	"google.golang.org/protobuf/proto"
)

// DecodeFP8ForEval prepares a lowered model for the reference interpreter,
// which has no float8 tensors: every FLOAT8E4M3FN initializer of the main
// graph is replaced by a FLOAT initializer of the same name and shape holding
// the decoded E4M3 values (exact in float32; the UE8M0 scales stay separate).
// Both the registered MoKDispatchFFNCombine kernel and the function body
// (whose Cast to float is then the identity) compute the same result from
// them as from the codes. It returns how many initializers it replaced. The
// model grows fourfold in those tensors; it is meant for checks, not serving.
//
// This is an adapter for graph/eval's missing float8 support: once eval
// reads FLOAT8E4M3FN, it is no longer needed.
func DecodeFP8ForEval(m *graph.Model) (int, error) {
	g := m.Proto.GetGraph()
	n := 0
	for i, t := range g.GetInitializer() {
		if graph.DataType(t) != pb.TensorProto_FLOAT8E4M3FN {
			continue
		}
		b, err := m.TensorBytes(t)
		if err != nil {
			return n, err
		}
		raw := make([]byte, 4*len(b))
		for j, c := range b {
			binary.LittleEndian.PutUint32(raw[4*j:], math.Float32bits(mxfp8.DecodeE4M3(c)))
		}
		g.Initializer[i] = &pb.TensorProto{Name: proto.String(t.GetName()), Dims: append([]int64(nil), t.GetDims()...),
			DataType: proto.Int32(int32(pb.TensorProto_FLOAT)), RawData: raw}
		n++
	}
	return n, nil
}

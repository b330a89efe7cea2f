package passes

import (
	"math"

	"github.com/mokopt/mokopt/graph"
	"github.com/mokopt/mokopt/graph/eval"
	pb "github.com/mokopt/mokopt/graph/onnxpb"
	"github.com/mokopt/mokopt/moe"
)

// declaredElemType returns the element type the graph declares for value v
// (as a graph input, output or value_info), or UNDEFINED.
func declaredElemType(g *pb.GraphProto, v string) pb.TensorProto_DataType {
	for _, list := range [][]*pb.ValueInfoProto{g.Input, g.ValueInfo, g.Output} {
		for _, vi := range list {
			if vi.GetName() == v {
				if tt := vi.GetType().GetTensorType(); tt != nil {
					return pb.TensorProto_DataType(tt.GetElemType())
				}
			}
		}
	}
	return pb.TensorProto_UNDEFINED
}

// setIOType records a block's I/O element type in its spec: the type the
// graph declares for the block's input or output, else that of the router
// weight (a half-precision export stores half-precision weights). Types
// other than float32, float16 and bfloat16 refuse the block.
func setIOType(m *graph.Model, b *Block) {
	dt := declaredElemType(m.Proto.Graph, b.Input)
	if dt == pb.TensorProto_UNDEFINED {
		dt = declaredElemType(m.Proto.Graph, b.Output)
	}
	if dt == pb.TensorProto_UNDEFINED && b.W != nil && b.W.Router.Init != nil {
		dt = graph.DataType(b.W.Router.Init)
	}
	if dt == pb.TensorProto_UNDEFINED {
		dt = pb.TensorProto_FLOAT
	}
	io, ok := moe.IOTypeOf(dt)
	if !ok {
		fail("block input %q has type %s; fused blocks take float32, float16 or bfloat16", b.Input, dt)
	}
	b.Spec.IOType = io
}

// checkTolerance is the numerical check's tolerance for a block whose
// output has element type dt: float32 uses CheckTolerance; half-precision
// outputs, which round every intermediate value of the original graph,
// compare with a tolerance scaled to the output's magnitude and skip the
// tokens whose routing is a near-tie at that precision (halfTokens, nearTie).
func checkTolerance(dt pb.TensorProto_DataType, peak float64) (rtol, atol float64, halfTokens bool) {
	if rel, ok := eval.HalfTolerance(dt); ok {
		return rel, rel * peak, true
	}
	return CheckTolerance.RTol, CheckTolerance.ATol, false
}

// tokensOff counts the tokens (rows of H values) with an element past the
// tolerance, skipping those skip says may differ, and returns the worst
// excess among the counted ones and its element.
func tokensOff(got, want []float32, H int, rtol, atol float64, skip func(token int) bool) (off int, worst float64, at int) {
	at = -1
	for t := 0; t*H < len(want); t++ {
		if skip != nil && skip(t) {
			continue
		}
		bad := false
		for j := t * H; j < (t+1)*H && j < len(want); j++ {
			d := math.Abs(float64(got[j]) - float64(want[j]))
			if d > atol+rtol*math.Abs(float64(want[j])) {
				bad = true
				if d > worst {
					worst, at = d, j
				}
			}
		}
		if bad {
			off++
		}
	}
	return off, worst, at
}

// nearTie is the relative selection gap (moe.RouteGaps) below which a
// half-precision graph's rounded router may choose other experts than the
// float32 semantics: a few units of the type's precision.
func nearTie(dt pb.TensorProto_DataType) float64 {
	switch dt {
	case pb.TensorProto_FLOAT16:
		return 5e-3 // five float16 units (2^-10)
	case pb.TensorProto_BFLOAT16:
		return 2e-2 // under three bfloat16 units (2^-7)
	}
	return 0
}

package canon

import (
	"slices"

	"github.com/mokopt/mokopt/graph"
	pb "github.com/mokopt/mokopt/graph/onnxpb"
)

// DropNoOpCast removes a Cast to the element type its input already has.
var DropNoOpCast = Rule{
	Name: "drop-noop-cast",
	Ops:  []string{"Cast"},
	Apply: func(w *Work, n *pb.NodeProto) (bool, error) {
		if len(n.Input) != 1 {
			return false, nil
		}
		to := graph.AttrInt(n, "to", 0)
		if to == 0 || int64(w.ElemType(n.Input[0])) != to {
			return false, nil
		}
		return w.Drop(n, n.Input[0]), nil
	},
}

// DropRoundTripCast removes Cast(Cast(x, wide), type of x) where wide holds
// every value of x's type exactly (float32 through double, a half type
// through float32 or double, a narrower integer through a wider one, a
// bool through any integer): the round trip gives x back, bit for bit. A
// router or expert computed in double between casts, or an exporter's
// upcast and downcast around an op, then reads as the op on x.
var DropRoundTripCast = Rule{
	Name: "drop-roundtrip-cast",
	Ops:  []string{"Cast"},
	Apply: func(w *Work, n *pb.NodeProto) (bool, error) {
		if len(n.Input) != 1 || n.GetDomain() != "" {
			return false, nil
		}
		p := w.Producer(n.Input[0])
		if p == nil || p.GetOpType() != "Cast" || p.GetDomain() != "" || len(p.Input) != 1 {
			return false, nil
		}
		from := pb.TensorProto_DataType(w.ElemType(p.Input[0]))
		wide := pb.TensorProto_DataType(graph.AttrInt(p, "to", 0))
		if from == 0 || int64(from) != graph.AttrInt(n, "to", 0) || !holdsExactly(wide, from) {
			return false, nil
		}
		return w.Drop(n, p.Input[0]), nil
	},
}

// exactWidening lists, for a type, the types that hold each of its values
// exactly.
var exactWidening = map[pb.TensorProto_DataType][]pb.TensorProto_DataType{
	pb.TensorProto_FLOAT:    {pb.TensorProto_DOUBLE},
	pb.TensorProto_FLOAT16:  {pb.TensorProto_FLOAT, pb.TensorProto_DOUBLE},
	pb.TensorProto_BFLOAT16: {pb.TensorProto_FLOAT, pb.TensorProto_DOUBLE},
	pb.TensorProto_INT8:     {pb.TensorProto_INT16, pb.TensorProto_INT32, pb.TensorProto_INT64, pb.TensorProto_FLOAT, pb.TensorProto_DOUBLE},
	pb.TensorProto_UINT8:    {pb.TensorProto_INT16, pb.TensorProto_INT32, pb.TensorProto_INT64, pb.TensorProto_FLOAT, pb.TensorProto_DOUBLE},
	pb.TensorProto_INT16:    {pb.TensorProto_INT32, pb.TensorProto_INT64, pb.TensorProto_FLOAT, pb.TensorProto_DOUBLE},
	pb.TensorProto_INT32:    {pb.TensorProto_INT64, pb.TensorProto_DOUBLE},
	pb.TensorProto_BOOL:     {pb.TensorProto_INT8, pb.TensorProto_UINT8, pb.TensorProto_INT16, pb.TensorProto_INT32, pb.TensorProto_INT64},
}

// holdsExactly reports whether every value of from is a value of wide.
func holdsExactly(wide, from pb.TensorProto_DataType) bool {
	return slices.Contains(exactWidening[from], wide)
}

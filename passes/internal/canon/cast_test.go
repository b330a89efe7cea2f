package canon

import (
	"math/rand/v2"
	"testing"

	"github.com/mokopt/mokopt/graph"
	"github.com/mokopt/mokopt/graph/eval"
	pb "github.com/mokopt/mokopt/graph/onnxpb"
)

func TestDropRoundTripCast(t *testing.T) {
	r := rand.New(rand.NewPCG(18, 19))
	x := map[string]*eval.Tensor{"x": randF32(r, 3, 4)}
	ids := map[string]*eval.Tensor{"x": eval.NewInt64([]int{3}, []int64{-5, 0, 1 << 40})}
	cast := func(in, out string, to pb.TensorProto_DataType) *pb.NodeProto {
		return node("Cast", []string{in}, []string{out}, graph.IntAttr("to", int64(to)))
	}
	relu := node("Relu", []string{"b"}, []string{"y"})
	runRuleCases(t, []Rule{DropRoundTripCast, DropDead}, []ruleCase{
		{name: "float through double", nodes: []*pb.NodeProto{cast("x", "a", pb.TensorProto_DOUBLE), cast("a", "b", pb.TensorProto_FLOAT), relu},
			inputs: x, outputs: []string{"y"}, want: map[string]int{"Cast": 0, "Relu": 1}},
		{name: "double value still read", nodes: []*pb.NodeProto{cast("x", "a", pb.TensorProto_DOUBLE), cast("a", "b", pb.TensorProto_FLOAT), relu},
			inputs: x, outputs: []string{"y", "a"}, want: map[string]int{"Cast": 1}},
		{name: "float through float16 kept: it rounds", nodes: []*pb.NodeProto{cast("x", "a", pb.TensorProto_FLOAT16), cast("a", "b", pb.TensorProto_FLOAT), relu},
			inputs: x, outputs: []string{"y"}, noChange: true},
		{name: "int64 through int32 kept: it wraps", nodes: []*pb.NodeProto{cast("x", "a", pb.TensorProto_INT32), cast("a", "b", pb.TensorProto_INT64),
			node("Abs", []string{"b"}, []string{"y"})},
			inputs: ids, outputs: []string{"y"}, noChange: true},
		{name: "float through double to float16 kept", nodes: []*pb.NodeProto{cast("x", "a", pb.TensorProto_DOUBLE), cast("a", "y", pb.TensorProto_FLOAT16)},
			inputs: x, outputs: []string{"y"}, noChange: true},
	})
}

package moe

import (
	"testing"

	"github.com/mokopt/mokopt/graph"
	pb "github.com/mokopt/mokopt/graph/onnxpb"
)

// TestWeightTypeBody: a spec whose expert matrices are stored in a half
// type has its own overload, and its function body widens every expert
// matrix it reads with a Cast to float before any other use (ONNX Runtime
// has no MatMul of float by bfloat16); a float32 spec's body casts none.
func TestWeightTypeBody(t *testing.T) {
	base := Spec{NumExperts: 8, TopK: 2, Hidden: 64, Inter: 32, SharedInter: 32, RouterActivation: Softmax, RouterOrder: ActivationThenTopK,
		NormalizeTopK: true, RoutedScalingFactor: 1, NGroup: 1, TopKGroup: 1, Activation: SwiGLU, SwiGLUAlpha: 1, EPSize: 1, IOType: IOBFloat16}
	weights := []int{InGate, InUp, InDown, InSharedGate, InSharedUp, InSharedDown}
	for _, wt := range []string{"", IOFloat16, IOBFloat16} {
		s := base
		s.WeightType = wt
		if err := s.Validate(); err != nil {
			t.Fatal(err)
		}
		f, err := Function(&s, 18)
		if err != nil {
			t.Fatal(err)
		}
		for _, pos := range weights {
			name := InputNames[pos]
			var casts, direct int
			for _, n := range f.Node {
				for _, in := range n.Input {
					if in != name {
						continue
					}
					if n.GetOpType() == "Cast" && graph.AttrInt(n, "to", 0) == int64(pb.TensorProto_FLOAT) {
						casts++
					} else {
						direct++
					}
				}
			}
			if wt != "" && (casts != 1 || direct != 0) {
				t.Errorf("weight_type %q: %s read by %d casts to float and %d other nodes, want one cast", wt, name, casts, direct)
			}
			if wt == "" && casts != 0 {
				t.Errorf("float32 weights: %s cast %d times", name, casts)
			}
		}
		if f.GetOverload() != s.Overload() || (wt != "") != (s.Overload() != base.Overload()) {
			t.Errorf("weight_type %q: overload %q (float32 weights: %q)", wt, s.Overload(), base.Overload())
		}
		// The attribute round-trips through the node form.
		in := make([]string, NumInputs)
		copy(in, InputNames[:])
		in[InRouterB], in[InCorrectionBias], in[InGateBias], in[InUpBias], in[InDownBias], in[InSharedGateW] = "", "", "", "", "", ""
		n := graph.NewNode(OpType, Domain, "moe", in, []string{"y"}, s.Attributes()...)
		dims := map[int][]int64{InRouterW: {8, 64}, InGate: {8, 32, 64}, InUp: {8, 32, 64}, InDown: {8, 64, 32},
			InSharedGate: {32, 64}, InSharedUp: {32, 64}, InSharedDown: {64, 32}}
		got, err := SpecFromNode(n, func(pos int) []int64 { return dims[pos] })
		if err != nil {
			t.Fatal(err)
		}
		if got.WeightType != wt {
			t.Errorf("weight_type %q read back as %q", wt, got.WeightType)
		}
	}
	bad := base
	bad.WeightType = "int8"
	if bad.Validate() == nil {
		t.Error("weight_type int8 validated")
	}
}

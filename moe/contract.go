package moe

import (
	"fmt"

	"github.com/mokopt/mokopt/graph"
	pb "github.com/mokopt/mokopt/graph/onnxpb"
)

// CheckDims checks the shapes of a fused node's inputs against its spec,
// as the op contract states them (E experts, E_s = StoredExperts of them
// stored on this node, hidden size H, expert width I, shared width I_s):
//
//	hidden_states           [..., H]
//	router_weight           [E, H]
//	router_bias, router_correction_bias  [E]
//	gate, up                [E_s, I, H]
//	down                    [E_s, H, I]
//	gate_bias, up_bias      [E_s, I]
//	down_bias               [E_s, H]
//	shared_gate, shared_up  [I_s, H]
//	shared_down             [H, I_s]
//	shared_gate_weight      H values (any shape)
//
// dims gives an input's dims by position (nil: absent or unknown); a dim
// that is not positive (symbolic) is not compared. Every consumer of the
// fused node (lowering to the kernel or to ONNX Runtime, the reference
// interpreter) reads the contract through SpecFromNode, which calls this,
// so that they accept and refuse the same nodes.
func CheckDims(n *pb.NodeProto, s *Spec, dims func(pos int) []int64) error {
	E, Es, H, I, Is := int64(s.NumExperts), int64(s.StoredExperts()), int64(s.Hidden), int64(s.Inter), int64(s.SharedInter)
	want := map[int][]int64{
		InRouterW: {E, H}, InRouterB: {E}, InCorrectionBias: {E},
		InGate: {Es, I, H}, InUp: {Es, I, H}, InDown: {Es, H, I},
		InGateBias: {Es, I}, InUpBias: {Es, I}, InDownBias: {Es, H},
		InSharedGate: {Is, H}, InSharedUp: {Is, H}, InSharedDown: {H, Is},
	}
	for pos := InHidden; pos < NumInputs; pos++ {
		d := dims(pos)
		if d == nil {
			continue
		}
		bad := func(format string, args ...any) error {
			return fmt.Errorf("node %q: input %s has dims %v; %s", graph.NodeLabel(n), InputNames[pos], d, fmt.Sprintf(format, args...))
		}
		switch pos {
		case InHidden:
			if len(d) < 1 || d[len(d)-1] > 0 && d[len(d)-1] != H {
				return bad("the contract needs [..., H] with H=%d", H)
			}
		case InSharedGateW:
			n := int64(1)
			for _, v := range d {
				n *= v
			}
			if n != H {
				return bad("the contract needs H=%d values", H)
			}
		default:
			w := want[pos]
			ok := len(d) == len(w)
			for i := 0; ok && i < len(w); i++ {
				ok = d[i] <= 0 || d[i] == w[i]
			}
			if !ok {
				return bad("the contract needs %v (E=%d, stored experts %d, H=%d, I=%d, shared I=%d)", w, E, Es, H, I, Is)
			}
		}
	}
	return nil
}

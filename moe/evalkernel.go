package moe

import (
	"fmt"

	"github.com/mokopt/mokopt/graph/eval"
	pb "github.com/mokopt/mokopt/graph/onnxpb"
)

func init() { eval.Register(Domain, OpType, evalKernel) }

// evalKernel runs ai.mok::MoE in the reference interpreter with the
// reference semantics of Forward (not the function body), so that the two
// can check each other (eval.Options.PreferFunctions runs the body).
func evalKernel(_ *eval.OpContext, n *pb.NodeProto, in []*eval.Tensor) ([]*eval.Tensor, error) {
	get := func(pos int) *eval.Tensor {
		if pos < len(in) {
			return in[pos]
		}
		return nil
	}
	s, err := SpecFromNode(n, func(pos int) []int64 {
		t := get(pos)
		if t == nil {
			return nil
		}
		d := make([]int64, len(t.Shape))
		for i, v := range t.Shape {
			d[i] = int64(v)
		}
		return d
	})
	if err != nil {
		return nil, err
	}
	f32 := func(pos int) ([]float32, error) {
		t := get(pos)
		if t == nil {
			return nil, nil
		}
		if t.F32 == nil {
			return nil, fmt.Errorf("ai.mok::MoE input %s must be float", InputNames[pos])
		}
		return t.F32, nil
	}
	var w Weights
	targets := []struct {
		pos int
		dst *[]float32
	}{
		{InRouterW, &w.RouterW}, {InRouterB, &w.RouterB}, {InCorrectionBias, &w.CorrectionBias},
		{InGate, &w.Gate}, {InUp, &w.Up}, {InDown, &w.Down},
		{InGateBias, &w.GateB}, {InUpBias, &w.UpB}, {InDownBias, &w.DownB},
		{InSharedGate, &w.SharedGate}, {InSharedUp, &w.SharedUp}, {InSharedDown, &w.SharedDown}, {InSharedGateW, &w.SharedGateW},
	}
	for _, tg := range targets {
		if *tg.dst, err = f32(tg.pos); err != nil {
			return nil, err
		}
	}
	x := get(InHidden)
	if x == nil || x.F32 == nil || len(x.Shape) == 0 || x.Shape[len(x.Shape)-1] != s.Hidden {
		return nil, fmt.Errorf("ai.mok::MoE hidden_states must be float [..., %d]", s.Hidden)
	}
	s.SharedGated = w.SharedGateW != nil
	T := len(x.F32) / s.Hidden
	y, err := Forward(s, &w, x.F32, T)
	if err != nil {
		return nil, err
	}
	return []*eval.Tensor{eval.NewFloat32(append([]int(nil), x.Shape...), y)}, nil
}

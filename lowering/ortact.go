package lowering

import (
	"fmt"
	"math"

	"github.com/mokopt/mokopt/internal/ortmoe"
	"github.com/mokopt/mokopt/moe"
)

// ortActivation maps the spec's expert activation onto ONNX Runtime's MoE
// through the activation table; reason is non-empty when the op cannot
// compute it exactly.
func ortActivation(s *moe.Spec) (ortmoe.Attrs, string) {
	def := s.ActivationDef()
	if def == nil {
		return ortmoe.Attrs{}, fmt.Sprintf("the expert activation %q, which is not in the activation table", s.Activation)
	}
	m, why := def.ORT(s.ActParams())
	if why != "" {
		return ortmoe.Attrs{}, why
	}
	a := ortmoe.Attrs{K: s.TopK, Activation: m.Type,
		Normalize: s.NormalizeTopK || s.RouterOrder == moe.TopKThenActivation, Alpha: 1, Limit: float32(math.Inf(1))}
	if m.Type == ortmoe.SwiGLU {
		a.Fusion, a.Alpha, a.Beta = ortmoe.FusionInterleaved, m.Alpha, m.Beta
		if m.Limit > 0 {
			a.Limit = m.Limit
		}
	}
	return a, ""
}

// ortFC1 returns the op's attributes, the number f of fc1 rows per
// intermediate unit (2 for SwiGLU, gate row i at 2i and up row i at 2i+1;
// 1 for an ungated activation, fc1 = up) and fc1's weights and biases.
// The spec is one ORTUnsupported accepted.
func ortFC1(s *moe.Spec, w *moe.Weights) (ortmoe.Attrs, int64, []float32, []float32) {
	a, f, fc1b := ortFC1Bias(s, w)
	if f == 1 {
		return a, 1, w.Up, fc1b
	}
	E, H, I := s.NumExperts, s.Hidden, s.Inter
	fc1 := make([]float32, E*2*I*H)
	interleaveFC1(fc1, w.Gate, w.Up, E, I, H)
	return a, 2, fc1, fc1b
}

// interleaveFC1 writes into fc1 [E, 2I, H] the rows of gate and up
// ([E, I, H] each) interleaved: gate row i at 2i, up row i at 2i+1.
func interleaveFC1(fc1, gate, up []float32, E, I, H int) {
	for e := 0; e < E; e++ {
		for i := 0; i < I; i++ {
			src := (e*I + i) * H
			copy(fc1[(e*2*I+2*i)*H:], gate[src:src+H])
			copy(fc1[(e*2*I+2*i+1)*H:], up[src:src+H])
		}
	}
}

// ortFC1Bias is ortFC1 without fc1's weights (which w need not hold): the
// attributes, f, and fc1's biases (nil without expert biases).
func ortFC1Bias(s *moe.Spec, w *moe.Weights) (ortmoe.Attrs, int64, []float32) {
	a, _ := ortActivation(s)
	E, I := s.NumExperts, s.Inter
	if a.Activation != ortmoe.SwiGLU {
		var b []float32
		if s.ExpertBias {
			b = make([]float32, E*I)
			copy(b, w.UpB)
		}
		return a, 1, b
	}
	if !s.ExpertBias {
		return a, 2, nil
	}
	fc1b := make([]float32, E*2*I)
	for e := 0; e < E; e++ {
		for i := 0; i < I; i++ {
			if w.GateB != nil {
				fc1b[e*2*I+2*i] = w.GateB[e*I+i]
			}
			if w.UpB != nil {
				fc1b[e*2*I+2*i+1] = w.UpB[e*I+i]
			}
		}
	}
	return a, 2, fc1b
}

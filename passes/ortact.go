package passes

import (
	"github.com/mokopt/mokopt/internal/ortmoe"
	"github.com/mokopt/mokopt/moe"
)

// ortUngatedActs maps ONNX Runtime MoE's activation_type without fc3 onto
// the activation table: act(fc1), with fc1 the up projection. Its gelu is
// the tanh approximation.
var ortUngatedActs = map[string]string{ortmoe.Relu: moe.ReLU, ortmoe.Gelu: moe.GELUTanh, ortmoe.Silu: moe.SiLU, ortmoe.Identity: moe.Identity}

// ortGatedActs maps activation_type with fc3 (the CUDA kernels' Mixtral
// form act(fc1)·fc3, fc1 the gate) onto the table.
var ortGatedActs = map[string]string{ortmoe.Relu: moe.ReGLU, ortmoe.Gelu: moe.GeGLUTanh, ortmoe.Silu: moe.SwiGLU}

// ungate turns a plan read with fc1 as the gate into an ungated one when
// the spec's activation has no gate: fc1 (and its bias) is the up
// projection.
func ungate(plan *WeightPlan, s *moe.Spec) {
	if s.Gated() {
		return
	}
	for e := range plan.Experts {
		ep := &plan.Experts[e]
		ep.Up, ep.UpB, ep.Gate, ep.GateB = ep.Gate, ep.GateB, nil, nil
	}
}

package lowering

import (
	"fmt"

	"github.com/mokopt/mokopt/kernel"
	"github.com/mokopt/mokopt/moe"
)

// Codes of the rules only a lowering can check (kernel.Check sees a layer
// spec, not the fused node).
const (
	// CodeWeightsOnInput: the routing weight scales the expert input
	// (Llama-4); MoK applies it to the expert output, after combine.
	CodeWeightsOnInput = "WEIGHTS_ON_INPUT"
	// CodeEPAttr: the fused node was exported for a different EP size.
	CodeEPAttr = "EP_ATTR_MISMATCH"
	// CodeWeightsNotConstant: a weight is not an initializer, so it cannot be
	// quantized ahead of time.
	CodeWeightsNotConstant = "WEIGHTS_NOT_CONSTANT"
	// CodeBadSpec: the fused node's attributes or weights are inconsistent.
	CodeBadSpec = "FUSED_NODE_INVALID"
)

var loweringRules = []kernel.Constraint{
	{Code: CodeWeightsOnInput, Severity: kernel.SeverityError, Text: "router weights multiply the expert output (MoK applies them after combine), not the expert input"},
	{Code: CodeEPAttr, Severity: kernel.SeverityError, Text: "the fused node's ep_size is 1 or equals the lowering's EP size"},
	{Code: CodeWeightsNotConstant, Severity: kernel.SeverityError, Text: "routed and shared expert weights are initializers (quantized ahead of time)"},
	{Code: CodeBadSpec, Severity: kernel.SeverityError, Text: "the fused ai.mok::MoE node is well formed (moe.SpecFromNode)"},
	{Code: CodeEPShard, Severity: kernel.SeverityError, Text: "the fused node holds all experts (an EP rank's shard is merged first)"},
}

// NumberedConstraint is one rule a lowering checks, with its number.
type NumberedConstraint struct {
	// Number is the rule's 1-based position: kernel.Constraints() first, then
	// the lowering's own rules.
	Number int `json:"number"`
	kernel.Constraint
}

// Constraints returns every rule Lower checks, numbered: the kernel contract
// (kernel.Constraints, numbers 1..n in its order) followed by the rules only
// a lowering can see (weights on the expert input, EP attribute, constant
// weights, a well-formed fused node).
func Constraints() []NumberedConstraint {
	var out []NumberedConstraint
	for _, c := range kernel.Constraints() {
		out = append(out, NumberedConstraint{Number: len(out) + 1, Constraint: c})
	}
	for _, c := range loweringRules {
		out = append(out, NumberedConstraint{Number: len(out) + 1, Constraint: c})
	}
	return out
}

var ruleByCode = func() map[string]NumberedConstraint {
	m := map[string]NumberedConstraint{}
	for _, c := range Constraints() {
		m[c.Code] = c
	}
	return m
}()

// Violation is one failed rule of one block.
type Violation struct {
	// Number is the rule's number in Constraints() (0 if the code is unknown).
	Number int `json:"number"`
	// Code is the stable rule code, e.g. "H_MOD_256".
	Code string `json:"code"`
	// Severity is "error" or "warning".
	Severity kernel.Severity `json:"severity"`
	// Message states the violation with the offending numbers.
	Message string `json:"message"`
	// Constraint is the rule's text, e.g. "H % 256 == 0".
	Constraint string `json:"constraint"`
}

// String formats the violation as
// "error #8 H_MOD_256: hidden size H=64 is not a multiple of 256 (constraint: H % 256 == 0)".
func (v Violation) String() string {
	return fmt.Sprintf("%s #%d %s: %s (constraint: %s)", v.Severity, v.Number, v.Code, v.Message, v.Constraint)
}

func fromKernel(kv kernel.Violation) Violation {
	return Violation{Number: ruleByCode[kv.Code].Number, Code: kv.Code, Severity: kv.Severity, Message: kv.Message, Constraint: kv.Constraint}
}

func newViolation(code, format string, args ...any) Violation {
	c := ruleByCode[code]
	return Violation{Number: c.Number, Code: code, Severity: c.Severity, Message: fmt.Sprintf(format, args...), Constraint: c.Text}
}

// LayerSpec maps a fused node's spec to what kernel.Check needs.
func LayerSpec(s *moe.Spec) kernel.LayerSpec {
	ls := kernel.LayerSpec{
		E: s.NumExperts, K: s.TopK, H: s.Hidden, I: s.Inter,
		SharedI: s.SharedInter, SharedGated: s.SharedGated,
		Activation: s.Activation, SwiGLULimit: float64(s.SwiGLULimit), ExpertBias: s.ExpertBias,
	}
	if s.SharedInter > 0 {
		ls.NumShared = 1
	}
	return ls
}

// splittable are the error codes a lowering can work around by keeping the
// shared expert outside the kernel.
var splittable = map[string]bool{kernel.CodeSharedGated: true, kernel.CodeSharedIMismatch: true}

// checkBlock returns every violation of a block, in a stable order: the
// kernel's, then the lowering's own.
func checkBlock(s *moe.Spec, opt *Options, knobs kernel.Knobs) []Violation {
	var vs []Violation
	for _, kv := range kernel.CheckWithKnobs(LayerSpec(s), opt.Target, opt.EP, opt.TokensPerRank, knobs) {
		vs = append(vs, fromKernel(kv))
	}
	if s.WeightsOnInput {
		vs = append(vs, newViolation(CodeWeightsOnInput, "the routing weight scales the expert input (weights_on_input=1); MoK applies router_weights to the expert outputs after combine, which differs for a non-linear expert"))
	}
	if s.EPSize > 1 && s.EPSize != opt.EP {
		vs = append(vs, newViolation(CodeEPAttr, "the fused node has ep_size=%d, the lowering asks for EP=%d", s.EPSize, opt.EP))
	}
	return append(vs, shardViolation(s)...)
}

// decide classifies a block's violations: lowered as is, lowered with the
// shared expert kept outside, or not lowered (with the blocking violations).
func decide(vs []Violation) (lower, sharedOutside bool, blocking []Violation) {
	for _, v := range vs {
		if v.Severity != kernel.SeverityError {
			continue
		}
		if splittable[v.Code] {
			sharedOutside = true
			continue
		}
		blocking = append(blocking, v)
	}
	return len(blocking) == 0, sharedOutside, blocking
}

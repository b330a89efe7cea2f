package kernel

import (
	"fmt"
	"strconv"
	"strings"
)

// Severity says whether a violation blocks lowering ("error") or is worth
// knowing ("warning").
type Severity string

// The severities.
const (
	SeverityError   Severity = "error"
	SeverityWarning Severity = "warning"
)

// Violation is one failed constraint.
type Violation struct {
	// Code is a stable identifier, e.g. "H_MOD_256".
	Code string
	// Severity is SeverityError or SeverityWarning.
	Severity Severity
	// Message states the violation with the offending numbers,
	// e.g. "hidden size H=64 is not a multiple of 256".
	Message string
	// Constraint is the constraint's text, as in docs/kernel.md.
	Constraint string
}

// String formats the violation as "error H_MOD_256: message (constraint: text)".
func (v Violation) String() string {
	return fmt.Sprintf("%s %s: %s (constraint: %s)", v.Severity, v.Code, v.Message, v.Constraint)
}

// HasErrors reports whether any violation has error severity.
func HasErrors(vs []Violation) bool {
	for _, v := range vs {
		if v.Severity == SeverityError {
			return true
		}
	}
	return false
}

// Violation codes. Every code Check, CheckWithKnobs, Knobs.Validate and
// CheckEnvironment can emit is listed in Constraints.
const (
	CodeGPUArch              = "GPU_ARCH"
	CodeEPSize               = "EP_SIZE"
	CodeEPDomain             = "EP_EXCEEDS_NVLINK_DOMAIN"
	CodeEModEP               = "E_MOD_EP"
	CodeDimPositive          = "DIM_NOT_POSITIVE"
	CodeTMin                 = "T_MIN_512"
	CodeTMod                 = "T_MOD_256"
	CodeHMod                 = "H_MOD_256"
	CodeIMod                 = "I_MOD_256"
	CodeTopKRange            = "TOPK_RANGE"
	CodeTopKExceedsE         = "TOPK_EXCEEDS_E"
	CodeActivation           = "ACTIVATION_NOT_SWIGLU"
	CodeActivationGPTOSS     = "ACTIVATION_GPT_OSS"
	CodeSwiGLULimit          = "SWIGLU_LIMIT"
	CodeExpertBias           = "EXPERT_BIAS"
	CodeNoShared             = "NO_SHARED_EXPERT"
	CodeMultipleShared       = "MULTIPLE_SHARED_EXPERTS"
	CodeSharedInconsistent   = "SHARED_SPEC_INCONSISTENT"
	CodeSharedIMismatch      = "SHARED_I_MISMATCH"
	CodeSharedGated          = "SHARED_GATED"
	CodeFwdCommSMs           = "FWD_COMM_SMS"
	CodeBwdCommSMs           = "BWD_COMM_SMS"
	CodeMinibatch            = "MINIBATCH_MOD_256"
	CodeMacrobatch           = "MACROBATCH_MOD_MINIBATCH"
	CodeCapacityMultiplier   = "CAPACITY_MULTIPLIER"
	CodeAllGatherChunk       = "ALLGATHER_CHUNK_BYTES"
	CodeMinibatchRuleOfThumb = "MINIBATCH_RULE_OF_THUMB"
	CodeCUDAVersion          = "CUDA_VERSION"
	CodePyTorchVersion       = "PYTORCH_VERSION"
	CodePythonVersion        = "PYTHON_VERSION"
)

// Constraint is one rule of the contract.
type Constraint struct {
	// Code is the violation code the rule produces.
	Code string
	// Severity is the severity of a violation of the rule.
	Severity Severity
	// Text states the rule.
	Text string
}

var constraintList = []Constraint{
	{CodeGPUArch, SeverityError, "GPU: SM100 (GB200) or SM103 (GB300) only"},
	{CodeEPSize, SeverityError, "EP size ∈ {1, 4, 8, 16, 32, 64} (so at most 64 GPUs of a 72-GPU rack)"},
	{CodeEPDomain, SeverityError, "the EP group lies inside one NVLink domain"},
	{CodeEModEP, SeverityError, "E % EP == 0; contiguous expert placement"},
	{CodeDimPositive, SeverityError, "E, H, I > 0 and T ≥ 0 (T = 0: not known yet, not checked)"},
	{CodeTMin, SeverityError, "T (tokens per rank) ≥ 512, same T on every rank (static)"},
	{CodeTMod, SeverityError, "T % 256 == 0"},
	{CodeHMod, SeverityError, "H % 256 == 0"},
	{CodeIMod, SeverityError, "I % 256 == 0"},
	{CodeTopKRange, SeverityError, "1 ≤ k ≤ 255"},
	{CodeTopKExceedsE, SeverityError, "k ≤ E (k distinct experts per token)"},
	{CodeActivation, SeverityError, "Activation: SwiGLU only (silu(gate) * up), optional clamp swiglu_limit; no GELU"},
	{CodeActivationGPTOSS, SeverityError, "no GPT-OSS alpha / +1 SwiGLU form"},
	{CodeSwiGLULimit, SeverityError, "swiglu_limit is absent or non-negative (gate ≤ limit, −limit ≤ up ≤ limit)"},
	{CodeExpertBias, SeverityError, "no expert biases"},
	{CodeNoShared, SeverityWarning, "exactly one shared expert"},
	{CodeMultipleShared, SeverityError, "exactly one shared expert"},
	{CodeSharedInconsistent, SeverityError, "the layer spec describes its shared expert consistently"},
	{CodeSharedIMismatch, SeverityError, "the shared expert has the same I as the routed experts"},
	{CodeSharedGated, SeverityError, "the shared expert is ungated"},
	{CodeFwdCommSMs, SeverityError, "fwd_num_comm_sms: even, < SM count"},
	{CodeBwdCommSMs, SeverityError, "bwd_num_comm_sms: even, < SM count"},
	{CodeMinibatch, SeverityError, "minibatch_size: multiple of 256"},
	{CodeMacrobatch, SeverityError, "macrobatch_size: multiple of minibatch_size"},
	{CodeCapacityMultiplier, SeverityError, "schedule_capacity_multiplier > 0"},
	{CodeAllGatherChunk, SeverityError, "all_gather_top_experts_chunk_bytes > 0"},
	{CodeMinibatchRuleOfThumb, SeverityWarning, "minibatch rule of thumb: T_mb ≥ 2·C·128·256 / min(2I, H), C = SM count"},
	{CodeCUDAVersion, SeverityError, "CUDA ≥ 13.0"},
	{CodePyTorchVersion, SeverityError, "PyTorch ≥ 2.10"},
	{CodePythonVersion, SeverityError, "Python ≥ 3.12"},
}

var constraintByCode = func() map[string]Constraint {
	m := make(map[string]Constraint, len(constraintList))
	for _, c := range constraintList {
		m[c.Code] = c
	}
	return m
}()

// Constraints returns every rule the checks enforce, one per violation code.
// Two rules of docs/kernel.md cannot be checked from a layer spec and are left to
// the runtime: "same T on every rank" and "contiguous expert placement" (this
// package's tensor table states the placement, expert e on rank e / E_l).
func Constraints() []Constraint { return append([]Constraint(nil), constraintList...) }

// Activation names a LayerSpec can carry.
const (
	ActivationSwiGLU        = "swiglu"         // silu(gate) * up
	ActivationSwiGLUClamped = "swiglu_clamped" // with swiglu_limit clamping
	ActivationSwiGLUOAI     = "swiglu_oai"     // GPT-OSS: (up + 1) * gate * sigmoid(alpha * gate)
	ActivationGELU          = "gelu"
)

// LayerSpec is what Check needs to know about one MoE layer.
type LayerSpec struct {
	// E is the number of routed experts (global).
	E int
	// K is top-k, the number of routed experts per token.
	K int
	// H is the hidden size.
	H int
	// I is the intermediate size of each routed expert.
	I int
	// SharedI is the intermediate size of each shared expert (0 if none).
	SharedI int
	// SharedGated is true when the shared expert's output is multiplied by a
	// learned gate (e.g. Qwen2-MoE's sigmoid shared_expert_gate).
	SharedGated bool
	// Activation is one of the Activation* names, or anything else (refused).
	Activation string
	// SwiGLULimit is the clamp of a clamped SwiGLU (0: none).
	SwiGLULimit float64
	// ExpertBias is true when the routed experts' projections have biases.
	ExpertBias bool
	// NumShared is the number of shared experts.
	NumShared int
}

// Check verifies a layer against every hard constraint of docs/kernel.md for a
// target, an EP size and tokens per rank (0 when not known: the T rules are then
// skipped), with the default knobs. It returns all violations, errors and
// warnings, in a stable order; none means MoK can run the layer.
func Check(spec LayerSpec, target Target, ep int, tokensPerRank int) []Violation {
	return CheckWithKnobs(spec, target, ep, tokensPerRank, DefaultKnobs())
}

// CheckWithKnobs is Check with explicit knobs, which are validated too.
func CheckWithKnobs(spec LayerSpec, target Target, ep int, tokensPerRank int, knobs Knobs) []Violation {
	var vs []Violation
	add := func(code, format string, args ...any) { vs = append(vs, violation(code, format, args...)) }

	if !target.Supported {
		add(CodeGPUArch, "target %s is %s (%s); MoK needs SM100 (GB200) or SM103 (GB300)", target.Name, target.Arch(), target.GPU)
	}
	switch ep {
	case 1, 4, 8, 16, 32, 64:
		if target.DomainGPUs > 0 && ep > target.DomainGPUs {
			add(CodeEPDomain, "EP=%d exceeds the %d GPUs of one NVLink domain of %s", ep, target.DomainGPUs, target.Name)
		}
	default:
		add(CodeEPSize, "EP size %d is not one of 1, 4, 8, 16, 32, 64", ep)
	}
	for _, d := range []struct {
		name string
		v    int
	}{{"number of experts E", spec.E}, {"hidden size H", spec.H}, {"intermediate size I", spec.I}} {
		if d.v <= 0 {
			add(CodeDimPositive, "%s=%d is not positive", d.name, d.v)
		}
	}
	if tokensPerRank < 0 {
		add(CodeDimPositive, "tokens per rank T=%d is negative", tokensPerRank)
	}
	if spec.E > 0 && ep > 0 && spec.E%ep != 0 {
		add(CodeEModEP, "E=%d experts do not divide evenly over EP=%d ranks", spec.E, ep)
	}
	if tokensPerRank > 0 {
		if tokensPerRank < 512 {
			add(CodeTMin, "tokens per rank T=%d is below 512", tokensPerRank)
		}
		if tokensPerRank%256 != 0 {
			add(CodeTMod, "tokens per rank T=%d is not a multiple of 256", tokensPerRank)
		}
	}
	if spec.H > 0 && spec.H%256 != 0 {
		add(CodeHMod, "hidden size H=%d is not a multiple of 256", spec.H)
	}
	if spec.I > 0 && spec.I%256 != 0 {
		add(CodeIMod, "intermediate size I=%d is not a multiple of 256", spec.I)
	}
	if spec.K < 1 || spec.K > 255 {
		add(CodeTopKRange, "top-k k=%d is outside 1..255", spec.K)
	} else if spec.E > 0 && spec.K > spec.E {
		add(CodeTopKExceedsE, "top-k k=%d exceeds the E=%d experts", spec.K, spec.E)
	}

	switch act := strings.ToLower(spec.Activation); act {
	case ActivationSwiGLU, ActivationSwiGLUClamped:
		if spec.SwiGLULimit < 0 {
			add(CodeSwiGLULimit, "swiglu_limit=%v is negative", spec.SwiGLULimit)
		}
	case ActivationSwiGLUOAI:
		add(CodeActivationGPTOSS, "activation %q is the GPT-OSS SwiGLU ((up + 1)·gate·sigmoid(alpha·gate)), which MoK does not implement", spec.Activation)
	case "":
		add(CodeActivation, "activation not given; MoK computes silu(gate)·up")
	default:
		add(CodeActivation, "activation %q is not SwiGLU; MoK computes silu(gate)·up only", spec.Activation)
	}
	if spec.ExpertBias {
		add(CodeExpertBias, "routed experts have biases; MoK's expert GEMMs have none")
	}

	switch {
	case spec.NumShared < 0:
		add(CodeSharedInconsistent, "NumShared=%d is negative", spec.NumShared)
	case spec.NumShared == 0 && spec.SharedI != 0:
		add(CodeSharedInconsistent, "SharedI=%d given but NumShared=0", spec.SharedI)
	case spec.NumShared == 0:
		add(CodeNoShared, "the layer has no shared expert, but MoK always runs one: lower with zero shared weights "+
			"(correct, since silu(0)·0 = 0, but it spends 1/(k+1) = 1/%d of the FLOPs on nothing) or keep the layer unfused", spec.K+1)
	case spec.NumShared > 1:
		add(CodeMultipleShared, "%d shared experts: they equal one shared expert of width %d·I=%d, wider than the routed I=%d, which MoK cannot run",
			spec.NumShared, spec.NumShared, spec.NumShared*spec.SharedI, spec.I)
	}
	if spec.NumShared >= 1 {
		if spec.SharedI != spec.I {
			add(CodeSharedIMismatch, "shared expert intermediate size %d differs from the routed I=%d; keep the shared expert outside the kernel", spec.SharedI, spec.I)
		}
		if spec.SharedGated {
			add(CodeSharedGated, "the shared expert is gated; keep it (or its gate) outside the kernel")
		}
	}

	h, i := spec.H, spec.I
	if h%256 != 0 || i%256 != 0 {
		h, i = 0, 0 // no rule of thumb for shapes that are refused anyway
	}
	vs = append(vs, knobs.Validate(target, h, i)...)
	return vs
}

// Environment is the software stack on the machines that will run the kernel.
type Environment struct {
	// CUDA is the CUDA version, e.g. "13.0".
	CUDA string
	// PyTorch is the PyTorch version, e.g. "2.10.0+cu130".
	PyTorch string
	// Python is the Python version, e.g. "3.12.3".
	Python string
}

// CheckEnvironment checks MoK's software requirements: CUDA ≥ 13.0, PyTorch ≥
// 2.10, Python ≥ 3.12. An empty field is not checked; an unparsable one is a
// violation.
func CheckEnvironment(env Environment) []Violation {
	var vs []Violation
	for _, c := range []struct {
		code, what, have string
		major, minor     int
	}{
		{CodeCUDAVersion, "CUDA", env.CUDA, 13, 0},
		{CodePyTorchVersion, "PyTorch", env.PyTorch, 2, 10},
		{CodePythonVersion, "Python", env.Python, 3, 12},
	} {
		if c.have == "" {
			continue
		}
		ma, mi, ok := parseVersion(c.have)
		if !ok {
			vs = append(vs, violation(c.code, "%s version %q cannot be parsed", c.what, c.have))
		} else if ma < c.major || (ma == c.major && mi < c.minor) {
			vs = append(vs, violation(c.code, "%s %s is older than %d.%d", c.what, c.have, c.major, c.minor))
		}
	}
	return vs
}

// parseVersion reads "MAJOR.MINOR[.anything]" (a leading "v" allowed).
func parseVersion(s string) (major, minor int, ok bool) {
	s = strings.TrimPrefix(strings.TrimSpace(s), "v")
	parts := strings.SplitN(s, ".", 3)
	if len(parts) < 2 {
		return 0, 0, false
	}
	major, err1 := strconv.Atoi(parts[0])
	minorText := parts[1]
	if j := strings.IndexFunc(minorText, func(r rune) bool { return r < '0' || r > '9' }); j >= 0 {
		minorText = minorText[:j]
	}
	minor, err2 := strconv.Atoi(minorText)
	return major, minor, err1 == nil && err2 == nil
}

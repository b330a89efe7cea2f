package mokopt

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"strings"

	"github.com/mokopt/mokopt/graph"
	"github.com/mokopt/mokopt/kernel"
	"github.com/mokopt/mokopt/lowering"
)

// Target names what Lower binds fused nodes to: a rack the MoK kernel runs
// on, or ONNX Runtime. Targets lists every name Lower and ParseTarget take.
type Target string

// Targets Lower knows.
const (
	// TargetGB300NVL72 is a GB300 NVL72 rack (72 B300 GPUs, SM103) for the
	// MoK kernel.
	TargetGB300NVL72 Target = "gb300-nvl72"
	// TargetGB200NVL72 is a GB200 NVL72 rack (72 B200 GPUs, SM100) for the
	// MoK kernel.
	TargetGB200NVL72 Target = "gb200-nvl72"
	// TargetORT is ONNX Runtime: Lower writes its com.microsoft::MoE or
	// QMoE (LowerOptions.Quant) instead of the MoK kernel's node.
	TargetORT Target = lowering.TargetORT
)

// Targets returns the names Lower takes, in the order the command lists
// them: the racks the MoK kernel runs on, then ONNX Runtime.
func Targets() []Target {
	var out []Target
	for _, t := range kernel.Targets() {
		if t.Supported {
			out = append(out, Target(t.Name))
		}
	}
	return append(out, TargetORT)
}

// IsMoK reports whether t is a rack the MoK kernel runs on (not ONNX
// Runtime).
func (t Target) IsMoK() bool { return t != TargetORT }

// ParseTarget checks a target name: one of Targets. A machine the kernel
// package knows but MoK does not run on (h200, an HGX H200 node: SM90) is
// refused with the reason.
func ParseTarget(name string) (Target, error) {
	known := Targets()
	for _, t := range known {
		if string(t) == name {
			return t, nil
		}
	}
	if t, err := kernel.LookupTarget(name); err == nil {
		return "", fmt.Errorf("target %q: the MoK kernel does not run there (%s); targets: %s", name, t.Note, targetList(known))
	}
	return "", fmt.Errorf("unknown target %q (targets: %s)", name, targetList(known))
}

// targetList joins target names with commas.
func targetList(ts []Target) string {
	s := make([]string, len(ts))
	for i, t := range ts {
		s[i] = string(t)
	}
	return strings.Join(s, ", ")
}

// LowerReport is what Lower did per fused node: for a MoK target the
// embedded *lowering.Report (per block the kernel constraints checked, and
// the launch plan), for TargetORT ORT (per block the ONNX Runtime op
// written). Its JSON is the set one's.
type LowerReport struct {
	*lowering.Report
	// ORT is set, and Report nil, for TargetORT.
	ORT *ORTReport
}

// ORTReport is what Lower did per fused node for TargetORT.
type ORTReport = lowering.ORTReport

// Lowered returns how many fused nodes were lowered.
func (r LowerReport) Lowered() int {
	if r.ORT != nil {
		n := 0
		for _, b := range r.ORT.Blocks {
			if b.Lowered {
				n++
			}
		}
		return n
	}
	return r.Report.Lowered()
}

// Summary is a one-line-per-block account, as the command prints it.
func (r LowerReport) Summary() string {
	if r.ORT != nil {
		return r.ORT.Summary()
	}
	return r.Report.Summary()
}

// String is Summary, so that %v prints the account.
func (r LowerReport) String() string { return r.Summary() }

// MarshalJSON writes the report of the target lowered to.
func (r LowerReport) MarshalJSON() ([]byte, error) {
	if r.ORT != nil {
		return json.Marshal(r.ORT)
	}
	return json.Marshal(r.Report)
}

// LowerOptions control Lower.
type LowerOptions struct {
	// EP is the expert-parallel group size (1, 4, 8, 16, 32 or 64); 0
	// picks one (PickEP). MoK targets only.
	EP int
	// TokensPerRank is the static tokens per rank T; 0 when unknown. MoK
	// targets only.
	TokensPerRank int
	// Strict refuses the whole model (a *KernelConstraintError, m
	// unchanged) when any block violates an error-severity rule. MoK
	// targets only.
	Strict bool
	// Partial keeps the fused nodes the target cannot take as ai.mok::MoE,
	// with warnings in the report. Without it Lower is all-or-nothing, as
	// Rewrite is: when some fused node cannot be lowered it returns an
	// error (a *KernelConstraintError for MoK targets, one wrapping
	// ErrORTUnsupported for TargetORT) and m is unchanged.
	Partial bool
	// Quant is "" (float com.microsoft::MoE), "int8" or "int4"
	// (com.microsoft::QMoE). TargetORT only.
	Quant string
	// BlockSize is QMoE's block-wise scale size (a power of two >= 16); 0
	// means one scale per output row. TargetORT with Quant only.
	BlockSize int
	// Progress, when set, receives "lower" events (blocks examined). The
	// quantization of the routed experts runs when the model is saved, and
	// is reported by SaveOptions.Progress.
	Progress Progress
}

// Lower binds the fused ai.mok::MoE nodes of m to target.
//
// For a MoK target it binds each node that the MoK kernel can take
// to the kernel: the router as standard ops, routed experts
// quantized to MXFP8 and the shared expert to BF16 (both computed when m
// is saved, so Save's context cancels them), one
// ai.mok::MoKDispatchFFNCombine node with the kernel knobs. A fused node
// the kernel cannot take refuses the model unless Partial keeps it
// unlowered, with warnings in the report.
//
// For TargetORT it replaces each node by ONNX Runtime's com.microsoft::MoE
// (or QMoE with Quant's int8/int4 weights), the router as a standard Gemm
// and a shared expert as standard ops beside it, so the model runs on ONNX
// Runtime's own kernel ([docs/ort-target.md]).
//
// An option the target does not use (EP, TokensPerRank or Strict for ONNX
// Runtime, Quant or BlockSize for MoK) is refused, as is an unknown target.
func Lower(ctx context.Context, m *Model, target Target, opt LowerOptions) (*LowerReport, error) {
	if err := errCtx(ctx); err != nil {
		return nil, err
	}
	if _, err := ParseTarget(string(target)); err != nil {
		return nil, err
	}
	if err := opt.check(target); err != nil {
		return nil, err
	}
	if target == TargetORT {
		return lowerORT(ctx, m, opt)
	}
	tgt, err := kernel.LookupTarget(string(target))
	if err != nil {
		return nil, err
	}
	if opt.EP == 0 {
		if opt.EP, _, err = lowering.PickEP(m.g, tgt); err != nil {
			return nil, err
		}
	}
	rep0, err := lowering.Lower(m.g, lowering.Options{Target: tgt, EP: opt.EP, TokensPerRank: opt.TokensPerRank, Strict: opt.Strict, RequireAll: !opt.Partial})
	var rep *LowerReport
	if rep0 != nil {
		rep = &LowerReport{Report: rep0}
	}
	if rep != nil {
		opt.Progress.report(StageLower, len(rep.Blocks), len(rep.Blocks))
	}
	if err != nil {
		if errors.Is(err, lowering.ErrRefused) && rep != nil {
			e := &KernelConstraintError{Report: rep, err: err}
			for _, b := range rep.Blocks {
				for _, v := range b.Violations {
					if v.Severity == kernel.SeverityError {
						e.Violations = append(e.Violations, ConstraintViolation{Node: b.Node, Violation: v})
					}
				}
			}
			return rep, e
		}
		return rep, err
	}
	if err := ctx.Err(); err != nil {
		return rep, err
	}
	return rep, nil
}

// SavePlan writes rep's launch plan as indented JSON to path atomically
// ("-": standard output).
func SavePlan(path string, rep *LowerReport) error {
	if rep.Report == nil {
		return fmt.Errorf("lower: target %s has no launch plan (MoK targets only)", TargetORT)
	}
	b, err := json.MarshalIndent(rep.Plan, "", "  ")
	if err != nil {
		return err
	}
	b = append(b, '\n')
	if path == Stdio {
		_, err := os.Stdout.Write(b)
		return err
	}
	return graph.WriteFileAtomic(path, b)
}

// check refuses the options target does not use, naming them.
func (opt LowerOptions) check(target Target) error {
	var unused []string
	if target.IsMoK() {
		if opt.Quant != "" {
			unused = append(unused, "Quant")
		}
		if opt.BlockSize != 0 {
			unused = append(unused, "BlockSize")
		}
	} else {
		if opt.EP != 0 {
			unused = append(unused, "EP")
		}
		if opt.TokensPerRank != 0 {
			unused = append(unused, "TokensPerRank")
		}
		if opt.Strict {
			unused = append(unused, "Strict")
		}
	}
	if len(unused) > 0 {
		return fmt.Errorf("lower: target %s does not use LowerOptions.%s", target, strings.Join(unused, ", LowerOptions."))
	}
	return nil
}

// ErrORTUnsupported is wrapped by Lower's error for TargetORT when a fused
// node has semantics ONNX Runtime's MoE op cannot express (the error names
// the node and the semantics); m is then unchanged unless Partial is set.
var ErrORTUnsupported = lowering.ErrORTUnsupported

// lowerORT is Lower for TargetORT.
func lowerORT(ctx context.Context, m *Model, opt LowerOptions) (*LowerReport, error) {
	rep, err := lowering.LowerORT(m.g, lowering.ORTOptions{Quant: opt.Quant, BlockSize: opt.BlockSize, Partial: opt.Partial})
	var out *LowerReport
	if rep != nil {
		out = &LowerReport{ORT: rep}
		opt.Progress.report(StageLower, len(rep.Blocks), len(rep.Blocks))
	}
	if err != nil {
		return out, err
	}
	if err := ctx.Err(); err != nil {
		return out, err
	}
	return out, nil
}

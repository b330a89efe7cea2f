package mokopt

import (
	"context"
	"encoding/json"
	"errors"
	"os"

	"github.com/mokopt/mokopt/graph"
	"github.com/mokopt/mokopt/kernel"
	"github.com/mokopt/mokopt/lowering"
)

// Target names the machine Lower binds fused nodes to.
type Target string

// Targets Lower knows.
const (
	TargetGB300NVL72 Target = "gb300-nvl72"
	TargetGB200NVL72 Target = "gb200-nvl72"
)

// ParseTarget checks a target name ("gb300-nvl72" or "gb200-nvl72").
func ParseTarget(name string) (Target, error) {
	if _, err := kernel.LookupTarget(name); err != nil {
		return "", err
	}
	return Target(name), nil
}

// LowerReport is what Lower did per fused node, with the launch plan.
type LowerReport = lowering.Report

// LowerOptions control Lower.
type LowerOptions struct {
	// EP is the expert-parallel group size (1, 4, 8, 16, 32 or 64).
	EP int
	// TokensPerRank is the static tokens per rank T; 0 when unknown.
	TokensPerRank int
	// Strict refuses the whole model (a *KernelConstraintError, m
	// unchanged) when any block violates an error-severity rule.
	Strict bool
	// Partial keeps the fused nodes the kernel cannot take as ai.mok::MoE,
	// with warnings in the report. Without it Lower is all-or-nothing, as
	// Rewrite is: when some fused node cannot be lowered it returns a
	// *KernelConstraintError and m is unchanged.
	Partial bool
	// Progress, when set, receives "lower" events (blocks examined). The
	// quantization of the routed experts runs when the model is saved, and
	// is reported by SaveOptions.Progress.
	Progress Progress
}

// Lower binds each fused ai.mok::MoE node of m that the MoK kernel can take
// to the kernel for target: the router as standard ops, routed experts
// quantized to MXFP8 and the shared expert to BF16 (both computed when m
// is saved, so Save's context cancels them), one
// ai.mok::MoKDispatchFFNCombine node with the kernel knobs. A fused node
// the kernel cannot take refuses the model unless Partial keeps it
// unlowered, with warnings in the report.
func Lower(ctx context.Context, m *Model, target Target, opt LowerOptions) (*LowerReport, error) {
	if err := errCtx(ctx); err != nil {
		return nil, err
	}
	tgt, err := kernel.LookupTarget(string(target))
	if err != nil {
		return nil, err
	}
	rep, err := lowering.Lower(m.g, lowering.Options{Target: tgt, EP: opt.EP, TokensPerRank: opt.TokensPerRank, Strict: opt.Strict, RequireAll: !opt.Partial})
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

// TargetORT names ONNX Runtime as a lowering target: LowerORT, not Lower,
// binds fused nodes to it.
const TargetORT Target = "ort"

// ORTOptions control LowerORT (quantization, partial lowering).
type ORTOptions = lowering.ORTOptions

// ORTReport is what LowerORT did per fused node.
type ORTReport = lowering.ORTReport

// ErrORTUnsupported is wrapped by LowerORT's error when a fused node has
// semantics ONNX Runtime's MoE op cannot express (the error names the node
// and the semantics); m is then unchanged unless ORTOptions.Partial is set.
var ErrORTUnsupported = lowering.ErrORTUnsupported

// LowerORT replaces each fused ai.mok::MoE node of m by ONNX Runtime's
// com.microsoft::MoE (or QMoE with int8/int4 weights), the router as a
// standard Gemm and a shared expert as standard ops beside it, so the model
// runs on ONNX Runtime's own kernel.
func LowerORT(ctx context.Context, m *Model, opt ORTOptions) (*ORTReport, error) {
	if err := errCtx(ctx); err != nil {
		return nil, err
	}
	rep, err := lowering.LowerORT(m.g, opt)
	if err != nil {
		return rep, err
	}
	if err := ctx.Err(); err != nil {
		return rep, err
	}
	return rep, nil
}

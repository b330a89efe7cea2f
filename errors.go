package mokopt

import (
	"errors"
	"fmt"
	"strings"

	"github.com/mokopt/mokopt/graph"
	"github.com/mokopt/mokopt/internal/verify"
	"github.com/mokopt/mokopt/lowering"
	"github.com/mokopt/mokopt/passes"
)

// InputError describes a malformed or unreadable input, naming the file and,
// where known, the node or tensor. errors.Is(err, ErrBadInput) holds for it.
type InputError = graph.InputError

// ErrBadInput is the class of every error caused by a malformed or hostile
// input file.
var ErrBadInput = graph.ErrBadInput

// ErrUnsupportedPattern is the class of *UnsupportedPatternError.
var ErrUnsupportedPattern = passes.ErrNotFused

// ErrKernelConstraint is the class of *KernelConstraintError.
var ErrKernelConstraint = lowering.ErrRefused

// ErrMismatch is the class of *MismatchError.
var ErrMismatch = errors.New("outputs differ")

// Candidate is an MoE candidate that was not fused, with the reason.
type Candidate = passes.NearMiss

// UnsupportedPatternError is returned by Rewrite when, without Partial, some
// MoE candidate could not be fused (a near-miss of the detector or a block
// refused by the weight reader or the numerical check); the model is then
// unchanged. Report holds what was found.
type UnsupportedPatternError struct {
	// File is the model's name.
	File string
	// Candidates lists every candidate not fused, with its reason.
	Candidates []Candidate
	// Report is the rewrite report.
	Report *RewriteReport
	err    error
}

// Error names the candidates and their reasons.
func (e *UnsupportedPatternError) Error() string { return e.err.Error() }

// Unwrap makes errors.Is(err, ErrUnsupportedPattern) hold.
func (e *UnsupportedPatternError) Unwrap() error { return e.err }

// ConstraintViolation is a violated rule of the MoK kernel contract on one
// fused node.
type ConstraintViolation struct {
	// Node is the fused node's name.
	Node string `json:"node"`
	lowering.Violation
}

// String formats the violation with its node, number and code.
func (v ConstraintViolation) String() string { return v.Node + ": " + v.Violation.String() }

// KernelConstraintError is returned by Lower when the kernel contract
// refuses the model: with Strict, some block violates an error-severity
// rule; without Partial, some fused node cannot be lowered. The model is
// then unchanged.
type KernelConstraintError struct {
	// Violations lists every error-severity violation, in graph order.
	Violations []ConstraintViolation
	// Report is the lowering report.
	Report *LowerReport
	err    error
}

// Error lists the violations with their numbers and codes.
func (e *KernelConstraintError) Error() string { return e.err.Error() }

// Unwrap makes errors.Is(err, ErrKernelConstraint) hold.
func (e *KernelConstraintError) Unwrap() error { return e.err }

// Codes returns the codes of the violated constraints, in order (with repeats).
func (e *KernelConstraintError) Codes() []string {
	var out []string
	for _, v := range e.Violations {
		out = append(out, v.Code)
	}
	return out
}

// OutputMismatch is one output of one case that failed Verify's check.
type OutputMismatch struct {
	// Case names the inputs ("tokens=7", a data set folder).
	Case string
	verify.OutputCheck
}

// MismatchError is returned by Verify (and Run) when outputs differ; the
// report is returned alongside it.
type MismatchError struct {
	// Outputs lists every failing output of every case.
	Outputs []OutputMismatch
	// Messages holds case-level failures (e.g. differing output counts).
	Messages []string
	// Report is the full verification report.
	Report *VerifyReport
}

// Error names the worst failing output.
func (e *MismatchError) Error() string {
	if len(e.Outputs) == 0 {
		if len(e.Messages) > 0 {
			return "outputs differ: " + strings.Join(e.Messages, "; ")
		}
		return "outputs differ"
	}
	w := e.Outputs[0]
	for _, o := range e.Outputs[1:] {
		if o.MaxAbsErr > w.MaxAbsErr {
			w = o
		}
	}
	return fmt.Sprintf("outputs differ in %d output(s); worst: %s output %d %s, max abs err %.3g at %v (%d of %d elements off)",
		len(e.Outputs), w.Case, w.Index, w.NameA, float64(w.MaxAbsErr), w.WorstMultiIndex, w.Mismatches, w.Elements)
}

// Is makes errors.Is(err, ErrMismatch) hold.
func (e *MismatchError) Is(target error) bool { return target == ErrMismatch }

func mismatchError(rep *VerifyReport) *MismatchError {
	e := &MismatchError{Report: rep}
	for _, c := range rep.Cases {
		for _, o := range c.Outputs {
			if !o.Pass {
				e.Outputs = append(e.Outputs, OutputMismatch{Case: c.Name, OutputCheck: o})
			}
		}
		if !c.Pass && c.Message != "" {
			e.Messages = append(e.Messages, c.Name+": "+c.Message)
		}
	}
	return e
}

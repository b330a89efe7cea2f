package mokopt

import (
	"context"
	"errors"

	"github.com/mokopt/mokopt/graph"
	"github.com/mokopt/mokopt/graph/eval"
	"github.com/mokopt/mokopt/internal/verify"

	"github.com/mokopt/mokopt/passes"
)

// RewriteReport is what Rewrite did: the fused blocks, near-misses, refused
// candidates and warnings.
type RewriteReport = passes.Report

// RewriteOptions control Rewrite.
type RewriteOptions struct {
	// Partial fuses the blocks that pass and reports the rest, instead of
	// refusing the whole model when any candidate fails.
	Partial bool
	// SkipCheck skips each block's numerical check (the original model on
	// random inputs, or CheckData's, in the reference interpreter against
	// the fused node's reference semantics), which otherwise runs before
	// the model is edited: the zero value is the safe behaviour. Skipping
	// it saves time and memory on big models (the stacked weights are then
	// streamed, not read); verify a same-shape small model instead.
	SkipCheck bool
	// RestoreTracedExperts rebuilds, with a warning, blocks whose
	// TorchScript trace computes fewer experts than the stacked weights
	// hold, instead of refusing them.
	RestoreTracedExperts bool
	// Progress, when set, receives detect, weights, check and fuse events.
	Progress Progress
	// EPTable names the EP collectives to recognise (nil: the defaults).
	EPTable *EPTable
	// CheckData, when set, is an ONNX test data folder (input_N.pb files,
	// or test_data_set_* folders of them) whose inputs the numerical check
	// runs the original model on instead of random inputs: for graphs that
	// only run on inputs like their export's (traces).
	CheckData string
	// MemLimit caps, in bytes, the tensors the numerical check's
	// interpreter holds at once (eval.Options.MemLimit); a check that needs
	// more fails with an error wrapping eval.ErrMemLimit. 0 means no limit.
	MemLimit int64
	// StreamWeights has the fused weights that are read from tensors
	// stored inside the model written from those sources when the model is
	// saved, instead of copied during Rewrite (weights read from side files
	// always are): less memory and time when the model is saved right
	// after. Until it is saved, only Save and Encode can write it (its
	// fused initializers hold no data yet for anything else to read).
	StreamWeights bool
}

// Rewrite finds every MoE block of m and replaces each with one fused
// ai.mok::MoE node carrying a model-local function (its decomposition in
// standard ONNX ops), stacked canonical weights and provenance. Without
// Partial, a candidate that cannot be fused refuses the whole model with
// an *UnsupportedPatternError and m is unchanged. Bad input gives an
// *InputError. A cancelled ctx returns its error; m may then be partly
// edited and must be discarded.
func Rewrite(ctx context.Context, m *Model, opt RewriteOptions) (*RewriteReport, error) {
	if err := errCtx(ctx); err != nil {
		return nil, err
	}
	po, err := opt.passes(ctx, m)
	if err != nil {
		return nil, err
	}
	rep, err := passes.Rewrite(m.g, po)
	return rep, rewriteError(ctx, m, rep, err)
}

// passes converts opt to the passes' options, reading CheckData's inputs
// for m.
func (opt RewriteOptions) passes(ctx context.Context, m *Model) (passes.Options, error) {
	po := passes.Options{Partial: opt.Partial, Check: !opt.SkipCheck, Context: ctx, RestoreTracedExperts: opt.RestoreTracedExperts, EPTable: opt.EPTable, MemLimit: opt.MemLimit, StreamWeights: opt.StreamWeights}
	if opt.CheckData != "" {
		sets, err := verify.DataSets(opt.CheckData)
		if err != nil {
			return po, err
		}
		for _, ds := range sets {
			feeds, err := eval.Feeds(m.g, ds.Inputs, ds.InputNames)
			if err != nil {
				return po, err
			}
			po.CheckData = append(po.CheckData, feeds)
		}
	}
	if opt.Progress != nil {
		po.Progress = func(stage string, done, total int) { opt.Progress.report(stage, done, total) }
	}
	return po, nil
}

// rewriteError is the error Rewrite returns for the passes' err on m.
func rewriteError(ctx context.Context, m *Model, rep *RewriteReport, err error) error {
	if err == nil {
		return nil
	}
	if errors.Is(err, passes.ErrNotFused) && rep != nil {
		var cs []Candidate
		cs = append(cs, rep.NearMiss...)
		cs = append(cs, rep.Refused...)
		return &UnsupportedPatternError{File: m.Name(), Candidates: cs, Report: rep, err: err}
	}
	if ctx.Err() != nil && !errors.Is(err, ctx.Err()) {
		return ctx.Err()
	}
	return err
}

// RewriteAndSave rewrites m as Rewrite does, then saves it to path as Save
// does. The report and errors are Rewrite's, then Save's (as a
// *SaveError); on any error nothing is written, and m may be partly edited
// and must be discarded.
//
// With the numerical check on and Partial off it is faster than Rewrite
// then Save: m is edited and written while the check runs on another
// goroutine over an unedited copy (passes.RewriteAhead), and the output is
// renamed into place (or, for standard output, copied there from where
// it was held) only once every block passed; a failed check leaves no
// output and no temporary file. The check then decides whether the
// output is committed, not what is fused, but for one case: when it moves
// a block's input (run-time shapes), the rewrite is redone the slow way on
// an unedited copy, which is written instead.
func RewriteAndSave(ctx context.Context, m *Model, path string, ropt RewriteOptions, sopt SaveOptions) (*RewriteReport, error) {
	if err := errCtx(ctx); err != nil {
		return nil, err
	}
	if ropt.Partial || ropt.SkipCheck {
		rep, err := Rewrite(ctx, m, ropt)
		if err != nil {
			return rep, err
		}
		return rep, saveError(Save(ctx, m, path, sopt))
	}
	// The check and the save report from goroutines of their own.
	serialize(&ropt.Progress, &sopt.Progress)
	po, err := ropt.passes(ctx, m)
	if err != nil {
		return nil, err
	}
	rep, wait, err := passes.RewriteAhead(m.g, po)
	if err != nil {
		return rep, rewriteError(ctx, m, rep, err)
	}
	var crep *RewriteReport
	var redone *graph.Model
	var cerr error
	waited := false
	check := func() error {
		crep, redone, cerr = wait()
		waited = true
		if cerr == nil && redone != nil {
			return errRedone // not this output: the redone one
		}
		return cerr
	}
	serr := save(ctx, m, path, sopt, check)
	if !waited {
		check() // the save failed first: the check's verdict comes before it, as in Rewrite then Save
	}
	if cerr != nil {
		return crep, rewriteError(ctx, m, crep, cerr)
	}
	if redone != nil {
		serr = save(ctx, &Model{g: redone}, path, sopt, nil)
	}
	return crep, saveError(serr)
}

// errRedone aborts the save of a model whose rewrite was redone on a copy.
var errRedone = errors.New("the rewrite was redone on an unedited copy")

// SaveError is an error of RewriteAndSave's save, after the rewrite
// succeeded; its message is the save's.
type SaveError struct{ Err error }

// Error returns the save's message.
func (e *SaveError) Error() string { return e.Err.Error() }

// Unwrap returns the save's error.
func (e *SaveError) Unwrap() error { return e.Err }

// saveError wraps a save's error (nil stays nil).
func saveError(err error) error {
	if err == nil {
		return nil
	}
	return &SaveError{Err: err}
}

package passes

import (
	"context"
	"fmt"
	"slices"

	"github.com/mokopt/mokopt/graph"
)

// RewriteAhead is Rewrite with the numerical check taken off the critical
// path: it edits m at once, without the check, while the check runs on
// another goroutine over an unedited copy (graph.Model.Fork of m's
// canonical form, which both share: the model is canonicalized once). It
// returns the edit's report, and wait, which waits for the check and
// returns the report and error Rewrite(m, opt) would have returned. The
// caller writes m meanwhile but commits it only once wait returned a nil
// error (graph.SaveOptions.Ready); on an error m must be discarded. When
// wait also returns a model, the check moved a block's input where the
// edit could not know it would (see checkBlock): the rewrite was redone,
// check included, on an unedited copy of m, and that copy, not m, is the
// output to write. (A model that cannot be forked is checked first, then
// edited, and wait only returns that result.)
//
// opt must have Check set and Partial off, the only combination in which
// the check decides whether anything is fused rather than what (with any
// block refused, nothing is), but for a moved input (above). When the edit itself fails, RewriteAhead
// waits for the check and returns what Rewrite would have (the check's
// verdict first), with a nil wait.
func RewriteAhead(m *graph.Model, opt Options) (rep *Report, wait func() (*Report, *graph.Model, error), err error) {
	if !opt.Check || opt.Partial {
		return nil, nil, fmt.Errorf("RewriteAhead needs Check on and Partial off")
	}
	ctx := opt.Context
	if ctx == nil {
		ctx = context.Background()
	}
	wc, res, skipped := canonicalView(ctx, m)
	target := m
	if wc != nil {
		target = wc
	}
	orig, ferr := target.Fork()
	// An unedited copy of m to redo the rewrite on, the slow way, should
	// the check move a block's input (below): orig itself when m is its
	// own canonical form (the check only reads it), else a fork of m.
	spare := orig
	if wc != nil && ferr == nil {
		spare, ferr = m.Fork()
	}
	if ferr != nil {
		rep, err := rewriteOn(m, wc, res, skipped, opt)
		if err != nil {
			return rep, nil, err
		}
		return rep, func() (*Report, *graph.Model, error) { return rep, nil, nil }, nil
	}
	// The check reads orig as rewriteOn would read m's canonical form.
	checkM, checkWC := orig, (*graph.Model)(nil)
	if wc != nil {
		checkM, checkWC = nil, orig
	}
	ctx, cancel := context.WithCancel(ctx)
	co := opt
	co.Context, co.checkOnly = ctx, true
	co.Progress = nil
	if opt.Progress != nil {
		co.Progress = func(stage string, done, total int) {
			if stage == "check" { // the edit reports the other stages
				opt.Progress(stage, done, total)
			}
		}
	}
	type result struct {
		rep *Report
		err error
	}
	done := make(chan result, 1)
	go func() {
		r, err := rewriteOn(checkM, checkWC, res, skipped, co)
		done <- result{r, err}
	}()
	eo := opt
	eo.Check = false
	rep, err = rewriteOn(m, wc, res, skipped, eo)
	collect := func() (*Report, *graph.Model, error) {
		defer cancel()
		c := <-done
		switch {
		case c.err != nil:
			return c.rep, nil, c.err
		case err != nil:
			return rep, nil, err
		case len(c.rep.moved) > 0:
			// The check moved a block's input to its router's (the
			// runtime shapes said so), which the edit could not know:
			// Rewrite would have fused on the moved input. Do it its
			// way on the unedited copy, whose result is then the output.
			r, err := rewriteCanonical(spare, opt)
			return r, spare, err
		}
		var fused []string
		for _, f := range rep.Fused {
			fused = append(fused, f.Block.Name)
		}
		if !slices.Equal(fused, c.rep.checked) {
			// Detection is deterministic on equal graphs: this is a bug.
			return rep, nil, fmt.Errorf("internal error: the numerical check saw blocks %v, the rewrite fused %v", c.rep.checked, fused)
		}
		out := *rep
		out.Warnings = slices.Concat(rep.Warnings[:rep.traced], c.rep.checkNotes, rep.Warnings[rep.traced:])
		return &out, nil, nil
	}
	if err != nil {
		r, redo, cerr := collect()
		if redo != nil && cerr == nil {
			// The slow way succeeded where the edit failed: both run
			// the same detection and emit, so this is a bug.
			return r, nil, fmt.Errorf("internal error: the rewrite failed (%v), but not when redone", err)
		}
		return r, nil, cerr
	}
	return rep, collect, nil
}

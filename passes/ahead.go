package passes

import (
	"context"
	"fmt"
	"slices"

	"github.com/mokopt/mokopt/graph"
	pb "github.com/mokopt/mokopt/graph/onnxpb"
	"github.com/mokopt/mokopt/moe"
	"github.com/mokopt/mokopt/passes/internal/canon"
)

// RewriteAhead is Rewrite with the numerical check taken off the critical
// path: it edits m as Rewrite does, but once detection has found the
// blocks, their check runs on another goroutine, over an unedited copy of
// the graph detection read (graph.Model.Fork, the blocks rebound to it),
// while the blocks are fused. It returns the edit's report, and wait,
// which waits for the check and returns the report and error Rewrite(m,
// opt) would have returned. The caller writes m meanwhile but commits it
// only once wait returned a nil error (graph.SaveOptions.Ready); on an
// error m must be discarded. When wait also returns a model, the check
// moved a block's input where the edit could not know it would (see
// checkBlock): the rewrite was redone, check included, on an unedited
// copy of m, and that copy, not m, is the output to write. (A model that
// cannot be forked is checked first, then edited, and wait only returns
// that result.)
//
// opt must have Check set and Partial off, the only combination in which
// the check decides whether anything is fused rather than what (with any
// block refused, nothing is), but for a moved input (above). When the
// edit itself fails, RewriteAhead waits for the check and returns what
// Rewrite would have (the check's verdict first), with a nil wait.
func RewriteAhead(m *graph.Model, opt Options) (rep *Report, wait func() (*Report, *graph.Model, error), err error) {
	if !opt.Check || opt.Partial {
		return nil, nil, fmt.Errorf("RewriteAhead needs Check on and Partial off")
	}
	if hasScopes(m) {
		// Blocks in subgraphs are checked on values the model gives them
		// when it runs: checked first, then edited.
		rep, err := rewriteScopes(m, opt)
		if err != nil {
			return rep, nil, err
		}
		return rep, func() (*Report, *graph.Model, error) { return rep, nil, nil }, nil
	}
	ctx := opt.Context
	if ctx == nil {
		ctx = context.Background()
	}
	// Forking only reads the model forked, so the forks are taken on other
	// goroutines while this one canonicalizes and detects: m's, which the
	// check reads when m is its own canonical form, and else the working
	// copy's, which it then reads, m's being kept unedited to redo the
	// rewrite on, the slow way, should the check move a block's input.
	// Both are done before anything is edited (beforeEdit) and before
	// RewriteAhead returns. Without a fork (a model that cannot be forked),
	// the check runs first.
	// The check's fork gets its graph index there too. (Whether m is its
	// own canonical form is only known once canonicalView returns; the
	// fork of m is indexed in case it is.)
	mFork := forkAsync(m, true)
	a := &aheadCheck{opt: opt, done: make(chan aheadResult, 1), ahead: true}
	a.wc, a.res, a.skipped = canonicalView(ctx, m)
	a.checkFork = mFork
	if a.wc != nil {
		a.checkFork = forkAsync(a.wc, true)
	}
	forksDone := func() {
		mFork.wait()
		a.checkFork.wait()
	}
	defer forksDone()
	if a.wc != nil {
		var ferr error
		a.spare, ferr = mFork.wait()
		a.ahead = ferr == nil
	}
	a.ctx, a.cancel = context.WithCancel(ctx)
	eo := opt
	eo.beforeEdit = forksDone
	eo.checkAhead = a.start
	a.rep, a.err = rewriteOn(m, a.wc, a.res, a.skipped, eo)
	if a.err != nil {
		r, redo, cerr := a.collect()
		if redo != nil && cerr == nil {
			// The slow way succeeded where the edit failed: both run the
			// same detection and emit, so this is a bug.
			return r, nil, fmt.Errorf("internal error: the rewrite failed (%v), but not when redone", a.err)
		}
		return r, nil, cerr
	}
	return a.rep, a.collect, nil
}

// aheadResult is what RewriteAhead's numerical check returns: numericCheck's
// verdict per block and its error.
type aheadResult struct {
	errs []error
	err  error
}

// aheadCheck is the state of one RewriteAhead: the canonical view detection
// read, the forks the check reads and the rewrite may be redone on, the
// check started on another goroutine, and the edit's own result.
type aheadCheck struct {
	opt    Options            // the caller's options
	ctx    context.Context    // the check's context, cancelled once collected
	cancel context.CancelFunc // cancels ctx

	wc      *graph.Model // canonicalView's working copy, nil when m is its own canonical form
	res     *canon.Result
	skipped string

	checkFork *asyncFork   // the fork the check reads
	ahead     bool         // whether the check may run ahead (m could be forked)
	spare     *graph.Model // an unedited copy of m, to redo the rewrite on

	started bool
	snap    *Report // the report when the check started
	before  int     // its warnings then
	bs      []*Block
	inputs  []string
	done    chan aheadResult

	rep *Report // the edit's report
	err error   // the edit's error
}

// start is the edit's checkAhead: it rebinds the blocks detection found on
// mm to the check's fork and starts their numerical check on another
// goroutine, or returns false to have the edit check them first.
func (a *aheadCheck) start(mm *graph.Model, blocks []*Block, rep *Report) bool {
	if !a.ahead {
		return false
	}
	orig, err := a.checkFork.wait()
	if err != nil {
		return false
	}
	fm, err := graph.MapFork(mm, orig)
	if err != nil {
		return false
	}
	// Detection made tensors of its own (weights dequantized on demand)
	// after the fork was taken: the check reads them too.
	orig.ShareDeferred(mm)
	if a.spare == nil {
		a.spare = orig
	}
	a.bs = make([]*Block, len(blocks))
	for i, b := range blocks {
		a.bs[i] = b.rebound(fm)
	}
	a.inputs = blockInputs(a.bs)
	a.snap, a.before = rep.clone(), len(rep.Warnings)
	a.started = true
	a.opt.progress("check", 0, len(a.bs))
	go func() {
		errs, err := numericCheck(a.ctx, orig, a.bs, make([]*moe.Weights, len(a.bs)), a.opt.CheckData, a.opt.MemLimit)
		a.done <- aheadResult{errs, err}
	}()
	return true
}

// collect is RewriteAhead's wait: it waits for the check and returns the
// report and error Rewrite would have returned, and the model to write
// instead of m when the rewrite had to be redone.
func (a *aheadCheck) collect() (*Report, *graph.Model, error) {
	defer a.cancel()
	if !a.started {
		return a.rep, nil, a.err // checked as Rewrite checks, or not at all
	}
	c := <-a.done
	_, cerr := checkResults(a.snap, a.bs, a.inputs, c.errs, c.err)
	if cerr == nil && len(a.snap.moved) > 0 {
		// Rewrite would have fused on the moved input: do it its way
		// on the unedited copy, whose result is then the output.
		r, err := rewriteCanonical(a.spare, a.opt)
		return r, a.spare, err
	}
	if cerr == nil {
		cerr = a.ctx.Err()
	}
	if cerr == nil {
		cerr = notFused(a.snap, false)
	}
	if cerr != nil {
		r, cerr := viewed(a.snap, cerr, a.wc, a.res, a.skipped) // as rewriteOn has it
		return r, nil, cerr
	}
	a.opt.progress("check", len(a.bs), len(a.bs))
	if a.err != nil {
		return a.rep, nil, a.err
	}
	// The check's warnings go where Rewrite puts them: after those
	// before the check, before those the edit added since.
	out := *a.rep
	out.Warnings = slices.Concat(a.snap.Warnings, a.rep.Warnings[a.before:])
	return &out, nil, nil
}

// asyncFork is a fork of a model being taken on another goroutine.
type asyncFork struct {
	done chan struct{}
	m    *graph.Model
	err  error
}

// forkAsync starts forking m (graph.Model.Fork), which must not be edited
// until the fork is done (wait); with index, the fork's main graph is
// indexed too, for its next Graph call.
func forkAsync(m *graph.Model, index bool) *asyncFork {
	f := &asyncFork{done: make(chan struct{})}
	go func() {
		defer close(f.done)
		f.m, f.err = m.Fork()
		if f.err == nil && index {
			f.m.KeepIndex(f.m.Graph())
		}
	}()
	return f
}

// wait returns the fork once it is done.
func (f *asyncFork) wait() (*graph.Model, error) {
	<-f.done
	return f.m, f.err
}

// clone returns a copy of r whose lists are its own.
func (r *Report) clone() *Report {
	c := *r
	c.Fused = slices.Clone(r.Fused)
	c.NearMiss = slices.Clone(r.NearMiss)
	c.Refused = slices.Clone(r.Refused)
	c.Warnings = slices.Clone(r.Warnings)
	c.moved = slices.Clone(r.moved)
	return &c
}

// rebound returns a copy of b that names fm's fork's nodes and tensors
// where b names the model's: the check reads the fork while the model is
// edited.
func (b *Block) rebound(fm *graph.ForkMap) *Block {
	c := *b
	c.Region = make([]*pb.NodeProto, len(b.Region))
	for i, n := range b.Region {
		c.Region[i] = fm.Node(n)
	}
	c.TopK = fm.Node(b.TopK)
	c.regionPos = slices.Clone(b.regionPos)
	if b.W != nil {
		c.W = b.W.rebound(fm)
	}
	return &c
}

// rebound returns a copy of p whose sources are fm's fork's tensors.
func (p *WeightPlan) rebound(fm *graph.ForkMap) *WeightPlan {
	proj := func(q *Proj) *Proj {
		if q == nil {
			return nil
		}
		c := *q
		c.Init = fm.Tensor(q.Init)
		return &c
	}
	c := &WeightPlan{Router: *proj(&p.Router), RouterB: proj(p.RouterB), Corr: proj(p.Corr),
		SharedGate: proj(p.SharedGate), SharedUp: proj(p.SharedUp), SharedDown: proj(p.SharedDown), SharedGateW: proj(p.SharedGateW)}
	c.Experts = make([]ExpertProj, len(p.Experts))
	for i, e := range p.Experts {
		c.Experts[i] = ExpertProj{Gate: proj(e.Gate), Up: proj(e.Up), Down: proj(e.Down), GateB: proj(e.GateB), UpB: proj(e.UpB), DownB: proj(e.DownB)}
	}
	return c
}

package main

import (
	"fmt"
	"io"
	"time"

	"github.com/mokopt/mokopt"
	"github.com/schollz/progressbar/v3"
	"github.com/spf13/cobra"
)

// Progress goes to stderr only, never to stdout. On a terminal it is a
// progress bar per stage (schollz/progressbar); otherwise a plain line per
// stage every progressStep of the work or every progressEvery, whichever
// comes first. Nothing is shown for work that ends within progressDelay,
// nor with --quiet.
var (
	progressDelay = 500 * time.Millisecond
	progressEvery = 5 * time.Second
)

const progressStep = 10 // percent

// progressReporter turns mokopt.Events into bars or lines.
type progressReporter struct {
	w     io.Writer
	tty   bool
	start time.Time
	now   func() time.Time

	stage    string
	since    time.Time // when the stage's first event came
	bar      *progressbar.ProgressBar
	lastLine time.Time
	lastPct  int64
}

// newProgress returns the reporter for a command: nil (no progress) with
// --quiet.
func newProgress(c *cobra.Command) mokopt.Progress {
	if q, err := c.Flags().GetBool("quiet"); err == nil && q {
		return nil
	}
	w := raw(c.ErrOrStderr()) // the bar's own carriage returns and escapes
	p := &progressReporter{w: w, tty: isTerminal(w), start: time.Now(), now: time.Now}
	return p.event
}

func (p *progressReporter) event(e mokopt.Event) {
	now := p.now()
	if now.Sub(p.start) < progressDelay {
		return
	}
	if p.tty {
		p.barEvent(e)
		return
	}
	if e.Total <= 0 {
		return
	}
	pct := 100 * e.Done / e.Total
	if e.Stage != p.stage {
		p.stage, p.lastPct, p.lastLine, p.since = e.Stage, -progressStep, time.Time{}, now
	}
	if pct < p.lastPct+progressStep && now.Sub(p.lastLine) < progressEvery && e.Done < e.Total {
		return
	}
	if e.Done == e.Total && p.lastPct == 100 {
		return
	}
	p.lastPct, p.lastLine = pct, now
	eta := etaOf(now.Sub(p.since), e.Done, e.Total)
	if e.Bytes {
		fmt.Fprintf(p.w, "mokopt: %s %s of %s (%d%%%s)\n", e.Stage, humanBytes(e.Done), humanBytes(e.Total), pct, eta)
	} else {
		fmt.Fprintf(p.w, "mokopt: %s %d/%d (%d%%%s)\n", e.Stage, e.Done, e.Total, pct, eta)
	}
}

// etaMin is how long a stage runs before its lines carry an estimate of
// the time left: earlier ones would mostly be noise.
const etaMin = 2 * time.Second

// etaOf is ", ETA 1m05s": the time left if the rest of the work goes at
// the rate of what was done in elapsed, or "" when that cannot be told yet
// or the work is done.
func etaOf(elapsed time.Duration, done, total int64) string {
	if elapsed < etaMin || done <= 0 || done >= total {
		return ""
	}
	left := time.Duration(float64(elapsed) * float64(total-done) / float64(done))
	return ", ETA " + left.Round(time.Second).String()
}

func (p *progressReporter) barEvent(e mokopt.Event) {
	if e.Stage != p.stage || p.bar == nil {
		p.finish()
		p.stage = e.Stage
		opts := []progressbar.Option{
			progressbar.OptionSetWriter(p.w),
			progressbar.OptionSetDescription(e.Stage),
			progressbar.OptionSetWidth(30),
			progressbar.OptionThrottle(100 * time.Millisecond),
			progressbar.OptionOnCompletion(func() { fmt.Fprintln(p.w) }),
		}
		if e.Bytes {
			opts = append(opts, progressbar.OptionShowBytes(true), progressbar.OptionShowCount(), progressbar.OptionUseIECUnits(true))
		} else {
			opts = append(opts, progressbar.OptionShowCount())
		}
		p.bar = progressbar.NewOptions64(e.Total, opts...)
	}
	_ = p.bar.Set64(e.Done)
}

// finish ends the current bar, if any.
func (p *progressReporter) finish() {
	if p.bar != nil && !p.bar.IsFinished() {
		_ = p.bar.Finish()
	}
	p.bar = nil
}

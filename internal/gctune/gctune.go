// Package gctune bounds the Go heap's garbage by bytes rather than by a
// fraction of the live heap.
//
// The Go collector lets the heap grow by GOGC percent (100 by default) of
// what was live after the last collection before it collects again. A
// command that holds one expert's matrices (hundreds of megabytes) and
// replaces them expert after expert then peaks near twice its live set:
// the previous expert's buffers are garbage the collector has not yet been
// asked to reclaim. The tuner re-sets the percent after every collection so
// that the growth allowed is about a fixed headroom: the default percent
// while the live heap is small (small models pay nothing), less as it
// grows, never below a floor that keeps the collector's CPU bounded.
//
// The runtime's soft memory limit (debug.SetMemoryLimit) caps the heap too,
// but only near the limit; the tuner keeps the peak near the live set
// everywhere below it. A collector paused by the program (a percent below
// zero, as a parser does while it builds a model) stays paused.
package gctune

import (
	"runtime"
	"runtime/debug"
	"runtime/metrics"
	"sync/atomic"
)

// Headroom is the garbage, in bytes, that Start lets grow between
// collections once the live heap is large.
const Headroom = 128 << 20

// MinPercent and MaxPercent bound the percent the tuner sets.
const (
	MinPercent = 10
	MaxPercent = 100
)

// Percent is the GC percent that lets a heap of live bytes grow by about
// headroom bytes, within [MinPercent, MaxPercent]; MaxPercent when live is
// unknown (0).
func Percent(live, headroom uint64) int {
	if live == 0 {
		return MaxPercent
	}
	p := headroom * 100 / live
	return int(min(MaxPercent, max(MinPercent, p)))
}

// Start runs the tuner until the returned function is called: after each
// collection the percent is set to Percent of the live heap and Headroom.
func Start() (stop func()) {
	var stopped atomic.Bool
	arm(&stopped)
	return func() { stopped.Store(true) }
}

// sentinel is an object allocated only to be collected: its finalizer runs
// once per collection cycle that finds it unreachable. It holds a pointer,
// so the tiny allocator, whose finalizers may never run, does not place it.
type sentinel struct {
	_ *int
	_ [8]byte
}

// arm allocates a sentinel whose finalizer tunes and arms the next one.
func arm(stopped *atomic.Bool) {
	s := &sentinel{}
	runtime.SetFinalizer(s, func(*sentinel) {
		if stopped.Load() {
			return
		}
		tune()
		arm(stopped)
	})
}

// tune sets the percent from the live heap the last collection measured,
// unless the collector is paused.
func tune() {
	s := []metrics.Sample{{Name: "/gc/heap/live:bytes"}}
	metrics.Read(s)
	var live uint64
	if s[0].Value.Kind() == metrics.KindUint64 {
		live = s[0].Value.Uint64()
	}
	if prev := debug.SetGCPercent(Percent(live, Headroom)); prev < 0 {
		debug.SetGCPercent(prev)
	}
}

package gctune

import (
	"runtime"
	"runtime/debug"
	"testing"
	"time"
)

func TestPercent(t *testing.T) {
	for _, c := range []struct {
		live, headroom uint64
		want           int
	}{
		{0, Headroom, MaxPercent},
		{64 << 20, Headroom, MaxPercent}, // small heap: the default
		{128 << 20, Headroom, 100},       // headroom = live
		{512 << 20, Headroom, 25},        // a 512 MiB live set grows by 128 MiB
		{1280 << 20, Headroom, 10},       // at the floor
		{64 << 30, Headroom, MinPercent}, // never below it
		{3 << 30, 1 << 30, 33},           // other headroom
	} {
		if got := Percent(c.live, c.headroom); got != c.want {
			t.Errorf("Percent(%d, %d) = %d, want %d", c.live, c.headroom, got, c.want)
		}
	}
}

// waitPercent collects until the tuner has set a percent other than from,
// and returns it (from itself after a second of trying).
func waitPercent(t *testing.T, from int) int {
	t.Helper()
	for deadline := time.Now().Add(time.Second); time.Now().Before(deadline); {
		runtime.GC()
		time.Sleep(5 * time.Millisecond)
		p := debug.SetGCPercent(from)
		if p != from {
			debug.SetGCPercent(p)
			return p
		}
	}
	return from
}

func TestStartTunesAfterCollections(t *testing.T) {
	defer debug.SetGCPercent(debug.SetGCPercent(100))
	live := make([]byte, 512<<20) // 512 MiB live (untouched pages: virtual only)
	stop := Start()
	defer stop()
	const marker = 77
	debug.SetGCPercent(marker)
	got := waitPercent(t, marker)
	runtime.KeepAlive(live)
	if got < 20 || got > 25 { // 128 MiB over a little more than 512 MiB live
		t.Fatalf("with 512 MiB live the tuner set GC percent %d, want about 25", got)
	}
}

func TestPausedCollectorStaysPaused(t *testing.T) {
	defer debug.SetGCPercent(debug.SetGCPercent(100))
	stop := Start()
	defer stop()
	debug.SetGCPercent(-1)
	for range 3 {
		runtime.GC()
		time.Sleep(5 * time.Millisecond)
	}
	if p := debug.SetGCPercent(-1); p != -1 {
		t.Fatalf("a paused collector was set to percent %d", p)
	}
}

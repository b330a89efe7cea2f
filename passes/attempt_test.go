package passes

import (
	"errors"
	"strings"
	"testing"
)

// TestAttempt: attempt returns a candidate's refusal as it is, turns a
// runtime error into a matcher-fault refusal and lets any other panic
// through (refusals are returns, not panics).
func TestAttempt(t *testing.T) {
	var none []int
	for _, tc := range []struct {
		name      string
		f         func() error
		want      string // "" for nil; a prefix otherwise
		wantPanic bool
	}{
		{"ok", func() error { return nil }, "", false},
		{"refusal", func() error { return rejectf("no router (%d)", 3) }, "no router (3)", false},
		{"runtime error", func() error { return rejectf("%d", none[1]) }, errMatcherFault + ": runtime error: index out of range", false},
		{"other panic", func() error { panic("not a refusal") }, "", true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var err error
			panicked := func() (p bool) {
				defer func() { p = recover() != nil }()
				err = attempt(tc.f)
				return false
			}()
			if panicked != tc.wantPanic {
				t.Fatalf("panicked %v, want %v", panicked, tc.wantPanic)
			}
			if tc.wantPanic {
				return
			}
			if tc.want == "" {
				if err != nil {
					t.Fatalf("err %v, want nil", err)
				}
				return
			}
			var rj reject
			if !errors.As(err, &rj) || !strings.HasPrefix(err.Error(), tc.want) {
				t.Fatalf("err %v (%T), want a reject starting %q", err, err, tc.want)
			}
		})
	}
}

package passes

import (
	"fmt"
	"runtime"
)

// errMatcherFault starts the reason of a candidate whose analysis hit a
// runtime error: a bug in the matcher that a malformed model exposed.
const errMatcherFault = "matcher fault on a malformed model (please report)"

// reject is the error that refuses a candidate: its message is the
// near-miss reason.
type reject struct{ msg string }

func (r reject) Error() string { return r.msg }

// rejectf returns a refusal of the candidate with a formatted reason.
func rejectf(format string, args ...any) error { return reject{fmt.Sprintf(format, args...)} }

// attempt runs f, one candidate's analysis, and returns its error: a
// refusal (reject) says why the candidate is no block. Refusals are
// ordinary error returns; the recover here is the package's only one and
// is a safety net, not control flow: a runtime error (an index past a
// malformed node's inputs, a nil tensor) is a matcher bug that a hostile
// or malformed model exposed, and it becomes a refusal of this candidate
// that says so (errMatcherFault), so that one bad candidate yields a
// near-miss instead of a crash of the whole detection; the fuzz target
// treats it as a failure. Any other panic propagates.
func attempt(f func() error) (err error) {
	defer func() {
		if r := recover(); r != nil {
			re, ok := r.(runtime.Error)
			if !ok {
				panic(r)
			}
			err = reject{fmt.Sprintf("%s: %v", errMatcherFault, re)}
		}
	}()
	return f()
}

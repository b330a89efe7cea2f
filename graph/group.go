package graph

import (
	"errors"
	"fmt"
	"strings"
)

// problemGroup is a run of problems that differ only in the names they
// quote.
type problemGroup struct {
	first error
	names []string // the first quoted name of each further problem
	n     int      // problems in the group
}

// Error is the first problem, then how many more are alike, with a few of
// their names.
func (g *problemGroup) Error() string {
	if g.n == 1 {
		return g.first.Error()
	}
	s := fmt.Sprintf("%s (and %d more like it", g.first.Error(), g.n-1)
	if len(g.names) > 0 {
		s += ": " + strings.Join(g.names, ", ")
		if g.n-1 > len(g.names) {
			s += ", ..."
		}
	}
	return s + ")"
}

// Unwrap returns the first problem, so that errors.Is sees its causes.
func (g *problemGroup) Unwrap() error { return g.first }

// maxGroupNames bounds the names a group lists.
const maxGroupNames = 3

// groupProblems merges the problems whose messages are the same once every
// quoted name is blanked ("initializer \"w1\": cannot open external data"
// and the same for w2, ... ) into one counted entry, in order of first
// appearance, and keeps at most max entries, the last saying how many
// more were left out.
func groupProblems(errs []error, max int) []error {
	var groups []*problemGroup
	byKey := map[string]*problemGroup{}
	for _, e := range errs {
		msg := e.Error()
		key, name := blankQuoted(msg)
		if g, ok := byKey[key]; ok {
			g.n++
			if len(g.names) < maxGroupNames && name != "" {
				g.names = append(g.names, name)
			}
			continue
		}
		g := &problemGroup{first: e, n: 1}
		byKey[key] = g
		groups = append(groups, g)
	}
	out := make([]error, 0, min(len(groups), max+1))
	left := 0
	for i, g := range groups {
		if i >= max {
			left += g.n
			continue
		}
		if g.n == 1 {
			out = append(out, g.first)
		} else {
			out = append(out, g)
		}
	}
	if left > 0 {
		out = append(out, fmt.Errorf("and %d more problems", left))
	}
	return out
}

// blankQuoted returns msg with the text of every "quoted" span removed,
// and the first quoted span (quotes included).
func blankQuoted(msg string) (key, first string) {
	var b strings.Builder
	in := false
	start := 0
	for i := 0; i < len(msg); i++ {
		c := msg[i]
		if c == '\\' && in && i+1 < len(msg) {
			i++
			continue
		}
		if c != '"' {
			if !in {
				b.WriteByte(c)
			}
			continue
		}
		if !in {
			in, start = true, i
			b.WriteString(`""`)
			continue
		}
		in = false
		if first == "" {
			first = msg[start : i+1]
		}
	}
	if in { // an unpaired quote: keep the rest as it is
		b.WriteString(msg[start+1:])
	}
	return b.String(), first
}

// joinProblems is errors.Join of groupProblems(errs, max).
func joinProblems(errs []error, max int) error { return errors.Join(groupProblems(errs, max)...) }

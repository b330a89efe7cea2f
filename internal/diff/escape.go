package diff

import (
	"fmt"
	"strings"
	"unicode/utf8"
)

// Printable returns s with every character that could act on a terminal
// escaped, so that a name read from a model cannot forge or hide output
// lines: C0 and C1 control characters (newline, carriage return, ESC, BEL,
// ...), DEL, bidirectional-override and line-separator characters, and
// invalid UTF-8. Newline, carriage return and tab become \n, \r and \t;
// the others \xHH or \uHHHH. Any other string is returned unchanged.
func Printable(s string) string {
	i := strings.IndexFunc(s, needsEscape)
	if i < 0 && utf8.ValidString(s) {
		return s
	}
	var b strings.Builder
	for len(s) > 0 {
		r, n := utf8.DecodeRuneInString(s)
		switch {
		case r == utf8.RuneError && n == 1:
			fmt.Fprintf(&b, `\x%02x`, s[0])
		case r == '\n':
			b.WriteString(`\n`)
		case r == '\r':
			b.WriteString(`\r`)
		case r == '\t':
			b.WriteString(`\t`)
		case r == '\\':
			b.WriteString(`\\`)
		case needsEscape(r) && r < 0x100:
			fmt.Fprintf(&b, `\x%02x`, r)
		case needsEscape(r):
			fmt.Fprintf(&b, `\u%04x`, r)
		default:
			b.WriteString(s[:n])
		}
		s = s[n:]
	}
	return b.String()
}

// needsEscape reports whether r could act on a terminal.
func needsEscape(r rune) bool {
	switch {
	case r < 0x20, r == 0x7f, r >= 0x80 && r < 0xa0:
		return true
	case r >= 0x200e && r <= 0x200f, r >= 0x2028 && r <= 0x202e, r >= 0x2066 && r <= 0x2069:
		return true
	}
	return false
}

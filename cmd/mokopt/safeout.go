package main

import (
	"fmt"
	"io"
	"os"
)

// safeWriter is how every human-readable line reaches the terminal: names
// of nodes, tensors and files come from the model and the file system, and
// a control character among them (an escape sequence that retitles the
// window or clears the screen, a carriage return that overwrites a line,
// a NUL) is written escaped (\x1b) instead. Newlines and tabs pass: the
// places that print a name on a line of its own escape it (diff.Printable)
// so that a name cannot forge a line. Output mokopt makes itself with
// control characters (diff's colours, the progress bar, a model on
// standard output) goes to the raw writer.
type safeWriter struct{ w io.Writer }

// raw returns the writer under w's escaping, or w itself.
func raw(w io.Writer) io.Writer {
	if s, ok := w.(safeWriter); ok {
		return s.w
	}
	return w
}

func (s safeWriter) Write(p []byte) (int, error) {
	start := 0
	for i, c := range p {
		if c >= 0x20 && c != 0x7f || c == '\n' || c == '\t' {
			continue
		}
		if _, err := s.w.Write(p[start:i]); err != nil {
			return start, err
		}
		if _, err := fmt.Fprintf(s.w, `\x%02x`, c); err != nil {
			return i, err
		}
		start = i + 1
	}
	if _, err := s.w.Write(p[start:]); err != nil {
		return start, err
	}
	return len(p), nil
}

// stdoutSafe and stderrSafe are the process's standard streams behind
// safeWriter, read when a command starts (tests redirect os.Stdout).
func stdoutSafe() io.Writer { return safeWriter{os.Stdout} }
func stderrSafe() io.Writer { return safeWriter{os.Stderr} }

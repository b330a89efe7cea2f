package graph

import (
	"errors"
	"fmt"
)

// ErrBadInput is the class of every error caused by a malformed or hostile
// input file: test with errors.Is(err, graph.ErrBadInput).
var ErrBadInput = errors.New("bad input")

// InputError describes what is wrong with an input file, naming the file and,
// where known, the node or tensor.
type InputError struct {
	File   string // the file that was being read, if any
	Object string // e.g. `node "Gemm_3"` or `initializer "w"`
	Msg    string
	Err    error // the underlying cause, if any
}

func (e *InputError) Error() string {
	s := ""
	if e.File != "" {
		s = e.File + ": "
	}
	if e.Object != "" {
		s += e.Object + ": "
	}
	s += e.Msg
	if e.Err != nil {
		s += ": " + e.Err.Error()
	}
	return s
}

// Unwrap lets errors.Is match ErrBadInput and the wrapped cause.
func (e *InputError) Unwrap() []error {
	if e.Err != nil {
		return []error{ErrBadInput, e.Err}
	}
	return []error{ErrBadInput}
}

func badInput(file, object, format string, args ...any) error {
	return &InputError{File: file, Object: object, Msg: fmt.Sprintf(format, args...)}
}

// DiskFullError is a write that ran out of space: which output was being
// written, in which folder, how many bytes the whole save needed, and how
// many were free when it began (-1 where the file system does not say).
// Nothing of the save is left behind. It unwraps to the system's error
// (errors.Is(err, syscall.ENOSPC)).
type DiskFullError struct {
	Path string // the output file being written when space ran out
	Dir  string // the folder the save writes into
	Need int64  // bytes the save writes in all (model file and side file)
	Free int64  // bytes free in Dir when the save began, -1 if unknown
	Err  error
}

func (e *DiskFullError) Error() string {
	s := fmt.Sprintf("%s: no space left on device: writing %s (with its side file, if any) needs about %s", e.Dir, e.Path, sizeOf(e.Need))
	if e.Free >= 0 {
		s += fmt.Sprintf(", and %s was free when it began", sizeOf(e.Free))
	}
	return s + "; nothing was left behind (free space there, or write elsewhere)"
}

// Unwrap returns the system's error.
func (e *DiskFullError) Unwrap() error { return e.Err }

// sizeOf writes n bytes for a reader: exact bytes, and a rounded figure
// beside them from 1 MB on.
func sizeOf(n int64) string {
	switch {
	case n >= 1e9:
		return fmt.Sprintf("%d bytes (%.1f GB)", n, float64(n)/1e9)
	case n >= 1e6:
		return fmt.Sprintf("%d bytes (%.1f MB)", n, float64(n)/1e6)
	}
	return fmt.Sprintf("%d bytes", n)
}

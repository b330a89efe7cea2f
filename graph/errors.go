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

package main

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"strings"

	"github.com/mokopt/mokopt"
	"github.com/mokopt/mokopt/graph"
	"github.com/mokopt/mokopt/graph/eval"
)

// engines maps the names --engine accepts to their runners; "ref" (mokopt's
// reference interpreter, a nil runner) is always there, "ort" (ONNX Runtime)
// only in binaries built with -tags ort (engine_ort.go).
var engines = map[string]mokopt.Runner{"ref": nil}

// engineInit holds, by engine name, what makes an engine ready (loading a
// shared library); its error refuses --engine before any model is read.
var engineInit = map[string]func() error{}

// engineRunner resolves an --engine name. An engine that is missing or
// cannot start is a usage error (exit 2); a model the engine cannot run is
// a bad input (exit 2) whatever the engine, as with the reference
// interpreter.
func engineRunner(name string) (mokopt.Runner, error) {
	r, ok := engines[name]
	if ok {
		if init := engineInit[name]; init != nil {
			if err := init(); err != nil {
				return nil, usageErr(fmt.Errorf("--engine %s: %w", name, err))
			}
		}
		if r == nil {
			return nil, nil
		}
		return unrunnable(name, r), nil
	}
	if name == "ort" {
		return nil, usageErr(fmt.Errorf("--engine ort: this mokopt was built without ONNX Runtime; build it with `go build -tags ort ./cmd/mokopt` (cgo) and put libonnxruntime.so.1 1.30 beside the binary, in .ortlib/ of a checkout (.ci/fetch-ort.sh) or a library path, or name it in $ONNXRUNTIME_LIB"))
	}
	return nil, usageErr(fmt.Errorf("--engine %q: unknown engine (have %s)", name, strings.Join(engineNames(), ", ")))
}

// unrunnable makes the errors of runner r (engine name) bad-input errors
// naming the model, as the reference interpreter's are, so that one cause
// gives one exit code whichever engine runs the model; cancellations and
// errors already classified pass through.
func unrunnable(name string, r mokopt.Runner) mokopt.Runner {
	return func(ctx context.Context, m *graph.Model, feeds map[string]*eval.Tensor) (map[string]*eval.Tensor, error) {
		out, err := r(ctx, m, feeds)
		if err != nil && ctx.Err() == nil && !errors.Is(err, graph.ErrBadInput) {
			err = &graph.InputError{File: m.Name(), Msg: "engine " + name + " cannot run the model", Err: err}
		}
		return out, err
	}
}

// engineNames returns the names --engine accepts in this binary.
func engineNames() []string {
	names := make([]string, 0, len(engines))
	for n := range engines {
		names = append(names, n)
	}
	sort.Strings(names)
	return names
}

// runFailed gives the exit code of a run that produced no comparison: a
// cancellation stays one (exit 130), the --mem-limit cap is a failed check
// (exit 1), and anything else means the model or its data cannot be run by
// the engine: exit 2, the same with every engine.
func runFailed(err error) error {
	switch {
	case errors.Is(err, context.Canceled), errors.Is(err, context.DeadlineExceeded):
		return err
	case errors.Is(err, eval.ErrMemLimit), errors.Is(err, eval.ErrWorkLimit):
		return &exitError{code: 1, msg: err.Error(), err: err}
	}
	return &exitError{code: 2, msg: err.Error(), err: err}
}

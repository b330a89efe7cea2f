package main

import (
	"fmt"
	"sort"
	"strings"

	"github.com/mokopt/mokopt/verify"
)

// engines maps the names --engine accepts to their runners; "ref" (mokopt's
// reference interpreter, a nil runner) is always there, "ort" (ONNX Runtime)
// only in binaries built with -tags ort (engine_ort.go).
var engines = map[string]verify.Runner{"ref": nil}

// engineRunner resolves an --engine name.
func engineRunner(name string) (verify.Runner, error) {
	r, ok := engines[name]
	if ok {
		return r, nil
	}
	if name == "ort" {
		return nil, usageErr(fmt.Errorf("--engine ort: this mokopt was built without ONNX Runtime; build it with `go build -tags ort ./cmd/mokopt` (cgo) and put libonnxruntime.so.1 1.30 in .ortlib/ (.ci/fetch-ort.sh) or name it in $ONNXRUNTIME_LIB"))
	}
	var names []string
	for n := range engines {
		names = append(names, n)
	}
	sort.Strings(names)
	return nil, usageErr(fmt.Errorf("--engine %q: unknown engine (have %s)", name, strings.Join(names, ", ")))
}

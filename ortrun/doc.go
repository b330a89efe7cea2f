// Package ortrun runs ONNX models in ONNX Runtime, through cgo, as an
// oracle independent of mokopt's own interpreter (graph/eval).
//
// Everything that links ONNX Runtime is behind the build tag "ort", so a
// plain `go build ./...`, `go vet ./...` or `go test ./...` neither needs
// cgo nor the shared library; this file only carries the package doc.
//
// With the tag, Run loads the shared library named by the environment
// variable ONNXRUNTIME_LIB or, when that is unset, .ortlib/libonnxruntime.so.1
// at the repository root (what .ci/fetch-ort.sh puts there), found by
// walking up from the working directory. Typical use:
//
//	bash .ci/fetch-ort.sh
//	go test -tags ort ./ortrun/ -v
package ortrun

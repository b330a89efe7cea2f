// Package ortrun runs ONNX models in ONNX Runtime, through cgo, as an
// oracle independent of mokopt's own interpreter (graph/eval).
//
// Everything that links ONNX Runtime is behind the build tag "ort", so a
// plain `go build ./...`, `go vet ./...` or `go test ./...` neither needs
// cgo nor the shared library; this file only carries the package doc.
//
// With the tag, Run loads the shared library FindLibrary finds: the file the
// environment variable ONNXRUNTIME_LIB names or, when that is unset, the
// first libonnxruntime found beside the executable, in .ortlib of the
// working directory or a folder above it (where .ci/fetch-ort.sh puts it in
// a checkout), or in the library search paths. Typical use:
//
//	bash .ci/fetch-ort.sh
//	go test -tags ort ./ortrun/ -v
package ortrun

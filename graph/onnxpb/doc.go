// Package onnxpb holds the Go protobuf types generated from the official ONNX
// v1.22.0 proto2 schema (onnx-ml.proto, IR version 13), with the proto package
// renamed to mokopt.onnx. The wire format is that of onnx.proto, so files
// decoded and re-encoded with these types round-trip byte for byte.
//
// Regenerate with `go generate ./graph/onnxpb` (needs protoc and protoc-gen-go).
package onnxpb

//go:generate ./gen.sh

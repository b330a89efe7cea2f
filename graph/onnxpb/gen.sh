#!/usr/bin/env bash
# Regenerates onnx-ml.pb.go from the ONNX v1.22.0 proto2 schema beside this script (onnx-ml.proto).
# Needs protoc (Debian: protobuf-compiler) and protoc-gen-go v1.36.12
# (go install google.golang.org/protobuf/cmd/protoc-gen-go@v1.36.12).
# The proto package is renamed to mokopt.onnx so that no other module in the same
# binary that registers onnx.* messages can clash with ours; the wire format is unchanged.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
src=${ONNX_PROTO:-$here/onnx-ml.proto}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
sed -e 's/^package onnx;/package mokopt.onnx;/' "$src" > "$tmp/onnx-ml.proto"
printf '\noption go_package = "github.com/mokopt/mokopt/graph/onnxpb";\n' >> "$tmp/onnx-ml.proto"
protoc -I "$tmp" --go_out="$tmp" --go_opt=paths=source_relative "$tmp/onnx-ml.proto"
mv "$tmp/onnx-ml.pb.go" "$here/onnx-ml.pb.go"

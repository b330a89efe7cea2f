#!/usr/bin/env bash
# fetch-ort.sh: put ONNX Runtime's linux/x64 shared library into .ortlib/.
#
# The library comes from the onnxruntime-node npm package (it bundles the
# prebuilt libonnxruntime.so.1). Only `npm pack` is used: it downloads the
# tarball without running any install script. Idempotent: an existing
# library of the right size is kept. Prints the library's path.
#
# Env: ORT_VERSION (default 1.30.0); ORT_PACK_CACHE, a folder that may
# already hold onnxruntime-node-$ORT_VERSION.tgz (default /tmp/ortpack).
set -euo pipefail

ORT_VERSION="${ORT_VERSION:-1.30.0}"
ORT_PACK_CACHE="${ORT_PACK_CACHE:-/tmp/ortpack}"
MEMBER="package/bin/napi-v6/linux/x64/libonnxruntime.so.1"

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
dest_dir="$root/.ortlib"
dest="$dest_dir/libonnxruntime.so.1"
stamp="$dest_dir/VERSION"

if [[ -s "$dest" && -f "$stamp" && "$(cat "$stamp")" == "$ORT_VERSION" ]]; then
	echo "$dest"
	exit 0
fi

tgz="$ORT_PACK_CACHE/onnxruntime-node-$ORT_VERSION.tgz"
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
if [[ ! -s "$tgz" ]] || ! tar -tzf "$tgz" "$MEMBER" >/dev/null 2>&1; then
	command -v npm >/dev/null || { echo "fetch-ort.sh: npm not found" >&2; exit 1; }
	(cd "$tmp" && npm pack --silent --ignore-scripts "onnxruntime-node@$ORT_VERSION" >/dev/null)
	tgz="$tmp/onnxruntime-node-$ORT_VERSION.tgz"
	[[ -s "$tgz" ]] || { echo "fetch-ort.sh: npm pack produced no $tgz" >&2; exit 1; }
fi

tar -xzf "$tgz" -C "$tmp" "$MEMBER"
mkdir -p "$dest_dir"
install -m 0644 "$tmp/$MEMBER" "$dest.tmp.$$"
mv -f "$dest.tmp.$$" "$dest"
echo "$ORT_VERSION" >"$stamp"
echo "$dest"

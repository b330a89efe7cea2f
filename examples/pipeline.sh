#!/usr/bin/env bash
# End-to-end export pipeline on the bundled example (a Mixtral MoE block
# exported by torch.onnx dynamo):
#
#   exported.onnx -> mokopt rewrite -> mokopt verify -> mokopt lower --plan
#                 -> mokopt diff --format markdown
#
# Each step's output is checked; the script exits non-zero on the first
# failure. Usage: examples/pipeline.sh [MODEL]  (MOKOPT=path/to/mokopt to
# use a built binary; KEEP=dir to keep the artifacts there).
set -euo pipefail
cd "$(dirname "$0")/.."

in=${1:-testdata/example/mixtral_block_dynamo_batched_mm.onnx}
work=${KEEP:-$(mktemp -d)}
mkdir -p "$work"
[ -n "${KEEP:-}" ] || trap 'rm -rf "$work"' EXIT
if [ -z "${MOKOPT:-}" ]; then
  go build -o "$work/mokopt" ./cmd/mokopt
  MOKOPT=$work/mokopt
fi
mk() { "$MOKOPT" --quiet "$@"; }
fail() { echo "pipeline: FAIL: $*" >&2; exit 1; }
step() { echo "pipeline: $*" >&2; }

# JSON from mokopt is indented one key per line, so a field is one grep away.
# ops_count FILE OP: the census count of OP in `inspect --json` output.
ops_count() { grep -A1 "\"op\": \"$2\"" "$1" | sed -n 's/.*"count": \([0-9]*\).*/\1/p' | head -1; }

step "inspect $in"
mk inspect "$in" >"$work/inspect_in.txt" || fail "inspect of the exported model"
blocks=$(sed -n 's/^MoE blocks: \([0-9]*\)$/\1/p' "$work/inspect_in.txt")
[ "${blocks:-0}" -ge 1 ] || fail "no MoE block found in $in"

step "rewrite -> fused.onnx ($blocks block(s) expected)"
mk rewrite "$in" -o "$work/fused.onnx" --report "$work/rewrite.json" >"$work/rewrite.txt" || fail "rewrite (exit $?)"
mk inspect --json "$work/fused.onnx" >"$work/inspect_fused.json" || fail "inspect of the fused model"
fused=$(ops_count "$work/inspect_fused.json" "ai.mok::MoE")
[ "${fused:-0}" = "$blocks" ] || fail "fused model has ${fused:-0} ai.mok::MoE node(s), want $blocks"
grep -q '"schema_version": 1' "$work/inspect_fused.json" || fail "inspect --json lacks schema_version"

step "verify fused.onnx against the exported model"
mk verify "$work/fused.onnx" "$in" >"$work/verify.txt" || fail "verify found a mismatch (exit $?): $(cat "$work/verify.txt")"
grep -q '^ok ' "$work/verify.txt" || fail "verify printed no passing output"
! grep -q MISMATCH "$work/verify.txt" || fail "verify reported a mismatch"

step "lower --target gb300-nvl72 --ep 8 --partial --plan plan.json"
# The example is small (H=64, I=128): the kernel contract wants H and I
# multiples of 256: --partial keeps the block unlowered with warnings and
# still writes the model and the plan (without it lower refuses, exit 1).
mk lower "$work/fused.onnx" -o "$work/lowered.onnx" --target gb300-nvl72 --ep 8 --partial --plan "$work/plan.json" >"$work/lower.txt" ||
  fail "lower (exit $?)"
[ -s "$work/lowered.onnx" ] || fail "lower wrote no model"
[ -s "$work/plan.json" ] || fail "lower wrote no plan"
grep -q '"schema_version": 1' "$work/plan.json" || fail "plan lacks schema_version"
grep -q '"target": "gb300-nvl72"' "$work/plan.json" || fail "plan is not for gb300-nvl72"
lowered=$(sed -n 's/.*: \([0-9]*\) of \([0-9]*\) MoE block(s) lowered.*/\1/p' "$work/lower.txt")
[ -n "$lowered" ] || fail "lower printed no summary"
grep -E 'error #|warning' "$work/lower.txt" | sed 's/^ */pipeline:   lower: /' >&2 || true

step "diff --format markdown"
set +e
mk diff --format markdown "$in" "$work/fused.onnx" >"$work/diff.md"
code=$?
set -e
[ "$code" = 1 ] || fail "diff exit $code, want 1 (the models differ)"
[ -s "$work/diff.md" ] || fail "diff output is empty"
grep -q 'ai.mok::MoE' "$work/diff.md" || fail "diff does not show the fused node"

echo "pipeline: ok: $blocks block(s) fused, verify passed, $lowered of $blocks lowered for gb300-nvl72 (plan $(wc -c <"$work/plan.json") bytes), diff $(wc -l <"$work/diff.md") lines"

#!/usr/bin/env bash
# One revision against another on the same workloads, in one run: builds
# mokopt at BASE (a git revision, default HEAD~1) and from the working tree,
# then times `mokopt rewrite` (default flags, numerical check on) of each
# workload with both binaries in turn, REPS rounds, and prints the fastest
# wall time of each and the ratio new/base (below 1: the working tree is
# faster). Workloads:
#   chain  500 directly chained copies of a real dynamo export (bench/chain)
#   stack  a pre-norm residual stack of 500 copies of it (bench/stack)
#   big    2 layers of E=8 k=2 H=1024 I=2816 from `mokopt gen` (side file)
#
#   bench/versus.sh [BASE]        (environment: REPS, default 5; W work folder)
#
# Timings on a shared machine are noisy; both binaries meet the same noise,
# so compare the ratio.
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
BASE=${1:-HEAD~1}
REPS=${REPS:-5}
W=${W:-$(mktemp -d /tmp/mokopt-versus.XXXXXX)}
mkdir -p "$W"
BLOCK=$ROOT/testdata/exported/qwen3_moe_block_dynamo_batched_mm.onnx

rm -rf "$W/base-src"
git -C "$ROOT" worktree add -q --detach "$W/base-src" "$BASE"
trap 'git -C "$ROOT" worktree remove --force "$W/base-src" 2>/dev/null || true' EXIT
(cd "$W/base-src" && go build -o "$W/mokopt-base" ./cmd/mokopt)
(cd "$ROOT" && go build -o "$W/mokopt-new" ./cmd/mokopt && go build -o "$W/chain" ./bench/chain && go build -o "$W/stack" ./bench/stack)
"$W/chain" -n 500 "$BLOCK" "$W/chain.onnx"
"$W/stack" -n 500 "$BLOCK" "$W/stack.onnx"
"$W/mokopt-new" -q gen --layers 2 --experts 8 --hidden 1024 --inter 2816 -o "$W/big.onnx"

# shellcheck source=bench/lib.sh
. "$ROOT/bench/lib.sh"
echo "# base $(git -C "$ROOT" rev-parse --short "$BASE") vs working tree, REPS=$REPS (fastest wall), $W"
printf '%-6s %10s %10s %8s %12s %12s\n' workload base_s new_s new/base base_rss_MiB new_rss_MiB
for wl in chain stack big; do
	for ((r = 0; r < REPS; r++)); do
		once "$wl-base" "$W/mokopt-base" -q rewrite "$W/$wl.onnx" -o "$W/out-base.onnx"
		once "$wl-new" "$W/mokopt-new" -q rewrite "$W/$wl.onnx" -o "$W/out-new.onnx"
	done
	b=${BEST_WALL[$wl-base]} n=${BEST_WALL[$wl-new]}
	printf '%-6s %10s %10s %8s %12d %12d\n' "$wl" "$b" "$n" "$(awk "BEGIN{printf \"%.2f\", $n / $b}")" "$((BEST_RSS[$wl-base] / 1024))" "$((BEST_RSS[$wl-new] / 1024))"
	rm -f "$W"/out-*.onnx*
done

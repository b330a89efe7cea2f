#!/usr/bin/env bash
# Cost of the numerical check that `mokopt rewrite` runs by default, as
# ratios measured in one run on the same files:
#
#   1. Generated batched-experts models (transformers' batched_mm export
#      shape, static token count T): default rewrite (check on; nochk_s is
#      rewrite --no-check, for the check's share) against
#      mokopt's own load+save (bench/loadsave) of the same file; peak RSS
#      against 1.5 x the model's weight bytes + 1 GiB. Cases T:E:k:H:I,
#      default "512:64:8:1024:512 4096:64:8:1024:512 8192:256:8:512:256".
#   2. The pre-norm residual stack of a real exported block (bench/stack,
#      N copies, default 500 of testdata/exported/olmoe_block_dynamo_batched_mm.onnx):
#      default rewrite against mokopt's load+save and Python onnx's
#      load+save; every block must fuse.
#
#   bench/check.sh [WORKDIR]
#
# Environment: CASES, STACK_BLOCK, STACK_N, REPS (default 1; the commands of
# a comparison run in turn, REPS rounds, and the fastest run of each counts), PY (default /usr/bin/python3; Debian's
# python3-onnx is installed when its onnx module is missing), KEEP=1 keeps
# the generated files. Timings on a shared machine are noisy: compare the
# ratios of one run. Each command runs under a 16 GB address-space cap
# (ulimit -v) so that a regression cannot take the machine down.
set -euo pipefail

ROOT=$(cd "$(dirname "$0")/.." && pwd)
W=${1:-$(mktemp -d /tmp/mokopt-check.XXXXXX)}
mkdir -p "$W"
PY=${PY:-/usr/bin/python3}
REPS=${REPS:-1}
CASES=${CASES:-"512:64:8:1024:512 4096:64:8:1024:512 8192:256:8:512:256"}
STACK_BLOCK=${STACK_BLOCK:-$ROOT/testdata/exported/olmoe_block_dynamo_batched_mm.onnx}
STACK_N=${STACK_N:-500}

if ! "$PY" -c 'import onnx' 2>/dev/null; then
	echo "# installing python3-onnx" >&2
	apt-get install -y python3-onnx >/dev/null || { apt-get update >/dev/null && apt-get install -y python3-onnx >/dev/null; }
	PY=/usr/bin/python3
fi
(cd "$ROOT" && go build -o "$W/mokopt" ./cmd/mokopt && go build -o "$W/loadsave" ./bench/loadsave && go build -o "$W/stack" ./bench/stack)
M="$W/mokopt"

# Each command runs under a 16 GB address-space cap (bench/lib.sh once).
# shellcheck source=bench/lib.sh
. "$ROOT/bench/lib.sh"
ONCE_ULIMIT_KB=16000000
pysave='import onnx, sys; m = onnx.load(sys.argv[1], load_external_data=False); onnx.save(m, sys.argv[2])'
verdict() { if awk "BEGIN{exit !($1)}"; then echo PASS; else echo FAIL; fi; }

echo "# 1. batched-experts models, static T: default rewrite vs load+save; peak RSS vs 1.5 x weights + 1 GiB (REPS=$REPS, $W)"
printf "%6s %4s %2s %5s %5s | %9s | %8s %8s %8s %7s %6s | %8s %9s %6s\n" T E k H I weights_MiB ls_s nochk_s rw_s rw/ls "<=10x" rss_MiB bound_MiB rss_ok
for c in $CASES; do
	IFS=: read -r T E K H I <<<"$c"
	in="$W/b_${T}_${E}.onnx"
	"$M" -q gen --shape batched --tokens "$T" --experts "$E" --top-k "$K" --hidden "$H" --inter "$I" -o "$in" >/dev/null
	wb=$(($(stat -c %s "$in.data")))
	BEST_WALL=() BEST_CPU=() BEST_RSS=()
	for ((r = 0; r < REPS; r++)); do
		once ls "$W/loadsave" "$in" "$W/ls.onnx"
		once nc "$M" -q rewrite --no-check "$in" -o "$W/rw.onnx"
		once rw "$M" -q rewrite "$in" -o "$W/rw.onnx"
	done
	ls_w=${BEST_WALL[ls]} nc_w=${BEST_WALL[nc]} rw_w=${BEST_WALL[rw]} rw_rss=${BEST_RSS[rw]}
	grep -q "1 MoE block(s) fused" "$W/out.rw" || { echo "T=$T: not fused" >&2; cat "$W/out.rw" >&2; }
	bound=$(awk "BEGIN{printf \"%.0f\", (1.5 * $wb + 2^30) / 2^20}")
	r=$(ratio "$rw_w" "$ls_w")
	printf "%6d %4d %2d %5d %5d | %9.0f | %8s %8s %8s %7s %6s | %8.0f %9s %6s\n" "$T" "$E" "$K" "$H" "$I" "$(awk "BEGIN{print $wb / 2^20}")" \
		"$ls_w" "$nc_w" "$rw_w" "$r" "$(verdict "$r <= 10")" "$(awk "BEGIN{print $rw_rss / 1024}")" "$bound" "$(verdict "$rw_rss / 1024 <= $bound")"
	[[ ${KEEP:-0} == 1 ]] || rm -f "$in" "$in.data" "$W"/ls.onnx* "$W"/rw.onnx*
done

echo "# 2. pre-norm residual stack of $STACK_N copies of $(basename "$STACK_BLOCK"): default rewrite vs load+save (mokopt, Python onnx)"
in="$W/stack_$STACK_N.onnx"
"$W/stack" -n "$STACK_N" "$STACK_BLOCK" "$in"
"$M" -q inspect "$in" >"$W/inspect.txt"
nodes=$(head -1 "$W/inspect.txt" | grep -o '[0-9]* nodes' | grep -o '[0-9]*')
BEST_WALL=() BEST_CPU=() BEST_RSS=()
for ((r = 0; r < REPS; r++)); do
	once ls "$W/loadsave" "$in" "$W/ls.onnx"
	once py "$PY" -c "$pysave" "$in" "$W/py.onnx"
	once nc "$M" -q rewrite --no-check "$in" -o "$W/rw.onnx"
	once rw "$M" -q rewrite "$in" -o "$W/rw.onnx"
done
ls_w=${BEST_WALL[ls]} py_w=${BEST_WALL[py]} nc_w=${BEST_WALL[nc]} rw_w=${BEST_WALL[rw]} rw_rss=${BEST_RSS[rw]}
fused=$(grep -o '[0-9]* MoE block(s) fused' "$W/out.rw" | grep -o '^[0-9]*')
r_ls=$(ratio "$rw_w" "$ls_w") r_py=$(ratio "$rw_w" "$py_w")
printf "%7s %10s | %8s %8s %8s %8s | %7s %6s | %7s %6s | %8s %6s\n" nodes bytes ls_s py_s nochk_s rw_s rw/ls "<=1.5" rw/py "<1" rss_MiB fused
printf "%7d %10d | %8s %8s %8s %8s | %7s %6s | %7s %6s | %8.0f %6s\n" "$nodes" "$(stat -c %s "$in")" "$ls_w" "$py_w" "$nc_w" "$rw_w" \
	"$r_ls" "$(verdict "$r_ls <= 1.5")" "$r_py" "$(verdict "$r_py < 1")" "$(awk "BEGIN{print $rw_rss / 1024}")" "$fused/$STACK_N"
[[ ${KEEP:-0} == 1 ]] || rm -f "$in" "$W"/ls.onnx* "$W"/rw.onnx* "$W"/py.onnx*

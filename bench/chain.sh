#!/usr/bin/env bash
# Directly chained blocks: N copies of a real exported block, copy i+1 reading
# copy i's output (no residual Add between), written by bench/chain; then, in
# the same run, `mokopt rewrite` with default flags (numerical check on) and
# Python onnx's own load + save of the same file. Prints both timings and
# rewrite/(load+save); every block must fuse.
#
#   bench/chain.sh [BLOCK.onnx] [N]    (defaults: testdata/exported/qwen3_moe_block_dynamo_batched_mm.onnx, 500)
#
# The default block is a dynamo export, whose graph runs on any input, so
# the numerical check runs on every copy; a TorchScript trace that unrolls
# its loop over the experts hit at trace time only runs on inputs like its
# own, and a chain's later copies do not get those (the check then warns).
# Without residual connections the activations vanish after a few copies,
# so the check's run restarts from random values of unit scale at each
# such copy's input (see docs/numerical-check.md).
#
# Environment: PY (default /usr/bin/python3; Debian's python3-onnx is
# installed with apt-get when its onnx module is missing), REPS (default 3;
# the two commands run in turn, REPS rounds, and the fastest run of each
# counts), PERTURB=1 gives each copy weights of its
# own, W (work folder, default a new one under /tmp). Timings on a shared
# machine are noisy: compare the ratio of one run.
set -euo pipefail

ROOT=$(cd "$(dirname "$0")/.." && pwd)
BLOCK=${1:-$ROOT/testdata/exported/qwen3_moe_block_dynamo_batched_mm.onnx}
N=${2:-500}
PY=${PY:-/usr/bin/python3}
REPS=${REPS:-3}
W=${W:-$(mktemp -d /tmp/mokopt-chain.XXXXXX)}
mkdir -p "$W"

if ! "$PY" -c 'import onnx' 2>/dev/null; then
	echo "# installing python3-onnx" >&2
	apt-get install -y python3-onnx >/dev/null || { apt-get update >/dev/null && apt-get install -y python3-onnx >/dev/null; }
	PY=/usr/bin/python3
fi

(cd "$ROOT" && go build -o "$W/mokopt" ./cmd/mokopt && go build -o "$W/chain" ./bench/chain)
flags=()
[[ ${PERTURB:-0} == 1 ]] && flags+=(-perturb)
in="$W/chain_$N.onnx"
"$W/chain" -n "$N" "${flags[@]}" "$BLOCK" "$in"

# shellcheck source=bench/lib.sh
. "$ROOT/bench/lib.sh"
rounds=()
for ((r = 0; r < REPS; r++)); do
	once rewrite "$W/mokopt" rewrite "$in" -o "$W/rewritten.onnx"
	once pysave "$PY" -c 'import onnx, sys; onnx.save(onnx.load(sys.argv[1]), sys.argv[2])' "$in" "$W/pysaved.onnx"
	read -r a _ <"$W/time.rewrite"
	read -r b _ <"$W/time.pysave"
	rounds+=("$(ratio "$a" "$b")")
done
rw=${BEST_WALL[rewrite]} rw_rss=${BEST_RSS[rewrite]} rw_cpu=${BEST_CPU[rewrite]}
py=${BEST_WALL[pysave]} py_rss=${BEST_RSS[pysave]} py_cpu=${BEST_CPU[pysave]}
held=$("$PY" -c 'import onnx, sys; g = onnx.load(sys.argv[1]).graph; print(sum(n.op_type == "MoE" for n in g.node), "/", len(g.node))' "$W/rewritten.onnx")

echo "# $N directly chained copies of $(basename "$BLOCK"): $(stat -c %s "$in") bytes, REPS=$REPS (fastest), $W"
echo "rewrite (default flags, numerical check on): wall ${rw} s, cpu ${rw_cpu} s, peak RSS $((rw_rss / 1024)) MiB"
echo "python onnx load+save:                       wall ${py} s, cpu ${py_cpu} s, peak RSS $((py_rss / 1024)) MiB"
echo "fused nodes / nodes in the output: $held"
grep -h "numerical check" "$W/err.rewrite" | head -3 || true
echo "ratio rewrite / (python load+save): wall $(awk "BEGIN{printf \"%.2f\", $rw / $py}"), cpu $(awk "BEGIN{printf \"%.2f\", $rw_cpu / $py_cpu}")"
# Each round ran both commands back to back: its ratio compares them under
# the same load of the machine.
sorted=$(printf '%s\n' "${rounds[@]}" | sort -n)
echo "per-round wall ratios, sorted: $(echo $sorted) (median $(echo "$sorted" | awk '{a[NR]=$1} END{print a[int((NR+1)/2)]}'), $(echo "$sorted" | awk '$1 < 1' | wc -l) of ${#rounds[@]} below 1)"

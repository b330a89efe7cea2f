#!/usr/bin/env bash
# Scale benchmarks for mokopt (docs/scale.md). Every figure is a ratio to a
# baseline measured in the same run, on the same files, one after the other:
#
#   bench/scale.sh graphs [WORKDIR]   rewrite time vs mokopt's own load+save
#                                     (bench/loadsave: load, Check, save as
#                                     every mokopt command; and with -no-check
#                                     decode+encode only) and vs Python onnx's
#                                     load+save, peak RSS vs protobuf size,
#                                     for unrolled graphs of 1k..500k nodes
#   bench/scale.sh lower [WORKDIR]    lower's MXFP8 quantization throughput vs
#                                     copying the same bytes (cp + fsync)
#   bench/scale.sh big [WORKDIR]      the DeepSeek-V3-sized run: a >=300k-node
#                                     per-expert-unrolled model with >=4 GiB of
#                                     external weights is rewritten twice (same
#                                     sha256?), loaded+saved by mokopt and by
#                                     Python onnx, and lowered; peak RSS is
#                                     checked against 2 GiB + the protobuf size;
#                                     a same-shape small model is verified
#
# Environment: SIZES="LAYERS:EXPERTS ..." for graphs (default below), REPS
# (default 1; the fastest run counts), BIG_LAYERS/BIG_EXPERTS/BIG_HIDDEN/
# BIG_INTER for big, PY (default /usr/bin/python3; Python columns are n/a
# without its onnx module), KEEP=1 keeps the generated files. Timings on a
# shared machine are noisy: compare the ratios of one run, not across runs.
set -euo pipefail

mode=${1:-graphs}
W=${2:-$(mktemp -d /tmp/mokopt-bench.XXXXXX)}
mkdir -p "$W"
ROOT=$(cd "$(dirname "$0")/.." && pwd)
PY=${PY:-/usr/bin/python3}
REPS=${REPS:-1}

(cd "$ROOT" && go build -o "$W/mokopt" ./cmd/mokopt && go build -o "$W/loadsave" ./bench/loadsave)
M="$W/mokopt"
have_py=0
if "$PY" -c 'import onnx' 2>/dev/null; then have_py=1; fi

# shellcheck source=bench/lib.sh
. "$ROOT/bench/lib.sh"
pysave='import onnx, sys; m = onnx.load(sys.argv[1], load_external_data=False); onnx.save(m, sys.argv[2])'
nodes_of() { grep -o '"nodes": *[0-9]*' "$1" | grep -o '[0-9]*$'; }

graphs() {
	local sizes=${SIZES:-"1:45 2:256 8:256 29:256 58:256 90:256"}
	echo "# rewrite (--no-check) vs load+save, unrolled graphs, H=I=16 (weights external), REPS=$REPS, $W"
	echo "# ls: mokopt load + Check + save (as every mokopt command loads); raw: decode + encode only (loadsave -no-check)"
	printf "%8s %10s %9s | %8s %8s | %8s %8s | %8s %8s | %8s %8s | %7s %7s %7s %7s %7s %7s | %8s %6s | %7s\n" \
		nodes proto_B data_B rw_wall rw_cpu ls_wall ls_cpu raw_wall raw_cpu py_wall py_cpu rw/ls rw/lsC rw/raw rw/rawC rw/py rw/pyC rss_MiB rss/pb us/node
	for s in $sizes; do
		L=${s%%:*} E=${s##*:}
		in="$W/g_${L}_${E}.onnx"
		"$M" gen --quiet --shape unrolled --layers "$L" --experts "$E" --top-k 8 --hidden 16 --inter 16 --json -o "$in" >"$W/gen.json"
		n=$(nodes_of "$W/gen.json")
		pb=$(stat -c %s "$in")
		data=$(stat -c %s "$in.data" 2>/dev/null || echo 0)
		measure ls "$W/loadsave" "$in" "$W/ls.onnx"
		ls_w=$T_WALL ls_c=$T_CPU
		measure raw "$W/loadsave" -no-check "$in" "$W/ls.onnx"
		raw_w=$T_WALL raw_c=$T_CPU
		measure rw "$M" rewrite --no-check "$in" -o "$W/rw.onnx"
		rw_w=$T_WALL rw_c=$T_CPU rw_rss=$T_RSS
		py_w=n/a py_c=n/a r_py=n/a r_pyc=n/a
		if ((have_py)); then
			measure py "$PY" -c "$pysave" "$in" "$W/py.onnx"
			py_w=$T_WALL py_c=$T_CPU
			r_py=$(ratio "$rw_w" "$py_w") r_pyc=$(ratio "$rw_c" "$py_c")
		fi
		printf "%8d %10d %9d | %8s %8s | %8s %8s | %8s %8s | %8s %8s | %7s %7s %7s %7s %7s %7s | %8.0f %6s | %7.1f\n" \
			"$n" "$pb" "$data" "$rw_w" "$rw_c" "$ls_w" "$ls_c" "$raw_w" "$raw_c" "$py_w" "$py_c" \
			"$(ratio "$rw_w" "$ls_w")" "$(ratio "$rw_c" "$ls_c")" "$(ratio "$rw_w" "$raw_w")" "$(ratio "$rw_c" "$raw_c")" "$r_py" "$r_pyc" \
			"$(awk "BEGIN{print $rw_rss / 1024}")" "$(ratio "$rw_rss * 1024" "$pb")" \
			"$(awk "BEGIN{print $rw_c * 1e6 / $n}")"
		[[ ${KEEP:-0} == 1 ]] || rm -f "$in" "$in.data" "$W"/ls.onnx* "$W"/rw.onnx* "$W"/py.onnx*
	done
}

lower() {
	local L=${LOWER_LAYERS:-4} E=${LOWER_EXPERTS:-64}
	local in="$W/lo.onnx"
	"$M" gen --quiet --shape unrolled --layers "$L" --experts "$E" --top-k 8 --hidden 256 --inter 256 -o "$in" >/dev/null
	"$M" rewrite --no-check "$in" -o "$W/lo_r.onnx" >/dev/null
	local bytes
	bytes=$(stat -c %s "$W/lo_r.onnx.data")
	measure cp bash -c 'cp "$1" "$2" && sync "$2"' _ "$W/lo_r.onnx.data" "$W/copy.data"
	local cp_w=$T_WALL
	measure lower "$M" lower "$W/lo_r.onnx" -o "$W/lo_l.onnx" --target gb300-nvl72 --ep 8
	local lo_w=$T_WALL lo_c=$T_CPU lo_rss=$T_RSS
	echo "# lower: $L layers x $E experts, H=I=256: $bytes float32 bytes quantized to MXFP8 (+ shared-expert zeros), REPS=$REPS"
	printf "%14s %9s %9s %9s %10s %10s %9s %8s\n" bytes lo_wall lo_cpu cp_wall lo_MB/s cp_MB/s lo/cp rss_MiB
	printf "%14d %9s %9s %9s %10.0f %10.0f %9s %8.0f\n" "$bytes" "$lo_w" "$lo_c" "$cp_w" \
		"$(awk "BEGIN{print $bytes / 1048576 / $lo_w}")" "$(awk "BEGIN{print $bytes / 1048576 / $cp_w}")" \
		"$(ratio "$cp_w" "$lo_w")" "$(awk "BEGIN{print $lo_rss / 1024}")"
	[[ ${KEEP:-0} == 1 ]] || rm -f "$W"/lo*.onnx* "$W/copy.data"
}

big() {
	local L=${BIG_LAYERS:-54} E=${BIG_EXPERTS:-256} H=${BIG_HIDDEN:-256} I=${BIG_INTER:-256}
	local in="$W/big.onnx"
	echo "# big: unrolled, $L layers x $E experts, top-8, H=$H I=$I, $W"
	if [[ ! -f $in || ! -f $in.data ]]; then
		measure gen "$M" gen --quiet --shape unrolled --layers "$L" --experts "$E" --top-k 8 --hidden "$H" --inter "$I" --json -o "$in"
		cp "$W/out.gen" "$W/big.json"
		echo "gen: ${T_WALL}s"
	fi
	local n pb data
	n=$("$M" inspect --json "$in" | grep -o '"nodes": *[0-9]*' | head -1 | grep -o '[0-9]*$')
	pb=$(stat -c %s "$in")
	data=$(stat -c %s "$in.data")
	echo "model: $n nodes, protobuf $pb B, external data $data B ($(awk "BEGIN{printf \"%.2f\", $data / 2^30}") GiB)"
	# Outputs of the same name in two folders: the side file's name is in the model.
	mkdir -p "$W/r1" "$W/r2" "$W/ls"
	measure ls "$W/loadsave" "$in" "$W/ls/out.onnx"
	local ls_w=$T_WALL ls_c=$T_CPU ls_rss=$T_RSS
	rm -f "$W"/ls/out.onnx*
	measure raw "$W/loadsave" -no-check "$in" "$W/ls/out.onnx"
	local raw_w=$T_WALL raw_c=$T_CPU
	rm -f "$W"/ls/out.onnx*
	measure rw1 "$M" rewrite --no-check "$in" -o "$W/r1/out.onnx"
	local rw_w=$T_WALL rw_c=$T_CPU rw_rss=$T_RSS
	local h1 d1
	h1=$(sha256sum <"$W/r1/out.onnx" | cut -c1-64)
	d1=$(sha256sum <"$W/r1/out.onnx.data" | cut -c1-64)
	local py_w=n/a py_c=n/a
	if ((have_py)); then
		measure py "$PY" -c "$pysave" "$in" "$W/py.onnx"
		py_w=$T_WALL py_c=$T_CPU
		rm -f "$W/py.onnx"
	fi
	rm -f "$W"/r1/out.onnx*
	measure rw2 "$M" rewrite --no-check "$in" -o "$W/r2/out.onnx"
	local rw2_w=$T_WALL rw2_c=$T_CPU rw2_rss=$T_RSS
	local h2 d2
	h2=$(sha256sum <"$W/r2/out.onnx" | cut -c1-64)
	d2=$(sha256sum <"$W/r2/out.onnx.data" | cut -c1-64)
	# The baseline again, after the rewrites (page-cache state differs by order).
	measure ls2 "$W/loadsave" "$in" "$W/ls/out.onnx"
	local ls2_w=$T_WALL ls2_c=$T_CPU
	rm -f "$W"/ls/out.onnx*
	measure lower "$M" lower "$W/r2/out.onnx" -o "$W/low.onnx" --target gb300-nvl72 --ep 8
	local lo_w=$T_WALL lo_c=$T_CPU lo_rss=$T_RSS
	grep -m1 'lowered' "$W/out.lower" || true
	local lo_data
	lo_data=$(stat -c %s "$W/low.onnx.data")
	local limit=$((2 * 1024 * 1024 * 1024 + pb))
	echo "loadsave: ${ls_w}s wall ${ls_c}s cpu, peak RSS $((ls_rss / 1024)) MiB (again after the rewrites: ${ls2_w}s wall ${ls2_c}s cpu)"
	echo "rewrite:  ${rw_w}s wall ${rw_c}s cpu, peak RSS $((rw_rss / 1024)) MiB (2nd run ${rw2_w}s wall ${rw2_c}s cpu, $((rw2_rss / 1024)) MiB)"
	echo "python onnx load+save: ${py_w}s wall ${py_c}s cpu"
	echo "lower:    ${lo_w}s wall ${lo_c}s cpu, peak RSS $((lo_rss / 1024)) MiB, output data $lo_data B"
	echo "load+save without Check (decode + encode only): ${raw_w}s wall ${raw_c}s cpu"
	echo "ratios (same run): rewrite/loadsave wall $(ratio "$rw_w" "$ls_w") cpu $(ratio "$rw_c" "$ls_c"); 2nd rewrite/2nd loadsave wall $(ratio "$rw2_w" "$ls2_w") cpu $(ratio "$rw2_c" "$ls2_c")"
	echo "ratios (same run): rewrite/decode+encode wall $(ratio "$rw_w" "$raw_w") cpu $(ratio "$rw_c" "$raw_c")"
	echo "ratios (same run): rewrite/python wall $([[ $py_w == n/a ]] && echo n/a || ratio "$rw_w" "$py_w") cpu $([[ $py_c == n/a ]] && echo n/a || ratio "$rw_c" "$py_c")"
	echo "rewrite sha256 run1: $h1 / data $d1"
	echo "rewrite sha256 run2: $h2 / data $d2"
	[[ $h1 == "$h2" && $d1 == "$d2" ]] && echo "determinism: PASS" || echo "determinism: FAIL"
	for x in "rewrite:$rw_rss" "rewrite2:$rw2_rss" "lower:$lo_rss"; do
		local kb=${x##*:}
		((kb * 1024 < limit)) && echo "peak RSS ${x%%:*} $((kb / 1024)) MiB < 2 GiB + protobuf ($((limit / 1048576)) MiB): PASS" ||
			echo "peak RSS ${x%%:*} $((kb / 1024)) MiB >= 2 GiB + protobuf: FAIL"
	done
	# Correctness on the same shape, small: same flags but 2 layers x 16 experts.
	"$M" gen --quiet --shape unrolled --layers 2 --experts 16 --top-k 8 --hidden "$H" --inter "$I" -o "$W/small.onnx" >/dev/null
	"$M" rewrite --no-check "$W/small.onnx" -o "$W/small_r.onnx" >/dev/null
	"$M" verify "$W/small.onnx" "$W/small_r.onnx" | head -3
	[[ ${KEEP:-0} == 1 ]] || rm -f "$W"/r2/out.onnx* "$W"/low.onnx* "$W"/small*.onnx*
}

case $mode in
graphs) graphs ;;
lower) lower ;;
big) big ;;
*)
	echo "usage: bench/scale.sh graphs|lower|big [WORKDIR]" >&2
	exit 2
	;;
esac

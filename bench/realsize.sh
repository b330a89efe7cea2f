#!/usr/bin/env bash
# A real-size run of the whole pipeline (docs/scale.md): gen a model of
# LAYERS MoE blocks (default 32 of E=8 k=2 H=1024 I=2816, 8.9 GB of float32
# weights in a side file), then rewrite -> verify (fused against the
# original) -> lower (MoK, gb300-nvl72, EP 8) -> verify (lowered against
# fused, block by block), each step once, printing its wall time, CPU time
# and peak RSS (/usr/bin/time) and the verify reports' figures.
#
#   bench/realsize.sh [WORKDIR]
#
# Environment: LAYERS, EXPERTS, TOPK, HIDDEN, INTER, SHARED (a shared
# expert's intermediate size, 0: none), ROUTER (softmax or sigmoid), DTYPE
# (fp32, fp16 or bf16), SHAPE (gen's --shape) give the model; TOKENS
# (verify's --tokens, default 1,7,64); KEEP=1 keeps the files (about 21 GB
# with the defaults). PRESET names one of the real-size proofs and sets
# what it fixes (the environment still overrides the rest):
#   deepseek-layer  one DeepSeek-V3-shaped layer in bf16: E=256 k=8 H=7168
#                   I=2048, sigmoid router, a shared expert (22.5 GB)
#   h4096-bf16      8 layers of E=8 k=2 H=4096 I=14336 in bf16 (22.5 GB)
# The machine is shared: the figures are of one run.
set -euo pipefail

W=${1:-$(mktemp -d /tmp/mokopt-realsize.XXXXXX)}
mkdir -p "$W"
case ${PRESET:-} in
'') ;;
deepseek-layer) : "${LAYERS:=1}" "${EXPERTS:=256}" "${TOPK:=8}" "${HIDDEN:=7168}" "${INTER:=2048}" "${SHARED:=2048}" "${ROUTER:=sigmoid}" "${DTYPE:=bf16}" ;;
h4096-bf16) : "${LAYERS:=8}" "${EXPERTS:=8}" "${TOPK:=2}" "${HIDDEN:=4096}" "${INTER:=14336}" "${DTYPE:=bf16}" ;;
*) echo "unknown PRESET $PRESET" >&2; exit 2 ;;
esac
L=${LAYERS:-32} E=${EXPERTS:-8} K=${TOPK:-2} H=${HIDDEN:-1024} I=${INTER:-2816} TOKENS=${TOKENS:-1,7,64}
S=${SHARED:-0} R=${ROUTER:-softmax} DT=${DTYPE:-fp32} SH=${SHAPE:-batched}
cd "$(dirname "$0")/.."
go build -o "$W/mokopt" ./cmd/mokopt
M=$W/mokopt
cleanup() { if [[ ${KEEP:-0} != 1 ]]; then rm -f "$W"/*.onnx "$W"/*.onnx.data; fi; }
trap cleanup EXIT
df -h "$W" | tail -1

step() { # step NAME CMD...: runs CMD once after a sync and prints its figures
	local name=$1 rc=0
	shift
	sync
	/usr/bin/time -f "%e %U %S %M" -o "$W/time.$name" "$@" >"$W/out.$name" 2>"$W/err.$name" || rc=$?
	local wall user sys rss
	read -r wall user sys rss < <(tail -1 "$W/time.$name")
	printf '%-14s exit %d  wall %8.1f s  cpu %8.1f s  peak RSS %6.0f MiB\n' "$name" "$rc" "$wall" "$(awk "BEGIN{print $user + $sys}")" "$(awk "BEGIN{print $rss / 1024}")"
	if [[ $rc -ne 0 && $rc -ne 1 ]]; then
		tail -5 "$W/err.$name" >&2
		exit 1
	fi
}

echo "model: $L layers, E=$E k=$K H=$H I=$I shared $S, $R router, $DT, $SH shape; verify --tokens $TOKENS"
step gen "$M" gen -q --layers "$L" --experts "$E" --top-k "$K" --hidden "$H" --inter "$I" --shared-inter "$S" --router "$R" --dtype "$DT" --shape "$SH" -o "$W/m.onnx"
du -b "$W/m.onnx" "$W/m.onnx.data" | awk '{printf "  %s: %.2f GB\n", $2, $1 / 1e9}'
step rewrite "$M" -q rewrite "$W/m.onnx" -o "$W/f.onnx"
step verify-fused "$M" -q verify --tokens "$TOKENS" "$W/f.onnx" "$W/m.onnx"
grep -E '^(ok|MISMATCH)' "$W/out.verify-fused" | sed 's/^/  /'
step lower "$M" -q lower "$W/f.onnx" -o "$W/l.onnx" --target gb300-nvl72 --ep 8
du -b "$W/l.onnx.data" | awk '{printf "  %s: %.2f GB\n", $2, $1 / 1e9}'
step verify-lowered "$M" -q verify --tokens "$TOKENS" --json "$W/l.onnx" "$W/f.onnx"
python3 - "$W/out.verify-lowered" <<'PY' || true
import json, sys
r = json.load(open(sys.argv[1]))
print(f"  pass {r['pass']}; block bound {r['block_bound']}, end-to-end bound {r['end_to_end_bound']:.3g}")
for c in r["cases"]:
    bs = c["blocks"]
    worst = max(bs, key=lambda b: b["rel_l2"])
    d = sum(b["decisions"] for b in bs)
    rf = sum(max(b["router_flips"], 0) for b in bs)
    ef = sum(max(b["end_to_end_flips"], 0) for b in bs)
    o = c["outputs"][0]
    print(f"  {c['name']}: {sum(b['pass'] for b in bs)} of {len(bs)} blocks pass, worst rel L2 {100*worst['rel_l2']:.2f}% ({worst['node']}); "
          f"routing flips {rf} of {d} on the reference's inputs, {ef} end to end; end to end mean rel {100*o['mean_rel']:.2f}%, rel L2 {100*o['rel_l2']:.2f}%")
PY

#!/usr/bin/env bash
# Expert-parallel figures of docs/expert-parallelism.md: for each
# per-rank form at EP 4 and 8 and each router-weight placement, generate the
# rank files, inspect rank 1, merge them (`rewrite --merge-ranks`, with its
# lockstep group check), and verify the merged model against the single-rank
# reference built with the same weights. Usage: examples/ep_figures.sh
# (MOKOPT=path/to/mokopt to use a built binary; KEEP=dir keeps the files).
set -euo pipefail
cd "$(dirname "$0")/.."
work=${KEEP:-$(mktemp -d)}
mkdir -p "$work"
[ -n "${KEEP:-}" ] || trap 'rm -rf "$work"' EXIT
if [ -z "${MOKOPT:-}" ]; then
  go build -o "$work/mokopt" ./cmd/mokopt
  MOKOPT=$work/mokopt
fi
mk() { "$MOKOPT" --quiet "$@"; }
size=(--experts 16 --top-k 4 --hidden 32 --inter 64 --layers 2 --seed 7 --inline)
mk gen --shape batched "${size[@]}" --shared-inter 64 -o "$work/ref.onnx" >/dev/null
mk gen --shape batched "${size[@]}" -o "$work/ref_noshared.onnx" >/dev/null
echo "| form | EP | placement | rank 1 (inspect) | rank nodes -> merged nodes | group check | verify vs reference |"
echo "|---|---|---|---|---|---|---|"
for form in ort-alltoall ort-allgather deepep ort-sharded; do
  for ep in 4 8; do
    for pl in before_combine after_combine; do
      shared=(--shared-inter 64) ref=$work/ref.onnx
      if [ $form = ort-sharded ]; then
        [ $pl = before_combine ] && continue
        shared=() ref=$work/ref_noshared.onnx
      fi
      pre=$work/$form.ep$ep.$pl
      mk gen --ep-form $form --ep $ep --placement $pl "${size[@]}" "${shared[@]}" -o $pre.onnx >/dev/null
      ins=$(mk inspect $pre.rank1.onnx | sed -n 's/.*(\(ep-[a-z-]*\), .*: E=\([0-9]*\) k=\([0-9]*\).*/E=\2 k=\3/p;s/.*expert parallel: \(EP=[0-9]*, E\/EP=[0-9]*\).*/\1/p' | sort -u | tr '\n' ' ')
      nin=$(mk inspect --json $pre.rank0.onnx | sed -n 's/^    "nodes": \([0-9]*\),/\1/p' | head -1)
      chk=$(mk rewrite --merge-ranks $(ls $pre.rank*.onnx | sort -V) -o $pre.merged.onnx | sed -n 's/.*max |error| //p')
      nout=$(mk inspect --json $pre.merged.onnx | sed -n 's/^    "nodes": \([0-9]*\),/\1/p' | head -1)
      v=$(mk verify $pre.merged.onnx $ref --tokens 1,7,64 | grep -o 'max abs err [0-9.e+-]*' | awk '{print $4}' | sort -g | tail -1)
      echo "| $form | $ep | $pl | $ins| $nin -> $nout | $chk | $v |"
    done
  done
done
for ep in 4 8; do
  pre=$work/sharding.ep$ep
  mk gen --ep-form sharding --ep $ep "${size[@]}" --shared-inter 64 -o $pre.onnx >/dev/null
  ins=$(mk inspect $pre.onnx | sed -n 's/.*(\([a-z-]*\), .*: E=\([0-9]*\) k=\([0-9]*\).*/E=\2 k=\3/p;s/.*expert parallel: \(EP=[0-9]*, E\/EP=[0-9]*\).*/\1/p' | sort -u | tr '\n' ' ')
  nin=$(mk inspect --json $pre.onnx | sed -n 's/^    "nodes": \([0-9]*\),/\1/p' | head -1)
  mk rewrite $pre.onnx -o $pre.fused.onnx >/dev/null
  nout=$(mk inspect --json $pre.fused.onnx | sed -n 's/^    "nodes": \([0-9]*\),/\1/p' | head -1)
  v=$(mk verify $pre.fused.onnx $work/ref.onnx --tokens 1,7,64 | grep -o 'max abs err [0-9.e+-]*' | awk '{print $4}' | sort -g | tail -1)
  echo "| sharding (one global model) | $ep | - | $ins| $nin -> $nout | per-block check | $v |"
done

#!/usr/bin/env bash
# Prints the import graph of mokopt's packages (from `go list`, non-test imports
# only) and checks that every import points to a strictly lower layer of the
# table below. Exit 1 on an upward or sideways edge, or on a package the table
# does not place.
#
#   bash docs/importgraph.sh           # print the graph (Markdown) and check it
#   bash docs/importgraph.sh --write   # also replace the graph in docs/architecture.md
#
# The layers, lowest first (a package may import only from layers below its own):
layers='
0 graph/onnxpb kernel/mxfp8 internal/fixtures internal/f32 internal/testtools internal/gctune
1 graph kernel
2 graph/eval kernel/perf internal/chain
3 moe internal/ortmoe
4 internal/ep internal/verify passes/internal/canon
5 passes internal/diff
6 lowering models
7 . internal/composite
8 cmd/mokopt internal/ortrun bench/loadsave bench/chain bench/stack tools/scrubpaths tools/funclen
'
set -euo pipefail
cd "$(dirname "$0")/.."
mod=$(go list -m)
status=0
rows=$(go list -f '{{.ImportPath}} {{join .Imports " "}}' ./... |
  awk -v mod="$mod" -v layers="$layers" '
    BEGIN {
      n = split(layers, rows, "\n")
      for (i = 1; i <= n; i++) {
        m = split(rows[i], f, " ")
        for (j = 2; j <= m; j++) layer[f[j]] = f[1]
      }
    }
    function short(p) { return p == mod ? "." : substr(p, length(mod) + 2) }
    {
      a = short($1)
      if (!(a in layer)) { printf "unplaced package %s: add it to the layer table in docs/importgraph.sh\n", a > "/dev/stderr"; bad = 1; next }
      line = ""
      for (i = 2; i <= NF; i++) {
        if ($i != mod && index($i, mod "/") != 1) continue
        b = short($i)
        line = line (line == "" ? "" : ", ") "`" b "`"
        if (!(b in layer)) continue
        if (layer[b] + 0 >= layer[a] + 0) {
          printf "%s edge: %s (layer %d) imports %s (layer %d)\n", (layer[b] + 0 > layer[a] + 0 ? "upward" : "sideways"), a, layer[a], b, layer[b] > "/dev/stderr"
          bad = 1
        }
      }
      printf "%d\t%s\t| %d | `%s` | %s |\n", layer[a], a, layer[a], a, (line == "" ? "—" : line)
    }
    END { exit bad }') || status=$?
out=$(printf '| layer | package | imports (module packages) |\n|---|---|---|\n'; printf '%s\n' "$rows" | sort -t "$(printf '\t')" -k1,1nr -k2,2 | cut -f3)
echo "$out"
if [ "${1:-}" = --write ] && [ $status -eq 0 ]; then
  f=docs/architecture.md
  tmp=$(mktemp)
  awk -v graph="$out" '
    /<!-- importgraph:begin -->/ { print; print graph; skip = 1; next }
    /<!-- importgraph:end -->/ { skip = 0 }
    !skip { print }' "$f" >"$tmp"
  mv "$tmp" "$f"
fi
exit $status

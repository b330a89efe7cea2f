#!/usr/bin/env python3
"""Respells exports and checks that mokopt treats each form as its source.

    python3 tools/export/respell_sweep.py MOKOPT OUTDIR SRC.onnx ...

For every SRC (with its SRC_data golden folder) it runs respell.py's
transforms (with the onnx package of /usr/bin/python3, or $RESPELL_PYTHON),
then `MOKOPT rewrite --json` and `MOKOPT run --data` on the source and on
each form. A form agrees with its source when it fuses into the same
variants (twice as many for the `if` form, one copy per branch) and its
fused model reproduces every golden the source's does, or when both are
refused. A form refused with a request for the export's inputs is
retried with its golden inputs as --check-data. Prints one line per form
that does not agree and a summary; exits 1 when any does not. Needs nothing but the Python standard library
here. $JOBS sets the parallelism (default: the CPU count); $FORMS (names
separated by spaces) runs those transforms only.
"""
import concurrent.futures
import json
import os
import shutil
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
PY = os.environ.get("RESPELL_PYTHON", "/usr/bin/python3")


def canonical(variant):
    """A variant whose router activates the top-k logits named as its equal that activates
    them all first (moe.Spec.CanonicalRouting): softmax over the top-k logits as softmax,
    top-k, renormalised; a sigmoid's order swapped."""
    if variant and variant.startswith("softmax_topk_act_"):
        return "softmax_act_topk_norm_" + variant[len("softmax_topk_act_"):]
    if variant and variant.startswith("sigmoid_topk_act_"):
        return "sigmoid_act_topk_" + variant[len("sigmoid_topk_act_"):]
    return variant


ASKS_DATA = "pass inputs like the export's with --check-data"


def fuse(mokopt, model, out):
    """(variants or None, refusal message, goldens reproduced per data set).
    A refusal that asks for the export's inputs (a trace whose shapes do not
    follow its declared dims) is retried with the model's golden inputs as
    --check-data, as its message tells a user to."""
    data = model[:-len(".onnx")] + "_data"
    r = subprocess.run([mokopt, "rewrite", "--json", model, "-o", out], capture_output=True, text=True)
    if r.returncode != 0 and ASKS_DATA in r.stderr and os.path.isdir(data):
        r = subprocess.run([mokopt, "rewrite", "--json", "--check-data", data, model, "-o", out], capture_output=True, text=True)
    if r.returncode != 0:
        return None, r.stderr.strip().splitlines()[-1:] or ["exit %d" % r.returncode], []
    variants = [canonical(f.get("variant")) for f in json.loads(r.stdout)["report"].get("fused") or []]
    ok = []
    for s in sorted(os.listdir(data)) if os.path.isdir(data) else []:
        q = subprocess.run([mokopt, "run", "--rtol", "1e-3", "--atol", "1e-4", out, "--data", os.path.join(data, s)],
                           capture_output=True, text=True)
        ok.append(q.returncode == 0)
    return variants, "", ok


def one(mokopt, outdir, src):
    name = os.path.basename(src)[:-len(".onnx")]
    work = os.path.join(outdir, name)
    os.makedirs(work, exist_ok=True)
    forms = os.environ.get("FORMS", "").split()
    r = subprocess.run([PY, os.path.join(HERE, "respell.py"), work, src] + forms, capture_output=True, text=True)
    if r.returncode != 0:
        return [(name, "respell failed: " + r.stderr.strip()[-300:])], 0
    base = fuse(mokopt, src, os.path.join(work, "src.fused.onnx"))
    bad, n = [], 0
    for f in sorted(os.listdir(work)):
        if not f.endswith(".onnx") or "__" not in f or f.endswith(".fused.onnx"):
            continue
        n += 1
        form = f[:-len(".onnx")].split("__", 1)[1]
        got = fuse(mokopt, os.path.join(work, f), os.path.join(work, f[:-5] + ".fused.onnx"))
        want_v = base[0] if base[0] is None or form != "if" else base[0] * 2
        if base[0] is None and got[0] is None:
            continue
        if got[0] is None:
            bad.append((f, "refused (source fused %s): %s" % (base[0], got[1][0])))
        elif want_v is None:
            bad.append((f, "fused %s (source refused: %s)" % (got[0], base[1][0])))
        elif sorted(got[0]) != sorted(want_v):
            bad.append((f, "fused %s, source %s" % (got[0], want_v)))
        elif got[2] != base[2]:
            bad.append((f, "goldens reproduced %s, source %s" % (got[2], base[2])))
    shutil.rmtree(work, ignore_errors=True)
    return bad, n


def main():
    if len(sys.argv) < 4:
        sys.exit(__doc__)
    mokopt, outdir, srcs = os.path.abspath(sys.argv[1]), sys.argv[2], sys.argv[3:]
    jobs = int(os.environ.get("JOBS", os.cpu_count() or 1))
    total, bad = 0, []
    with concurrent.futures.ThreadPoolExecutor(jobs) as ex:
        for b, n in ex.map(lambda s: one(mokopt, outdir, s), srcs):
            total += n
            for f, why in b:
                print("%s: %s" % (f, why), flush=True)
            bad += b
    print("%d sources, %d forms, %d do not agree with their source" % (len(srcs), total, len(bad)))
    sys.exit(1 if bad else 0)


if __name__ == "__main__":
    main()

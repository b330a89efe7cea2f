"""Export a matrix of transformers MoE families through every graph producer that
export_producers.py covers, at sizes of its own, with ONNX Runtime golden outputs: a sweep
that finds the (family, producer) pairs mokopt does not handle yet. The exports that taught
mokopt something are kept in testdata/producers (see its README); the sweep itself is
re-run, not stored.

Producers per family:
  ts            torch.onnx.export(dynamo=False)           (the plain source)
  dyn           torch.onnx.export(dynamo=True)            (the plain source)
  functions     TorchScript, export_modules_as_functions={the block's class}
  dynraw        dynamo=True, optimize=False
  ortext_ts     ORT_ENABLE_EXTENDED offline optimization of ts (CPU EP)
  ortall_dyn    ORT_ENABLE_ALL offline optimization of dyn (CPU EP)
  int8_ts       onnxruntime.quantization.quantize_dynamic of ts  (expected: refused)
  opset12       TorchScript opset 12
  symbolic      TorchScript with dynamic batch and sequence axes

usage: python3 export_matrix.py OUTDIR [family ...]
Sizes from MATRIX_H (96), MATRIX_E (6), MATRIX_K (3), MATRIX_MI (48), MATRIX_I (80), MATRIX_T (12).
"""
import json, os, sys, time

import numpy as np
import onnx
import onnxruntime as ort
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import export_moe as em  # noqa: E402
import export_producers as ep  # noqa: E402

H = int(os.environ.get("MATRIX_H", 96))
E = int(os.environ.get("MATRIX_E", 6))
K = int(os.environ.get("MATRIX_K", 3))
MI = int(os.environ.get("MATRIX_MI", 48))
I = int(os.environ.get("MATRIX_I", 80))
T = int(os.environ.get("MATRIX_T", 12))
FAMILIES = ["mixtral", "qwen2_moe", "qwen3_moe", "olmoe", "deepseek_v3", "gpt_oss", "phimoe",
            "granitemoe", "llama4", "glm4_moe", "ernie4_5_moe"]


def main():
    ep.OUT = sys.argv[1]
    only = set(sys.argv[2:])
    os.makedirs(ep.OUT, exist_ok=True)
    for fam in FAMILIES:
        if only and fam not in only:
            continue
        k = 1 if fam == "llama4" else K
        kx = 2 if fam == "phimoe" else k  # PhiMoE's sparsemixer routes top-2 whatever the config says
        g = (lambda s: [ep.inputs(H, s, t=T), ep.inputs(H, s + 1, t=T)])
        xs = g(90)
        for prod in ("ts", "dyn", "functions", "dynraw", "ortext_ts", "ortall_dyn", "int8_ts", "opset12", "symbolic"):
            name = f"m_{prod}_{fam}"
            t0 = time.time()
            try:
                exporter = "dynamo" if prod in ("dyn", "dynraw", "ortall_dyn") else "torchscript"
                impl_first = prod in ("dyn", "dynraw", "ortall_dyn")

                def build(impl):
                    moe, _ = ep.hf_block(fam, H, E, k, mi=MI, i=I, impl=impl, seed=3)
                    return em.First(moe).eval(), moe
                mod, moe = None, None
                for impl in (["batched_mm", None] if impl_first else [None]):
                    try:
                        mod, moe = build(impl)
                        kw = {}
                        src = name
                        if prod == "functions":
                            kw["export_modules_as_functions"] = {type(moe)}
                        if prod == "dynraw":
                            kw["optimize"] = False
                        if prod in ("ortext_ts", "ortall_dyn", "int8_ts"):
                            src = f"_src_{name}"
                        if prod == "symbolic":
                            kw["dynamic_axes"] = {"hidden_states": {0: "batch", 1: "sequence"}, "moe_out": {0: "batch", 1: "sequence"}}
                        call = ep.export(mod, xs[0], src, exporter, opset=12 if prod == "opset12" else None, **kw)
                        break
                    except Exception:  # noqa: BLE001
                        if impl is None or not impl_first:
                            raise
                out = os.path.join(ep.OUT, name + ".onnx")
                srcp = os.path.join(ep.OUT, f"_src_{name}.onnx")
                verdict = {"verdict": "fuse", "E": E, "k": kx}
                if prod in ("ortext_ts", "ortall_dyn"):
                    so = ort.SessionOptions()
                    so.graph_optimization_level = (ort.GraphOptimizationLevel.ORT_ENABLE_EXTENDED if prod == "ortext_ts"
                                                   else ort.GraphOptimizationLevel.ORT_ENABLE_ALL)
                    so.optimized_model_filepath = out
                    ort.InferenceSession(srcp, so, providers=["CPUExecutionProvider"])
                    call += f"; then ORT offline optimization ({prod}) to '{name}.onnx'"
                elif prod == "int8_ts":
                    from onnxruntime.quantization import quantize_dynamic
                    quantize_dynamic(srcp, out)
                    call += f"; then quantize_dynamic(that, '{name}.onnx')"
                    verdict = {"verdict": "refuse", "reason": "int8-quantized"}
                if os.path.exists(srcp):
                    os.remove(srcp)
                ref = ep.run_ref(mod, xs) if prod != "int8_ts" else None
                ep.finish(name, prod, fam, dict(H=H, E=E, k=kx, MI=MI, I=I, T=T), call, verdict,
                          [[x.numpy()] for x in xs], ref=ref, extra={"s": round(time.time() - t0, 1)})
            except Exception as ex:  # noqa: BLE001
                ep.fail(name, prod, fam, prod, ex)
        ep.write_manifest(only)
    ep.write_manifest(only)
    print("done", flush=True)


if __name__ == "__main__":
    main()

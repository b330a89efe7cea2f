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
  ortext_dyn    ORT_ENABLE_EXTENDED offline optimization of dyn
  ortall_ts     ORT_ENABLE_ALL offline optimization of ts
  int8pc_dyn    quantize_dynamic(per_channel=True) of dyn (value_info cleared first)
  nested        TorchScript functions for the block's class and every submodule class under it
  full_dyn      a 2-layer decoder (input_ids -> logits) through dynamo
  full_ortext   full_dyn, then ORT_ENABLE_EXTENDED
  full_raw      a 2-layer decoder through dynamo, optimize=False
  full_xfm      full_dyn, then onnxruntime.transformers.optimizer.optimize_model(model_type="gpt2")
  ortbasic_ts   ORT_ENABLE_BASIC offline optimization of ts
  osopt_ts      onnxscript.optimizer.optimize of ts (constant folding, dead code, its rewrite rules)
  fp16_ts       onnxruntime.transformers.float16.convert_float_to_float16(keep_io_types=True) of ts
  qdq_dyn       onnxruntime.quantization.quantize_static (QDQ, int8) of dyn, calibrated on the
                golden inputs                                        (expected: refused)
  initin_ts     TorchScript with keep_initializers_as_inputs=True (weights also graph inputs)
  nofold_ts     TorchScript with do_constant_folding=False
  symdyn        dynamo with dynamic batch and sequence axes
  extdata_dyn   dynamo, then onnx.save_model(save_as_external_data=True, every tensor in NAME.weights)
MATRIX_PRODUCERS picks some (comma-separated; default: the first nine).

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


def full_case(fam, prod, k, kx):
    """A 2-layer decoder of fam (input_ids -> logits) through dynamo, plain, ORT-optimized or raw."""
    name = f"m_{prod}_{fam}"
    try:
        em.set_sizes(H=H, E=E, K=k, MI=MI, I=I, L=2, V=128)
        last = None
        for impl in ("batched_mm", None):
            try:
                _, model = ep.hf_block(fam, H, E, k, mi=MI, i=I, layers=2, impl=impl, seed=5)
                mod = ep.Full(model).eval()
                ids = [torch.randint(0, 128, (2, T), generator=torch.Generator().manual_seed(s)) for s in (95, 96)]
                src = os.path.join(ep.OUT, (f"_src_{name}" if prod in ("full_ortext", "full_xfm") else name) + ".onnx")
                with torch.no_grad():
                    torch.onnx.export(mod, (ids[0],), src, input_names=["input_ids"], output_names=["logits"], dynamo=True,
                                      opset_version=18, external_data=False, optimize=prod != "full_raw")
                break
            except Exception as ex:  # noqa: BLE001
                last = ex
        else:
            raise last
        call = f"torch.onnx.export(Full(model), (input_ids[2,{T}],), dynamo=True, optimize={prod != 'full_raw'})"
        out = os.path.join(ep.OUT, name + ".onnx")
        if prod == "full_ortext":
            ep.ort_optimize(src, out)
            os.remove(src)
            call += "; then ORT_ENABLE_EXTENDED"
        if prod == "full_xfm":
            from onnxruntime.transformers.optimizer import optimize_model
            optimize_model(src, model_type="gpt2", num_heads=0, hidden_size=0).save_model_to_file(out)
            os.remove(src)
            call += '; then onnxruntime.transformers.optimizer.optimize_model(model_type="gpt2")'
        with torch.no_grad():
            ref = [mod(i).numpy() for i in ids]
        ep.finish(name, prod, fam, dict(H=H, E=E, k=kx, MI=MI, I=I, T=T, layers=2), call,
                  {"verdict": "fuse", "E": E, "k": kx, "blocks": 2}, [[i.numpy()] for i in ids], ref=ref)
    except Exception as ex:  # noqa: BLE001
        ep.fail(name, prod, fam, prod, ex)


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
        prods = os.environ.get("MATRIX_PRODUCERS", "ts,dyn,functions,dynraw,ortext_ts,ortall_dyn,int8_ts,opset12,symbolic").split(",")
        for prod in prods:
            if prod.startswith("full"):
                full_case(fam, prod, k, kx)
                continue
            name = f"m_{prod}_{fam}"
            t0 = time.time()
            try:
                exporter = "dynamo" if prod in ("dyn", "dynraw", "ortall_dyn", "ortext_dyn", "int8pc_dyn", "qdq_dyn", "symdyn",
                                                "extdata_dyn") else "torchscript"
                impl_first = exporter == "dynamo"

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
                        if prod == "nested":
                            kw["export_modules_as_functions"] = {type(x) for x in moe.modules()
                                                                 if type(x).__module__.startswith("transformers")}
                        if prod == "dynraw":
                            kw["optimize"] = False
                        if prod in ("ortext_ts", "ortall_dyn", "int8_ts", "ortext_dyn", "ortall_ts", "int8pc_dyn",
                                    "ortbasic_ts", "osopt_ts", "fp16_ts", "qdq_dyn"):
                            src = f"_src_{name}"
                        if prod == "initin_ts":
                            kw["keep_initializers_as_inputs"] = True
                        if prod == "nofold_ts":
                            kw["do_constant_folding"] = False
                        if prod == "extdata_dyn":
                            src = f"_src_{name}"
                        if prod in ("symbolic", "symdyn"):
                            kw["dynamic_axes"] = {"hidden_states": {0: "batch", 1: "sequence"}, "moe_out": {0: "batch", 1: "sequence"}}
                        call = ep.export(mod, xs[0], src, exporter, opset=12 if prod == "opset12" else None, **kw)
                        break
                    except Exception:  # noqa: BLE001
                        if impl is None or not impl_first:
                            raise
                out = os.path.join(ep.OUT, name + ".onnx")
                srcp = os.path.join(ep.OUT, f"_src_{name}.onnx")
                verdict = {"verdict": "fuse", "E": E, "k": kx}
                if prod in ("ortext_ts", "ortall_dyn", "ortext_dyn", "ortall_ts", "ortbasic_ts"):
                    ep.ort_optimize(srcp, out, {"ortext": ort.GraphOptimizationLevel.ORT_ENABLE_EXTENDED,
                                                "ortall": ort.GraphOptimizationLevel.ORT_ENABLE_ALL,
                                                "ortbas": ort.GraphOptimizationLevel.ORT_ENABLE_BASIC}[prod[:6]])
                    call += f"; then ORT offline optimization ({prod}) to '{name}.onnx'"
                elif prod in ("int8_ts", "int8pc_dyn"):
                    from onnxruntime.quantization import quantize_dynamic
                    m0 = onnx.load(srcp)
                    del m0.graph.value_info[:]  # dynamo's value_info trips the quantizer's shape inference
                    onnx.save(m0, srcp)
                    quantize_dynamic(srcp, out, per_channel=prod == "int8pc_dyn")
                    call += f"; value_info cleared; then quantize_dynamic(that, '{name}.onnx', per_channel={prod == 'int8pc_dyn'})"
                    verdict = {"verdict": "refuse", "reason": "int8-quantized"}
                elif prod == "extdata_dyn":
                    m0 = onnx.load(srcp)
                    onnx.save_model(m0, out, save_as_external_data=True, location=f"{name}.weights", size_threshold=0)
                    call += f"; then onnx.save_model(save_as_external_data=True, location='{name}.weights', size_threshold=0) to '{name}.onnx'"
                elif prod == "osopt_ts":
                    import onnxscript.optimizer
                    onnx.save(onnxscript.optimizer.optimize(onnx.load(srcp)), out)
                    call += f"; then onnxscript.optimizer.optimize to '{name}.onnx'"
                elif prod == "fp16_ts":
                    from onnxruntime.transformers.float16 import convert_float_to_float16
                    onnx.save(convert_float_to_float16(onnx.load(srcp), keep_io_types=True), out)
                    call += f"; then convert_float_to_float16(keep_io_types=True) to '{name}.onnx'"
                elif prod == "qdq_dyn":
                    from onnxruntime.quantization import CalibrationDataReader, QuantFormat, quantize_static

                    class Reader(CalibrationDataReader):
                        def __init__(s):
                            s.it = iter([{"hidden_states": x.numpy()} for x in xs])

                        def get_next(s):
                            return next(s.it, None)
                    m0 = onnx.load(srcp)
                    del m0.graph.value_info[:]
                    onnx.save(m0, srcp)
                    quantize_static(srcp, out, Reader(), quant_format=QuantFormat.QDQ)
                    call += f"; value_info cleared; then quantize_static(QDQ, calibrated on the inputs) to '{name}.onnx'"
                    verdict = {"verdict": "refuse", "reason": "int8-quantized"}
                if os.path.exists(srcp):
                    os.remove(srcp)
                ref = ep.run_ref(mod, xs) if not prod.startswith(("int8", "qdq", "fp16")) else None
                ep.finish(name, prod, fam, dict(H=H, E=E, k=kx, MI=MI, I=I, T=T), call, verdict,
                          [[x.numpy()] for x in xs], ref=ref, extra={"s": round(time.time() - t0, 1)})
            except Exception as ex:  # noqa: BLE001
                ep.fail(name, prod, fam, prod, ex)
        ep.write_manifest(only)
    ep.write_manifest(only)
    print("done", flush=True)


if __name__ == "__main__":
    main()

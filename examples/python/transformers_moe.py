#!/usr/bin/env python3
"""From a transformers MoE model to a fused and lowered ONNX model, in Python.

    torch.onnx.export -> mokopt.rewrite -> mokopt.verify (against ONNX Runtime
    on the export's inputs) -> mokopt.lower(target="ort") -> ONNX Runtime session

The model is a tiny Mixtral (2 decoder layers, hidden 64, 4 experts, top-2)
with random weights, so the example needs no download. ``--what full`` (the
default) exports the whole decoder (input_ids -> logits); ``--what block``
exports the first layer's sparse MoE block alone. Each step prints what it
did; the script exits non-zero if a step fails or the lowered model's outputs
under ONNX Runtime differ from the export's.

Needs torch, transformers, onnx, onnxruntime, the mokopt package
(``pip install ./python``) and a mokopt binary (the wheel's, MOKOPT_BINARY or
PATH). Usage: python3 examples/python/transformers_moe.py [--what full|block] [--out DIR]
"""

from __future__ import annotations

import argparse
import os
import tempfile

import numpy as np
import onnxruntime as ort
import torch
import transformers

import mokopt


def tiny_mixtral() -> torch.nn.Module:
    cfg = transformers.MixtralConfig(
        hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, head_dim=16, vocab_size=128, max_position_embeddings=128,
        num_local_experts=4, num_experts_per_tok=2,
    )
    torch.manual_seed(0)
    model = transformers.MixtralForCausalLM(cfg).eval().float()
    # transformers runs the experts as one batched matmul over the stacked
    # weights with this setting (its default is a Python loop over experts).
    for m in model.modules():
        if hasattr(m, "config"):
            m.config._experts_implementation = "batched_mm"
    return model


class Logits(torch.nn.Module):
    def __init__(self, m: torch.nn.Module) -> None:
        super().__init__()
        self.m = m

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        return self.m(input_ids=input_ids, use_cache=False).logits


class FirstOutput(torch.nn.Module):
    def __init__(self, m: torch.nn.Module) -> None:
        super().__init__()
        self.m = m

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.m(x)
        return y[0] if isinstance(y, tuple) else y


def session(path_or_model, providers):
    data = path_or_model if isinstance(path_or_model, str) else path_or_model.SerializeToString()
    return ort.InferenceSession(data, providers=providers)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--what", choices=["full", "block"], default="full")
    ap.add_argument("--out", default=None, help="keep the models in this folder")
    a = ap.parse_args()
    out = a.out or tempfile.mkdtemp(prefix="mokopt-example-")
    os.makedirs(out, exist_ok=True)

    model = tiny_mixtral()
    torch.manual_seed(1)
    if a.what == "full":
        mod, x, names = Logits(model), torch.randint(0, 128, (2, 8)), (["input_ids"], ["logits"])
    else:
        # The first sparse MoE block (named block_sparse_moe or mlp, by transformers version).
        blk = next(m for m in model.modules() if type(m).__name__.endswith("SparseMoeBlock"))
        mod, x, names = FirstOutput(blk), torch.randn(2, 8, 64), (["hidden_states"], ["moe_out"])
    mod.eval()  # the wrappers are new modules, in training mode until told
    exported = os.path.join(out, f"mixtral_{a.what}.onnx")
    with torch.no_grad():
        want = mod(x).numpy()
        torch.onnx.export(mod, (x,), exported, input_names=names[0], output_names=names[1], dynamo=True, external_data=False)
    feeds = {names[0][0]: x.numpy()}
    print(f"exported {exported} (transformers {transformers.__version__}, torch {torch.__version__})")

    # ONNX Runtime on the export: the reference outputs.
    cpu = ["CPUExecutionProvider"]
    (ref,) = session(exported, cpu).run(None, feeds)
    print(f"onnxruntime {ort.__version__} on the export: {names[1][0]} {list(ref.shape)}, "
          f"max abs diff vs torch {np.abs(ref - want).max():.3g}")

    fused, rep = mokopt.rewrite(exported)  # each block is checked numerically
    print(f"mokopt.rewrite: {len(rep.fused)} MoE block(s) fused")
    for f in rep.fused:
        s = f.block.spec
        print(f"  {f.node} ({f.block.kind}): {f.nodes_removed} nodes -> ai.mok::MoE [{f.variant}] "
              f"E={s.num_experts} k={s.top_k} H={s.hidden} I={s.inter}")

    v = mokopt.verify(fused, inputs=feeds, expected=[ref])  # raises VerifyMismatch if off
    o = v.cases[0].outputs[0]
    print(f"mokopt.verify (fused, mokopt's interpreter) vs onnxruntime (export): pass={v.passed}, "
          f"max abs err {o.max_abs_err:.3g}, max rel err {o.max_rel_err:.3g}, {o.mismatches} of {o.elements} off")

    lowered_path = os.path.join(out, f"mixtral_{a.what}_ort.onnx")
    lowered, lrep = mokopt.lower(fused, target="ort", output=lowered_path)
    print(f"mokopt.lower(target='ort'): {sum(b.lowered for b in lrep.blocks)} of {len(lrep.blocks)} fused node(s) "
          f"-> com.microsoft::MoE, written to {lowered_path}")

    providers = [p for p in ("CUDAExecutionProvider", "CPUExecutionProvider") if p in ort.get_available_providers()]
    try:
        sess = session(lowered_path, providers)
    except Exception as e:  # an execution provider without the contrib op: ONNX Runtime's CPU one has it
        print(f"{providers[0]} cannot run the lowered model ({type(e).__name__}); using CPUExecutionProvider")
        sess = session(lowered_path, cpu)
    (got,) = sess.run(None, feeds)
    err = float(np.abs(got - ref).max())
    ops = sorted({f"{n.domain or 'ai.onnx'}::{n.op_type}" for n in lowered.graph.node if n.op_type == "MoE"})
    print(f"onnxruntime on the lowered model ({sess.get_providers()[0]}, ops {ops}): "
          f"max abs diff vs the export {err:.3g}")
    if err > 1e-3 * max(1.0, float(np.abs(ref).max())):
        raise SystemExit(f"the lowered model's outputs differ from the export's by {err}")
    print("ok")


if __name__ == "__main__":
    main()

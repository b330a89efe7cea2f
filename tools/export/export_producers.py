"""Export tiny random MoE blocks through graph producers beyond torch.onnx's defaults, with
ONNX Runtime golden outputs (ONNX backend-test layout) and a manifest.

Each case NAME gives OUTDIR/NAME.onnx and OUTDIR/NAME_data/test_data_set_{0,1}/{input,output}_*.pb,
the outputs computed by ONNX Runtime (CPU EP) on the very file written. OUTDIR/manifest.json
records per case the producer class, family, sizes, the exporter call, node count, op census
(with domains), the expected verdict, or the exception when an export failed.

Producer classes:
  functions   TorchScript export_modules_as_functions (block class; block + expert class)
  dynamo_raw  torch.onnx.export(dynamo=True, optimize=False)
  ort_opt     ONNX Runtime offline-optimized (ORT_ENABLE_EXTENDED / ORT_ENABLE_ALL, CPU EP)
  int8_dyn    onnxruntime.quantization.quantize_dynamic (default, per_channel=True)
  sorted      sort-based grouped dispatch (JetMoE / GraniteMoE ParallelExperts design)
  capacity    capacity-limited routers (Switch top-1, NLLB-MoE top-2, tokens dropped)
  chain       blocks chained directly (nn.Sequential, no residual)
  low_opset   TorchScript opset 11 and 12
  symbolic    TorchScript dynamic_axes over a trace with static internal shapes

usage: python3 export_producers.py OUTDIR [class ...]
Reuses export_moe.py (beside this file) for the block classes and helpers.
"""
import json, os, re, sys, time, traceback
import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import export_moe as em  # noqa: E402
import onnx  # noqa: E402
import onnxruntime as ort  # noqa: E402
import transformers  # noqa: E402

OUT = None
MANIFEST = []
B, T = 2, 8


def census(m):
    ops = {}
    for n in m.graph.node:
        k = (n.domain + "::" if n.domain not in ("", "ai.onnx") else "") + n.op_type
        ops[k] = ops.get(k, 0) + 1
    fops = {}
    for f in m.functions:
        for n in f.node:
            k = (n.domain + "::" if n.domain not in ("", "ai.onnx") else "") + n.op_type
            fops[k] = fops.get(k, 0) + 1
    return ops, fops


def finish(name, cls, family, sizes, call, verdict, feeds_list, ref=None, extra=None):
    """Write the golden sets for OUT/name.onnx, record the case in the manifest."""
    p = os.path.join(OUT, name + ".onnx")
    m = onnx.load(p)
    ops, fops = census(m)
    errs = []
    for i, feeds in enumerate(feeds_list):
        outs = em.save_case(p, feeds, name, index=i)
        if ref is not None and i < len(ref) and ref[i] is not None:
            errs.append(float(np.abs(np.asarray(outs[0]) - ref[i]).max()))
    rec = {"name": name, "class": cls, "family": family, "sizes": sizes, "exporter_call": call,
           "ok": True, "nodes": len(m.graph.node), "ops": ops,
           "opsets": {(o.domain or "ai.onnx"): o.version for o in m.opset_import},
           "functions": [f"{f.domain}::{f.name}" for f in m.functions], "function_ops": fops,
           "inputs": [[i.name, [d.dim_param or d.dim_value for d in i.type.tensor_type.shape.dim]] for i in m.graph.input],
           "bytes": os.path.getsize(p), "test_data_sets": len(feeds_list), "expected": verdict}
    if errs:
        rec["max_abs_err_vs_torch"] = max(errs)
    if extra:
        rec.update(extra)
    MANIFEST.append(rec)
    print("OK", name, "nodes", len(m.graph.node), "bytes", rec["bytes"], "err", errs, sorted(ops.items(), key=lambda kv: -kv[1])[:10], flush=True)
    return rec


def _local(s):
    """Error text without this machine's paths."""
    s = s.replace(os.path.dirname(os.path.abspath(__file__)) + os.sep, "tools/export/")
    return re.sub(r"/\S*?/lib/python3\.\d+(/site-packages/|/)", "site-packages/", s)


def fail(name, cls, family, call, e):
    c = e
    while c.__cause__ is not None:
        c = c.__cause__
    MANIFEST.append({"name": name, "class": cls, "family": family, "exporter_call": call, "ok": False,
                     "error": _local(repr(c))[:1500]})
    print(_local(traceback.format_exc()[-1200:]), flush=True)
    print("FAIL", name, repr(c)[:500], flush=True)
    p = os.path.join(OUT, name + ".onnx")
    if os.path.exists(p):
        os.remove(p)


def inputs(h, seed, b=B, t=T):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(b, t, h, generator=g)


def export(mod, x, name, exporter, opset=None, **kw):
    """torch.onnx.export of mod on x to OUT/name.onnx; returns the call as text."""
    p = os.path.join(OUT, name + ".onnx")
    dyn = exporter == "dynamo"
    opset = opset or (18 if dyn else 17)
    args = dict(input_names=["hidden_states"], output_names=["moe_out"], dynamo=dyn, opset_version=opset)
    if dyn:
        args["external_data"] = False
    args.update(kw)
    with torch.no_grad():
        torch.onnx.export(mod, (x,), p, **args)
    shown = {k: (sorted(c.__name__ for c in v) if k == "export_modules_as_functions" else v) for k, v in args.items()}
    return f"torch.onnx.export(module, (hidden_states[{','.join(map(str, x.shape))}],), '{name}.onnx', " + \
        ", ".join(f"{k}={v!r}" for k, v in shown.items()) + ")"


def ort_optimize(src, out, level=ort.GraphOptimizationLevel.ORT_ENABLE_EXTENDED):
    """ONNX Runtime's offline optimization of src at level (CPU EP), written to out."""
    so = ort.SessionOptions()
    so.graph_optimization_level = level
    so.optimized_model_filepath = out
    ort.InferenceSession(src, so, providers=["CPUExecutionProvider"])


def run_ref(mod, xs):
    with torch.no_grad():
        return [mod(x).numpy() for x in xs]


# ---------------------------------------------------------------- families

def hf4(h, i, e, k, shared=False, seed=0):
    em.set_sizes(H=h, I=i, E=e, K=k)
    torch.manual_seed(seed)
    blk = em.HF4SparseMoe(shared=shared).eval()
    return blk


def hf_block(fam, h, e, k, mi=32, i=64, layers=1, seed=0, impl=None):
    """A transformers MoE block (and its model) of family fam from export_moe.fams()."""
    em.set_sizes(H=h, E=e, K=k, MI=mi, I=i, L=layers)
    for f, mk, clsname in em.fams():
        if f == fam:
            torch.manual_seed(seed)
            cfg = mk()
            model = getattr(transformers, clsname)(cfg).eval().float()
            em.set_experts_impl(model, impl)
            _, moe = em.find_moe(model)
            return moe, model
    raise KeyError(fam)


def with_impls(fn, exporter):
    """Try transformers' eager experts first, then batched_mm (dynamo cannot trace the eager loop)."""
    last = None
    for impl in ([None, "batched_mm"] if exporter == "dynamo" else [None]):
        try:
            return fn(impl), impl
        except Exception as e:  # noqa: BLE001
            last = e
    raise last


# ------------------------------------------------------ sort-based dispatch

class _ParallelExperts(torch.nn.Module):
    """JetMoE's ParallelExperts: weights [E, out, in]; inputs split by per-expert counts."""
    def __init__(s, e, i, o):
        super().__init__()
        s.weight = torch.nn.Parameter(torch.randn(e, o, i) * 0.08)
        s.num_experts = e

    def forward(s, x, expert_size):
        parts = x.split(expert_size, dim=0)
        return torch.cat([torch.nn.functional.linear(parts[j], s.weight[j]) for j in range(s.num_experts)], dim=0)


class _TopKGating(torch.nn.Module):
    """JetMoE's TopKGating: top-k on logits, softmax over the k, tokens sorted by expert id."""
    def __init__(s, h, e, k):
        super().__init__()
        s.layer = torch.nn.Linear(h, e, bias=False)
        s.num_experts, s.top_k = e, k

    def forward(s, x):
        logits = s.layer(x).float()
        top_k_logits, top_k_indices = logits.topk(s.top_k, dim=1)
        top_k_gates = torch.softmax(top_k_logits, dim=1).type_as(x)
        zeros = torch.zeros([top_k_gates.size(0), s.num_experts], dtype=top_k_gates.dtype)
        gates = zeros.scatter(1, top_k_indices, 1)
        expert_size = gates.long().sum(0).tolist()
        top_k_experts = top_k_indices.flatten()
        _, index_sorted_experts = top_k_experts.sort(0)
        batch_index = index_sorted_experts.div(s.top_k, rounding_mode="trunc")
        batch_gates = top_k_gates.flatten()[index_sorted_experts]
        return index_sorted_experts, batch_index, batch_gates, expert_size, logits


class SortedMoE(torch.nn.Module):
    """The JetMoE / GraniteMoE (transformers 4.x) MoE layer: sort-based grouped dispatch."""
    def __init__(s, h, i, e, k, bias=True, act="silu"):
        super().__init__()
        s.h = h
        s.act = {"silu": torch.nn.functional.silu, "gelu": torch.nn.functional.gelu}[act]
        s.bias = torch.nn.Parameter(torch.randn(h) * 0.05) if bias else None
        s.input_linear = _ParallelExperts(e, h, 2 * i)
        s.output_linear = _ParallelExperts(e, i, h)
        s.router = _TopKGating(h, e, k)

    def forward(s, layer_input):
        bsz, length, emb = layer_input.size()
        layer_input = layer_input.reshape(-1, emb)
        _, batch_index, batch_gates, expert_size, _ = s.router(layer_input)
        expert_inputs = layer_input[batch_index]
        hs = s.input_linear(expert_inputs, expert_size)
        c = hs.chunk(2, dim=-1)
        hs = s.act(c[0]) * c[1]
        out = s.output_linear(hs, expert_size) * batch_gates[:, None]
        zeros = torch.zeros((bsz * length, s.h), dtype=out.dtype)
        y = zeros.index_add(0, batch_index, out).view(bsz, length, s.h)
        if s.bias is not None:
            y = y + s.bias
        return y


def transformers_sorted(kind, h, i, e, k):
    """transformers' own JetMoeMoE / GraniteMoeMoE when it still has the ParallelExperts design."""
    if kind == "jetmoe":
        from transformers.models.jetmoe import modeling_jetmoe as mm
        cfg = transformers.JetMoeConfig(hidden_size=h, intermediate_size=i, num_local_experts=e, num_experts_per_tok=k,
                                        num_hidden_layers=1, num_key_value_heads=2, kv_channels=16, vocab_size=128)
        blk = mm.JetMoeMoE(cfg)
    else:
        from transformers.models.granitemoe import modeling_granitemoe as mm
        cfg = transformers.GraniteMoeConfig(hidden_size=h, intermediate_size=i, num_local_experts=e,
                                            num_experts_per_tok=k, num_hidden_layers=1, vocab_size=128)
        blk = mm.GraniteMoeMoE(cfg)
    if not hasattr(blk, "input_linear"):
        raise RuntimeError(f"{type(blk).__name__} in transformers {transformers.__version__} is not the ParallelExperts design")
    g = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for p in blk.parameters():
            p.copy_(torch.randn(p.shape, generator=g) * 0.08)
    return blk.eval()


def do_sorted():
    cases = [("jetmoe", 48, 32, 6, 2, True), ("granitemoe", 64, 48, 8, 2, False), ("jetmoe_k3", 32, 24, 4, 3, True)]
    for fam, h, i, e, k, bias in cases:
        kind = fam.split("_")[0]
        try:
            torch.manual_seed(0)
            blk, src = transformers_sorted(kind, h, i, e, k), f"transformers.{kind} ParallelExperts MoE"
        except Exception as ex:  # noqa: BLE001
            print("transformers", kind, "not usable:", repr(ex)[:300], "-> replica", flush=True)
            torch.manual_seed(0)
            blk, src = SortedMoE(h, i, e, k, bias=bias).eval(), f"replica of transformers 4.x {kind} MoE (sort-based dispatch)"
        mod = em.First(blk).eval()
        xs = [inputs(h, 10), inputs(h, 11)]
        for exporter in ("torchscript", "dynamo"):
            name = f"sorted_{fam}_{exporter}"
            try:
                call = export(mod, xs[0], name, exporter)
                finish(name, "sorted", fam, dict(H=h, I=i, E=e, k=k, bias=bias), call,
                       {"verdict": "fuse", "E": e, "k": k, "shared": False, "output_bias": bias},
                       [[xs[0].numpy()], [xs[1].numpy()]] if exporter == "dynamo" else [[xs[0].numpy()]],
                       ref=run_ref(mod, xs), extra={"source": src,
                       "note": "TorchScript fixes the per-expert counts of the traced input: only test_data_set_0 (the traced input) is valid" if exporter == "torchscript" else ""})
            except Exception as ex:  # noqa: BLE001
                fail(name, "sorted", fam, f"torch.onnx.export(..., dynamo={exporter == 'dynamo'})", ex)


# ------------------------------------------------------ capacity routers

class _DenseActDense(torch.nn.Module):
    def __init__(s, h, i, act="relu", bias=False):
        super().__init__()
        s.wi = torch.nn.Linear(h, i, bias=bias)
        s.wo = torch.nn.Linear(i, h, bias=bias)
        s.act = {"relu": torch.relu, "gelu": torch.nn.functional.gelu}[act]

    def forward(s, x):
        return s.wo(s.act(s.wi(x)))


class SwitchMoE(torch.nn.Module):
    """transformers 4.x SwitchTransformersSparseMLP: top-1 with expert_capacity (cumsum over the sequence);
    dropped tokens keep their input, scaled by the router probability."""
    def __init__(s, h, i, e, capacity):
        super().__init__()
        s.classifier = torch.nn.Linear(h, e, bias=False)
        s.experts = torch.nn.ModuleList([_DenseActDense(h, i) for _ in range(e)])
        s.e, s.capacity = e, capacity

    def forward(s, x):
        probs = torch.softmax(s.classifier(x), dim=-1)
        idx = torch.argmax(probs, dim=-1)
        mask = torch.nn.functional.one_hot(idx, num_classes=s.e)
        prio = torch.cumsum(mask, dim=-2)
        mask = mask * (prio <= s.capacity)
        p = torch.max(probs, dim=-1).values.unsqueeze(-1)
        out = x
        for j in range(s.e):
            m = mask[..., j:j + 1].to(x.dtype)
            out = out * (1 - m) + s.experts[j](x) * m
        return p * out


class NllbMoE(torch.nn.Module):
    """transformers 4.x NllbMoeSparseMLP (eval, no batch-prioritized routing): top-2 by argmax,
    locations by cumsum, second choices after all first choices, tokens beyond expert_capacity dropped."""
    def __init__(s, h, i, e, capacity):
        super().__init__()
        s.classifier = torch.nn.Linear(h, e, bias=False)
        s.experts = torch.nn.ModuleList([_DenseActDense(h, i, bias=True) for _ in range(e)])
        s.e, s.capacity = e, capacity

    def forward(s, x):
        b, t, h = x.shape
        xf = x.reshape(-1, h)
        logits = s.classifier(xf)
        probs = torch.softmax(logits, dim=-1)
        i1 = torch.argmax(probs, dim=-1)
        m1 = torch.nn.functional.one_hot(i1, s.e)
        i2 = torch.argmax(logits.masked_fill(m1.bool(), float("-inf")), dim=-1)
        m2 = torch.nn.functional.one_hot(i2, s.e)
        l1 = torch.cumsum(m1, dim=0) - 1
        l2 = torch.cumsum(m2, dim=0) - 1 + torch.sum(m1, dim=0, keepdim=True)
        p1 = (probs * m1).sum(dim=1)
        p2 = (probs * m2).sum(dim=1)
        den = torch.clamp(p1 + p2, min=torch.finfo(probs.dtype).eps)
        m1 = m1 * torch.lt(l1, s.capacity)
        m2 = m2 * torch.lt(l2, s.capacity)
        w = (p1 / den)[:, None] * m1 + (p2 / den)[:, None] * m2
        y = torch.zeros_like(xf)
        for j in range(s.e):
            y = y + s.experts[j](xf) * w[:, j:j + 1]
        return y.reshape(b, t, h)


def transformers_capacity(kind, h, i, e, capacity):
    if kind == "switch":
        from transformers.models.switch_transformers import modeling_switch_transformers as mm
        cfg = transformers.SwitchTransformersConfig(d_model=h, d_ff=i, num_experts=e, expert_capacity=capacity,
                                                    router_jitter_noise=0.0, num_layers=1, num_heads=2, d_kv=16)
        blk = mm.SwitchTransformersSparseMLP(cfg)
    else:
        from transformers.models.nllb_moe import modeling_nllb_moe as mm
        cfg = transformers.NllbMoeConfig(d_model=h, encoder_ffn_dim=i, decoder_ffn_dim=i, num_experts=e,
                                         expert_capacity=capacity, moe_eval_capacity_token_fraction=-1.0,
                                         second_expert_policy="all", batch_prioritized_routing=False,
                                         moe_token_dropout=0.0, router_dtype="float32")
        blk = mm.NllbMoeSparseMLP(cfg, ffn_dim=i)
    g = torch.Generator().manual_seed(2)
    with torch.no_grad():
        for p in blk.parameters():
            p.copy_(torch.randn(p.shape, generator=g) * 0.1)
    return blk.eval()


def dropped_rows(mod, x, setcap, capacity, big):
    """Rows of the output that change when the capacity is lifted (tokens dropped at `capacity`)."""
    with torch.no_grad():
        setcap(big)
        y_all = mod(x)
        setcap(capacity)
        y = mod(x)
    return int(((y - y_all).abs().reshape(-1, y.shape[-1]).max(dim=-1).values > 1e-6).sum())


def do_capacity():
    cases = [("switch", 32, 64, 4, 1, 2), ("nllb", 48, 64, 4, 2, 5), ("switch_e8", 64, 32, 8, 1, 1)]
    for fam, h, i, e, k, cap in cases:
        kind = fam.split("_")[0]
        xs = [inputs(h, 20), inputs(h, 21)]
        variants = []
        try:
            tb = transformers_capacity(kind, h, i, e, cap)
            def setcap_t(c, tb=tb):
                tb.router.expert_capacity = c
            n = dropped_rows(em.First(tb), xs[0], setcap_t, cap, 10 ** 6)
            print("transformers", kind, "drops", n, "rows at capacity", cap, flush=True)
            variants.append(("hf", tb, setcap_t, f"transformers {type(tb).__name__}", n))
        except Exception as ex:  # noqa: BLE001
            print("transformers", kind, "not usable:", repr(ex)[:400], flush=True)
            MANIFEST.append({"name": f"capacity_{fam}_hf", "class": "capacity", "family": fam, "ok": False,
                             "error": "build: " + repr(ex)[:800]})
        torch.manual_seed(0)
        rb = (SwitchMoE if kind == "switch" else NllbMoE)(h, i, e, cap).eval()
        def setcap_r(c, rb=rb):
            rb.capacity = c
        variants.append(("replica", rb, setcap_r, f"replica of transformers 4.x {kind} sparse MLP", dropped_rows(rb, xs[0], setcap_r, cap, 10 ** 6)))
        for tag, blk, setcap, src, ndrop in variants:
            setcap(cap)
            mod = em.First(blk).eval()
            for exporter in ("torchscript", "dynamo"):
                name = f"capacity_{fam}_{tag}_{exporter}"
                try:
                    call = export(mod, xs[0], name, exporter)
                    finish(name, "capacity", fam, dict(H=h, I=i, E=e, k=k, capacity=cap), call,
                           {"verdict": "refuse", "reason": f"capacity-limited router: expert_capacity={cap}, tokens over capacity are dropped",
                            "capacity": cap},
                           [[xs[0].numpy()], [xs[1].numpy()]], ref=run_ref(mod, xs),
                           extra={"source": src, "dropped_rows_set0": ndrop})
                except Exception as ex:  # noqa: BLE001
                    fail(name, "capacity", fam, f"torch.onnx.export(..., dynamo={exporter == 'dynamo'})", ex)


class GShardMoE(torch.nn.Module):
    """A GShard/Tutel-style top-k router with capacity: TopK on the softmax, one-hot masks by
    scatter, positions by cumsum (k-th choices queued after earlier ones), capacity derived from
    the token count (T*k // (2E)), dense expert compute weighted by the kept assignments."""
    def __init__(s, h, i, e, k):
        super().__init__()
        s.gate = torch.nn.Linear(h, e, bias=False)
        s.experts = torch.nn.ModuleList([_DenseActDense(h, i, act="gelu") for _ in range(e)])
        s.e, s.k = e, k
        s.unlimited = False  # for counting the dropped tokens only

    def forward(s, x):
        b, t, h = x.shape
        xf = x.reshape(-1, h)
        n = xf.shape[0]
        cap = n * s.k if s.unlimited else n * s.k // (2 * s.e)
        probs = torch.softmax(s.gate(xf), dim=-1)
        w, idx = torch.topk(probs, s.k, dim=-1)
        cw = torch.zeros_like(probs)
        before = torch.zeros(1, s.e, dtype=probs.dtype)
        for j in range(s.k):
            m = torch.zeros_like(probs).scatter(1, idx[:, j:j + 1], 1.0)
            pos = torch.cumsum(m, dim=0) - 1 + before
            before = before + m.sum(dim=0, keepdim=True)
            m = m * (pos < cap).to(m.dtype)
            cw = cw + w[:, j:j + 1] * m
        y = torch.zeros_like(xf)
        for j in range(s.e):
            y = y + s.experts[j](xf) * cw[:, j:j + 1]
        return y.reshape(b, t, h)


def do_capacity_topk():
    h, i, e, k = 40, 32, 4, 2
    torch.manual_seed(3)
    blk = GShardMoE(h, i, e, k).eval()
    mod = em.First(blk).eval()
    xs = [inputs(h, 25), inputs(h, 26)]
    cap = B * T * k // (2 * e)
    def setcap(c):
        blk.unlimited = c != cap
    ndrop = dropped_rows(mod, xs[0], setcap, cap, -1)
    for exporter, dyn in (("torchscript", False), ("dynamo", False), ("dynamo", True)):
        name = f"capacity_gshard_topk_{exporter}" + ("_dynamic" if dyn else "")
        try:
            kw = {}
            if dyn:
                kw = dict(dynamic_shapes={"x": {1: torch.export.Dim("sequence", min=2, max=64)}})
            call = export(mod, xs[0], name, exporter, **kw)
            finish(name, "capacity", "gshard_topk", dict(H=h, I=i, E=e, k=k, capacity=cap), call,
                   {"verdict": "refuse", "reason": f"capacity-limited router: capacity T*k//(2E) = {cap} at the traced size, tokens over capacity are dropped",
                    "capacity": cap, "capacity_at_run_time": dyn},
                   [[xs[0].numpy()], [xs[1].numpy()]], ref=run_ref(mod, xs),
                   extra={"source": "GShard/Tutel-style top-k capacity router (export_producers.GShardMoE)", "dropped_rows_set0": ndrop})
        except Exception as ex:  # noqa: BLE001
            fail(name, "capacity", "gshard_topk", f"torch.onnx.export(..., dynamo={exporter == 'dynamo'})", ex)


# ------------------------------------------------------ functions

def do_functions():
    # (name, builder, function classes)
    def mk_hf4():
        b = hf4(48, 32, 8, 2)
        return b, {em.HF4SparseMoe}, dict(H=48, I=32, E=8, k=2), "hf4_mixtral", False
    def mk_hf4_shared():
        b = hf4(64, 48, 6, 2, shared=True)
        return b, {em.HF4SparseMoe}, dict(H=64, I=48, E=6, k=2, shared_I=48), "hf4_qwen2_shared", True
    def mk_nested():
        b = hf4(32, 32, 4, 2, shared=True)
        return b, {em.HF4SparseMoe, em._HF4Expert}, dict(H=32, I=32, E=4, k=2, shared_I=32), "hf4_qwen2_shared", True
    def mk_qwen2():
        moe, _ = hf_block("qwen2_moe", 64, 8, 2, mi=32, i=64)
        return moe, {type(moe)}, dict(H=64, MI=32, E=8, k=2, shared_I=64), "qwen2_moe", True
    for name, mk in (("functions_hf4_mixtral", mk_hf4), ("functions_hf4_qwen2_shared", mk_hf4_shared),
                     ("functions_nested_hf4_qwen2_shared", mk_nested), ("functions_qwen2_moe", mk_qwen2)):
        try:
            blk, classes, sizes, fam, shared = mk()
            h = sizes["H"]
            t = 16 if fam == "qwen2_moe" else T
            xs = [inputs(h, 30, t=t), inputs(h, 31, t=t)]
            mod = em.First(blk).eval()
            call = export(mod, xs[0], name, "torchscript", export_modules_as_functions=classes)
            finish(name, "functions", fam, sizes, call, {"verdict": "fuse", "E": sizes["E"], "k": sizes["k"], "shared": shared},
                   [[xs[0].numpy()], [xs[1].numpy()]], ref=run_ref(mod, xs))
        except Exception as ex:  # noqa: BLE001
            fail(name, "functions", name, "torch.onnx.export(..., dynamo=False, export_modules_as_functions=...)", ex)


# ------------------------------------------------------ dynamo unoptimized

def do_dynamo_raw():
    specs = [("mixtral", 64, 8, 2, 32, 32, False), ("qwen2_moe", 48, 8, 4, 32, 48, True),
             ("qwen3_moe", 32, 16, 4, 16, 32, False), ("deepseek_v3", 64, 8, 2, 32, 64, True)]
    for fam, h, e, k, mi, i, shared in specs:
        name = f"dynamo_raw_{fam}"
        xs = [inputs(h, 40), inputs(h, 41)]
        def go(impl):
            moe, _ = hf_block(fam, h, e, k, mi=mi, i=i, impl=impl)
            mod = em.First(moe).eval()
            return mod, export(mod, xs[0], name, "dynamo", optimize=False)
        try:
            (mod, call), impl = with_impls(go, "dynamo")
            finish(name, "dynamo_raw", fam, dict(H=h, E=e, k=k, MI=mi, I=i), call,
                   {"verdict": "fuse", "E": e, "k": k, "shared": shared}, [[xs[0].numpy()], [xs[1].numpy()]],
                   ref=run_ref(mod, xs), extra={"experts_implementation": impl or "eager"})
        except Exception as ex:  # noqa: BLE001
            fail(name, "dynamo_raw", fam, "torch.onnx.export(..., dynamo=True, optimize=False)", ex)


# ------------------------------------------------------ sources for ORT passes

SOURCES = {}


def source(fam, exporter):
    """A plain export kept as a source for the ONNX Runtime optimizer / quantizer (not a case itself)."""
    key = (fam, exporter)
    if key in SOURCES:
        return SOURCES[key]
    name = f"_src_{fam}_{exporter}"
    if fam == "hf4_mixtral":
        blk, sizes, shared = hf4(64, 32, 8, 2), dict(H=64, I=32, E=8, k=2), False
    elif fam == "hf4_qwen2_shared":
        blk, sizes, shared = hf4(48, 32, 4, 1, shared=True), dict(H=48, I=32, E=4, k=1, shared_I=32), True
    elif fam == "qwen2_moe":
        blk, _ = hf_block("qwen2_moe", 64, 8, 2, mi=32, i=64, impl="batched_mm" if exporter == "dynamo" else None)
        sizes, shared = dict(H=64, MI=32, E=8, k=2, shared_I=64), True
    else:
        raise KeyError(fam)
    mod = em.First(blk).eval()
    h = sizes["H"]
    t = 16 if fam == "qwen2_moe" else T
    xs = [inputs(h, 50, t=t), inputs(h, 51, t=t)]
    call = export(mod, xs[0], name, exporter)
    SOURCES[key] = (os.path.join(OUT, name + ".onnx"), call, sizes, shared, xs, run_ref(mod, xs))
    return SOURCES[key]


def do_ort_opt():
    for fam in ("hf4_mixtral", "qwen2_moe"):
        for exporter in ("torchscript", "dynamo"):
            for lvl, lname in ((ort.GraphOptimizationLevel.ORT_ENABLE_EXTENDED, "extended"),
                               (ort.GraphOptimizationLevel.ORT_ENABLE_ALL, "all")):
                name = f"ort_{lname}_{fam}_{exporter}"
                try:
                    src, call, sizes, shared, xs, ref = source(fam, exporter)
                    out = os.path.join(OUT, name + ".onnx")
                    ort_optimize(src, out, lvl)
                    twin = os.path.join(OUT, f"ort_extended_{fam}_{exporter}.onnx")
                    if lname == "all" and os.path.exists(twin) and open(twin, "rb").read() == open(out, "rb").read():
                        os.remove(out)
                        MANIFEST.append({"name": name, "class": "ort_opt", "family": fam, "ok": True, "kept": False,
                                         "identical_to": f"ort_extended_{fam}_{exporter}",
                                         "note": "ORT_ENABLE_ALL wrote the same bytes as ORT_ENABLE_EXTENDED on the CPU EP; not kept twice"})
                        print("SAME", name, flush=True)
                        continue
                    finish(name, "ort_opt", fam, sizes,
                           call + f"; then ort.InferenceSession(that, SessionOptions(graph_optimization_level={lvl}, optimized_model_filepath='{name}.onnx'), providers=['CPUExecutionProvider'])",
                           {"verdict": "fuse", "E": sizes["E"], "k": sizes["k"], "shared": shared},
                           [[x.numpy()] for x in xs], ref=ref)
                except Exception as ex:  # noqa: BLE001
                    fail(name, "ort_opt", fam, "ORT offline optimization", ex)


def do_int8():
    from onnxruntime.quantization import quantize_dynamic
    for fam, exporter in (("hf4_mixtral", "torchscript"), ("hf4_qwen2_shared", "torchscript"), ("qwen2_moe", "dynamo")):
        for pc in (False, True):
            name = f"int8_{fam}_{exporter}" + ("_per_channel" if pc else "")
            try:
                src, call, sizes, shared, xs, ref = source(fam, exporter)
                if exporter == "dynamo":
                    # the dynamo export's value_info disagrees with the quantizer's shape inference
                    # ("Inferred shape and existing shape differ"): quantize a copy without it
                    m0 = onnx.load(src)
                    del m0.graph.value_info[:]
                    src = src[:-5] + "_novi.onnx"
                    onnx.save(m0, src)
                    call += "; value_info cleared"
                quantize_dynamic(src, os.path.join(OUT, name + ".onnx"), per_channel=pc)
                finish(name, "int8_dyn", fam, sizes,
                       call + f"; then onnxruntime.quantization.quantize_dynamic(that, '{name}.onnx', per_channel={pc})",
                       {"verdict": "refuse", "reason": "dynamically int8-quantized block (DynamicQuantizeLinear + MatMulInteger)",
                        "E": sizes["E"], "k": sizes["k"], "shared": shared},
                       [[x.numpy()] for x in xs], ref=None,
                       extra={"max_abs_err_vs_float_torch": None})
                # quantization error against the float block, for the record
                r = MANIFEST[-1]
                sess = ort.InferenceSession(os.path.join(OUT, name + ".onnx"), providers=["CPUExecutionProvider"])
                y = sess.run(None, {sess.get_inputs()[0].name: xs[0].numpy()})[0]
                r["max_abs_err_vs_float_torch"] = float(np.abs(y - ref[0]).max())
            except Exception as ex:  # noqa: BLE001
                fail(name, "int8_dyn", fam, "quantize_dynamic", ex)
                continue
            if pc:
                continue
            # the quantized model as a deployment pipeline ships it: ORT extended optimization
            # fuses the integer linears into com.microsoft contrib ops
            name2 = f"int8_ortext_{fam}_{exporter}"
            try:
                ort_optimize(os.path.join(OUT, name + ".onnx"), os.path.join(OUT, name2 + ".onnx"))
                finish(name2, "int8_dyn", fam, sizes,
                       call + f"; then quantize_dynamic(that, '{name}.onnx'); then ort.InferenceSession('{name}.onnx', "
                       f"SessionOptions(graph_optimization_level=ORT_ENABLE_EXTENDED, optimized_model_filepath='{name2}.onnx'), providers=['CPUExecutionProvider'])",
                       {"verdict": "refuse", "reason": "dynamically int8-quantized block, integer linears fused by ONNX Runtime",
                        "E": sizes["E"], "k": sizes["k"], "shared": shared},
                       [[x.numpy()] for x in xs], ref=None)
            except Exception as ex:  # noqa: BLE001
                fail(name2, "int8_dyn", fam, "quantize_dynamic then ORT extended optimization", ex)


# ------------------------------------------------------ chains

def do_chain():
    def same():
        em.set_sizes(H=32, I=32, E=6, K=2)
        torch.manual_seed(5)
        blocks = [em.HF4SparseMoe().eval() for _ in range(3)]
        return torch.nn.Sequential(*[em.First(b) for b in blocks]).eval(), dict(H=32, I=32, E=6, k=2, blocks=3), "hf4_mixtral x3", [6, 6, 6]
    def mixed():
        em.set_sizes(H=32, I=32, E=6, K=2)
        torch.manual_seed(6)
        a = em.HF4SparseMoe().eval()
        em.set_sizes(H=32, I=16, E=4, K=1)
        b = em.HF4SparseMoe(shared=True).eval()
        em.set_sizes(H=32, I=32, E=6, K=2)
        return _Mixed(a, b), dict(H=32, blocks=[dict(I=32, E=6, k=2), dict(I=16, E=4, k=1, shared=True)]), "hf4_mixtral + hf4_qwen2_shared", [6, 4]
    def mixed_hf():
        em.set_sizes(H=32, I=32, E=4, K=2)
        torch.manual_seed(7)
        a = em.HF4SparseMoe().eval()
        b, _ = hf_block("qwen3_moe", 32, 8, 2, mi=16, i=32, impl="batched_mm")
        em.set_sizes(E=4, K=2)
        return torch.nn.Sequential(em.First(a), em.First(b)).eval(), dict(H=32, blocks=[dict(I=32, E=4, k=2), dict(MI=16, E=8, k=2)]), "hf4_mixtral + qwen3_moe", [4, 8]
    for cname, mk in (("same3", same), ("mixed2", mixed), ("mixed2_qwen3", mixed_hf)):
        for exporter in ("torchscript", "dynamo"):
            name = f"chain_{cname}_{exporter}"
            try:
                mod, sizes, fam, es = mk()
                h = sizes["H"]
                xs = [inputs(h, 60), inputs(h, 61)]
                call = export(mod, xs[0], name, exporter)
                finish(name, "chain", fam, sizes, call, {"verdict": "fuse", "blocks": len(es), "E": es},
                       [[x.numpy()] for x in xs], ref=run_ref(mod, xs))
            except Exception as ex:  # noqa: BLE001
                fail(name, "chain", cname, f"torch.onnx.export(nn.Sequential(...), dynamo={exporter == 'dynamo'})", ex)


class _Mixed(torch.nn.Module):
    """Two HF4 blocks of different sizes chained; the sizes they read are fixed per block at trace time."""
    def __init__(s, a, b):
        super().__init__()
        s.a, s.b = a, b

    def forward(s, x):
        em.set_sizes(E=6, K=2)
        y = s.a(x)
        em.set_sizes(E=4, K=1)
        z = s.b(y)
        em.set_sizes(E=6, K=2)
        return z


# ------------------------------------------------------ low opset, symbolic

def do_low_opset():
    for opset in (11, 12):
        for fam in ("hf4_mixtral", "hf4_qwen2_shared"):
            name = f"opset{opset}_{fam}"
            try:
                if fam == "hf4_mixtral":
                    blk, sizes, shared = hf4(32, 48, 4, 2), dict(H=32, I=48, E=4, k=2), False
                else:
                    blk, sizes, shared = hf4(48, 32, 8, 3, shared=True), dict(H=48, I=32, E=8, k=3, shared_I=32), True
                mod = em.First(blk).eval()
                xs = [inputs(sizes["H"], 70), inputs(sizes["H"], 71)]
                call = export(mod, xs[0], name, "torchscript", opset=opset)
                finish(name, "low_opset", fam, sizes, call, {"verdict": "fuse", "E": sizes["E"], "k": sizes["k"], "shared": shared},
                       [[x.numpy()] for x in xs], ref=run_ref(mod, xs))
            except Exception as ex:  # noqa: BLE001
                fail(name, "low_opset", fam, f"torch.onnx.export(..., dynamo=False, opset_version={opset})", ex)


class StaticHF4(em.HF4SparseMoe):
    """HF4SparseMoe whose forward reads the input's sizes as Python ints (as many model codes do), so that a
    trace keeps them as constants in its Reshape/Expand shapes even under dynamic_axes."""
    def forward(s, x):
        b, t, h = (int(v) for v in x.shape)
        x = x.reshape(b * t, h)
        w = torch.softmax(s.gate(x), dim=1, dtype=torch.float)
        w, sel = torch.topk(w, em.K, dim=-1)
        w = w / w.sum(dim=-1, keepdim=True)
        out = torch.zeros(b * t, h)
        mask = torch.nn.functional.one_hot(sel, num_classes=em.E).permute(2, 1, 0)
        for e in range(em.E):
            idx, top = torch.where(mask[e])
            y = s.experts[e](x[top].reshape(-1, h)) * w[top, idx, None]
            out = out.index_add(0, top, y)
        return out.reshape(b, t, h)


def do_symbolic():
    for fam in ("static_hf4_mixtral", "hf4_mixtral", "hf4_qwen2_shared"):
        name = f"symbolic_{fam}"
        try:
            if fam == "static_hf4_mixtral":
                em.set_sizes(H=96, I=32, E=4, K=2)
                torch.manual_seed(0)
                blk, sizes, shared = StaticHF4().eval(), dict(H=96, I=32, E=4, k=2), False
            elif fam == "hf4_mixtral":
                blk, sizes, shared = hf4(48, 32, 4, 2), dict(H=48, I=32, E=4, k=2), False
            else:
                blk, sizes, shared = hf4(32, 32, 4, 2, shared=True), dict(H=32, I=32, E=4, k=2, shared_I=32), True
            mod = em.First(blk).eval()
            xs = [inputs(sizes["H"], 80), inputs(sizes["H"], 81)]
            call = export(mod, xs[0], name, "torchscript",
                          dynamic_axes={"hidden_states": {0: "batch", 1: "sequence"}, "moe_out": {0: "batch", 1: "sequence"}})
            m = onnx.load(os.path.join(OUT, name + ".onnx"))
            sym = [d.dim_param for d in m.graph.input[0].type.tensor_type.shape.dim if d.dim_param]
            inits = {i.name: i for i in m.graph.initializer}
            consts = {}
            for n in m.graph.node:
                if n.op_type == "Constant":
                    for a in n.attribute:
                        if a.name == "value":
                            consts[n.output[0]] = a.t
            static = []
            for n in m.graph.node:
                if n.op_type in ("Reshape", "Expand") and len(n.input) > 1:
                    t = inits.get(n.input[1]) or consts.get(n.input[1])
                    if t is not None:
                        v = onnx.numpy_helper.to_array(t).tolist()
                        if B * T in v or T in v:
                            static.append([n.name, n.op_type, v])
            finish(name, "symbolic", fam, sizes, call, {"verdict": "fuse", "E": sizes["E"], "k": sizes["k"], "shared": shared},
                   [[x.numpy()] for x in xs], ref=run_ref(mod, xs),
                   extra={"symbolic_input_dims": sym, "static_token_shapes": static[:8],
                          "note": "goldens at the traced size [2, 8, H]"})
        except Exception as ex:  # noqa: BLE001
            fail(name, "symbolic", fam, "torch.onnx.export(..., dynamic_axes=...)", ex)


# ------------------------------------------------------ full decoders

class Full(torch.nn.Module):
    """A transformers causal LM as input_ids -> logits (no cache), for whole-decoder exports."""

    def __init__(s, m):
        super().__init__()
        s.m = m

    def forward(s, input_ids):
        return s.m(input_ids=input_ids, use_cache=False).logits


def do_full():
    # 2-layer decoders through dynamo (TorchScript cannot export transformers 5's mask code: aten::diff):
    # Mixtral then ONNX Runtime extended-optimized; Qwen2-MoE unoptimized (optimize=False), smaller;
    # Mixtral dynamically int8-quantized
    for name, fam, post, h, mi, i in (("full_ort_extended_mixtral_dynamo", "mixtral", "ort", 64, 32, 64),
                                      ("full_dynamo_raw_qwen2_moe", "qwen2_moe", "raw", 32, 16, 32),
                                      ("full_int8_mixtral_dynamo", "mixtral", "int8", 64, 32, 64)):
        try:
            moe, model = hf_block(fam, h, 4, 2, mi=mi, i=i, layers=2, impl="batched_mm")
            mod = Full(model).eval()
            g = torch.Generator().manual_seed(90)
            ids = [torch.randint(0, 128, (B, T), generator=g) for _ in range(2)]
            p = os.path.join(OUT, name + ".onnx")
            src = p[:-5] + "_src.onnx"
            kw = dict(input_names=["input_ids"], output_names=["logits"], dynamo=True, opset_version=18, external_data=False)
            if post == "raw":
                kw["optimize"] = False
            with torch.no_grad():
                ref = [mod(i).numpy() for i in ids]
                torch.onnx.export(mod, (ids[0],), p if post == "raw" else src, **kw)
            call = f"torch.onnx.export({type(model).__name__}(2 layers, experts batched_mm), (input_ids[{B},{T}],), ..., dynamo=True, opset_version=18"
            verdict = {"verdict": "fuse", "E": 4, "k": 2, "blocks": 2, "shared": fam == "qwen2_moe"}
            cls = "full_" + post
            if post == "raw":
                call += ", optimize=False)"
            elif post == "ort":
                call += "); then ORT_ENABLE_EXTENDED optimized_model_filepath (CPU EP)"
                ort_optimize(src, p)
            else:
                from onnxruntime.quantization import quantize_dynamic
                m0 = onnx.load(src)
                del m0.graph.value_info[:]
                onnx.save(m0, src)
                quantize_dynamic(src, p)
                call += "); value_info cleared; then onnxruntime.quantization.quantize_dynamic(that, '" + name + ".onnx')"
                verdict = {"verdict": "refuse", "reason": "dynamically int8-quantized blocks", "E": 4, "k": 2, "blocks": 2, "shared": False}
                cls, ref = "int8_dyn", None
            if os.path.exists(src):
                os.remove(src)
            finish(name, cls, fam, dict(H=h, MI=mi, I=i, E=4, k=2, layers=2, vocab=128), call, verdict,
                   [[i.numpy()] for i in ids], ref=ref)
        except Exception as ex:  # noqa: BLE001
            fail(name, "full", fam, "full decoder", ex)


CLASSES = [("sorted", do_sorted), ("capacity", do_capacity), ("capacity_topk", do_capacity_topk), ("functions", do_functions),
           ("dynamo_raw", do_dynamo_raw), ("ort_opt", do_ort_opt), ("int8_dyn", do_int8),
           ("chain", do_chain), ("low_opset", do_low_opset), ("symbolic", do_symbolic), ("full", do_full)]


def main():
    global OUT
    OUT = sys.argv[1]
    only = set(sys.argv[2:])
    os.makedirs(OUT, exist_ok=True)
    t0 = time.time()
    for cname, fn in CLASSES:
        if only and cname not in only:
            continue
        t1 = time.time()
        try:
            fn()
        except Exception as ex:  # noqa: BLE001
            fail(cname, cname, "-", "class driver", ex)
        print(f"== {cname} {time.time() - t1:.1f}s", flush=True)
        write_manifest(only)
    for p, *_ in SOURCES.values():
        for q in (p, p[:-5] + "_novi.onnx"):
            if os.path.exists(q):
                os.remove(q)
    write_manifest(only)
    print(f"done {time.time() - t0:.1f}s", flush=True)


def write_manifest(only):
    man = {"versions": {"torch": torch.__version__, "transformers": transformers.__version__, "onnx": onnx.__version__,
                        "onnxruntime": ort.__version__, "python": sys.version.split()[0], "numpy": np.__version__},
           "command": "python3 tools/export/export_producers.py OUTDIR" + "".join(" " + c for c in sorted(only)),
           "cases": MANIFEST}
    try:
        import onnxscript
        man["versions"]["onnxscript"] = onnxscript.__version__
    except Exception:  # noqa: BLE001
        pass
    json.dump(man, open(os.path.join(OUT, "manifest.json"), "w"), indent=1, default=str)


if __name__ == "__main__":
    main()

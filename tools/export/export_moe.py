"""Export tiny random-initialised MoE blocks and decoders from Hugging Face
transformers to ONNX with PyTorch's own exporters, and record ONNX Runtime
outputs as golden data (ONNX test_data_set layout).

The graphs are what real export pipelines produce; nobody on the project wrote
them. Runs where torch + transformers + onnx + onnxruntime are installed.

usage: python3 export_moe.py OUTDIR [family ...]
       python3 export_moe.py --half OUTDIR [family ...]   (float16 and bfloat16 blocks; see half_main)
Importable: the block classes, fams(), find_moe, First, set_sizes, set_experts_impl and
save_case are reused by export_producers.py; importing runs nothing.
Sizes and modes come from the environment: MOE_H (hidden, 64), MOE_I (intermediate, 128),
MOE_MI (MoE intermediate, 32), MOE_E (experts, 8), MOE_K (top-k, 2), MOE_L (layers, 2),
MOE_B / MOE_T (batch 2, tokens 8), MOE_WHAT (block,full), MOE_EXPORTERS (dynamo,torchscript).
"""
import json, os, shutil, sys, traceback, time
import numpy as np
import torch
import transformers
import onnx
from onnx import numpy_helper
import onnxruntime as ort

H, I, MI, E, K, L, V = (int(os.environ.get(k, d)) for k, d in
                         (("MOE_H", 64), ("MOE_I", 128), ("MOE_MI", 32), ("MOE_E", 8), ("MOE_K", 2), ("MOE_L", 2), ("MOE_V", 128)))
common = dict(hidden_size=H, intermediate_size=I, num_hidden_layers=L,
              num_attention_heads=4, num_key_value_heads=2, vocab_size=V,
              max_position_embeddings=128, head_dim=16)


def set_sizes(**kw):
    """Change the module-wide sizes (H, I, MI, E, K, L, V) that the block classes and fams() read."""
    g = globals()
    for k, v in kw.items():
        if k not in ("H", "I", "MI", "E", "K", "L", "V"):
            raise KeyError(k)
        g[k] = int(v)
    common.update(hidden_size=g["H"], intermediate_size=g["I"], num_hidden_layers=g["L"], vocab_size=g["V"])


def set_experts_impl(model, impl):
    """Select transformers' experts implementation (None: eager loop) on a model and its submodules."""
    model.config._experts_implementation = impl or "eager"
    for mm_ in model.modules():
        if hasattr(mm_, "config") and mm_ is not model:
            try: mm_.config._experts_implementation = impl or "eager"
            except Exception: pass


class _HF4Expert(torch.nn.Module):
    """Per-expert SwiGLU MLP laid out as transformers 4.x did (w1 gate, w3 up, w2 down)."""
    def __init__(s):
        super().__init__()
        s.w1 = torch.nn.Linear(H, I, bias=False); s.w3 = torch.nn.Linear(H, I, bias=False); s.w2 = torch.nn.Linear(I, H, bias=False)
    def forward(s, x):
        return s.w2(torch.nn.functional.silu(s.w1(x)) * s.w3(x))

class HF4SparseMoe(torch.nn.Module):
    """The transformers 4.x Mixtral sparse block: softmax -> topk -> renormalise -> loop over experts."""
    def __init__(s, shared=False):
        super().__init__()
        s.gate = torch.nn.Linear(H, E, bias=False)
        s.experts = torch.nn.ModuleList([_HF4Expert() for _ in range(E)])
        s.shared = _HF4Expert() if shared else None
        s.shared_gate = torch.nn.Linear(H, 1, bias=False) if shared else None
    def forward(s, x):
        b, t, h = x.shape
        x = x.view(-1, h)
        logits = s.gate(x)
        w = torch.softmax(logits, dim=1, dtype=torch.float)
        w, sel = torch.topk(w, K, dim=-1)
        w = w / w.sum(dim=-1, keepdim=True)
        out = torch.zeros_like(x)
        mask = torch.nn.functional.one_hot(sel, num_classes=E).permute(2, 1, 0)
        for e in range(E):
            idx, top = torch.where(mask[e])
            cur = x[None, top].reshape(-1, h)
            y = s.experts[e](cur) * w[top, idx, None]
            out.index_add_(0, top, y)
        if s.shared is not None:
            out = out + torch.sigmoid(s.shared_gate(x)) * s.shared(x)
        return out.reshape(b, t, h)

class DenseMoe(torch.nn.Module):
    """Export-friendly dense form: every expert runs on every token, weighted by a scattered routing matrix."""
    def __init__(s):
        super().__init__()
        s.gate = torch.nn.Linear(H, E, bias=False)
        s.w_gate = torch.nn.Parameter(torch.randn(E, H, I) * 0.05)
        s.w_up = torch.nn.Parameter(torch.randn(E, H, I) * 0.05)
        s.w_down = torch.nn.Parameter(torch.randn(E, I, H) * 0.05)
    def forward(s, x):
        b, t, h = x.shape
        x = x.reshape(-1, h)
        p = torch.softmax(s.gate(x), dim=-1)
        w, sel = torch.topk(p, K, dim=-1)
        w = w / w.sum(-1, keepdim=True)
        r = torch.zeros_like(p).scatter(1, sel, w)            # [T, E]
        xe = x.unsqueeze(0).expand(E, -1, -1)                  # [E, T, H]
        y = torch.bmm(torch.nn.functional.silu(torch.bmm(xe, s.w_gate)) * torch.bmm(xe, s.w_up), s.w_down)  # [E, T, H]
        return (y * r.t().unsqueeze(-1)).sum(0).reshape(b, t, h)

class _Hold(torch.nn.Module):
    def __init__(s, blk):
        super().__init__(); s.blk = blk; s.config = transformers.PretrainedConfig()
    def forward(s, input_ids=None, use_cache=False):
        raise RuntimeError("block-only family")

def fams():
    t = transformers
    yield "hf4_mixtral", None, HF4SparseMoe
    yield "hf4_qwen2_shared", None, (lambda: HF4SparseMoe(shared=True))
    yield "dense_topk", None, DenseMoe
    yield "mixtral", lambda: t.MixtralConfig(**common, num_local_experts=E, num_experts_per_tok=K), "MixtralForCausalLM"
    yield "qwen2_moe", lambda: t.Qwen2MoeConfig(**common, num_experts=E, num_experts_per_tok=K, moe_intermediate_size=MI,
                                               shared_expert_intermediate_size=I, decoder_sparse_step=1, norm_topk_prob=False), "Qwen2MoeForCausalLM"
    yield "qwen3_moe", lambda: t.Qwen3MoeConfig(**common, num_experts=E, num_experts_per_tok=K, moe_intermediate_size=MI,
                                               decoder_sparse_step=1, norm_topk_prob=True), "Qwen3MoeForCausalLM"
    yield "olmoe", lambda: t.OlmoeConfig(**common, num_experts=E, num_experts_per_tok=K), "OlmoeForCausalLM"
    yield "deepseek_v3", lambda: t.DeepseekV3Config(**{k: v for k, v in common.items() if k != "head_dim"},
                                                   n_routed_experts=E, num_experts_per_tok=K, moe_intermediate_size=MI,
                                                   n_shared_experts=1, first_k_dense_replace=0, n_group=2, topk_group=1,
                                                   q_lora_rank=32, kv_lora_rank=16, qk_rope_head_dim=8, qk_nope_head_dim=8,
                                                   v_head_dim=16, routed_scaling_factor=2.5, norm_topk_prob=True), "DeepseekV3ForCausalLM"
    yield "gpt_oss", lambda: t.GptOssConfig(**common, num_local_experts=E, num_experts_per_tok=K,
                                           layer_types=["full_attention"] * L), "GptOssForCausalLM"
    yield "phimoe", lambda: t.PhimoeConfig(**common, num_local_experts=E, num_experts_per_tok=K), "PhimoeForCausalLM"
    yield "granitemoe", lambda: t.GraniteMoeConfig(**common, num_local_experts=E, num_experts_per_tok=K), "GraniteMoeForCausalLM"
    yield "llama4", lambda: t.Llama4TextConfig(**common, num_local_experts=E, num_experts_per_tok=1,
                                              intermediate_size_mlp=I, interleave_moe_layer_step=1), "Llama4ForCausalLM"
    yield "glm4_moe", lambda: t.Glm4MoeConfig(**common, n_routed_experts=E, num_experts_per_tok=K, moe_intermediate_size=MI,
                                             n_shared_experts=1, first_k_dense_replace=0, n_group=1, topk_group=1), "Glm4MoeForCausalLM"
    yield "ernie4_5_moe", lambda: t.Ernie4_5_MoeConfig(**common, moe_num_experts=E, moe_k=K, moe_intermediate_size=MI,
                                                      moe_num_shared_experts=1, moe_layer_start_index=0), "Ernie4_5_MoeForCausalLM"

def find_moe(model):
    for name, m in model.named_modules():
        if hasattr(m, "experts") and not isinstance(m, torch.nn.ModuleList):
            return name, m
    return None, None

class First(torch.nn.Module):
    def __init__(self, m):
        super().__init__(); self.m = m
    def forward(self, x):
        y = self.m(x)
        if isinstance(y, tuple):
            y = y[0]
        return y

def save_case(path_onnx, feeds, tag, index=0):
    """Run path_onnx on feeds with ONNX Runtime (CPU EP) and write TAG_data/test_data_set_INDEX."""
    sess = ort.InferenceSession(path_onnx, providers=["CPUExecutionProvider"])
    names = [i.name for i in sess.get_inputs()]
    outs = sess.run(None, {n: feeds[j] for j, n in enumerate(names)})
    d = os.path.join(os.path.dirname(path_onnx), tag + "_data", f"test_data_set_{index}")
    os.makedirs(d, exist_ok=True)
    for j, n in enumerate(names):
        t = numpy_helper.from_array(feeds[j], n)
        open(os.path.join(d, f"input_{j}.pb"), "wb").write(t.SerializeToString())
    for j, (o, meta) in enumerate(zip(outs, sess.get_outputs())):
        t = numpy_helper.from_array(np.asarray(o), meta.name)
        open(os.path.join(d, f"output_{j}.pb"), "wb").write(t.SerializeToString())
    return outs

def main():
    OUT = sys.argv[1]
    ONLY = set(sys.argv[2:])
    os.makedirs(OUT, exist_ok=True)
    manifest = {"versions": {"torch": torch.__version__, "transformers": transformers.__version__,
                             "onnx": onnx.__version__, "onnxruntime": ort.__version__}, "cases": []}
    for fam, mkcfg, clsname in fams():
        if ONLY and fam not in ONLY:
            continue
        rec = {"family": fam}
        try:
            torch.manual_seed(0)
            if mkcfg is None:
                moe = clsname().eval(); name = "block"; model = _Hold(moe); cfg = model.config
            else:
                cfg = mkcfg()
                model = getattr(transformers, clsname)(cfg).eval().float()
                name, moe = find_moe(model)
            rec["moe_module"] = name
            rec["moe_class"] = type(moe).__name__ if moe is not None else None
            rec["config"] = {k: v for k, v in cfg.to_dict().items() if isinstance(v, (int, float, str, bool)) and ("expert" in k or "moe" in k or "top" in k or "k" == k or "group" in k or "scal" in k or "norm" in k)}
        except Exception as e:
            rec["error_build"] = repr(e)[:500]
            manifest["cases"].append(rec); print(fam, "BUILD FAIL", repr(e)[:300], flush=True); continue
        x = torch.randn(int(os.environ.get("MOE_B", 2)), int(os.environ.get("MOE_T", 8)), H)
        IMPLS = [None] if mkcfg is None else [None, "batched_mm", "grouped_mm"]
        for exporter in tuple(os.environ.get("MOE_EXPORTERS", "dynamo,torchscript").split(",")):
            for what in (("block",) if mkcfg is None else tuple(os.environ.get("MOE_WHAT", "block,full").split(","))):
              for impl in IMPLS:
                tag = f"{fam}_{what}_{exporter}" + (f"_{impl}" if impl else "")
                p = os.path.join(OUT, tag + ".onnx")
                t0 = time.time()
                try:
                    if mkcfg is not None:
                        set_experts_impl(model, impl)
                    if what == "block":
                        mod, args, inames, onames = First(moe), (x,), ["hidden_states"], ["moe_out"]
                    else:
                        ids = torch.randint(0, V, (x.shape[0], x.shape[1]))
                        class Full(torch.nn.Module):
                            def __init__(s, m): super().__init__(); s.m = m
                            def forward(s, input_ids): return s.m(input_ids=input_ids, use_cache=False).logits
                        mod, args, inames, onames = Full(model), (ids,), ["input_ids"], ["logits"]
                    with torch.no_grad():
                        ref = mod(*args).numpy()
                        torch.onnx.export(mod, args, p, input_names=inames, output_names=onames,
                                          dynamo=(exporter == "dynamo"), opset_version=18 if exporter == "dynamo" else 17,
                                          external_data=False)
                    m = onnx.load(p)
                    ops = {}
                    for n in m.graph.node:
                        ops[n.op_type] = ops.get(n.op_type, 0) + 1
                    outs = save_case(p, [a.numpy() for a in args], tag)
                    err = float(np.abs(outs[0] - ref).max())
                    rec[tag] = {"ok": True, "nodes": len(m.graph.node), "ops": ops, "max_abs_err_vs_torch": err,
                                "bytes": os.path.getsize(p), "s": round(time.time() - t0, 1), "functions": len(m.functions)}
                    print(tag, "OK nodes", len(m.graph.node), "err", err, "ops", sorted(ops.items(), key=lambda kv: -kv[1])[:12], flush=True)
                    break
                except Exception as e:
                    c = e
                    while c.__cause__ is not None: c = c.__cause__
                    rec[tag] = {"ok": False, "error": repr(c)[:1200], "s": round(time.time() - t0, 1)}
                    print(tag, "FAIL", repr(c)[:600], flush=True)
                    if os.path.exists(p): os.remove(p)
        manifest["cases"].append(rec)
    json.dump(manifest, open(os.path.join(OUT, "manifest.json"), "w"), indent=1)
    print("done")


HALF_FAMILIES = ("mixtral", "qwen2_moe", "qwen3_moe", "olmoe", "deepseek_v3")


def _strip(m):
    """Drop node doc strings and node metadata (the exporter's stack traces with local paths)."""
    def walk(g):
        for n in g.node:
            n.doc_string = ""
            del n.metadata_props[:]
            for a in n.attribute:
                if a.g is not None and a.type == onnx.AttributeProto.GRAPH:
                    walk(a.g)
    walk(m.graph)
    for f in m.functions:
        for n in f.node:
            n.doc_string = ""
            del n.metadata_props[:]


def _f32_edges(m):
    """A copy of model m whose float16/bfloat16 graph inputs and outputs are float32 with a Cast
    beside each (exact both ways for values of the half type), so ONNX Runtime's Python API, which
    has no bfloat16 arrays, can feed and read the model; the graph between the casts is m's."""
    m = onnx.ModelProto.FromString(m.SerializeToString())
    g = m.graph
    half = (onnx.TensorProto.FLOAT16, onnx.TensorProto.BFLOAT16)
    pre, post = [], []
    for vi in g.input:
        et = vi.type.tensor_type.elem_type
        if et in half:
            inner = vi.name + "__half"
            for n in list(g.node):
                n.input[:] = [inner if x == vi.name else x for x in n.input]
            pre.append(onnx.helper.make_node("Cast", [vi.name], [inner], to=et))
            vi.type.tensor_type.elem_type = onnx.TensorProto.FLOAT
    for vo in g.output:
        et = vo.type.tensor_type.elem_type
        if et in half:
            inner = vo.name + "__half"
            for n in g.node:
                n.output[:] = [inner if x == vo.name else x for x in n.output]
                n.input[:] = [inner if x == vo.name else x for x in n.input]
            post.append(onnx.helper.make_node("Cast", [inner], [vo.name], to=onnx.TensorProto.FLOAT))
            vo.type.tensor_type.elem_type = onnx.TensorProto.FLOAT
    nodes = pre + list(g.node) + post
    del g.node[:]
    g.node.extend(nodes)
    return m


def _ort_run(m, feeds, eps):
    """Run model m (float32 edges) on the first EP of eps that takes it, with no CPU fallback
    for an EP other than the CPU's. Returns (outputs, EP name, errors of the EPs tried before)."""
    errs = {}
    for ep in eps:
        try:
            so = ort.SessionOptions()
            if ep != "CPUExecutionProvider":
                so.add_session_config_entry("session.disable_cpu_ep_fallback", "1")
            sess = ort.InferenceSession(m.SerializeToString(), so, providers=[ep])
            return sess.run(None, feeds), ep, errs
        except Exception as e:
            errs[ep] = repr(e)[:300]
    raise RuntimeError(f"no EP ran the model: {errs}")


def _half_tensor(a, name, et):
    """A FLOAT16 or BFLOAT16 TensorProto holding float32 array a, whose values are of that type."""
    a = np.ascontiguousarray(a, dtype=np.float32)
    if et == onnx.TensorProto.FLOAT16:
        return numpy_helper.from_array(a.astype(np.float16), name)
    bits = (a.view(np.uint32) >> 16).astype("<u2")
    assert np.array_equal((bits.astype(np.uint32) << 16).view(np.float32), a), "not bfloat16 values"
    t = onnx.TensorProto(name=name, data_type=et, dims=list(a.shape))
    t.raw_data = bits.tobytes()
    return t


def _probe_ort_moe():
    """Which EPs of this ONNX Runtime run com.microsoft::MoE with T = float16 / bfloat16."""
    from onnx import helper
    res = {}
    h, e, i = 16, 2, 16
    for name, et in (("float16", onnx.TensorProto.FLOAT16), ("bfloat16", onnx.TensorProto.BFLOAT16)):
        rng = np.random.default_rng(0)
        def init(n, shape):
            a = torch.from_numpy(rng.standard_normal(shape).astype(np.float32) * 0.1)
            a = a.to(torch.float16 if name == "float16" else torch.bfloat16).float().numpy()
            return _half_tensor(a, n, et)
        node = helper.make_node("MoE", ["x", "r", "fc1", "", "fc2"], ["y"], domain="com.microsoft", k=1,
                                activation_type="silu", normalize_routing_weights=1)
        g = helper.make_graph([node], "probe", [helper.make_tensor_value_info("x", et, [4, h]), helper.make_tensor_value_info("r", et, [4, e])],
                              [helper.make_tensor_value_info("y", et, [4, h])], [init("fc1", [e, i, h]), init("fc2", [e, h, i])])
        m = _f32_edges(helper.make_model(g, opset_imports=[helper.make_opsetid("", 18), helper.make_opsetid("com.microsoft", 1)], ir_version=10))
        feeds = {"x": rng.standard_normal((4, h)).astype(np.float32), "r": rng.standard_normal((4, e)).astype(np.float32)}
        for ep in ("CPUExecutionProvider", "CUDAExecutionProvider"):
            try:
                _ort_run(m, feeds, [ep])
                res[f"{name}/{ep}"] = "ok"
            except Exception as ex:
                res[f"{name}/{ep}"] = repr(ex)[:300]
    return res


def half_main():
    """Export the MoE block of each family in float16 and bfloat16 (the module cast with .to(dtype);
    the dynamo exporter with batched_mm experts, and TorchScript with the default per-expert loop,
    as MOE_EXPORTERS says), with ONNX Runtime outputs on two random inputs as
    golden data, and manifest.json recording which EP computed each case's goldens. ONNX Runtime
    runs the exported graph between exact float32 Casts at its edges (_f32_edges: its Python API
    has no bfloat16 arrays); the CPU EP is tried first, the CUDA EP (no CPU fallback) where the
    CPU EP lacks a kernel, as it does for most bfloat16 ops."""
    OUT = sys.argv[2]
    ONLY = set(sys.argv[3:])
    os.makedirs(OUT, exist_ok=True)
    set_sizes(H=int(os.environ.get("MOE_H", 32)), I=int(os.environ.get("MOE_I", 64)), MI=int(os.environ.get("MOE_MI", 32)),
              E=int(os.environ.get("MOE_E", 4)), K=int(os.environ.get("MOE_K", 2)), L=1)
    manifest = {"versions": {"torch": torch.__version__, "transformers": transformers.__version__,
                             "onnx": onnx.__version__, "onnxruntime": ort.__version__},
                "sizes": {"H": H, "I": I, "MI": MI, "E": E, "K": K}, "ort_moe_kernels": _probe_ort_moe(), "cases": []}
    print("ort MoE kernels:", manifest["ort_moe_kernels"], flush=True)
    for fam, mkcfg, clsname in fams():
        if fam not in HALF_FAMILIES or (ONLY and fam not in ONLY):
            continue
        for exporter, dt in [(x, d) for x in os.environ.get("MOE_EXPORTERS", "dynamo,torchscript").split(",")
                             for d in (torch.float16, torch.bfloat16)]:
            dname = str(dt).split(".")[-1]
            tag = f"{fam}_block_{exporter}_{dname}"
            # dynamo: transformers' batched_mm experts; TorchScript traces the default per-expert loop
            impl = "batched_mm" if exporter == "dynamo" else None
            rec = {"case": tag, "family": fam, "dtype": dname, "exporter": exporter, "experts_implementation": impl or "eager"}
            t0 = time.time()
            try:
                torch.manual_seed(0)
                model = getattr(transformers, clsname)(mkcfg()).eval()
                set_experts_impl(model, impl)
                name, moe = find_moe(model)
                moe = moe.to(dt)
                rec["moe_module"], rec["moe_class"] = name, type(moe).__name__
                p = os.path.join(OUT, tag + ".onnx")
                xs = [torch.randn(2, 8, H).to(dt) for _ in range(2)]
                with torch.no_grad():
                    torch.onnx.export(First(moe), (xs[0],), p, input_names=["hidden_states"], output_names=["moe_out"],
                                      dynamo=(exporter == "dynamo"), opset_version=18 if exporter == "dynamo" else 17,
                                      external_data=False)
                    refs = [First(moe)(x).float().numpy() for x in xs]
                m = onnx.load(p)
                _strip(m)
                onnx.save(m, p)
                ops = {}
                for n in m.graph.node:
                    ops[n.op_type] = ops.get(n.op_type, 0) + 1
                rec.update(nodes=len(m.graph.node), ops=ops, bytes=os.path.getsize(p), sets=[])
                et = onnx.TensorProto.FLOAT16 if dt == torch.float16 else onnx.TensorProto.BFLOAT16
                wrapped = _f32_edges(m)
                for si, x in enumerate(xs):
                    xin = x.float().numpy()
                    try:
                        outs, ep, errs = _ort_run(wrapped, {"hidden_states": xin}, ["CPUExecutionProvider", "CUDAExecutionProvider"])
                        got = np.asarray(outs[0], dtype=np.float32)
                    except RuntimeError as e:
                        if dt != torch.bfloat16:
                            raise
                        # No EP of this ONNX Runtime runs the bfloat16 graph (its CPU EP has no
                        # bfloat16 MatMul): the golden is PyTorch's eager output of the same
                        # module on the same input, and the manifest says so.
                        ep, errs, got = "torch-eager", {"ort": str(e)[:300]}, refs[si]
                    d = os.path.join(OUT, tag + "_data", f"test_data_set_{si}")
                    os.makedirs(d, exist_ok=True)
                    open(os.path.join(d, "input_0.pb"), "wb").write(_half_tensor(xin, "hidden_states", et).SerializeToString())
                    open(os.path.join(d, "output_0.pb"), "wb").write(_half_tensor(got, "moe_out", et).SerializeToString())
                    rec["sets"].append({"ep": ep, "golden": "torch" if ep == "torch-eager" else "onnxruntime", "eps_refused": errs,
                                        "max_abs_err_vs_torch": float(np.abs(got - refs[si]).max()),
                                        "max_abs_out": float(np.abs(refs[si]).max())})
                rec["s"] = round(time.time() - t0, 1)
                print(tag, "OK", rec["nodes"], "nodes", [(s["ep"], s["max_abs_err_vs_torch"]) for s in rec["sets"]], flush=True)
            except Exception as e:
                c = e
                while c.__cause__ is not None: c = c.__cause__
                rec["error"] = repr(c)[:1200]
                print(tag, "FAIL", repr(c)[:600], flush=True)
                if os.path.exists(os.path.join(OUT, tag + ".onnx")):
                    os.remove(os.path.join(OUT, tag + ".onnx"))
                shutil.rmtree(os.path.join(OUT, tag + "_data"), ignore_errors=True)
            manifest["cases"].append(rec)
    json.dump(manifest, open(os.path.join(OUT, "manifest.json"), "w"), indent=1)
    print("done")


if __name__ == "__main__":
    if len(sys.argv) > 2 and sys.argv[1] == "--half":
        half_main()
    else:
        main()

"""Export DeepEP-style per-rank MoE models with PyTorch's ONNX exporter.

Each rank module routes its tokens with a replicated router, calls the custom
ops deep_ep::dispatch / deep_ep::combine (defined here with torch.library and
exported through register_custom_op_symbolic, as a DeepEP export pipeline
would), and runs its E/G local SwiGLU experts with torch.bmm. Both placements
of the router-weight multiply are written: before combine (on the expert's
rank) and after combine (on the token's rank). A dense PyTorch reference of
the whole MoE with the same weights writes test_data_set_0 (input_0.pb,
output_0.pb) for the G*T tokens of the group.

Run: OUT=dir python export_deepep.py   (CPU is enough)
"""
import os

import numpy as np
import onnx
import torch
import torch.nn as nn
import torch.nn.functional as F
from onnx import numpy_helper
from torch.onnx import symbolic_helper

E, H, I, K, T = 16, 16, 32, 2, 5
OUT = os.environ.get("OUT", ".")

lib = torch.library.Library("deep_ep", "DEF")
lib.define("dispatch(Tensor x, Tensor topk_idx, Tensor topk_weights, int num_ranks, int num_experts) -> (Tensor, Tensor, Tensor, Tensor)")
lib.define("combine(Tensor x, Tensor handle, int num_ranks) -> Tensor")


def dispatch_impl(x, idx, w, num_ranks, num_experts):
    R = num_ranks * x.shape[0]
    return (x.new_zeros(R, x.shape[1]), idx.new_full((R, idx.shape[1]), -1),
            w.new_zeros(R, w.shape[1]), idx.new_zeros(R))


def combine_impl(x, handle, num_ranks):
    return x.new_zeros((x.shape[0] // num_ranks,) + tuple(x.shape[1:]))


lib.impl("dispatch", dispatch_impl, "CompositeExplicitAutograd")
lib.impl("combine", combine_impl, "CompositeExplicitAutograd")


@symbolic_helper.parse_args("v", "v", "v", "i", "i")
def sym_dispatch(g, x, idx, w, num_ranks, num_experts):
    return g.op("deep_ep::dispatch", x, idx, w, num_ranks_i=num_ranks, num_experts_i=num_experts, outputs=4)


@symbolic_helper.parse_args("v", "v", "i")
def sym_combine(g, x, handle, num_ranks):
    return g.op("deep_ep::combine", x, handle, num_ranks_i=num_ranks)


torch.onnx.register_custom_op_symbolic("deep_ep::dispatch", sym_dispatch, 1)
torch.onnx.register_custom_op_symbolic("deep_ep::combine", sym_combine, 1)

gen = torch.Generator().manual_seed(0)
Wr = torch.randn(E, H, generator=gen) / H ** 0.5
Wg = torch.randn(E, I, H, generator=gen) / H ** 0.5
Wu = torch.randn(E, I, H, generator=gen) / H ** 0.5
Wd = torch.randn(E, H, I, generator=gen) / I ** 0.5


class RankMoE(nn.Module):
    def __init__(self, rank, G, before):
        super().__init__()
        L = E // G
        self.G, self.L, self.before = G, L, before
        self.gate = nn.Linear(H, E, bias=False)
        self.gate.weight.data.copy_(Wr)
        sl = slice(rank * L, (rank + 1) * L)
        self.w_gate = nn.Parameter(Wg[sl].transpose(1, 2).contiguous())  # [L, H, I]
        self.w_up = nn.Parameter(Wu[sl].transpose(1, 2).contiguous())
        self.w_down = nn.Parameter(Wd[sl].transpose(1, 2).contiguous())  # [L, I, H]

    def forward(self, x):
        scores = self.gate(x).softmax(-1)
        w, idx = scores.topk(K, -1)
        w = w / w.sum(-1, keepdim=True)
        rx, ridx, rw, handle = torch.ops.deep_ep.dispatch(x, idx, w, self.G, E)
        onehot = (ridx.unsqueeze(-1) == torch.arange(self.L)).to(x.dtype)  # [R, k, L]
        xx = rx.unsqueeze(0).expand(self.L, -1, -1)
        a = F.silu(torch.bmm(xx, self.w_gate)) * torch.bmm(xx, self.w_up)
        d = torch.bmm(a, self.w_down)  # [L, R, H]
        if self.before:
            route = (onehot * rw.unsqueeze(-1)).sum(1)  # [R, L]
            y = (d * route.t().unsqueeze(-1)).sum(0)
            return x + torch.ops.deep_ep.combine(y, handle, self.G)
        ys = torch.bmm(onehot, d.transpose(0, 1))  # [R, k, H]
        c = torch.ops.deep_ep.combine(ys, handle, self.G)
        return x + (c * w.unsqueeze(-1)).sum(1)


def reference(x):
    scores = (x @ Wr.T).softmax(-1)
    w, idx = scores.topk(K, -1)
    w = w / w.sum(-1, keepdim=True)
    out = x.clone()
    for t in range(x.shape[0]):
        for j in range(K):
            e = idx[t, j]
            a = F.silu(Wg[e] @ x[t]) * (Wu[e] @ x[t])
            out[t] += w[t, j] * (Wd[e] @ a)
    return out


for G in (4, 8):
    for before in (True, False):
        name = f"deepep_ep{G}_{'before' if before else 'after'}"
        for r in range(G):
            m = RankMoE(r, G, before).eval()
            path = os.path.join(OUT, f"{name}.rank{r}.onnx")
            torch.onnx.export(m, (torch.randn(T, H),), path, input_names=["x"], output_names=["y"],
                              dynamic_axes={"x": {0: "tokens"}, "y": {0: "tokens"}}, opset_version=18, dynamo=False)
            mp = onnx.load(path)
            if not any(o.domain == "deep_ep" for o in mp.opset_import):
                mp.opset_import.append(onnx.helper.make_opsetid("deep_ep", 1))
            kv = mp.metadata_props.add()
            kv.key, kv.value = "ai.mok.ep_rank", str(r)
            onnx.save(mp, path)
        x = torch.randn(G * T, H, generator=gen)
        d = os.path.join(OUT, f"{name}_data", "test_data_set_0")
        os.makedirs(d, exist_ok=True)
        with open(os.path.join(d, "input_0.pb"), "wb") as f:
            f.write(numpy_helper.from_array(x.numpy(), "x").SerializeToString())
        with open(os.path.join(d, "output_0.pb"), "wb") as f:
            f.write(numpy_helper.from_array(reference(x).numpy(), "y").SerializeToString())
        print(name, "ok")
print("torch", torch.__version__, "onnx", onnx.__version__)

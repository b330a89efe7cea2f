# Export a few transformers MoE blocks in float16 and bfloat16 with the dynamo exporter (no golden data).
import os, sys, torch, transformers as t
OUT = sys.argv[1]; os.makedirs(OUT, exist_ok=True)
H, E, K = 64, 8, 2
common = dict(hidden_size=H, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, vocab_size=128, max_position_embeddings=128, head_dim=16)
fams = {
  "mixtral": lambda: t.MixtralForCausalLM(t.MixtralConfig(**common, num_local_experts=E, num_experts_per_tok=K)),
  "qwen3_moe": lambda: t.Qwen3MoeForCausalLM(t.Qwen3MoeConfig(**common, num_experts=E, num_experts_per_tok=K, moe_intermediate_size=32, decoder_sparse_step=1, norm_topk_prob=True)),
  "deepseek_v3": lambda: t.DeepseekV3ForCausalLM(t.DeepseekV3Config(**{k: v for k, v in common.items() if k != "head_dim"}, n_routed_experts=E, num_experts_per_tok=K, moe_intermediate_size=32, n_shared_experts=1, first_k_dense_replace=0, n_group=2, topk_group=1, q_lora_rank=32, kv_lora_rank=16, qk_rope_head_dim=8, qk_nope_head_dim=8, v_head_dim=16, routed_scaling_factor=2.5, norm_topk_prob=True)),
}
class First(torch.nn.Module):
    def __init__(s, m): super().__init__(); s.m = m
    def forward(s, x):
        y = s.m(x); return y[0] if isinstance(y, tuple) else y
for name, mk in fams.items():
    for dt in (torch.float16, torch.bfloat16):
        torch.manual_seed(0)
        model = mk().eval()
        model.config._experts_implementation = "batched_mm"
        for m in model.modules():
            if hasattr(m, "config"):
                try: m.config._experts_implementation = "batched_mm"
                except Exception: pass
        moe = next(m for n, m in model.named_modules() if hasattr(m, "experts") and not isinstance(m, torch.nn.ModuleList))
        moe = moe.to(dt)
        x = torch.randn(2, 8, H, dtype=dt)
        tag = f"{name}_block_dynamo_{str(dt).split('.')[-1]}"
        try:
            with torch.no_grad():
                torch.onnx.export(First(moe), (x,), os.path.join(OUT, tag + ".onnx"), input_names=["hidden_states"], output_names=["moe_out"], dynamo=True, opset_version=18, external_data=False)
            print(tag, "OK", flush=True)
        except Exception as e:
            print(tag, "FAIL", repr(e)[:300], flush=True)

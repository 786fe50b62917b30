"""Hugging Face transformers models with their MoE blocks swapped for WeaveMoE (weave_kernel.hf.replace_moe_blocks),
timed against the same model as transformers runs it (its default experts implementation, grouped_mm on Hopper),
and checked against it. Random weights, a few layers of a model's real architecture (attention included), one
prefill sequence on one GPU; the base model's last hidden state (no LM head).

    python tests/kernel/hf_e2e.py --models qwen3-moe,deepseek-v2-lite --layers 4 --tokens 4096 [--out hf_e2e.json]
    python tests/kernel/hf_e2e.py --tiny --device cpu --backend torch      # CPU smoke run of the same code

Needs transformers 5.x (pip install -e ".[hf]").
"""
from __future__ import annotations

import argparse
import json
import time

import torch


def configs(tiny: bool, layers: int) -> dict:
    from transformers import DeepseekV2Config, Qwen3MoeConfig

    if tiny:
        return {
            "qwen3-moe": Qwen3MoeConfig(vocab_size=101, hidden_size=128, intermediate_size=256, moe_intermediate_size=64,
                                        num_experts=8, num_experts_per_tok=2, num_hidden_layers=layers,
                                        num_attention_heads=2, num_key_value_heads=1, head_dim=64, norm_topk_prob=True),
            "deepseek-v2-lite": DeepseekV2Config(vocab_size=101, hidden_size=128, intermediate_size=256,
                                                 moe_intermediate_size=64, n_routed_experts=8, n_shared_experts=2,
                                                 num_experts_per_tok=3, num_hidden_layers=layers, num_attention_heads=2,
                                                 num_key_value_heads=2, kv_lora_rank=32, q_lora_rank=None,
                                                 qk_nope_head_dim=32, qk_rope_head_dim=16, v_head_dim=32,
                                                 first_k_dense_replace=0, topk_method="greedy", routed_scaling_factor=1.0),
        }
    return {  # the published geometries (Qwen3-30B-A3B; DeepSeek-V2-Lite, every layer MoE), fewer layers
        "qwen3-moe": Qwen3MoeConfig(vocab_size=151936, hidden_size=2048, intermediate_size=6144,
                                    moe_intermediate_size=768, num_experts=128, num_experts_per_tok=8,
                                    num_hidden_layers=layers, num_attention_heads=32, num_key_value_heads=4,
                                    head_dim=128, norm_topk_prob=True),
        "deepseek-v2-lite": DeepseekV2Config(vocab_size=102400, hidden_size=2048, intermediate_size=10944,
                                             moe_intermediate_size=1408, n_routed_experts=64, n_shared_experts=2,
                                             num_experts_per_tok=6, num_hidden_layers=layers, num_attention_heads=16,
                                             num_key_value_heads=16, kv_lora_rank=512, q_lora_rank=None,
                                             qk_nope_head_dim=128, qk_rope_head_dim=64, v_head_dim=128,
                                             first_k_dense_replace=0, topk_method="greedy", routed_scaling_factor=1.0),
    }


def build(name: str, cfg, device, seed: int):
    from transformers import AutoModel

    cfg._attn_implementation = "sdpa"
    torch.manual_seed(seed)
    with torch.device(device):
        model = AutoModel.from_config(cfg, dtype=torch.bfloat16).eval()
    g = torch.Generator(device=device).manual_seed(seed)
    with torch.no_grad():  # unit-scale activations; norms stay ones, biases zeros
        for pname, p in model.named_parameters():
            if p.dim() >= 2:
                p.copy_(torch.randn(p.shape, device=device, generator=g) / p.shape[-1] ** 0.5)
        for bname, b in model.named_buffers():
            if "correction_bias" in bname:
                b.zero_()
    return model


def median_ms(fn, device, warmup: int = 2, repeats: int = 5) -> float:
    cuda = torch.device(device).type == "cuda"
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(repeats):
        if cuda:
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        fn()
        if cuda:
            torch.cuda.synchronize()
        times.append((time.perf_counter() - t0) * 1e3)
    return sorted(times)[len(times) // 2]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--models", default="qwen3-moe,deepseek-v2-lite")
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--tokens", type=int, default=4096)
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--backend", default="kernel", choices=("kernel", "torch"), help="WeaveMoE backend")
    ap.add_argument("--policy", default="weave")
    ap.add_argument("--tiny", action="store_true", help="tiny configs (a smoke run)")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--no-share", action="store_true",
                    help="one MoEMegakernel per block (replace_moe_blocks(share_kernel=False)) instead of one per model")
    ap.add_argument("--out", default="")
    args = ap.parse_args(argv)
    names = args.models.split(",")
    known = ("qwen3-moe", "deepseek-v2-lite")
    if any(n not in known for n in names):
        ap.error(f"--models: {', '.join(n for n in names if n not in known)} unknown; known: {', '.join(known)}")
    if min(args.layers, args.tokens, args.repeats) < 1:
        ap.error("--layers, --tokens and --repeats must be >= 1")
    try:
        dev = torch.device(args.device)
    except RuntimeError as exc:
        ap.error(f"--device {args.device!r}: {exc}")
    if dev.type == "cuda" and not torch.cuda.is_available():
        ap.error("--device cuda, but this torch sees no GPU; on CPU: --tiny --device cpu --backend torch")
    if args.backend == "kernel" and dev.type != "cuda":
        ap.error(f"--backend kernel runs the CUDA megakernel and needs --device cuda, not {args.device}; "
                 f"--backend torch runs anywhere")
    try:
        import transformers
    except ImportError:
        ap.error('needs transformers 5.x: pip install -e ".[hf]"')

    from weave_kernel.e2e import kernel_buffers
    from weave_kernel.hf import replace_moe_blocks
    from weave_kernel.module import WeaveMoE

    cfgs = configs(args.tiny, args.layers)
    rows = []
    for name in names:
        cfg = cfgs[name]
        model = build(name, cfg, args.device, seed=0)
        ids = torch.randint(0, cfg.vocab_size, (1, args.tokens), generator=torch.Generator().manual_seed(1))
        ids = ids.to(args.device)
        impl = getattr(model.config, "_experts_implementation_internal", None) or \
            getattr(model.config, "_experts_implementation", None)
        with torch.no_grad():
            want = model(ids).last_hidden_state
            t_hf = median_ms(lambda: model(ids), args.device, repeats=args.repeats)
            n = replace_moe_blocks(model, max_tokens=args.tokens, backend=args.backend, policy=args.policy,
                                   check=False, share_kernel=not args.no_share)
            got = model(ids).last_hidden_state
            t_weave = median_ms(lambda: model(ids), args.device, repeats=args.repeats)
        for m in model.modules():
            if hasattr(m, "raise_if_error"):
                m.raise_if_error()
        bufs = kernel_buffers([m for m in model.modules() if isinstance(m, WeaveMoE)])
        err = float((got.float() - want.float()).norm() / want.float().norm())
        rows.append({"model": name, "layers": args.layers, "tokens": args.tokens, "moe_blocks": n,
                     "transformers_experts": impl, "transformers_ms": t_hf, "weave_ms": t_weave,
                     "speedup": t_hf / t_weave, "rel_err_last_hidden": err, "backend": args.backend,
                     "policy": args.policy, "kernels": bufs["kernels"],
                     "kernel_buffer_bytes": bufs["kernel_buffer_bytes"]})
        print(f"{name}: {n} MoE blocks swapped; transformers ({impl}) {t_hf:.3f} ms, WeaveMoE ({args.backend}, "
              f"{args.policy}) {t_weave:.3f} ms, {t_hf / t_weave:.2f}x; last hidden state rel. error {err:.2e}; "
              f"{bufs['kernels']} MoEMegakernel(s), buffers {bufs['kernel_buffer_bytes'] / 2**30:.2f} GiB",
              flush=True)
        del model
        if torch.device(args.device).type == "cuda":
            torch.cuda.empty_cache()
    header = (f"{args.layers} layers of each model's architecture, random weights, one sequence of {args.tokens} "
              f"tokens, transformers {transformers.__version__}, "
              f"{torch.cuda.get_device_name() if torch.device(args.device).type == 'cuda' else 'CPU'}, "
              f"{time.strftime('%Y-%m-%d')}")
    print(header)
    if args.out:
        with open(args.out, "w") as f:
            json.dump({"header": header, "rows": rows}, f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

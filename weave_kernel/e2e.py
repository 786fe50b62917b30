"""A decoder stack with WeaveMoE blocks, timed end to end: how much of a whole forward the MoE layer's speed-up
keeps once attention and norms run beside it. Random weights of a preset's MoE geometry; each rank runs its own
tokens through attention (data-parallel attention, as expert-parallel serving does) and the MoE blocks across
ranks. A stand-in attention: grouped-query, head_dim 128, hidden / 128 query heads and a quarter as many KV heads,
causal SDPA (the presets' own attention, e.g. DeepSeek's MLA, is not modelled). Prefill of one sequence per rank.

    torchrun --nproc_per_node=G -m weave_kernel.e2e --model qwen3-30b-a3b --tokens 4096 --layers 4

Prints, per MoE backend (the megakernel under each --policies entry, and the all-to-all reference "torch"), the
forward's median time and the MoE blocks' share of it (the same stack with the MoE blocks removed), and writes a
JSON with --out.
"""
from __future__ import annotations

import argparse
import json
import time

import torch
import torch.nn.functional as F

HEAD_DIM = 128


class Attention(torch.nn.Module):
    def __init__(self, hidden: int, dev):
        super().__init__()
        self.heads = max(1, hidden // HEAD_DIM)
        self.kv_heads = max(1, self.heads // 4)
        bf = dict(dtype=torch.bfloat16, device=dev)
        s = hidden ** -0.5
        self.wq = torch.randn(self.heads * HEAD_DIM, hidden, **bf) * s
        self.wkv = torch.randn(2 * self.kv_heads * HEAD_DIM, hidden, **bf) * s
        self.wo = torch.randn(hidden, self.heads * HEAD_DIM, **bf) * (self.heads * HEAD_DIM) ** -0.5

    def forward(self, x):  # x [T, H]
        T = x.shape[0]
        q = (x @ self.wq.t()).view(T, self.heads, HEAD_DIM).transpose(0, 1)
        k, v = (x @ self.wkv.t()).view(T, 2, self.kv_heads, HEAD_DIM).permute(1, 2, 0, 3)
        o = F.scaled_dot_product_attention(q[None], k[None], v[None], is_causal=True, enable_gqa=True)[0]
        return o.transpose(0, 1).reshape(T, -1) @ self.wo.t()


class DecoderLayer(torch.nn.Module):
    def __init__(self, hidden: int, moe, dev):
        super().__init__()
        self.attn = Attention(hidden, dev)
        self.moe = moe
        self.n1 = torch.nn.RMSNorm(hidden, device=dev, dtype=torch.bfloat16)
        self.n2 = torch.nn.RMSNorm(hidden, device=dev, dtype=torch.bfloat16)

    def forward(self, x, with_moe: bool = True):
        x = x + self.attn(self.n1(x))
        return x + self.moe(self.n2(x)) if with_moe else x


def build_moes(model, layers: int, tokens: int, backend: str, policy: str, shared: bool, dev, seed: int,
               share: bool = True, expert_dtype: str = "bf16"):
    """One WeaveMoE per layer, every rank with the same random weights (its local experts of them); on the kernel
    backend all layers run on the first one's MoEMegakernel (kernel=: one layer's buffers, as a model would), or
    each on its own with share=False. expert_dtype "fp8": the same draws, quantized (fp8.quantize_weight)."""
    from .fp8 import quantize_weight
    from .module import WeaveMoE

    H, I, E = model.hidden_size, model.expert_ffn_size, model.num_experts
    Is = model.num_shared_experts * I if shared else 0
    out = []
    for layer in range(layers):
        m = WeaveMoE(hidden=H, inter=I, num_experts=E, top_k=model.top_k, max_tokens=tokens, backend=backend,
                     policy=policy, shared_inter=Is, device=dev, check=False, expert_dtype=expert_dtype,
                     kernel=out[0] if out and share and backend == "kernel" else None)

        def r(*shape, d, key):  # the same draw on every rank, for this layer and key
            g = torch.Generator(device=dev).manual_seed((seed * 1000 + layer) * 10007 + key)
            return (torch.randn(*shape, device=dev, generator=g) * d ** -0.5).to(torch.bfloat16)

        m.load_router(r(E, H, d=H, key=0))
        with torch.no_grad():  # only this rank's experts are drawn (expert e from key 10 + e, whoever holds it)
            for le, e in enumerate(m.local):
                w13, w2 = r(2 * I, H, d=H, key=10 + e), r(H, I, d=I, key=10 + E + e)
                if expert_dtype == "fp8":
                    for (q, s), qd, sd in ((quantize_weight(w13), m.w13_q, m.w13_s), (quantize_weight(w2), m.w2_q, m.w2_s)):
                        qd[le].copy_(q)
                        sd[le].copy_(s)
                else:
                    m.w13[le].copy_(w13)
                    m.w2[le].copy_(w2)
        if Is:
            m.load_shared(r(Is, H, d=H, key=1), r(Is, H, d=H, key=2), r(H, Is, d=Is, key=3))
        out.append(m)
    return out


def kernel_buffers(moes) -> dict:
    """The MoEMegakernels under `moes`: "kernels" (how many), "workspace_bytes" (one kernel's buffers) and
    "kernel_buffer_bytes" (all of them together, as hf_e2e.py reports: a kernel per layer holds one set each)."""
    kernels = {id(m.layer): m.layer for m in moes if m.layer is not None}
    total = [k.workspace_bytes()["total"] for k in kernels.values()]
    return {"kernels": len(kernels), "workspace_bytes": total[0] if total else 0, "kernel_buffer_bytes": sum(total)}


def shared_note(model, shared: bool) -> str:
    """The header's word on shared experts: fused, left out, or none in the model (--shared on a model without)."""
    if not shared:
        return "left out"
    return "fused" if model.num_shared_experts else f"none in {model.name}"


def _sync_ranks() -> None:
    import torch.distributed as dist

    torch.cuda.synchronize()
    if dist.is_initialized():
        dist.barrier()


def median_ms(fn, warmup: int, repeats: int) -> float:
    """Median ms of one fn() (symm.cuda_time_ms, the ranks synchronised before each repetition)."""
    from .symm import cuda_time_ms

    return cuda_time_ms(fn, warmup, repeats, before=_sync_ranks)


def main(argv=None) -> int:
    import torch.distributed as dist

    from weave_sim.presets import get_model

    from .symm import init_ranks

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="qwen3-30b-a3b")
    ap.add_argument("--tokens", type=int, default=4096, help="tokens per rank (one sequence)")
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--policies", default="weave,static:20", help="megakernel policies to time")
    ap.add_argument("--shared", action="store_true", help="include the model's shared experts (fused)")
    ap.add_argument("--expert-dtype", choices=("bf16", "fp8"), default="bf16",
                    help="the experts' dtype (fp8: e4m3 with 128x128 block scales; the reference backend computes "
                         "the same FP8 arithmetic)")
    ap.add_argument("--repeats", type=int, default=10)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--separate-kernels", action="store_true",
                    help="also time each policy with a MoEMegakernel per layer (rows 'POLICY/separate') beside the "
                         "default, every layer on one kernel")
    ap.add_argument("--out", default="")
    args = ap.parse_args(argv)
    if args.tokens < 1 or args.layers < 1 or args.repeats < 1:
        raise SystemExit("weave_kernel.e2e: --tokens, --layers and --repeats must be >= 1")
    try:
        model = get_model(args.model)
    except (KeyError, ValueError) as exc:
        raise SystemExit(f"weave_kernel.e2e: {exc}")
    rank, world, dev = init_ranks()
    torch.manual_seed(args.seed)
    H = model.hidden_size
    x = torch.randn(args.tokens, H, device=dev, generator=torch.Generator(device=dev).manual_seed(args.seed + rank))
    x = x.to(torch.bfloat16)
    rows, outputs = {}, {}
    pols = [p for p in args.policies.split(",") if p]
    backends = [("kernel", p, sh) for p in pols for sh in ((True, False) if args.separate_kernels else (True,))] \
        + [("torch", "-", True)]
    for backend, policy, share in backends:
        moes = build_moes(model, args.layers, args.tokens, backend, policy if backend == "kernel" else "weave",
                          args.shared, dev, args.seed, share=share, expert_dtype=args.expert_dtype)
        torch.manual_seed(args.seed)  # the same attention weights for every backend (and rank)
        stack = [DecoderLayer(H, m, dev) for m in moes]

        def fwd(with_moe=True):
            h = x
            for lay in stack:
                h = lay(h, with_moe)
            return h

        with torch.no_grad():
            y = fwd()
            t_all = median_ms(fwd, args.warmup, args.repeats)
            t_attn = median_ms(lambda: fwd(False), args.warmup, args.repeats)
        for m in moes:
            m.raise_if_error()
        t = torch.tensor([t_all, t_attn], device=dev)
        if dist.is_initialized():
            dist.all_reduce(t, op=dist.ReduceOp.MAX)
        name = (policy if share else f"{policy}/separate") if backend == "kernel" else "reference"
        rows[name] = {"forward_ms": float(t[0]), "without_moe_ms": float(t[1])}
        if backend == "kernel":  # one MoEMegakernel's buffers serve every layer (build_moes), or one per layer
            rows[name].update(kernel_buffers(moes))
        outputs[name] = y
        stack = moes = None  # noqa: F841 - frees the layer's weights before the next backend
        torch.cuda.empty_cache()
    ref = rows["reference"]["forward_ms"]
    for name, y in outputs.items():  # the whole stack's output against the reference path's (bf16 through L layers)
        e = torch.tensor([float((y.float() - outputs["reference"].float()).norm() /
                                outputs["reference"].float().norm())], device=dev)
        if dist.is_initialized():
            dist.all_reduce(e, op=dist.ReduceOp.MAX)
        rows[name]["rel_err_vs_reference"] = float(e)
    if rank == 0:
        print(f"{args.layers} decoder layers of {model.name} (stand-in GQA attention), {args.tokens} tokens per rank, "
              f"EP={world}, {torch.cuda.get_device_name(dev)}, {args.expert_dtype} experts, shared experts "
              f"{shared_note(model, args.shared)}, "
              f"median of {args.repeats}, {time.strftime('%Y-%m-%d')}")
        print(f"{'MoE backend':<14}{'forward ms':>12}{'MoE ms':>10}{'MoE share':>11}{'vs reference':>14}"
              f"{'rel. error':>12}")
        for name, r in rows.items():
            moe = r["forward_ms"] - r["without_moe_ms"]
            print(f"{name:<14}{r['forward_ms']:>12.3f}{moe:>10.3f}{moe / r['forward_ms']:>10.1%}"
                  f"{ref / r['forward_ms']:>13.3f}x{r['rel_err_vs_reference']:>12.1e}")
        if args.expert_dtype == "fp8":
            print("(fp8: the reference is the torch backend's exact FP8 arithmetic in fp32, dequantizing each expert's "
                  "blocks per call: a correctness reference, not a speed baseline; time the bf16 stack beside it)")
        if args.out:
            with open(args.out, "w") as f:
                json.dump({"config": vars(args), "world": world, "model": model.name, "rows": rows}, f, indent=1)
    if dist.is_initialized():
        dist.barrier()
        dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

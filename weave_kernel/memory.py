"""GPU memory of a model's MoE layers on the megakernel, per GPU, by expert-parallel size: this GPU's routed experts,
the shared experts and routers of every MoE layer (bf16 experts, fp32 routers, as WeaveMoE holds them), and the
buffers of one MoEMegakernel, which every layer of the geometry shares (WeaveMoE(kernel=), hf.replace_moe_blocks),
against one kernel per layer. Attention, embeddings, activations and the KV cache are not counted.

    python -m weave_kernel.memory --models deepseek-v3,qwen3-30b-a3b --gpus 1,2,4,8 --max-tokens 4096
    python -m weave_kernel.memory --models custom:E=64:k=4:H=2048:I=1024:layers=24 --recv-factor 2

--recv-factor F sizes the receive rows for F times a balanced load (recv_capacity = F x max_tokens x top_k; default
the worst case, every pair of every rank on one GPU). --fp8 counts the layer as MoEMegakernel(expert_dtype="fp8")
holds it: the experts' weights in e4m3 (1 byte an element) with an fp32 scale per 128 x 128 block
(fp8.quantize_experts), and the FP8 kernel's buffers (workspace_bytes(expert_dtype="fp8"): e4m3 h and x with their
scales, the received rows' scales, the shared expert's e4m3 h and scales); the shared experts' weights are FP8 too,
as the FP8 kernel runs them. H, I and the shared width must be multiples of 128 there. Needs no GPU.
"""
from __future__ import annotations

import argparse
import math

from weave_sim.presets import WEAVE_EVAL_MODELS, get_model

from .geometry import check_geometry
from .buffers import FP8_BLOCK, workspace_bytes

GIB = 2**30


def _weight_bytes(rows: int, cols: int, fp8: bool) -> int:
    """Bytes of one [rows, cols] weight matrix: bf16, or e4m3 plus an fp32 scale per 128 x 128 block (fp8.py's
    weight_scale_inv layout [rows / 128, cols / 128]; moe_memory checks that both are multiples of 128)."""
    if not fp8:
        return 2 * rows * cols
    return rows * cols + 4 * (rows // FP8_BLOCK) * (cols // FP8_BLOCK)


def moe_memory(model, world: int, max_tokens: int, recv_factor: float | None = None, num_ctas: int = 132,
               fp8: bool = False) -> dict:
    """Bytes per GPU of `model`'s (a weave_sim ModelPreset) MoE layers at expert-parallel size `world`; fp8: as
    MoEMegakernel(expert_dtype="fp8") holds them (module docstring): e4m3 experts (shared ones too) with their block
    scales and the FP8 kernel's buffers."""
    H, I, E, k, L = model.hidden_size, model.expert_ffn_size, model.num_experts, model.top_k, model.num_moe_layers
    Is = model.num_shared_experts * I
    check_geometry(H, I, E, k, world, world, Is)
    if fp8 and (H % FP8_BLOCK or I % FP8_BLOCK or Is % FP8_BLOCK):
        raise ValueError(f"FP8 experts need hidden, inter and the shared width multiples of {FP8_BLOCK} (their scale "
                         f"blocks), got hidden {H}, inter {I}, shared {Is}")
    if recv_factor is not None and not 0 < recv_factor < math.inf:
        raise ValueError(f"recv_factor must be a finite number > 0, got {recv_factor}")
    cap = None if recv_factor is None else max(1, int(recv_factor * max_tokens * k))
    buf = workspace_bytes(hidden=H, inter=I, num_experts=E, top_k=k, world=world, max_tokens=max_tokens,
                          shared_inter=Is, num_ctas=num_ctas, recv_capacity=cap,
                          expert_dtype="fp8" if fp8 else "bf16")["total"]
    expert = 2 * _weight_bytes(I, H, fp8) + _weight_bytes(H, I, fp8)  # gate and up [I, H], down [H, I]
    shared = 2 * _weight_bytes(Is, H, fp8) + _weight_bytes(H, Is, fp8) if Is else 0
    out = {"routed": L * (E // world) * expert, "shared": L * shared,
           "routers": L * E * (H + 1) * 4, "buffers": buf}
    out["total"] = sum(out.values())
    out["total_kernel_per_layer"] = out["total"] + (L - 1) * buf
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--models", default=",".join(WEAVE_EVAL_MODELS),
                    help="presets (weave-sim models) or custom:E=..:k=..:H=..:I=..:layers=.. specs, comma-separated")
    ap.add_argument("--gpus", default="1,2,4,8", help="expert-parallel sizes, comma-separated")
    ap.add_argument("--max-tokens", type=int, default=4096, help="tokens per GPU per call (MoEMegakernel max_tokens)")
    ap.add_argument("--recv-factor", type=float, default=None,
                    help="receive rows for this many times a balanced load (default: the worst case)")
    ap.add_argument("--gpu-gib", type=float, default=139.0, help="memory per GPU in GiB (an H200 as torch sees it)")
    ap.add_argument("--fp8", action="store_true",
                    help="FP8 experts (expert_dtype='fp8'): e4m3 weights with 128 x 128 block scales, the FP8 "
                         "kernel's buffers")
    args = ap.parse_args(argv)
    try:
        gpus = [int(g) for g in args.gpus.split(",") if g]
    except ValueError:
        ap.error(f"--gpus {args.gpus!r}: comma-separated integers")
    if not gpus or min(gpus) < 1:
        ap.error("--gpus: at least one size, each >= 1")
    if args.max_tokens < 1:
        ap.error("--max-tokens must be >= 1")
    if args.recv_factor is not None and not 0 < args.recv_factor < math.inf:
        ap.error("--recv-factor must be a finite number > 0")
    if not 0 < args.gpu_gib < math.inf:
        ap.error("--gpu-gib must be a finite number > 0")
    try:
        models = [get_model(m) for m in args.models.split(",") if m]
    except (KeyError, ValueError) as exc:
        ap.error(str(exc).strip("'\""))
    if not models:
        ap.error("--models: at least one model")
    w = max(22, *(len(m.name) + 2 for m in models))  # custom specs are longer than the presets' names
    recv = "worst case" if args.recv_factor is None else f"{args.recv_factor:g} x a balanced load"
    print(f"# MoE layers only (no attention, embeddings, KV cache), GiB per GPU, max_tokens {args.max_tokens}, receive "
          f"rows for the {recv}; fits: total <= {args.gpu_gib:g} GiB"
          + ("; experts in FP8 (e4m3 + 128x128 block scales, the FP8 kernel's buffers)" if args.fp8 else ""))
    print(f"{'model':<{w}}{'EP':>4}{'layers':>7}{'experts/GPU':>12}{'routed':>9}{'shared':>8}{'routers':>8}"
          f"{'buffers':>9}{'total':>9}{'fits':>6}{'a kernel per layer':>20}")
    for m in models:
        for g in gpus:
            try:
                r = moe_memory(m, g, args.max_tokens, args.recv_factor, fp8=args.fp8)
            except ValueError as exc:
                print(f"{m.name:<{w}}{g:>4}  -  {exc}")
                continue
            fits = "yes" if r["total"] <= args.gpu_gib * GIB else "no"
            print(f"{m.name:<{w}}{g:>4}{m.num_moe_layers:>7}{m.num_experts // g:>12}{r['routed'] / GIB:>9.1f}"
                  f"{r['shared'] / GIB:>8.2f}{r['routers'] / GIB:>8.2f}{r['buffers'] / GIB:>9.2f}{r['total'] / GIB:>9.1f}"
                  f"{fits:>6}{r['total_kernel_per_layer'] / GIB:>20.1f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

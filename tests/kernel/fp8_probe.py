"""What FP8 experts would change, measured with cuBLAS on one GPU: the sustained rate of the experts' grouped GEMMs
in bf16 (torch._grouped_mm) and in FP8 e4m3 with per-row / per-column scales (torch._scaled_grouped_mm), on the
shapes each preset's layer has per GPU at EP=2 and 4096 tokens per GPU (balanced routing: 2 * 4096 * k / E rows
per local expert, rounded to 16), each timed after the GPU has run that GEMM back to back for a while, so at its power state.
Both are checked against an fp32 product first. The ratio FP8 / bf16 is what weave_sim's fp8 what-if needs as the
tiles' speed-up (docs/kernel.md, "FP8 experts: what they would buy").

    python tests/kernel/fp8_probe.py [--models ...] [--warm-s 1.5] [--out probe.json]
"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys

import torch

from weave_sim.presets import get_model

MODELS = "qwen3-30b-a3b,deepseek-v2-lite,qwen3.5-35b-a3b,phi-3.5-moe,deepseek-v2,deepseek-v3"
E4M3_MAX = 448.0


def gpu_state() -> dict:
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=clocks.sm,power.draw,clocks_throttle_reasons.sw_power_cap",
                              "--format=csv,noheader,nounits", "-i", str(torch.cuda.current_device())],
                             capture_output=True, text=True, timeout=10).stdout.strip().split(", ")
        return {"sm_mhz": float(out[0]), "power_w": float(out[1]), "power_capped": out[2].strip() != "Not Active"}
    except Exception as exc:  # noqa: BLE001 - the probe's figures stand without it
        return {"error": str(exc)}


def quantize_rows(t: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """e4m3 rows of t [..., K] with one fp32 scale per row (t ~= q * scale)."""
    scale = t.float().abs().amax(dim=-1, keepdim=True).clamp(min=1e-12) / E4M3_MAX
    return (t.float() / scale).to(torch.float8_e4m3fn), scale.squeeze(-1)


def timed(fn, warm_s: float, iters: int) -> float:
    """Seconds per call: back-to-back calls for warm_s, then iters calls between two events."""
    start = torch.cuda.Event(enable_timing=True)
    end = torch.cuda.Event(enable_timing=True)
    fn()
    torch.cuda.synchronize()
    start.record()
    n = 0
    while True:
        fn()
        n += 1
        end.record()
        end.synchronize()
        if start.elapsed_time(end) / 1e3 >= warm_s:
            break
    start.record()
    for _ in range(iters):
        fn()
    end.record()
    end.synchronize()
    return start.elapsed_time(end) / 1e3 / iters


def probe(groups: int, rows: int, k: int, n: int, warm_s: float, iters: int, seed: int) -> dict:
    dev = torch.device("cuda")
    g = torch.Generator(device=dev).manual_seed(seed)
    a = torch.randn(groups * rows, k, device=dev, generator=g).to(torch.bfloat16)
    w = (torch.randn(groups, n, k, device=dev, generator=g) / k ** 0.5).to(torch.bfloat16)  # [G, N, K], K-major
    offs = torch.arange(1, groups + 1, device=dev, dtype=torch.int32) * rows
    bf16 = lambda: torch._grouped_mm(a, w.transpose(-2, -1), offs=offs, out_dtype=torch.bfloat16)  # noqa: E731
    qa, sa = quantize_rows(a)
    qw, sw = quantize_rows(w)  # a scale per output column of each group
    fp8 = lambda: torch._scaled_grouped_mm(qa, qw.transpose(-2, -1), sa, sw, offs=offs,  # noqa: E731
                                           out_dtype=torch.bfloat16)
    ref = torch.cat([a[i * rows:(i + 1) * rows].float() @ w[i].float().t() for i in range(groups)])
    err = {}
    for name, fn in (("bf16", bf16), ("fp8", fp8)):
        y = fn().float()
        err[name] = float((y - ref).norm() / ref.norm())
    flops = 2.0 * groups * rows * k * n
    row = {"groups": groups, "rows": rows, "k": k, "n": n, "rel_err": err}
    for name, fn in (("bf16", bf16), ("fp8", fp8), ("bf16_again", bf16)):
        s = timed(fn, warm_s, iters)
        row[name] = {"us": s * 1e6, "tflops": flops / s / 1e12, **gpu_state()}
    return row


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", default=MODELS)
    ap.add_argument("--tokens", type=int, default=4096, help="tokens per GPU (default %(default)s)")
    ap.add_argument("--gpus", type=int, default=2, help="expert-parallel GPUs whose layer is probed (default %(default)s)")
    ap.add_argument("--warm-s", type=float, default=1.5)
    ap.add_argument("--iters", type=int, default=20)
    ap.add_argument("--out", default=None)
    args = ap.parse_args(argv)
    if not torch.cuda.is_available():
        print("needs a GPU", file=sys.stderr)
        return 2
    if not hasattr(torch, "_scaled_grouped_mm"):
        print(f"torch {torch.__version__} has no _scaled_grouped_mm", file=sys.stderr)
        return 2
    rows_out = []
    print(f"{'model':<18} {'gemm':<6} {'G x rows':>10} {'K':>6} {'N':>6} {'bf16 TF/s':>10} {'fp8 TF/s':>9} "
          f"{'fp8/bf16':>8} {'MHz bf16/fp8':>13} {'err bf16/fp8':>16}")
    for i, name in enumerate(args.models.split(",")):
        m = get_model(name)
        local = m.num_experts // args.gpus
        rows = max(16, 16 * round(args.gpus * args.tokens * m.top_k / m.num_experts / 16))  # FP8 wants 16s
        for gemm, k, n in (("gemm0", m.hidden_size, 2 * m.expert_ffn_size), ("gemm1", m.expert_ffn_size, m.hidden_size)):
            r = probe(local, rows, k, n, args.warm_s, args.iters, seed=i)
            r.update(model=name, gemm=gemm)
            rows_out.append(r)
            ratio = r["fp8"]["tflops"] / (0.5 * (r["bf16"]["tflops"] + r["bf16_again"]["tflops"]))
            r["fp8_over_bf16"] = ratio
            print(f"{name:<18} {gemm:<6} {f'{local}x{rows}':>10} {k:>6} {n:>6} {r['bf16']['tflops']:>10.0f} "
                  f"{r['fp8']['tflops']:>9.0f} {ratio:>8.2f} "
                  f"{r['bf16'].get('sm_mhz', 0):>6.0f}/{r['fp8'].get('sm_mhz', 0):<6.0f} "
                  f"{r['rel_err']['bf16']:.1e}/{r['rel_err']['fp8']:.1e}", flush=True)
    ratios = [r["fp8_over_bf16"] for r in rows_out]
    geo = float(torch.tensor(ratios).log().mean().exp())
    print(f"geomean fp8 / bf16 rate: {geo:.3f} over {len(ratios)} GEMMs (range {min(ratios):.2f}-{max(ratios):.2f})")
    if args.out:
        with open(args.out, "w") as f:
            json.dump({"device": torch.cuda.get_device_name(), "torch": torch.__version__, "tokens": args.tokens,
                       "gpus": args.gpus, "rows": rows_out, "geomean_fp8_over_bf16": geo}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())

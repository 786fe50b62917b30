"""Dispatch by all threads (copy_rows) against dispatch by bulk copies (csrc/bulk_copy.cuh; `--modes`, e.g.
threads,bulk:1,bulk:4,bulk:8: the issuing warps per CTA), on one GPU.

Two virtual ranks (weave_kernel/virtual.py) share the GPU, so a "push" is a copy inside one HBM, not over NVLink:
this measures what the copy code itself holds in flight and costs, not the link. For each model (all its
experts, `--tokens` tokens per rank, Zipf-skewed routing per rank) both layers run on the same inputs; every
output is checked against the fp32 reference (rel. error <= 1e-2, outputs poisoned first) and the two modes'
outputs must be bitwise equal (only the copy differs). Then, per policy, the layers are timed in alternation
(median over repetitions of back-to-back calls), and one call of each records its timeline: the dispatch span
per rank (first dispatch start to last dispatch end over the comm CTAs) gives the copy rate, bytes / span.
Prints one table; exits 1 on a failed check. `--expert-dtype fp8`: FP8 experts (e4m3 rows of H bytes, their
scales by the threads in every mode), checked against fp8.moe_reference_fp8 (rel. error <= 3e-2, fp8_worker's).

    python tests/kernel/dispatch_ab.py [--models qwen3-30b-a3b,deepseek-v2-lite] [--tokens 4096] [--policies static:4,static:8]
"""
from __future__ import annotations

import argparse
import statistics
import sys

import numpy as np
import torch

from weave_kernel.fp8 import moe_reference_fp8, quantize_experts
from weave_kernel.reference import make_weights, moe_reference
from weave_kernel.routing import skewed_routing
from weave_kernel.virtual import VirtualRanks
from virtual_worker import TOL_FP8, rank_experts  # this folder is on sys.path when the script runs
from weave_sim.placement import contiguous
from weave_sim.presets import get_model

TOL = 1e-2  # bf16 against moe_reference (FP8: virtual_worker.TOL_FP8, fp8_worker's)


def dispatch_span_us(layer) -> tuple[float, int]:
    """(first dispatch start to last dispatch end in us, dispatch records) of the layer's last recorded call."""
    events, _ = layer.timeline_events()
    d = [e for e in events if e.get("name", "").startswith("dispatch")]
    if not d:
        return float("nan"), 0
    return max(e["ts"] + e["dur"] for e in d) - min(e["ts"] for e in d), len(d)


def time_ms(fn, calls: int) -> float:
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    fn()
    start.record()
    for _ in range(calls):
        fn()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) / calls


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--models", default="qwen3-30b-a3b,deepseek-v2-lite,phi-3.5-moe,deepseek-v2")
    ap.add_argument("--tokens", type=int, default=4096)
    ap.add_argument("--policies", default="static:4,static:8,static:20,weave:8")
    ap.add_argument("--repeats", type=int, default=7)
    ap.add_argument("--calls", type=int, default=4)
    ap.add_argument("--modes", default="threads,bulk", help="dispatch modes; the first is the baseline")
    ap.add_argument("--expert-dtype", default="bf16", choices=("bf16", "fp8"))
    ap.add_argument("--csrc", default="", help="build the layers from these kernel sources (an A/B of two versions "
                                               "runs this script once per version in one call)")
    args = ap.parse_args()
    dev = torch.device("cuda", torch.cuda.current_device())
    ext = None
    if args.csrc:
        from weave_kernel.build import load_extension

        ext = load_extension(csrc=args.csrc)
    world, n = 2, args.tokens
    failures, rows, ctas, modes = [], [], 0, args.modes.split(",")
    for mi, name in enumerate(args.models.split(",")):
        m = get_model(name)
        H, I, E, k = m.hidden_size, m.expert_ffn_size, m.num_experts, m.top_k
        pl = contiguous(E, world)
        gen = torch.Generator(device=dev).manual_seed(100 + mi)
        w13_all, w2_all = make_weights(E, H, I, device=dev, generator=gen)
        fp8 = args.expert_dtype == "fp8"
        if fp8:  # (q, s) pairs; a rank's experts are rows of both
            w13_all, w2_all = quantize_experts(w13_all, w2_all)
        w13s = [rank_experts(w13_all, pl, r) for r in range(world)]
        w2s = [rank_experts(w2_all, pl, r) for r in range(world)]
        row_bytes = H + 4 * (H // 128) if fp8 else 2 * H  # e4m3 row and its fp32 scales, or the bf16 row
        ids, ws, xs = [], [], []
        for r in range(world):
            i, w = skewed_routing(n, E, k, seed=1000 * mi + r, zipf_s=1.0)
            ids.append(torch.as_tensor(i).to(dev))
            ws.append(torch.as_tensor(w).to(dev))
            xs.append(torch.randn(n, H, generator=torch.Generator().manual_seed(7 * mi + r)).to(torch.bfloat16).to(dev))
        oracle = moe_reference_fp8 if fp8 else moe_reference
        ref = list(torch.split(oracle(torch.cat(xs), torch.cat(ids), torch.cat(ws), w13_all, w2_all).float(), n))
        owner = np.asarray(pl.owner)
        sent = [int(np.sum(owner[ids[r].cpu().numpy()] != r)) for r in range(world)]  # rows leaving each rank
        modes = args.modes.split(",")
        layers = {mode: VirtualRanks(world, hidden=H, inter=I, num_experts=E, top_k=k, placement=pl, max_tokens=n,
                                     timeline_per_cta=512, dispatch=mode, expert_dtype=args.expert_dtype, ext=ext)
                  for mode in modes}
        ctas = layers[modes[0]].num_ctas
        del w13_all, w2_all
        for pol in args.policies.split(","):
            outs, errs = {}, {}
            for mode, vr in layers.items():
                o = [torch.full((n, H), float("nan"), dtype=torch.bfloat16, device=dev) for _ in range(world)]
                vr.poison_scratch()
                vr(xs, ids, ws, w13s, w2s, policy=pol, outs=o)
                torch.cuda.synchronize()
                e = [float((o[r].float() - ref[r]).norm() / ref[r].norm()) if torch.isfinite(o[r]).all()
                     else float("inf") for r in range(world)]
                if max(e) > (TOL_FP8 if fp8 else TOL):
                    failures.append(f"{name} {pol} {mode}: rel. error {max(e):.2e}")
                outs[mode], errs[mode] = o, max(e)
            same = all(all(torch.equal(a, b) for a, b in zip(outs[modes[0]], outs[m])) for m in modes[1:])
            if not same:
                failures.append(f"{name} {pol}: the dispatch modes' outputs differ")
            times = {m: [] for m in modes}
            for _ in range(args.repeats):
                for m in modes:
                    vr = layers[m]
                    times[m].append(time_ms(lambda vr=vr: vr(xs, ids, ws, w13s, w2s, policy=pol, check=False), args.calls))
            gbs = {}
            for m, vr in layers.items():
                vr.raise_if_error()
                vr(xs, ids, ws, w13s, w2s, policy=pol, record_timeline=True)
                torch.cuda.synchronize()
                spans = [dispatch_span_us(vr[r])[0] for r in range(world)]
                gbs[m] = min(row_bytes * s / (sp * 1e3) for s, sp in zip(sent, spans))
            med = {m: statistics.median(t) for m, t in times.items()}
            rows.append((name, pol, med, gbs, max(errs.values()), same))
            print(f"{name} {pol}: " + ", ".join(f"{m} {med[m]:.3f} ms {gbs[m]:.0f} GB/s" for m in modes), flush=True)
        del layers
        torch.cuda.empty_cache()
    print(f"\ndispatch A/B on one GPU ({torch.cuda.get_device_name(dev)}), {args.expert_dtype} experts, 2 virtual ranks x "
          f"{ctas} CTAs, {n} tokens "
          f"per rank, Zipf(1.0) routing; a push is a copy inside one HBM. ms: median layer time; x: baseline time / "
          f"mode time (> 1: faster); GB/s: rows pushed by the slower rank over its dispatch span")
    head = f"{'model':<18}{'policy':<10}" + "".join(f"{m + ' ms':>14}{'x':>7}{'GB/s':>6}" for m in modes)
    print(head + f"{'rel err':>9}{'equal':>7}")
    for name, pol, med, gbs, err, same in rows:
        print(f"{name:<18}{pol:<10}" + "".join(f"{med[m]:>14.3f}{med[modes[0]] / med[m]:>7.3f}{gbs[m]:>6.0f}"
                                               for m in modes) + f"{err:>9.1e}{str(same):>7}")
    print(f"FAILURES: {len(failures)}" + ("".join(f"\n  {f}" for f in failures)))
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())

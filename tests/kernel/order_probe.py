"""Does weave's time at EP=1 depend on where the busiest experts sit in the tile queue? (1x GPU, one process)

fp8_worker.py --bench timed weave 13-17% slower than static:8 on deepseek-v2's FP8 layers, where `bench` timed it 3-4%
faster (tests/kernel/fp8_harness_run.sh, docs/kernel.md); static:8 agreed between the two. The harnesses draw their
Zipf(1.0) routing from different seeds, so the busiest experts land at different expert ids, i.e. at different
places in the tile queue. Here the same layer is timed on routing whose expert ids are relabelled so that the experts
with the most rows come first ("hot-first"), last ("hot-last"), or as drawn (seeds 1 and 2), static:8 and weave
interleaved (median of REPS back-to-back calls, CUDA events, 2 warm-up calls).

    python tests/kernel/order_probe.py [--models deepseek-v2,phi-3.5-moe] [--tokens 2048,8192] [--dtypes bf16,fp8]
"""
from __future__ import annotations

import argparse
import statistics
import sys

import numpy as np
import torch

from fp8_worker import quantize_chunked, timed  # (this folder is the script's: sys.path[0])
from weave_kernel.megakernel import MoEMegakernel
from weave_kernel.reference import make_weights
from weave_kernel.routing import skewed_routing
from weave_sim.placement import contiguous
from weave_sim.presets import get_model


def relabel(ids: np.ndarray, num_experts: int, order: str) -> np.ndarray:
    """ids with expert labels permuted so that the experts' row counts fall ('hot-first') or rise ('hot-last') with
    the label; 'drawn' leaves them."""
    if order == "drawn":
        return ids
    counts = np.bincount(ids.ravel(), minlength=num_experts)
    by_load = np.argsort(-counts if order == "hot-first" else counts, kind="stable")  # new label i <- old by_load[i]
    new = np.empty(num_experts, dtype=ids.dtype)
    new[by_load] = np.arange(num_experts, dtype=ids.dtype)
    return new[ids]


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--models", default="deepseek-v2,phi-3.5-moe")
    ap.add_argument("--tokens", default="2048,8192")
    ap.add_argument("--dtypes", default="bf16,fp8")
    ap.add_argument("--reps", type=int, default=7)
    args = ap.parse_args()
    dev = torch.device("cuda", torch.cuda.current_device())
    tokens = [int(t) for t in args.tokens.split(",")]
    rows = []
    for name in args.models.split(","):
        m = get_model(name)
        H, I, E, k = m.hidden_size, m.expert_ffn_size, m.num_experts, m.top_k
        w13b, w2b = make_weights(E, H, I, device=dev)
        weights = {"bf16": (w13b, w2b)}
        if "fp8" in args.dtypes:
            weights["fp8"] = quantize_chunked(w13b, w2b)
        kw = dict(hidden=H, inter=I, num_experts=E, top_k=k, placement=contiguous(E, 1), max_tokens=max(tokens),
                  device=dev)
        for dt in args.dtypes.split(","):
            layer = MoEMegakernel(**kw, expert_dtype=dt)
            w13, w2 = weights[dt]
            for n in tokens:
                x = torch.randn(n, H, device=dev).to(torch.bfloat16)
                for seed, order in ((1, "drawn"), (2, "drawn"), (1, "hot-first"), (1, "hot-last")):
                    ids_np, tw_np = skewed_routing(n, E, k, seed=seed)
                    ids = torch.as_tensor(relabel(ids_np, E, order), device=dev)
                    tw = torch.as_tensor(tw_np, device=dev)
                    t = {pol: timed(lambda: layer(x, ids, tw, w13, w2, policy=pol, check=False), args.reps)
                         for pol in ("static:8", "weave", "static:8 ")}  # static:8 twice: the drift
                    s8 = 0.5 * (t["static:8"] + t["static:8 "])
                    rows.append((name, n, dt, f"{order}:{seed}", s8, t["weave"], t["weave"] / s8))
                    print(f"ORDER {name} n={n} {dt} {order} seed {seed}: static:8 {t['static:8']:.3f} / "
                          f"{t['static:8 ']:.3f} ms, weave {t['weave']:.3f} ms, weave / static:8 {t['weave'] / s8:.3f}",
                          flush=True)
            layer.raise_if_error()
            del layer
        del weights, w13b, w2b
        torch.cuda.empty_cache()
    print(f"{'model':14s} {'tok':>5s} {'dtype':5s} {'routing':12s} {'static:8':>8s} {'weave':>8s} {'w/s8':>6s}")
    for r in rows:
        print(f"{r[0][:14]:14s} {r[1]:5d} {r[2]:5s} {r[3]:12s} {r[4]:8.3f} {r[5]:8.3f} {r[6]:6.3f}")
    for order in ("drawn", "hot-first", "hot-last"):
        sel = [r[6] for r in rows if r[3].startswith(order)]
        if sel:
            print(f"geomean weave / static:8, {order}: {statistics.geometric_mean(sel):.3f} over {len(sel)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

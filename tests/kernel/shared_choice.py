"""Does the in-kernel (c*, K*) choice need to know about the fused shared expert? (CPU only, simulator.)

The megakernel picks its comm CTAs c* per GPU from the cost table (weave_sim.costmodel.choose on the routed work
only); with bench --shared first|last it also computes the shared FFN (width num_shared_experts x I, on the GPU's own
tokens), which that choice ignores. Per model x world size this simulates, with the fused shared expert on
(--shared, default last), the kernel's scheduling as weave_kernel.predict does (kernel options, the bench's
routing and contiguous placement, one layer):
  (a) kernel:weave            c* from the cost model without the shared work (the kernel as built)
  (b) best kernel:weave:C     the best fixed C of --grid, the same on every GPU (the oracle)
  (c) kernel:weave@C'         C' per GPU = choose() on the volumes with the shared FLOPs and weight bytes added
                              (costmodel.bound_volumes(..., shared=True)); '@' keeps (a)'s decision cost, so (c)
                              is (a) exactly wherever C' = c*
and prints the regrets (a)/(b) - 1 and (c)/(b) - 1, and the geomean of (a)/(c) per world size: above 1 where knowing
the shared work pays. kernel:weave:C makes no choice (CTA 0 records C), so (b) saves the choice's cost (a few us)
that (a) and (c) pay: part of every regret here.

    python tests/kernel/shared_choice.py [--models deepseek-v2-lite,...] [--gpus 2,4] [--tokens 4096]
        [--profile h200-megakernel-ep2] [--shared last] [--out shared_choice.json]
"""
from __future__ import annotations

import argparse
import json
import math
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

from weave_kernel.predict import config_counts
from weave_sim import costmodel as cm
from weave_sim.engine import simulate_layer
from weave_sim.presets import get_model
from weave_sim.profile import load_profile
from weave_sim.validate import KERNEL_LAYOUTS, kernel_layout_for
from weave_sim.workload import workload_from_counts

MODELS = ("deepseek-v2-lite", "deepseek-v2", "qwen3.5-35b-a3b", "deepseek-v3")
GRID = (1, 2, 4, 6, 8, 12, 16, 20, 24, 32)


def shared_choice(model_name: str, world: int, tokens: int, profile_name: str, shared: str = "last",
                  grid=GRID, seed: int = 0) -> dict:
    """One configuration: c*, C', the oracle's C and the latencies (ms) of (a), (b), (c), plus kernel:weave with the
    shared expert off (what it costs)."""
    model, profile = get_model(model_name), load_profile(profile_name)
    counts, _, pl = config_counts(model, world, tokens, seed)
    w = workload_from_counts(counts["source_expert_pairs"], counts["dispatch_rows"], model, pl,
                             counts["tokens_per_gpu"])
    base = KERNEL_LAYOUTS[kernel_layout_for(shared=shared != "off")]
    opts = {**base, **({"shared": shared} if shared != "off" else {})}

    def sim(policy, o=opts):
        return simulate_layer(w, profile, policy, **o).latency_ns / 1e6

    c_star = [int(c) for c in cm.choose(cm.Volumes.from_workloads([w], profile), profile).num_comm_sms[0]]
    vol = cm.bound_volumes([w], profile, shared=shared != "off")  # off: the same volumes, C' = c* (a baseline)
    c_shared = [int(c) for c in cm.choose(vol, profile).num_comm_sms[0]]
    sweep = {c: sim(f"kernel:weave:{c}") for c in grid}
    best_c = min(sweep, key=sweep.get)
    a, c = sim("kernel:weave"), sim(f"kernel:weave@{','.join(map(str, c_shared))}")
    b = sweep[best_c]
    return {"model": model_name, "gpus": world, "tokens_per_gpu": tokens, "profile": profile_name, "shared": shared,
            "inter_shared": model.shared_ffn_size, "c_star": c_star, "c_shared": c_shared, "best_c": best_c,
            "weave_ms": a, "oracle_ms": b, "weave_shared_choice_ms": c, "sweep_ms": {str(k): v for k, v in sweep.items()},
            # without the shared expert the kernel runs its other instance, with half tiles (kernel_layout_for)
            "weave_shared_off_ms": sim("kernel:weave", KERNEL_LAYOUTS[kernel_layout_for()]),
            "regret": a / b - 1.0, "regret_shared_choice": c / b - 1.0}


def geomean(xs) -> float:
    xs = list(xs)
    return math.exp(sum(map(math.log, xs)) / len(xs))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", default=",".join(MODELS))
    ap.add_argument("--gpus", default="2,4")
    ap.add_argument("--tokens", default="4096")
    ap.add_argument("--profile", default="h200-megakernel-ep2")
    ap.add_argument("--shared", default="last", choices=["off", "first", "last"],
                    help="the shared expert's tiles first or last in the GEMM queue (off: the regrets without it)")
    ap.add_argument("--grid", default=",".join(map(str, GRID)), help="C values of the oracle's kernel:weave:C sweep")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--jobs", type=int, default=2)
    ap.add_argument("--out", type=Path, default=None, help="write the rows as JSON")
    args = ap.parse_args(argv)
    grid = tuple(int(c) for c in args.grid.split(","))
    jobs = [(m, int(g), int(t)) for g in args.gpus.split(",") for m in args.models.split(",")
            for t in args.tokens.split(",")]
    with ProcessPoolExecutor(max_workers=max(1, args.jobs)) as pool:
        futs = [pool.submit(shared_choice, m, g, t, args.profile, args.shared, grid, args.seed) for m, g, t in jobs]
        rows = [f.result() for f in futs]
    print(f"simulator ({args.profile}), kernel scheduling, bench routing (seed {args.seed}), shared expert "
          f"{args.shared}; (a) kernel:weave, (b) best kernel:weave:C over C in {{{args.grid}}}, (c) kernel:weave@C' "
          f"with C' = choose() on the volumes with the shared work; ms")
    print(f"{'EP':>3} {'model':>17} {'tokens':>6} {'Is':>5} {'c*':>12} {'C_prime':>12} {'best C':>6} {'off ms':>7} "
          f"{'(a) ms':>7} {'(b) ms':>7} {'(c) ms':>7} {'(a)/(b)':>8} {'(c)/(b)':>8}")
    for r in rows:
        print(f"{r['gpus']:>3} {r['model']:>17} {r['tokens_per_gpu']:>6} {r['inter_shared']:>5} "
              f"{','.join(map(str, r['c_star'])):>12} {','.join(map(str, r['c_shared'])):>12} {r['best_c']:>6} "
              f"{r['weave_shared_off_ms']:>7.3f} {r['weave_ms']:>7.3f} {r['oracle_ms']:>7.3f} "
              f"{r['weave_shared_choice_ms']:>7.3f} {r['regret']:>+8.2%} {r['regret_shared_choice']:>+8.2%}")
    for g in sorted({r["gpus"] for r in rows}):
        sel = [r for r in rows if r["gpus"] == g]
        print(f"  EP={g}: geomean (a)/(b) {geomean(r['weave_ms'] / r['oracle_ms'] for r in sel):.4f}, "
              f"(c)/(b) {geomean(r['weave_shared_choice_ms'] / r['oracle_ms'] for r in sel):.4f}, "
              f"(a)/(c) {geomean(r['weave_ms'] / r['weave_shared_choice_ms'] for r in sel):.4f}")
    print(f"  all: (a)/(c) {geomean(r['weave_ms'] / r['weave_shared_choice_ms'] for r in rows):.4f} "
          f"(above 1: the choice gains by knowing the shared work)")
    if args.out:
        args.out.write_text(json.dumps({"profile": args.profile, "shared": args.shared, "grid": list(grid),
                                        "seed": args.seed, "rows": rows}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

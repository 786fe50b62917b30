"""Where a measured layer's distance from the lower bound goes, by the simulator: the configurations of a kernel
benchmark simulated under `kernel:weave` as built, then with one of the bound's idealisations after another.

The lower bound (weave_sim.costmodel.lower_bound_ns, seed profile `h200`) is the slowest of the chip's peak
FLOP rate on the layer's FLOPs, the link's peak on its distinct token rows, and HBM on its weights. The kernel
misses it for reasons the engine models separately, removed here in this order (each step keeps the ones
before it):
  tiles     every SM computes at the bound's rate (peak TFLOP/s / SMs) at any rows per expert, weights stream at
            the bound's HBM rate; no power model, no fixed share per tile, no dependence on how many SMs compute
  padding   a row block's MMAs cost its rows, not the whole 128-row block (pad:1 of weave_kernel.whatif; the tiles
            and their weight streams stay)
  fixed     no fixed costs: count exchange, grid barrier, ticket claims, cross-GPU signals, the choice, pieces
  push      any number of comm CTAs pushes at the link's peak (the bound's NVLink rate)
  dedup     dispatch sends each token once per destination GPU, not once per (token, expert) pair (as the
            bound counts bytes; whatif's dedup)
What is left after the last step is the schedule itself: the wait for rows before the first tiles, the tail of
the last tiles, the reduction, the GPUs' uneven loads. The order matters (a step is worth what is left of it
once the ones before it are gone), so read the columns as a waterfall, not as independent gains; `--alone`
applies each step on its own to the kernel as built instead. A result that ran the fused shared expert (bench
--shared first|last: its "shared" and "inter_shared") is simulated with it at every step, and a bound computed here
counts its FLOPs and weights (the benchmark's recorded "lower_bound_ms" already does). A result of FP8 experts is
simulated as FP8 and measured against FP8's bound (e4m3 bytes, FP8's peak; bench's "fp8_lower_bound_ms").

    python -m weave_kernel.gap docs/results/ep2/kernel_bench_B_ep2.json --profile h200-megakernel-ep2 [--tokens 4096]

CPU only; needs no torch.
"""
from __future__ import annotations

import argparse
import json
import math
from pathlib import Path

from weave_sim.engine import simulate_layer
from weave_sim.profile import load_profile, profile_from_dict
from weave_sim.validate import kernel_options, profile_for_result

from .whatif import distinct_dispatch_rows, result_bound_ms, result_workload, results_with_counts, warn_other_kernel

STEPS = ("tiles", "padding", "fixed", "push", "dedup")
POLICY = "kernel:weave"


def ideal_tiles(raw: dict, bound: dict, tflops: float | None = None) -> dict:
    """Profile dict `raw` whose tiles run at the bound's rate (see module docstring), or at `tflops` per GPU."""
    prof = json.loads(json.dumps(raw))
    peak = float(tflops or bound["gemm"]["peak_tflops"])
    gemm = prof["gemm"]
    gemm["peak_tflops"] = peak
    gemm["per_sm_tflops_by_rows"] = {k: peak / prof["num_sms"] for k in gemm["per_sm_tflops_by_rows"]}
    for key in ("k_fixed", "scale_by_ctas"):
        gemm.pop(key, None)
    prof.pop("power", None)
    prof["hbm_gbs"] = float(bound["hbm_gbs"])
    return prof


def no_fixed_costs(raw: dict) -> dict:
    prof = json.loads(json.dumps(raw))
    prof["fixed_ns"] = {k: 0 for k in prof["fixed_ns"]}
    return prof


def push_at_peak(raw: dict, bound: dict) -> dict:
    prof = json.loads(json.dumps(raw))
    peak = float(bound["nvlink"]["peak_gbs"])
    nv = prof["nvlink"]
    nv["push_gbs_by_ctas"] = {k: peak for k in nv["push_gbs_by_ctas"]}
    nv["peak_gbs"] = peak
    return prof


def gap_result(result: dict, profile, cfg: dict, bound_profile=None, alone: bool = False,
               tile_tflops: float | None = None) -> dict:
    """Simulated `kernel:weave` latency (ms) of one benchmark result as built and after each step of STEPS (each
    added to the ones before it; alone=True: each on its own). tile_tflops: the tiles step's rate per GPU (default
    the bound's peak)."""
    bound_profile = bound_profile or load_profile("h200")
    profile = profile_for_result(result, profile)
    w = result_workload(result)
    opts = dict(kernel_options(result))
    raw, braw = profile.to_dict(), bound_profile.to_dict()
    sim = {"as built": simulate_layer(w, profile, POLICY, **opts).latency_ns / 1e6}
    built = (w, raw, dict(opts))
    for step in STEPS:
        if alone:
            w, raw, opts = built[0], built[1], dict(built[2])
        if step == "tiles":
            raw = ideal_tiles(raw, braw, tile_tflops)
        elif step == "padding":
            if "expert_pad_rows" not in opts:
                raise ValueError(f"the padding step models the expert-packed kernel layout; this result ran {opts}")
            opts["expert_pad_rows"] = 1
        elif step == "fixed":
            raw = no_fixed_costs(raw)
        elif step == "push":
            raw = push_at_peak(raw, braw)
        elif step == "dedup":
            w = result_workload(result, distinct_dispatch_rows(result, cfg))
            opts["dispatch_order"] = "token"
        prof = profile_from_dict(raw, origin=f"{profile.name}, ideal {'in' if alone else 'up to'} {step}")
        sim[step] = simulate_layer(w, prof, POLICY, **opts).latency_ns / 1e6
    bound = result_bound_ms(result, cfg, bound_profile)
    return {"model": result["model"], "tokens_per_gpu": int(result["tokens_per_gpu"]), "gpus": int(result["gpus"]),
            "measured_ms": result["latency_ms"].get("weave"), "bound_ms": float(bound), "simulated_ms": sim,
            "steps": "alone" if alone else "cumulative"}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("bench", type=Path, help="kernel benchmark JSON with counts (python -m weave_kernel.bench)")
    ap.add_argument("--profile", default="h200-megakernel-ep2", help="the kernel's fitted profile (default %(default)s)")
    ap.add_argument("--tokens", default="", help="only these tokens/GPU, comma-separated")
    ap.add_argument("--tile-tflops", type=float, default=None,
                    help="the tiles step's rate per GPU in TFLOP/s (default: the bound's peak, 790 on h200; e.g. 667, "
                         "what the tile's mainloop sustains at the 700 W cap, docs/power.md)")
    ap.add_argument("--alone", action="store_true", help="each step on its own, not added to the ones before")
    ap.add_argument("--out", type=Path, default=None, help="write the rows as JSON")
    args = ap.parse_args(argv)
    try:
        profile = load_profile(args.profile)
        data, picked = results_with_counts(args.bench, args.tokens)
    except (ValueError, FileNotFoundError) as exc:
        ap.error(str(exc))
    warn_other_kernel(data, profile)
    bound_profile = load_profile("h200")
    if args.tile_tflops is not None and not 1.0 <= args.tile_tflops <= 1e5:  # NaN fails too
        ap.error(f"--tile-tflops must be a GPU's tile rate in TFLOP/s, between 1 and 100000 (got {args.tile_tflops})")
    try:  # e.g. a result whose layout the padding step does not model
        rows = [gap_result(r, profile, data.get("config", {}), bound_profile, args.alone, args.tile_tflops)
                for r in picked]
    except ValueError as exc:
        ap.error(str(exc))
    cols = ["as built", *STEPS]
    how = "each idealisation on its own" if args.alone else "with each idealisation added to the ones before"
    rate = f"{args.tile_tflops:g} TFLOP/s" if args.tile_tflops else "the bound's peak"
    print(f"simulator ({args.profile}), {POLICY}: fraction of the lower bound, measured, then simulated as built and "
          f"{how} (tiles at {rate})")
    print(f"{'model':>17} {'tokens':>6} {'measured':>9} " + " ".join(f"{c:>9}" for c in cols))
    for r in rows:
        meas = r["bound_ms"] / r["measured_ms"] if r["measured_ms"] else float("nan")
        print(f"{r['model']:>17} {r['tokens_per_gpu']:>6} {meas:>9.1%} "
              + " ".join(f"{r['bound_ms'] / r['simulated_ms'][c]:>9.1%}" for c in cols))
    if rows:
        mean = lambda v: sum(v) / len(v)  # noqa: E731
        have = [r for r in rows if r["measured_ms"]]
        meas = mean([r["bound_ms"] / r["measured_ms"] for r in have]) if have else float("nan")
        print(f"{'mean':>17} {'':>6} {meas:>9.1%} "
              + " ".join(f"{mean([r['bound_ms'] / r['simulated_ms'][c] for r in rows]):>9.1%}" for c in cols))
        prev = {c: "as built" if args.alone else p for p, c in zip(cols, cols[1:])}
        gains = {c: math.exp(mean([math.log(r["simulated_ms"][prev[c]] / r["simulated_ms"][c]) for r in rows]))
                 for c in cols[1:]}
        print(f"geomean gain of each step over {'the kernel as built' if args.alone else 'the one before'}: "
              + ", ".join(f"{c} {g:.3f}x" for c, g in gains.items()))
    if args.out:
        args.out.write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

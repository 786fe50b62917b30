"""Median GEMM tile time in a measured kernel trace against the simulator's, for the same routing counts.

    python tests/kernel/trace_vs_sim_tiles.py --profile h200-megakernel-power-ep1 BENCH.json TRACE.json [...]

BENCH.json / TRACE.json: what `python -m weave_kernel.bench ... --trace TRACE.json --trace-policy P --out BENCH.json`
wrote for one configuration (the first result's counts drive the simulation). Per GEMM kind: the measured median
span of the tile records (trace_tiles.py) and the median simulated time per 128 x 256 output tile of the same
policy; both are per tile of the kernel's shape, so a ratio far from 1 at one K and not at another is the tile
time's dependence on K (docs/engine.md, "Tile time by K"). CPU only (weave_sim)."""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from trace_tiles import tile_stats  # noqa: E402

from weave_sim.engine import simulate_layer  # noqa: E402
from weave_sim.engine.dag import KIND_NAMES  # noqa: E402
from weave_sim.profile import load_profile  # noqa: E402
from weave_sim.validate import _layer_from_result, bench_results, kernel_options, profile_for_result, sim_policy  # noqa: E402


def compare(bench_path: str, trace_path: str, profile, policy: str) -> dict:
    doc = json.loads(Path(bench_path).read_text())
    r = (bench_results(doc) if isinstance(doc, dict) else doc)[0]
    prof = profile_for_result(r, profile)
    res = simulate_layer(_layer_from_result(r), prof, sim_policy(policy, r), seed=0, record_timeline=True,
                         **kernel_options(r))
    g = res.graph
    dur_us = (res.end_ns - res.start_ns) / 1e3
    H, I = int(r["hidden"]), int(r["inter"])
    measured = tile_stats(trace_path, H, I)
    out = {"model": r["model"], "tokens": r["tokens_per_gpu"], "H": H, "I": I,
           "layer_ms": {"measured": r["latency_ms"].get(policy), "simulated": res.latency_ns / 1e6}}
    for kind, mult in (("gemm0", 2), ("gemm1", 1)):
        sel = g.kind == KIND_NAMES.index(kind)
        per_tile = dur_us[sel] / (g.tiles[sel] * prof.tile_cols * mult / 256)  # kernel tiles: 256 outputs wide
        out[kind] = {"measured_us": measured[kind][1] if kind in measured else None,
                     "simulated_us": float(np.median(per_tile)) if sel.any() else None}
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--profile", default="h200-megakernel-power-ep1")
    ap.add_argument("--policy", default="weave", help="the traced policy (bench --trace-policy)")
    ap.add_argument("pairs", nargs="+", help="BENCH.json TRACE.json, repeated")
    args = ap.parse_args(argv)
    if len(args.pairs) % 2:
        ap.error("give BENCH.json TRACE.json pairs")
    prof = load_profile(args.profile)
    print(f"profile {args.profile}; median us per 128 x 256 tile, simulated / measured")
    print(f"{'model':<18}{'H':>6}{'I':>6}{'gemm0 meas':>12}{'sim':>8}{'ratio':>7}{'gemm1 meas':>12}{'sim':>8}{'ratio':>7}"
          f"{'layer ms meas':>15}{'sim':>7}")
    for b, t in zip(args.pairs[::2], args.pairs[1::2]):
        c = compare(b, t, prof, args.policy)
        cells = []
        for kind in ("gemm0", "gemm1"):
            m, s = c[kind]["measured_us"], c[kind]["simulated_us"]
            cells.append(f"{m or float('nan'):>12.2f}{s or float('nan'):>8.2f}{(s / m if m and s else float('nan')):>7.2f}")
        lm = c["layer_ms"]
        print(f"{c['model']:<18}{c['H']:>6}{c['I']:>6}{cells[0]}{cells[1]}{lm['measured'] or float('nan'):>15.3f}"
              f"{lm['simulated']:>7.3f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""How a GEMM tile's time depends on its K: the calibration GEMM (the megakernel's 128 x 256 tile with its
store epilogue, csrc/calib.cuh) at several K, rows per expert and CTA counts, timed as the calibration times it
(`Bench.gemm_by_k`: one warm-up, median of 5, outputs checked against torch).

    python tests/kernel/tile_k_probe.py [--k 512,768,...] [--rows 2048,256] [--ctas 132,16] [--out tile_k.json]
    weave-sim calibrate --fit BENCH.json --gemm-k tile_k.json ...      # the engine's gemm.k_fixed from it

Per (rows, CTAs) it fits t_tile = a + b * K over the K values (t_tile = call time x CTAs / tiles): a is the
tile's fixed cost (claim, pipeline fill, epilogue), b its time per unit of K. `python -m weave_kernel.calibrate`
measures the same at 16 CTAs only (gemm_by_k); this probe adds other CTA counts and K values. One GPU.
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import time

import numpy as np
import torch

from weave_kernel.calib_runs import Bench
from weave_kernel.calibrate import FULL, GEMM_K
from weave_sim.calibrate import gemm_k_fixed


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--k", default="512,768,1024,1536,2048,3072,4096,5120,7168")
    ap.add_argument("--rows", default="2048,256")
    ap.add_argument("--ctas", default="132,16")
    ap.add_argument("--tiles", type=int, default=1056, help="output tiles per call (about)")
    ap.add_argument("--out", default="tile_k.json")
    args = ap.parse_args()
    ks = tuple(int(v) for v in args.k.split(","))
    if any(k < 64 or k % 64 for k in ks) or len(set(ks)) < 3:
        raise SystemExit("--k: at least three different K, each a positive multiple of 64 (a line is fitted)")
    bench = Bench.start()
    points = []
    for n in (int(v) for v in args.ctas.split(",")):
        plan = dataclasses.replace(FULL, k_values=ks, k_rows=tuple(int(v) for v in args.rows.split(",")), k_ctas=n,
                                   k_tiles=args.tiles)
        points += bench.gemm_by_k(plan)
    fits = []
    for rows in sorted({p["rows_per_expert"] for p in points}, reverse=True):
        for ctas in sorted({p["ctas"] for p in points}, reverse=True):
            sel = [p for p in points if p["rows_per_expert"] == rows and p["ctas"] == ctas]
            kk = np.array([p["k"] for p in sel], float)
            tt = np.array([p["tile_us"] for p in sel])
            slope, icpt = np.polyfit(kk, tt, 1)
            fits.append({"rows_per_expert": rows, "ctas": ctas, "fixed_us": icpt, "us_per_k": slope,
                         "rate_tflops_per_sm": 2 * 128 * 256 / slope / 1e6,
                         "max_resid_us": float(np.abs(tt - (icpt + slope * kk)).max()),
                         "fixed_share_at_k2048": icpt / (icpt + slope * 2048)})
    print(f"\n{'rows':>5} {'CTAs':>5} {'fixed us':>9} {'us per 1k K':>12} {'mainloop TF/s/SM':>17} "
          f"{'fixed share @K2048':>19} {'max resid us':>13}")
    for f in fits:
        print(f"{f['rows_per_expert']:>5} {f['ctas']:>5} {f['fixed_us']:>9.2f} {f['us_per_k'] * 1e3:>12.2f} "
              f"{f['rate_tflops_per_sm']:>17.2f} {f['fixed_share_at_k2048']:>19.1%} {f['max_resid_us']:>13.2f}")
    # gemm_by_k + gemm_k (the calibration curve's K): what `weave-sim calibrate --gemm-k FILE` reads
    out = {"gpu_name": torch.cuda.get_device_name(bench.dev), "date": time.strftime("%Y-%m-%d"),
           "failed_checks": bench.failed_checks, "gemm_k": GEMM_K, "gemm_by_k": points, "fits": fits}
    kf = gemm_k_fixed(out)
    print(f"gemm.k_fixed: share {kf['share']:.3f} at K {kf['k']} ({kf['ctas']} CTAs)")
    with open(args.out, "w") as fh:
        json.dump(out, fh, indent=1)
    print("failed checks:", bench.failed_checks or "none")
    return 1 if bench.failed_checks else 0


if __name__ == "__main__":
    raise SystemExit(main())

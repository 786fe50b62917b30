"""How a GEMM tile's time depends on its K: the calibration GEMM (the megakernel's 128 x 256 tile with its
store epilogue, csrc/calib.cuh) at several K, rows per expert and CTA counts, burst-timed as the calibration
times it (one warm-up, median of 5, after a pause), with the SM clock meanwhile.

    python tests/kernel/tile_k_probe.py [--k 512,768,...] [--rows 2048,256] [--ctas 132,16] [--out tile_k.json]
    weave-sim calibrate --fit BENCH.json --gemm-k tile_k.json ...      # the engine's gemm.k_fixed from it

Per (rows, CTAs) it fits t_tile = a + b * K over the K values (t_tile = call time x CTAs / tiles): a is the
tile's fixed cost (claim, pipeline fill, epilogue), b its time per unit of K. The calibration's GEMM curve is
taken at K = 2048 only; weave_sim charges a tile FLOPs / rate, i.e. a = 0. One GPU; needs the extension.
"""
from __future__ import annotations

import argparse
import json
import statistics
import time

import numpy as np
import torch

from weave_kernel.calib_runs import Bench
from weave_kernel.calibrate import BLOCK_ROWS, GEMM_K, GEMM_N, TILE_N, experts_for
from weave_kernel.gpu_state import GpuStateSampler
from weave_kernel.symm import cuda_time_ms


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--k", default="512,768,1024,1536,2048,3072,4096,5120,7168")
    ap.add_argument("--rows", default="2048,256")
    ap.add_argument("--ctas", default="132,16")
    ap.add_argument("--tiles", type=int, default=1056, help="output tiles per call (about)")
    ap.add_argument("--pause-s", type=float, default=0.5)
    ap.add_argument("--out", default="tile_k.json")
    args = ap.parse_args()
    ks = [int(v) for v in args.k.split(",")]
    if any(k < 64 or k % 64 for k in ks):
        raise SystemExit("--k: every K must be a positive multiple of 64")
    bench = Bench.start()
    dev = bench.dev
    sampler = GpuStateSampler.for_device(dev, period_ms=20)
    points = []
    for rows in (int(v) for v in args.rows.split(",")):
        e = experts_for(rows, args.tiles)
        tiles = e * -(-rows // BLOCK_ROWS) * (GEMM_N // TILE_N)
        for k in ks:
            b = torch.randn(e, GEMM_N, k, device=dev, dtype=torch.bfloat16) * k ** -0.5
            a = torch.randn(e * rows, k, device=dev, dtype=torch.bfloat16)
            c = torch.empty(e * rows, GEMM_N, device=dev, dtype=torch.bfloat16)
            tickets = torch.zeros(8, dtype=torch.int32, device=dev)
            grid_bar = torch.zeros(2, dtype=torch.int32, device=dev)
            for n in (int(v) for v in args.ctas.split(",")):
                ctas = min(n, bench.num_sms)
                params = {**bench.sync_params(), "a": a.data_ptr(), "b": b.data_ptr(), "c": c.data_ptr(),
                          "tickets": tickets.data_ptr(), "grid_bar": grid_bar.data_ptr(), "num_experts": e,
                          "rows_per_expert": rows, "n": GEMM_N, "k": k, "num_chunks": 1}
                fn = lambda: bench.ext.calib_gemm(params, ctas, bench.stream)  # noqa: E731
                what = f"gemm K={k} {e}x{rows} rows {ctas} CTAs"
                fn()
                bench.check(what)
                time.sleep(args.pause_s)
                t0 = time.time()
                ms = cuda_time_ms(fn, 1, 5)
                st = sampler.summary(t0, time.time()) or {}
                bench.check(what)
                c.fill_(float("nan"))  # poisoned: the check below sees this call's outputs only
                fn()
                bench.check(what)
                bench.verify_gemm(a, b, c, e, rows, what)
                points.append({"k": k, "rows_per_expert": rows, "experts": e, "ctas": ctas, "tiles": tiles,
                               "ms": ms, "tile_us": ms * 1e3 * ctas / tiles,
                               "tflops": 2.0 * e * rows * GEMM_N * k / ms / 1e9, "sm_mhz": st.get("sm_mhz_median")})
                print(f"K {k:>5}  {e:>3} x {rows:>4} rows  {ctas:>3} CTAs  {ms:8.3f} ms  tile "
                      f"{points[-1]['tile_us']:7.2f} us  {points[-1]['tflops']:6.0f} TF/s  "
                      f"{points[-1]['sm_mhz'] or float('nan'):6.0f} MHz", flush=True)
            del a, b, c
    sampler.stop()
    fits = []
    for rows in sorted({p["rows_per_expert"] for p in points}, reverse=True):
        for ctas in sorted({p["ctas"] for p in points}, reverse=True):
            sel = [p for p in points if p["rows_per_expert"] == rows and p["ctas"] == ctas]
            if len(sel) < 2:
                continue
            kk = np.array([p["k"] for p in sel], float)
            tt = np.array([p["tile_us"] for p in sel])
            slope, icpt = np.polyfit(kk, tt, 1)
            resid = tt - (icpt + slope * kk)
            fits.append({"rows_per_expert": rows, "ctas": ctas, "fixed_us": icpt, "us_per_k": slope,
                         "rate_tflops_per_sm": 2 * 128 * 256 / slope / 1e6, "max_resid_us": float(np.abs(resid).max()),
                         "fixed_share_at_k2048": icpt / (icpt + slope * 2048)})
    print(f"\n{'rows':>5} {'CTAs':>5} {'fixed us':>9} {'us per 1k K':>12} {'mainloop TF/s/SM':>17} "
          f"{'fixed share @K2048':>19} {'max resid us':>13}")
    for f in fits:
        print(f"{f['rows_per_expert']:>5} {f['ctas']:>5} {f['fixed_us']:>9.2f} {f['us_per_k'] * 1e3:>12.2f} "
              f"{f['rate_tflops_per_sm']:>17.2f} {f['fixed_share_at_k2048']:>19.1%} {f['max_resid_us']:>13.2f}")
    with open(args.out, "w") as fh:
        # gemm_by_k + gemm_k (the calibration curve's K): what `weave-sim calibrate --gemm-k FILE` reads
        json.dump({"gpu_name": torch.cuda.get_device_name(dev), "date": time.strftime("%Y-%m-%d"),
                   "failed_checks": bench.failed_checks, "gemm_k": GEMM_K, "gemm_by_k": points, "fits": fits},
                  fh, indent=1)
    print("failed checks:", bench.failed_checks or "none")
    return 1 if bench.failed_checks else 0


if __name__ == "__main__":
    raise SystemExit(main())

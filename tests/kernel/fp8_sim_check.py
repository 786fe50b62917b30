"""The simulator's FP8 model against the FP8 layers measured at EP=1 (CPU).

Reads the table fp8_worker.py --bench prints (bf16, FP8, bf16 again per model, tokens and policy) and runs
weave_kernel.predict at EP=1 on the same models and token counts, bf16 and with FP8 tiles S x the profile's per-SM
rate (whatif's fp8:S) for each S given; prints, per S, the median and worst |predicted - measured| / measured of the
FP8 layers and the predicted against the measured geomean gain t(bf16) / t(FP8) (measured bf16: the mean of its
two timings). Usage: python tests/kernel/fp8_sim_check.py FP8_WORKER_LOG [--profile P] [--scales 1.15,1.2,1.25,1.3]

Superseded for fitting: fp8_worker's FP8 timings run at the clock its bf16 calls left, which understates FP8's gain.
Fit a profile's factor with `weave-sim calibrate --amend P --fp8 BF16.json:FP8.json` on bench files, each format
timed in its own process (docs/calibration.md, "FP8 tiles, from bf16 / FP8 benchmark pairs").
"""
from __future__ import annotations

import argparse
import re
import statistics

from concurrent.futures import ProcessPoolExecutor

from weave_kernel.predict import predict_config


def measured(path: str) -> dict:
    rows = {}
    for line in open(path):
        r = line.split()
        if len(r) >= 9 and re.match(r"^[a-z0-9.\-]+$", r[0]) and r[1].isdigit() and r[2] in ("static:8", "weave"):
            rows[(r[0], int(r[1]), r[2])] = ((float(r[3]) + float(r[4])) / 2, float(r[5]))
    return rows


def predicted(models, tokens, profile: str, fp8: float) -> dict:
    """EP=1, the benchmark's default routing draw (seed 0), as `python -m weave_kernel.predict --gpus 1`."""
    jobs = [(m, n) for m in models for n in tokens]
    with ProcessPoolExecutor(max_workers=2) as pool:
        rows = list(pool.map(_one, [(m, n, profile, fp8) for m, n in jobs]))
    return {(r["model"], r["tokens_per_gpu"]): r["predicted_ms"] for r in rows}


def _one(job):
    m, n, profile, fp8 = job
    return predict_config(m, 1, n, profile, fp8=fp8)


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("log")
    ap.add_argument("--profile", default="h200-megakernel-ep1")
    ap.add_argument("--scales", default="1.15,1.2,1.25,1.3,1.45")
    a = ap.parse_args()
    meas = measured(a.log)
    models = sorted({m for m, _, _ in meas})
    tokens = sorted({n for _, n, _ in meas})
    pb = predicted(models, tokens, a.profile, 0.0)
    errs = [abs(pb[(m, n)][p] - t16) / t16 for (m, n, p), (t16, _) in meas.items()]
    print(f"bf16 layers, {a.profile}: median |err| {100 * statistics.median(errs):.1f}%, worst {100 * max(errs):.1f}%")
    for s in (float(v) for v in a.scales.split(",")):
        pf = predicted(models, tokens, a.profile, s)
        out = []
        for pol in ("static:8", "weave"):
            sel = [(k, v) for k, v in meas.items() if k[2] == pol]
            e = [(pf[(m, n)][pol] - t8) / t8 for (m, n, _), (_, t8) in sel]
            gp = statistics.geometric_mean([pb[(m, n)][pol] / pf[(m, n)][pol] for (m, n, _), _ in sel])
            gm = statistics.geometric_mean([t16 / t8 for _, (t16, t8) in sel])
            out.append(f"{pol}: median |err| {100 * statistics.median(map(abs, e)):.1f}%, worst "
                       f"{100 * max(map(abs, e)):.1f}%, gain predicted {gp:.3f} / measured {gm:.3f}")
        print(f"fp8:{s:<5} " + " | ".join(out))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

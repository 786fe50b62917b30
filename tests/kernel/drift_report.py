"""Report of tests/kernel/drift_run.sh: the GPU's clocks over the sweep, and the same sweep timed in two orders.

    python tests/kernel/drift_report.py NVSMI.csv POLICY_ORDER.json INTERLEAVED.json

Prints (1) per 20 s of the nvidia-smi log (`--format=csv,nounits`, header included): median and lowest SM clock,
highest power and temperature, the clock-event reasons seen; (2) per configuration, the SM clock each run
recorded (`gpu_state`), t(interleaved) / t(policy order) per policy (geomean and range), and the largest bump of
the weave:C sweep in each run (t(C) over the slower of its two neighbours: an isolated slow point, as
deepseek-v3 2048 weave:8 was in the 2x H200 runs, shows as a bump well above 1).
"""
from __future__ import annotations

import csv
import json
import sys
from datetime import datetime

import numpy as np

from weave_kernel.gpu_state import decode_reasons


def read_nvsmi(path: str) -> list[dict]:
    rows = []
    with open(path) as f:
        for r in csv.reader(f):
            if not r or r[0].startswith("timestamp"):
                continue
            try:
                t = datetime.strptime(r[0].strip(), "%Y/%m/%d %H:%M:%S.%f").timestamp()
                rows.append({"t": t, "gpu": int(r[1]), "sm": float(r[2]), "power": float(r[4]),
                             "temp": float(r[6]), "reasons": int(r[7], 16)})
            except (ValueError, IndexError):
                continue
    return rows


def clock_bins(rows: list[dict], width_s: float = 20.0) -> list[str]:
    if not rows:
        return ["no nvidia-smi samples"]
    t0 = rows[0]["t"]
    out = [f"{'t s':>6} {'gpu':>3} {'SM MHz med':>10} {'min':>6} {'W max':>6} {'C max':>5}  reasons"]
    keys = sorted({(int((r["t"] - t0) // width_s), r["gpu"]) for r in rows})
    for b, g in keys:
        sel = [r for r in rows if int((r["t"] - t0) // width_s) == b and r["gpu"] == g]
        mask = 0
        for r in sel:
            mask |= r["reasons"]
        out.append(f"{b * width_s:>6.0f} {g:>3} {np.median([r['sm'] for r in sel]):>10.0f} "
                   f"{min(r['sm'] for r in sel):>6.0f} {max(r['power'] for r in sel):>6.0f} "
                   f"{max(r['temp'] for r in sel):>5.0f}  {','.join(decode_reasons(mask & ~1)) or '-'}")
    return out


def sweep_bump(lat: dict) -> tuple[float, str]:
    cs = sorted(int(p.split(":")[1]) for p in lat if p.startswith("weave:"))
    best = (1.0, "-")
    for a, c, b in zip(cs, cs[1:], cs[2:]):
        bump = lat[f"weave:{c}"] / max(lat[f"weave:{a}"], lat[f"weave:{b}"])
        if bump > best[0]:
            best = (bump, f"weave:{c}")
    return best


def compare(pol_path: str, int_path: str) -> list[str]:
    a = {(r["model"], r["tokens_per_gpu"]): r for r in json.load(open(pol_path))["results"]}
    b = {(r["model"], r["tokens_per_gpu"]): r for r in json.load(open(int_path))["results"]}
    out = [f"{'model':<18}{'tok':>6} {'MHz pol':>8} {'MHz int':>8} {'int/pol geo':>11} {'range':>13} "
           f"{'bump pol':>15} {'bump int':>15}"]
    allr = []
    for key in a:
        if key not in b:
            continue
        la, lb = a[key]["latency_ms"], b[key]["latency_ms"]
        ratios = [lb[p] / la[p] for p in la if p in lb]
        allr += ratios
        mhz = lambda r: ",".join(f"{g['sm_mhz_median']:.0f}" if g else "?" for g in r.get("gpu_state") or [None])  # noqa: E731
        ba, bb = sweep_bump(la), sweep_bump(lb)
        out.append(f"{key[0]:<18}{key[1]:>6} {mhz(a[key]):>8} {mhz(b[key]):>8} "
                   f"{np.exp(np.mean(np.log(ratios))):>11.3f} {min(ratios):>6.3f}-{max(ratios):.3f} "
                   f"{ba[0]:>7.3f} {ba[1]:>7} {bb[0]:>7.3f} {bb[1]:>7}")
    if allr:
        out.append(f"all points: t(interleaved) / t(policy order) geomean {np.exp(np.mean(np.log(allr))):.3f}, "
                   f"range {min(allr):.3f}-{max(allr):.3f} over {len(allr)} points")
    return out


def main(argv: list[str]) -> int:
    if len(argv) != 3:
        print(__doc__)
        return 2
    print("\n".join(clock_bins(read_nvsmi(argv[0]))))
    print("\n".join(compare(argv[1], argv[2])))
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))

"""The FP8 harness question as one table (tests/kernel/fp8_harness_run.sh): per model, tokens and policy, the layer's
time and the median SM clock while it was timed, in fp8_worker.py --bench (bf16 / FP8 / bf16 back to back, each the
median of a few calls), in bench (calls interleaved with the reference) and in bench --sustained (each policy back to
back for about a second after 0.5 s idle). ms x MHz is the time in (mega)cycles: where two harnesses differ in time
but agree in it, the clock explains the difference.

    python tests/kernel/harness_table.py fp8_worker.log bench_fp8.json bench_bf16.json
"""
from __future__ import annotations

import json
import re
import statistics
import sys

LINE = re.compile(r"^BENCH (\S+) n=(\d+) (\S+): bf16 ([\d.]+) / ([\d.]+) ms, fp8 ([\d.]+) ms.*?"
                  r"(?:SM MHz (\d+) / (\d+) / (\d+))?$")


def worker_rows(path: str) -> dict:
    """{(model, tokens, policy, dtype): (ms, MHz or None)} from fp8_worker's BENCH lines (bf16: the first timing)."""
    out = {}
    for line in open(path):
        m = LINE.match(line.strip())
        if m:
            key = (m[1], int(m[2]), m[3])
            out[key + ("bf16",)] = (float(m[4]), float(m[7]) if m[7] else None)
            out[key + ("fp8",)] = (float(m[6]), float(m[8]) if m[8] else None)
    return out


def _mhz(states) -> float | None:
    """Median SM clock over a gpu_state list (one summary per rank, None where nvidia-smi did not answer)."""
    vals = [s["sm_mhz_median"] for s in states or [] if s]
    return statistics.median(vals) if vals else None


def bench_rows(path: str) -> dict:
    """{(model, tokens, policy, dtype, 'bench' | 'sustained'): (ms, MHz or None)} from a bench JSON. The bench
    clock is the configuration's window (every policy and the reference); the sustained one the policy's passes."""
    data = json.load(open(path))
    out = {}
    for r in data.get("results", []):
        dt = r.get("expert_dtype", "bf16")
        key = (r["model"], int(r["tokens_per_gpu"]))
        for pol, ms in (r.get("latency_ms") or {}).items():
            out[key + (pol, dt, "bench")] = (ms, _mhz(r.get("gpu_state")))
        for pol, ms in (r.get("sustained_ms") or {}).items():
            passes = (r.get("sustained_gpu_state") or {}).get(pol) or []
            mhz = [m for m in (_mhz(p) for p in passes) if m is not None]
            out[key + (pol, dt, "sustained")] = (ms, statistics.mean(mhz) if mhz else None)
    return out


def main(argv=None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) < 2:
        print(__doc__.strip().splitlines()[-1].strip(), file=sys.stderr)
        return 2
    worker = worker_rows(args[0])
    bench = {}
    for p in args[1:]:
        bench.update(bench_rows(p))
    fmt = lambda v: ("-" if v is None else f"{v[0]:.3f} @{v[1]:.0f}" if v[1] else f"{v[0]:.3f}")  # noqa: E731
    print(f"{'model':16s} {'tok':>5s} {'policy':8s} {'dtype':5s} {'fp8_worker':>14s} {'bench':>14s} {'sustained':>14s}"
          f" {'bench/worker':>12s} {'cycles b/w':>10s} {'sust/worker':>11s}")
    ratios = {}
    for key in sorted(worker):
        m, n, pol, dt = key
        w = worker[key]
        b, s = bench.get((m, n, pol, dt, "bench")), bench.get((m, n, pol, dt, "sustained"))
        rb = b[0] / w[0] if b else None
        cyc = b[0] * b[1] / (w[0] * w[1]) if b and b[1] and w[1] else None
        rs = s[0] / w[0] if s else None
        for name, v in (("bench", rb), ("cycles", cyc), ("sustained", rs)):
            if v is not None:
                ratios.setdefault((dt, name), []).append(v)
        cell = lambda v: "-" if v is None else f"{v:.3f}"  # noqa: E731
        print(f"{m[:16]:16s} {n:5d} {pol:8s} {dt:5s} {fmt(w):>14s} {fmt(b):>14s} {fmt(s):>14s} {cell(rb):>12s} "
              f"{cell(cyc):>10s} {cell(rs):>11s}")
    for (dt, name), v in sorted(ratios.items()):
        print(f"geomean {dt} {name} / fp8_worker: {statistics.geometric_mean(v):.3f} over {len(v)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

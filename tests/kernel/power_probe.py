"""Short against sustained GEMM rates on one GPU, with the SM clock and power nvidia-smi reports meanwhile.

    python tests/kernel/power_probe.py [--out power.json]

For cuBLAS (torch bf16 8192^3) and for the calibration GEMM (csrc/calib.cuh, the megakernel's tile pipeline;
2048 rows per expert) at several CTA counts: after 1.5 s idle, a short measurement as the calibration takes it
(one warm-up, median of 5 calls), then 3 s of back-to-back calls, of which the last 1.5 s are timed (CUDA
events over the window). Per row: TFLOP/s short and sustained, the SM clock and power in each window, and the
rate per SM per GHz: if that is the same at every CTA count, the lower per-SM rate at more CTAs is the clock
(the 700 W power cap), not operand bandwidth. One process, one GPU; needs the extension (builds it).
"""
from __future__ import annotations

import argparse
import json
import time

import torch

from weave_kernel.calib_runs import Bench
from weave_kernel.calibrate import GEMM_K, GEMM_N, experts_for, useful_tflops
from weave_kernel.gpu_state import GpuStateSampler, sustained_ms
from weave_kernel.symm import cuda_time_ms


def measure(fn, flop: float, sampler: GpuStateSampler, sustain_s: float = 3.0) -> dict:
    time.sleep(1.5)
    t0 = time.time()
    short_ms = cuda_time_ms(fn, 1, 5)
    short = sampler.summary(t0, time.time())
    sus_ms, ta, tb = sustained_ms(fn, sustain_s)
    return {"short_tflops": flop / short_ms / 1e9, "sustained_tflops": flop / sus_ms / 1e9,
            "short_state": short, "sustained_state": sampler.summary(ta, tb)}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", default="power_probe.json")
    ap.add_argument("--ctas", default="16,33,66,99,132")
    ap.add_argument("--rows", default="2048", help="rows per expert of the calibration GEMM (comma-separated); "
                    "rows other than the first run at all SMs only")
    ap.add_argument("--hbm", action="store_true", help="also a sustained 1 GiB device-to-device copy")
    args = ap.parse_args()
    bench = Bench.start()
    dev = bench.dev
    sampler = GpuStateSampler.for_device(dev, period_ms=50)
    rows_out = []

    x = torch.randn(8192, 8192, device=dev, dtype=torch.bfloat16)
    y = torch.randn(8192, 8192, device=dev, dtype=torch.bfloat16)
    r = measure(lambda: torch.mm(x, y), 2.0 * 8192 ** 3, sampler)
    rows_out.append({"case": "cublas 8192^3", "ctas": bench.num_sms, **r})
    del x, y

    if args.hbm:
        src = torch.empty(1 << 30, dtype=torch.uint8, device=dev)
        dst = torch.empty_like(src)
        r = measure(lambda: dst.copy_(src), 2.0 * (1 << 30), sampler)  # "TFLOP/s" columns: TB/s moved
        rows_out.append({"case": "hbm copy 1 GiB (TB/s)", "ctas": bench.num_sms, **r})
        del src, dst
    for i, rows in enumerate(int(v) for v in args.rows.split(",")):
        e = experts_for(rows, 2048)
        b = torch.randn(e, GEMM_N, GEMM_K, device=dev, dtype=torch.bfloat16) * GEMM_K ** -0.5
        a = torch.randn(e * rows, GEMM_K, device=dev, dtype=torch.bfloat16)
        c = torch.empty(e * rows, GEMM_N, device=dev, dtype=torch.bfloat16)
        tickets = torch.zeros(8, dtype=torch.int32, device=dev)
        grid_bar = torch.zeros(2, dtype=torch.int32, device=dev)
        flop = useful_tflops(e, rows, 1.0) * 1e9  # FLOP of one call (TFLOP/s at 1 ms x 1e9)
        for n in [int(v) for v in args.ctas.split(",")] if i == 0 else [bench.num_sms]:
            fn = bench.gemm_call(a, b, c, tickets, grid_bar, e, rows, min(n, bench.num_sms), 1)
            fn()
            bench.check(f"gemm {n} CTAs")
            r = measure(fn, flop, sampler)
            bench.check(f"gemm {n} CTAs")
            rows_out.append({"case": f"calib gemm {e}x{rows} rows", "ctas": min(n, bench.num_sms), **r})
        bench.verify_gemm(a, b, c, e, rows, "power probe gemm")
        del a, b, c
    sampler.stop()

    def mhz(s):
        return s["sm_mhz_median"] if s else float("nan")

    print(f"{'case':<26}{'CTAs':>5}{'short TF/s':>11}{'MHz':>6}{'W':>5}{'sust TF/s':>10}{'MHz':>6}{'W':>5}"
          f"{'GF/s/SM/GHz short':>19}{'sust':>7}  reasons (sustained)")
    for r in rows_out:
        s, u = r["short_state"], r["sustained_state"]
        per = lambda tf, st: tf * 1e3 / r["ctas"] / (mhz(st) / 1e3)  # noqa: E731
        print(f"{r['case']:<26}{r['ctas']:>5}{r['short_tflops']:>11.0f}{mhz(s):>6.0f}"
              f"{(s or {}).get('power_w_max', float('nan')):>5.0f}{r['sustained_tflops']:>10.0f}{mhz(u):>6.0f}"
              f"{(u or {}).get('power_w_max', float('nan')):>5.0f}{per(r['short_tflops'], s):>19.1f}"
              f"{per(r['sustained_tflops'], u):>7.1f}  {','.join((u or {}).get('event_reasons', [])) or '-'}")
    with open(args.out, "w") as f:
        json.dump({"gpu": torch.cuda.get_device_name(dev), "date": time.strftime("%Y-%m-%d"),
                   "failed_checks": bench.failed_checks, "rows": rows_out}, f, indent=1)
    print("failed checks:", bench.failed_checks or "none")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

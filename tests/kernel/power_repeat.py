"""How well board-power readings repeat: a sustained 1 GiB device copy and the calibration GEMM on all SMs,
alternated, each after 1.5 s idle, with the SM clock, the power (max and median of the 50 ms samples) and the
temperature of each window. One GPU:

    python tests/kernel/power_repeat.py [--rounds 3] [--out power_repeat.json]
"""
from __future__ import annotations

import argparse
import json
import time

import torch

from weave_kernel.calib_runs import Bench
from weave_kernel.calibrate import GEMM_K, GEMM_N, experts_for, useful_tflops
from weave_kernel.gpu_state import GpuStateSampler, sustained_ms


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--seconds", type=float, default=3.0)
    ap.add_argument("--out", default="power_repeat.json")
    args = ap.parse_args()
    bench = Bench.start()
    dev = bench.dev
    sampler = GpuStateSampler.for_device(dev, period_ms=50)
    src = torch.empty(1 << 30, dtype=torch.uint8, device=dev)
    dst = torch.empty_like(src)
    rows = 2048
    e = experts_for(rows, 2048)
    b = torch.randn(e, GEMM_N, GEMM_K, device=dev, dtype=torch.bfloat16) * GEMM_K ** -0.5
    a = torch.randn(e * rows, GEMM_K, device=dev, dtype=torch.bfloat16)
    c = torch.empty(e * rows, GEMM_N, device=dev, dtype=torch.bfloat16)
    gemm = bench.gemm_call(a, b, c, torch.zeros(8, dtype=torch.int32, device=dev),
                           torch.zeros(2, dtype=torch.int32, device=dev), e, rows, bench.num_sms, 1)
    gemm()
    bench.check("gemm")
    out = []
    for i in range(args.rounds):
        for name, fn, unit in (("copy", lambda: dst.copy_(src), 2.0 * src.numel() / 1e9),
                               ("gemm", gemm, useful_tflops(e, rows, 1.0))):
            ms, t0, t1 = sustained_ms(fn, args.seconds)
            st = sampler.summary(t0, t1) or {}
            row = {"round": i, "what": name, "rate": unit / ms, "rate_unit": "TB/s" if name == "copy" else "TFLOP/s",
                   **{k: st.get(k) for k in ("sm_mhz_median", "power_w_max", "power_w_median", "temp_c_max",
                                               "event_reasons", "samples", "gpu")}}
            out.append(row)
            print(f"round {i} {name}: {row['rate']:.2f} {row['rate_unit']}, {row['sm_mhz_median']} MHz, power max "
                  f"{row['power_w_max']} W median {row['power_w_median']} W, {row['temp_c_max']} C", flush=True)
    bench.check("gemm")
    sampler.stop()
    with open(args.out, "w") as f:
        json.dump({"gpu": torch.cuda.get_device_name(dev), "date": time.strftime("%Y-%m-%d"), "rows": out}, f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

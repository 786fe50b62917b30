"""Would an FP8-aware cost table change weave's FP8 layers? (CPU; the simulator)

The kernel's FP8 layers choose their split from the bf16 cost table: bf16 tile rates and bf16 bytes per row
(weave_sim.profile.table_profile; docs/kernel.md, "FP8 experts in the layer"). Here each FP8 layer is simulated
twice under the engine's model of the kernel (kernel:weave, FP8 tiles and e4m3 bytes): with that choice, and with
the choice an FP8-aware table would make (the FP8 profile's rates and the e4m3 dispatch bytes,
costmodel.bound_volumes(..., "fp8")), given as kernel:weave@c0,c1,... Prints per model and token count the ratio
t(bf16 table) / t(FP8 table) over a few layers of realistic routing (--synthetic fitted), above 1 where the FP8 table
would be faster, and the comm CTAs each table picks on the first two layers.

    python tests/kernel/fp8_table_check.py [--models M,...] [--tokens 2048,4096,8192] [--gpus 2]
        [--profile h200-megakernel-ep2] [--layers 4]
"""
from __future__ import annotations

import argparse
import statistics
import sys

import numpy as np

from weave_sim import costmodel as cm
from weave_sim.config import RunConfig, resolve
from weave_sim.engine import simulate_layer
from weave_sim.placement import placement_for
from weave_sim.presets import WEAVE_EVAL_MODELS
from weave_sim.profile import fp8_profile, load_profile
from weave_sim.workload import layer_workload


def main(argv=None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--models", default=",".join(WEAVE_EVAL_MODELS))
    ap.add_argument("--tokens", default="2048,4096,8192")
    ap.add_argument("--gpus", type=int, default=2)
    ap.add_argument("--profile", default="h200-megakernel-ep2")
    ap.add_argument("--layers", type=int, default=4, help="MoE layers per model, spread over its depth")
    args = ap.parse_args(argv)
    ratios = []
    for m in args.models.split(","):
        for t in (int(x) for x in args.tokens.split(",")):
            res = resolve(RunConfig(model=m, num_gpus=args.gpus, tokens_per_gpu=t, trace=None, synthetic="fitted",
                                    profile=args.profile))
            p8 = fp8_profile(res.profile)
            n = res.routing.shape[1]
            t_bf, t_f8, c_bf, c_f8 = [], [], [], []
            for li in np.linspace(0, n - 1, min(n, args.layers)).astype(int):
                w = layer_workload(res.routing[:, li, :], res.model, placement_for(res.placement, li))
                as_built = simulate_layer(w, p8, "kernel:weave", expert_dtype="fp8")
                vol = cm.bound_volumes([w], p8, expert_dtype="fp8")
                c = tuple(int(x) for x in cm.choose(vol, p8).num_comm_sms[0])
                aware = simulate_layer(w, p8, "kernel:weave@" + ",".join(map(str, c)), expert_dtype="fp8")
                t_bf.append(as_built.latency_ns)
                t_f8.append(aware.latency_ns)
                c_bf.append(tuple(as_built.plan.num_comm_sms))
                c_f8.append(c)
            r = sum(t_bf) / sum(t_f8)
            ratios.append(r)
            print(f"{m:18s} {t:5d}  t(bf16 table) / t(FP8 table) {r:.4f}  comm CTAs: bf16 table {c_bf[:2]}, "
                  f"FP8 table {c_f8[:2]}", flush=True)
    scale = fp8_profile(load_profile(args.profile)).raw["gemm"]["fp8_applied"]["scale"]
    print(f"geomean {statistics.geometric_mean(ratios):.4f} over {len(ratios)} (profile {args.profile}, EP={args.gpus}, "
          f"FP8 tiles x{scale:g})")
    return 0


if __name__ == "__main__":
    sys.exit(main())

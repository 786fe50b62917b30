"""Each policy of a layer run sustained, with the SM clock and board power it settles at (one JSON in the
benchmark's result format, so `weave-sim validate` and the power model can replay it):

    torchrun --nproc_per_node=G tests/kernel/power_layers.py --models deepseek-v3,qwen3-30b-a3b --tokens 4096 \
        --policies sequential,static:8,static:20,weave --out power_layers.json

Per (model, policy): 1.5 s idle, then about --seconds of back-to-back calls (the same number on every rank),
the second half timed (CUDA events; weave_kernel.gpu_state.sustained_ms); latency_ms = the slowest rank's, gpu_state = each rank's clock and power
in that window. Routing: the benchmark's seeded Zipf routing (weave_kernel.routing.bench_routing).
"""
from __future__ import annotations

import argparse
import json
import time
from types import SimpleNamespace

import torch
import torch.distributed as dist

from weave_kernel.bench import make_layer
from weave_kernel.bench_timing import max_over_ranks
from weave_kernel.choice import counts_from_routing
from weave_kernel.gpu_state import GpuStateSampler, sustained_calls, sustained_ms
from weave_kernel.megakernel import DEFAULT_COST_PROFILE
from weave_kernel.reference import ep_moe_reference
from weave_kernel.routing import bench_routing
from weave_kernel.symm import init_ranks
from weave_sim.placement import contiguous
from weave_sim.presets import get_model
from weave_sim.validate import KERNEL_DECIDERS, KERNEL_LAYOUT


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--models", default="deepseek-v3,qwen3-30b-a3b")
    ap.add_argument("--tokens", type=int, default=4096)
    ap.add_argument("--policies", default="sequential,static:8,static:20,weave")
    ap.add_argument("--seconds", type=float, default=3.0)
    ap.add_argument("--out", default="power_layers.json")
    args = ap.parse_args()
    rank, world, dev = init_ranks()
    sampler = GpuStateSampler.for_device(dev, period_ms=50)
    lay_args = SimpleNamespace(seed=0, cost_profile=DEFAULT_COST_PROFILE, trace="", ab_csrc="")
    results = []
    for name in args.models.split(","):
        model = get_model(name)
        n = args.tokens
        layer, w13, w2 = make_layer(model, n, lay_args, world, dev)
        placement = contiguous(model.num_experts, world)
        ids, w = bench_routing(n, model.num_experts, model.top_k, seed=0, rank=rank, zipf_s=1.0)
        gathered = [None] * world
        dist.all_gather_object(gathered, ids)
        x = torch.randn(n, model.hidden_size, device=dev).to(torch.bfloat16)
        ids_d, w_d = torch.as_tensor(ids, device=dev), torch.as_tensor(w, device=dev)
        owner, local_idx = torch.as_tensor(placement.owner), torch.as_tensor(placement.local_index())
        y_ref = ep_moe_reference(x, ids_d, w_d, w13, w2, owner, local_idx)
        res = {"kernel_layout": KERNEL_LAYOUT, "kernel_deciders": KERNEL_DECIDERS, "model": model.name,
               "tokens_per_gpu": n, "gpus": world,
               "experts": model.num_experts, "local_experts": model.num_experts // world, "top_k": model.top_k,
               "hidden": model.hidden_size, "inter": model.expert_ffn_size, "latency_ms": {}, "gpu_state": {},
               "rel_err_vs_reference": {}, "timing": f"sustained {args.seconds} s, second half timed",
               "counts": counts_from_routing(gathered, model.num_experts, placement)}
        for pol in args.policies.split(","):
            y = layer(x, ids_d, w_d, w13, w2, policy=pol)  # checked call
            res["rel_err_vs_reference"][pol] = max_over_ranks(
                float((y.float() - y_ref.float()).norm() / y_ref.float().norm()))
            fn = lambda: layer(x, ids_d, w_d, w13, w2, policy=pol, check=False)  # noqa: E731
            calls = sustained_calls(fn, args.seconds, agree=lambda n: int(max_over_ranks(n)))  # same on every rank
            dist.barrier()
            ms, t0, t1 = sustained_ms(fn, args.seconds, calls=calls)
            layer.raise_if_error()
            res["latency_ms"][pol] = max_over_ranks(ms)
            state = [None] * world
            dist.all_gather_object(state, sampler.summary(t0, t1))
            res["gpu_state"][pol] = state
            if rank == 0:
                print(f"{name} N={n} {pol}: {res['latency_ms'][pol]:.3f} ms, " + ", ".join(
                    f"GPU{g} {s['sm_mhz_median']:.0f} MHz {s['power_w_max']:.0f} W" if s else f"GPU{g} ?"
                    for g, s in enumerate(state)) + f", rel err {res['rel_err_vs_reference'][pol]:.1e}", flush=True)
        results.append(res)
        del layer, w13, w2
        torch.cuda.empty_cache()
    sampler.stop()
    if rank == 0:
        with open(args.out, "w") as f:
            json.dump({"header": f"power_layers, {world}x {torch.cuda.get_device_name(dev)}, {time.strftime('%Y-%m-%d')}",
                       "results": results}, f, indent=1)
    dist.barrier()
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

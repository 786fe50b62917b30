"""Benchmark: one MoE layer, reference vs megakernel policies. Run under torchrun, one process per GPU:

    torchrun --nproc_per_node=2 -m weave_kernel.bench --out bench.json

For each model x tokens per GPU it times (a) the PyTorch EP reference (NCCL all_to_all + grouped_mm),
(b) `sequential`, (c) `static:C` for a grid of C, (d) `weave` (the kernel's own (c*, K*) per call and rank)
and `weave:C` for a grid of C, and prints latency, speedup over (a), fraction of the weave_sim lower bound,
achieved NVLink GB/s and TFLOP/s (per GPU), then weave against the best static:C and static:20.
Per result it stores the exchanged `counts` (pair-based dispatch rows, see weave_kernel/choice.py), the
kernel's (c*, K*) per rank and weave_sim.costmodel.choose's for the same counts. Latency of a call = max over ranks of
the per-rank median (CUDA events) after warm-up; every repetition starts after a device sync and a barrier.
By default the repetitions of all the policies of a configuration (the reference included) are interleaved, a
round forward and the next backward (`--order alternating`; repetitions rounded up to even), so that drift of the
GPU during a configuration (clocks, temperature) reaches every policy alike and no policy always runs late in a
round (docs/kernel.md "weave:C slower than weave at EP=1"); `--order interleaved` keeps one fixed order in every
round, as runs from 2026-12-01 to 2026-12-03 did; `--order shuffled` draws a fresh order every round (from --seed,
the same on every rank), which turns the effect of the policy timed before (a 3-5% bias at the power cap) into noise;
`--order policy` times one policy after the other, as runs before 2026-12-01 did. `--ab-sustained S` adds the
steady state to an A/B (each version alone for about S seconds).
Per configuration and rank, `gpu_state` records the SM clock, power, temperature and clock-event reasons
nvidia-smi reported meanwhile (weave_kernel.gpu_state).
`--sustained S` also times every policy back to back for about S seconds (the same number of calls on every
rank), in order and then in reverse: `sustained_ms` (mean of the two passes) and `sustained_gpu_state`, what a
power-capped GPU holds under a stream of layers (docs/power.md).
Routing (weave_kernel.routing.RoutingSpec, recorded in the results' config as "routing"): by default a seeded
Zipf-skewed top-k per rank (`--zipf`, weave_kernel.routing.bench_routing); with `--synthetic KIND [-p key=value]`
(weave_sim's generators, e.g. `fitted`: the per-layer skew and token reuse of the shipped real trace) or
`--routing-trace FILE|default` (a recorded trace of the model, e.g. `--models gpt-oss-20b --routing-trace default`)
every configuration is timed on each MoE layer in `--layers` (default: four spread over the depth), one result per
layer ("layer"), so that per-layer decisions meet per-layer routing.
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import math
import os
import time

import numpy as np
import torch
import torch.distributed as dist

from weave_sim.placement import contiguous, expert_loads, make_placement
from weave_sim.presets import WEAVE_EVAL_MODELS, get_model
from weave_sim.validate import KERNEL_DECIDERS, kernel_layout_for  # the layouts and deciders of this kernel
from weave_sim.workload import EXPERT_DTYPES, expert_bytes

from .choice import choice_agrees, counts_from_routing, geometry_model, model_choice
from .megakernel import DEFAULT_COST_PROFILE, MoEMegakernel
from .reference import ep_moe_reference
from .routing import RoutingSpec, add_routing_args, parse_layers, rank_routing, spec_from_args
from .gpu_state import GpuStateSampler
from .symm import init_ranks
from .geometry import check_geometry
from .bench_report import (ab_summary, format_table, format_weave_table, geomean, graph_summary, ratio, run_header,
                           weave_geomeans)
from .bench_timing import (ab_times, graph_of, host_us_per_call, max_over_ranks, sustained_times, time_policies,
                           warm_gpu)

DEFAULT_TOKENS = (128, 2048, 4096, 8192)
DEFAULT_COMM = (8, 16, 20, 24, 32, 48)


def parse_args(argv=None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--models", default=",".join(WEAVE_EVAL_MODELS),
                    help="comma-separated models: preset names or specs such as custom:E=64:k=4:H=2048:I=1024 "
                         "(weave_sim.presets.get_model)")
    ap.add_argument("--tokens", default=",".join(map(str, DEFAULT_TOKENS)), help="tokens per GPU, comma-separated")
    ap.add_argument("--comm", default=",".join(map(str, DEFAULT_COMM)), help="C values for static:C")
    ap.add_argument("--weave-comm", default=None, help="C values for weave:C (default: --comm; '' = none)")
    ap.add_argument("--no-weave", action="store_true", help="time only the reference, sequential and static:C")
    ap.add_argument("--weave-nosteal", action="store_true",
                    help="also weave's split without bubble stealing (policy weave-nosteal; weave_vs_nosteal)")
    ap.add_argument("--no-sequential", action="store_true", help="skip the sequential policy")
    ap.add_argument("--max-local-experts", type=int, default=0, help="cap experts per GPU (0 = the model's)")
    ap.add_argument("--cost-profile", default=DEFAULT_COST_PROFILE,
                    help="weave_sim profile (name or JSON path) whose cost table the kernel's weave choice reads")
    add_routing_args(ap)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--repeats", type=int, default=7)
    ap.add_argument("--calls-per-rep", type=int, default=4,
                    help="back-to-back calls timed per repetition (amortises the ranks' launch skew)")
    ap.add_argument("--warm-gpu-s", type=float, default=2.0, help="seconds of matmuls before the first config")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", default="kernel_bench.json")
    ap.add_argument("--trace", default="", help="write a Chrome trace of the first config")
    ap.add_argument("--ab-csrc", default="",
                    help="also build the kernel sources in this folder and time them against the package's, "
                         "alternating calls in this process (A/B without drift between processes)")
    ap.add_argument("--ab-cost-profile", default="",
                    help="A/B of the in-kernel choice: B = the same kernel reading this cost profile (name or path), "
                         "timed against --cost-profile's as --ab-csrc does; static policies are the A-vs-A control")
    ap.add_argument("--dispatch", default="threads",
                    help="how comm CTAs copy their rows: threads (all threads, default), bulk or bulk:W (bulk copies "
                         "issued by W warps, csrc/bulk_copy.cuh)")
    ap.add_argument("--ab-sustained", type=float, default=0.0,
                    help="with an A/B (--ab-csrc, --ab-cost-profile, --ab-dispatch): also time A and B each alone for "
                         "about S seconds after 0.5 s idle, in the order A, B, B, A (the steady state of a power-capped "
                         "GPU, where a version that draws less power runs at a higher clock): a_over_b_sustained")
    ap.add_argument("--ab-dispatch", action="store_true",
                    help="A/B of the dispatch copies: B = the same kernel with the other --dispatch mode, timed "
                         "against A as --ab-csrc does")
    ap.add_argument("--placement", choices=("contiguous", "balanced"), default="contiguous",
                    help="expert -> rank map: contiguous (default), or balanced per configuration from that "
                         "configuration's routing over all ranks (weave_sim.placement.balanced; the layer's tables "
                         "are rewritten with MoEMegakernel.set_placement, the reference uses the same map)")
    ap.add_argument("--order", choices=("alternating", "shuffled", "interleaved", "policy"), default="alternating",
                    help="interleave the policies' repetitions forward and backward in turn (default: each "
                         "policy's place in a round evened out; repetitions rounded up to even), in a fresh random "
                         "order every round (drawn from --seed), in one fixed order, or time one policy after the "
                         "other")
    ap.add_argument("--sustained", type=float, default=0.0,
                    help="also time every policy back to back for about this many seconds after 0.5 s idle (the "
                         "clock a power-capped GPU holds under a stream of layers; docs/power.md): sustained_ms")
    ap.add_argument("--num-ctas", type=int, default=0,
                    help="the megakernel's grid (default 0: one CTA per SM); fewer CTAs draw less power (docs/power.md)")
    ap.add_argument("--no-gpu-state", action="store_true", help="do not sample clocks / power with nvidia-smi")
    ap.add_argument("--cuda-graph", choices=("off", "on", "ab"), default="off",
                    help="time the megakernel's policies as replays of a CUDA graph of one call ('on'; the reference "
                         "stays eager), or both ways in the same interleaved rounds ('ab': graph times in "
                         "graph_latency_ms, eager / graph in graph_speedup)")
    ap.add_argument("--shared", choices=("off", "first", "last"), default="off",
                    help="models with shared experts: compute them inside the megakernel, their tiles before ('first') "
                         "or after ('last') the routed experts' in the ticket order; the reference runs them after "
                         "its combine, and shared_separate_ms times the megakernel without them followed by the same "
                         "dense FFN (off: routed experts only, as before)")
    ap.add_argument("--trace-policy", default="best-static", help="policy of the trace ('best-static' or a policy)")
    ap.add_argument("--expert-dtype", choices=EXPERT_DTYPES, default="bf16",
                    help="the megakernel's experts: bf16, or fp8 (e4m3 with 128x128 block scales, weave_kernel/fp8.py; "
                         "the reference then runs in bf16 on the dequantized weights, and the lower bound stays bf16's)")
    args = ap.parse_args(argv)
    if args.weave_nosteal and args.no_weave:
        ap.error("--weave-nosteal adds to the weave policies, which --no-weave leaves out")
    return args


def kernel_sources(args) -> dict:
    """Fingerprints of the kernel sources this run built (build.sources_digest): "main", and "ab" for --ab-csrc."""
    from .build import CSRC, sources_digest

    out = {"main": sources_digest(CSRC)}
    if getattr(args, "ab_csrc", ""):
        out["ab"] = sources_digest(args.ab_csrc)
    return out


def lower_bound(all_ids: np.ndarray, model, placement, shared: bool = False, expert_dtype: str = "bf16") \
        -> tuple[float, dict]:
    """Layer lower bound in ms from weave_sim (slowest GPU), and the per-GPU volumes. shared: the layer computes its
    shared experts too (their FLOPs and weight bytes join the bound's). expert_dtype 'fp8': the bound of FP8 experts
    (e4m3 weights and dispatched rows, FP8's GEMM peak; weave_sim.costmodel.bound_volumes) in vol["fp8_bound_ms"]
    beside the bf16 one, which stays the returned bound (the targets are stated for it)."""
    from weave_sim.workload import layer_workload

    wl = layer_workload(all_ids, model, placement)
    flops = wl.flops + (wl.shared_flops if shared else 0)
    vol = {"flops": flops.tolist(), "pairs_out": wl.outgoing_pairs.tolist(), "pairs_in": wl.incoming_pairs.tolist()}
    try:
        from weave_sim.costmodel import bound_volumes, lower_bound_ns
        from weave_sim.profile import load_profile

        prof = load_profile("h200")
        lb_ms = float(lower_bound_ns(bound_volumes([wl], prof, shared), prof).max()) / 1e6
        vol["bound"] = "weave_sim.costmodel.lower_bound_ns(h200)"
        if expert_dtype == "fp8":
            from weave_sim.profile import fp8_profile

            p8 = fp8_profile(prof)
            vol["fp8_bound_ms"] = float(lower_bound_ns(bound_volumes([wl], p8, shared, "fp8"), p8).max()) / 1e6
    except Exception as exc:  # noqa: BLE001 - fall back to measured-h200.md's formula, and say so
        link = np.maximum(wl.dispatch_bytes_in + wl.combine_bytes_in, wl.dispatch_bytes_out + wl.combine_bytes_out)
        wb = wl.weight_bytes + (wl.shared_weight_bytes if shared else 0)
        lb_ms = float(np.max(np.maximum.reduce([flops / 750e12, link / 350e9, wb / 4.3e12]))) * 1e3
        vol["bound"] = f"fallback max(F/750TF, bytes/350GB/s, W/4.3TB/s) ({exc})"
    return lb_ms, vol


def bench_model(name: str, args, world: int):
    """The geometry benchmarked for model `name`: its preset or spec, with --max-local-experts applied."""
    model = get_model(name)
    if args.max_local_experts and model.num_experts // world > args.max_local_experts:
        e = args.max_local_experts * world
        model = dataclasses.replace(model, num_experts=e, top_k=min(model.top_k, e))
    return model


def make_layer(model, max_tokens: int, args, world: int, dev) -> tuple[MoEMegakernel, torch.Tensor, torch.Tensor]:
    """One layer (buffers sized for the largest token count) and random local expert weights per model."""
    placement = contiguous(model.num_experts, world)
    e_loc = model.num_experts // world
    gen = torch.Generator(device=dev).manual_seed(args.seed + dist.get_rank())
    H, I = model.hidden_size, model.expert_ffn_size
    w13 = (torch.randn(e_loc, 2 * I, H, device=dev, generator=gen) / H**0.5).to(torch.bfloat16)
    w2 = (torch.randn(e_loc, H, I, device=dev, generator=gen) / I**0.5).to(torch.bfloat16)
    kw = dict(hidden=H, inter=I, num_experts=model.num_experts, top_k=model.top_k, placement=placement,
              max_tokens=max_tokens, cost_profile=args.cost_profile, num_ctas=args.num_ctas or None,
              dispatch=args.dispatch)
    ref_w = None
    if getattr(args, "expert_dtype", "bf16") == "fp8":  # e4m3 experts for the kernel, their bf16 values for the reference
        from .fp8 import dequant_weight, quantize_weight

        kw["expert_dtype"] = "fp8"
        q13, q2 = [], []
        for i in range(0, e_loc, 16):  # a few experts at a time: the fp32 temporaries of all would not fit
            q13.append(quantize_weight(w13[i:i + 16]))
            q2.append(quantize_weight(w2[i:i + 16]))
        w13 = (torch.cat([q[0] for q in q13]), torch.cat([q[1] for q in q13]))
        w2 = (torch.cat([q[0] for q in q2]), torch.cat([q[1] for q in q2]))
        ref_w = (torch.cat([dequant_weight(*q).to(torch.bfloat16) for q in q13]),
                 torch.cat([dequant_weight(*q).to(torch.bfloat16) for q in q2]))
    # the shared expert (num_shared_experts x I wide, as one FFN), with --shared on a model that has one
    inter_shared = model.num_shared_experts * I if args.shared != "off" else 0
    kw["shared_inter"] = inter_shared
    layer = MoEMegakernel(**kw, timeline_per_cta=4096 if args.trace else 0)
    layer.ref_w = ref_w  # FP8: the reference's bf16 weights (what the e4m3 blocks hold)
    layer.shared_w, layer.shared_ref_w = (shared_weights(H, inter_shared, layer.fp8, dev, gen) if inter_shared
                                          else (None, None))
    if args.ab_csrc:  # the other kernel version, same weights and routing (bench_config times both)
        from .build import load_extension

        layer.ab_other = MoEMegakernel(**kw, ext=load_extension(csrc=args.ab_csrc))
    elif args.ab_cost_profile:  # the same kernel choosing its split from another cost table
        layer.ab_other = MoEMegakernel(**{**kw, "cost_profile": args.ab_cost_profile})
    elif args.ab_dispatch:  # the same kernel copying its dispatch rows the other way
        layer.ab_other = MoEMegakernel(**{**kw, "dispatch": "bulk" if args.dispatch == "threads" else "threads"})
    return layer, w13, w2


def bench_config(model, n: int, layer, w13, w2, args, rank: int, world: int, dev, sampler=None,
                 moe_layer: int | None = None) -> dict:
    ids, w = rank_routing(args.spec, model, world, n, seed=args.seed, rank=rank, layer=moe_layer)
    gathered = [None] * world
    dist.all_gather_object(gathered, ids)
    all_ids = np.concatenate(gathered)
    # every rank builds the same map from the same gathered routing; the random local weights stand for whichever
    # experts the map gives this rank
    placement = make_placement(args.placement, model.num_experts, world,
                               loads=expert_loads(all_ids, model.num_experts))
    for lay in (layer, getattr(layer, "ab_other", None)):
        if lay is not None:
            lay.set_placement(placement)
    H, I = model.hidden_size, model.expert_ffn_size
    x = torch.randn(n, H, device=dev).to(torch.bfloat16)
    ids_d, w_d = torch.as_tensor(ids, device=dev), torch.as_tensor(w, device=dev)
    owner, local_idx = torch.as_tensor(placement.owner), torch.as_tensor(placement.local_index())
    res = {"kernel_deciders": KERNEL_DECIDERS, "model": model.name, "tokens_per_gpu": n, "gpus": world, "experts": model.num_experts,
           "local_experts": model.num_experts // world, "top_k": model.top_k, "hidden": H, "inter": I,
           "num_ctas": layer.num_ctas, "latency_ms": {}, "timing_order": args.order}
    if moe_layer is not None:
        res["layer"] = moe_layer
    if args.placement != "contiguous":  # read back by weave_sim.validate.result_placement
        res["placement"], res["placement_owner"] = args.placement, placement.owner.tolist()
    sw = layer.shared_w  # the shared expert's weights, or None
    sw_ref = layer.shared_ref_w  # the same in bf16 (FP8: what the e4m3 blocks hold), for the reference
    order = args.shared if sw is not None else "off"
    res["shared"] = order  # read back by weave_sim.validate.result_shared
    if sw is not None:
        res["inter_shared"] = layer.shared_inter
    kshared = {} if sw is None else {"shared": sw, "shared_order": order}

    rw13, rw2 = layer.ref_w if getattr(layer, "ref_w", None) is not None else (w13, w2)
    res["expert_dtype"] = "fp8" if layer.fp8 else "bf16"
    res["kernel_layout"] = kernel_layout_for(res["expert_dtype"], shared=sw is not None)
    y_ref = ep_moe_reference(x, ids_d, w_d, rw13, rw2, owner, local_idx, shared=sw_ref)
    fns = {"reference": lambda: ep_moe_reference(x, ids_d, w_d, rw13, rw2, owner, local_idx, shared=sw_ref)}
    policies = ([] if args.no_sequential else ["sequential"]) + [f"static:{c}" for c in args.comm if c < layer.num_ctas]
    if not args.no_weave:
        policies += ["weave"] + (["weave-nosteal"] if args.weave_nosteal else []) + \
            [f"weave:{c}" for c in args.weave_comm if c < layer.num_ctas]
    # the counts the kernel exchanges (pair-based dispatch rows) and the cost model's choice for them
    res["counts"] = counts_from_routing(gathered, model.num_experts, placement)
    geo = geometry_model(H, I, model.num_experts, model.top_k, name=model.name)
    py_choice = model_choice(res["counts"], geo, placement, args.cost_profile)
    errs = {}
    for pol in policies:
        y = layer(x, ids_d, w_d, w13, w2, policy=pol, **kshared)  # checked call: raises on any kernel error
        errs[pol] = float((y.float() - y_ref.float()).norm() / y_ref.float().norm())
        if pol == "weave":
            kc = [None] * world
            dist.all_gather_object(kc, layer.last_choice())
            res["weave_choice"] = {
                "kernel": kc, "cost_model": py_choice,
                "agrees": [choice_agrees(k, p) for k, p in zip(kc, py_choice)],
                "profile": args.cost_profile, "note": "c_star/k_star per rank; comm_ctas_used = min(c*, CTAs - 1)"}
        fns[pol] = lambda pol=pol: layer(x, ids_d, w_d, w13, w2, policy=pol, check=False, **kshared)
    separate = []  # the shared expert outside the megakernel: the layer without it, then the dense FFN, added
    if sw is not None:
        from .reference import shared_ffn

        for pol in [p for p in ("weave", "static:20") if p in policies]:
            def sep(pol=pol):
                y = layer(x, ids_d, w_d, w13, w2, policy=pol, check=False)
                return y.add_(shared_ffn(x, sw_ref[0], sw_ref[1]))
            y = sep()
            errs[f"separate:{pol}"] = float((y.float() - y_ref.float()).norm() / y_ref.float().norm())
            fns[f"separate:{pol}"] = sep
            separate.append(pol)
    if args.cuda_graph != "off":
        res["cuda_graph"] = args.cuda_graph
        res["host_us_per_call"] = {}
        for pol in policies:
            res["host_us_per_call"][pol] = max_over_ranks(host_us_per_call(fns[pol]))
            replay, y_g = graph_of(fns[pol])
            errs[f"graph:{pol}"] = float((y_g.float() - y_ref.float()).norm() / y_ref.float().norm())
            fns[pol if args.cuda_graph == "on" else f"graph:{pol}"] = replay
    t0 = time.time()
    ms = time_policies(fns, args)
    t1 = time.time()
    layer.raise_if_error()
    for name, t in ms.items():
        if name.startswith("graph:"):
            res.setdefault("graph_latency_ms", {})[name[6:]] = max_over_ranks(t)
        elif name.startswith("separate:"):  # not a policy of the megakernel: kept out of latency_ms
            res.setdefault("shared_separate_ms", {})[name[9:]] = max_over_ranks(t)
        else:
            res["latency_ms"][name] = max_over_ranks(t)
    if "graph_latency_ms" in res:  # above 1: the graph replay is faster than the same call issued eagerly
        res["graph_speedup"] = {p: res["latency_ms"][p] / t for p, t in res["graph_latency_ms"].items()}
    if sampler is not None:
        state = [None] * world
        dist.all_gather_object(state, sampler.summary(t0, t1))
        res["gpu_state"] = state
    if args.sustained > 0:
        res.update(sustained_times(fns, args, world, sampler))
        layer.raise_if_error()
    other = getattr(layer, "ab_other", None)
    if other is not None:
        for pol in policies:
            res.setdefault("ab", {})[pol] = ab_times(layer, other, pol, (x, ids_d, w_d, w13, w2), y_ref, args,
                                                     kshared)
    res["rel_err_vs_reference"] = {k: max_over_ranks(v) for k, v in errs.items()}
    res["max_rel_err_vs_reference"] = max(res["rel_err_vs_reference"].values())

    lb_ms, vol = lower_bound(all_ids, model, placement, shared=sw is not None, expert_dtype=res["expert_dtype"])
    statics = {p: t for p, t in res["latency_ms"].items() if p.startswith("static:")}
    best = min(statics, key=statics.get)
    t_best = statics[best]
    total_flops = float(sum(vol["flops"]))
    # bytes this kernel moves over NVLink: one row per remote pair each way (dispatch is per pair in v1); FP8
    # dispatches e4m3 rows and their scales, combine rows are bf16
    row_out = expert_bytes(res["expert_dtype"], H)[0]
    link_bytes = float(sum(vol["pairs_out"])) * (row_out + 2 * H)
    res.update({
        "best_static": best,
        "lower_bound_ms": lb_ms,
        "lower_bound_source": vol["bound"],
        "speedup_best_static": res["latency_ms"]["reference"] / t_best,
        "speedup_sequential": (res["latency_ms"]["reference"] / res["latency_ms"]["sequential"]
                               if "sequential" in res["latency_ms"] else None),
        "fraction_of_lower_bound": lb_ms / t_best,
        "nvlink_gbs_per_gpu": link_bytes / world / (t_best * 1e-3) / 1e9,
        "tflops_per_gpu": total_flops / world / (t_best * 1e-3) / 1e12,
    })
    if "fp8_bound_ms" in vol:  # FP8 experts: their own bound too (e4m3 bytes, FP8 peak), and the fractions of it
        res["fp8_lower_bound_ms"] = vol["fp8_bound_ms"]
        res["fp8_fraction_of_lower_bound"] = {p: vol["fp8_bound_ms"] / t for p, t in res["latency_ms"].items()
                                              if p != "reference"}
    if "weave" in res["latency_ms"]:
        t_w = res["latency_ms"]["weave"]
        wc = {p: t for p, t in res["latency_ms"].items() if p.startswith("weave:")}
        res.update({
            "weave_vs_best_static": t_best / t_w,
            "weave_vs_static20": res["latency_ms"]["static:20"] / t_w if "static:20" in res["latency_ms"] else None,
            "weave_vs_reference": res["latency_ms"]["reference"] / t_w,
            "best_weave_c": min(wc, key=wc.get) if wc else None,
            "weave_fraction_of_lower_bound": lb_ms / t_w,
        })
        if "weave-nosteal" in res["latency_ms"]:  # above 1: stealing pays
            res["weave_vs_nosteal"] = res["latency_ms"]["weave-nosteal"] / t_w
    if args.trace:
        from .timeline import process_metadata, write_chrome_trace

        best = best if args.trace_policy == "best-static" else args.trace_policy
        layer(x, ids_d, w_d, w13, w2, policy=best, record_timeline=True, **kshared)
        torch.cuda.synchronize()
        events, base = layer.timeline_events()
        t = torch.tensor([base], dtype=torch.int64, device=dev)
        dist.all_reduce(t, op=dist.ReduceOp.MIN)
        events, _ = layer.timeline_events(int(t.item()))
        allev = [None] * world
        dist.all_gather_object(allev, events)
        if rank == 0:
            meta = [process_metadata(g, f"GPU {g} ({best})") for g in range(world)]
            write_chrome_trace(args.trace, meta + [e for ev in allev for e in ev],
                               {"model": model.name, "tokens_per_gpu": n, "policy": best, "layer": moe_layer,
                                **({"placement_owner": placement.owner.tolist()} if args.placement != "contiguous"
                                   else {})})
        args.trace = ""
    return res


def shared_weights(hidden: int, inter_shared: int, fp8: bool, device, generator) -> tuple:
    """A benchmark's shared expert: (the kernel's weights, the reference's bf16 weights). bf16 layers: the same
    (w13s, w2s) twice; FP8 layers: ((q, s), (q, s)) pairs quantized from them (fp8.quantize_weight) and their
    dequantized bf16 values, so the reference and shared_separate_ms compute what the e4m3 blocks hold."""
    from .reference import make_shared_weights

    w = make_shared_weights(hidden, inter_shared, device=device, generator=generator)
    if not fp8:
        return w, w
    from .fp8 import dequant_weight, quantize_weight

    q = tuple(quantize_weight(t) for t in w)
    return q, tuple(dequant_weight(*p).to(torch.bfloat16) for p in q)


def main(argv=None) -> int:
    args = parse_args(argv)
    if sum(map(bool, (args.ab_csrc, args.ab_cost_profile, args.ab_dispatch))) > 1:
        raise SystemExit("weave_kernel.bench: --ab-csrc, --ab-cost-profile and --ab-dispatch are different A/Bs; "
                         "give one")
    if args.ab_cost_profile:
        from weave_sim.profile import ProfileError, load_profile

        try:
            load_profile(args.ab_cost_profile)
        except ProfileError as exc:
            raise SystemExit(f"weave_kernel.bench: --ab-cost-profile: {exc}")
    try:
        from .policies import dispatch_issuers

        dispatch_issuers(args.dispatch)
    except ValueError as exc:
        raise SystemExit(f"weave_kernel.bench: --dispatch: {exc}")
    if args.repeats < 1 or args.calls_per_rep < 1 or args.warmup < 0:
        raise SystemExit("--repeats and --calls-per-rep must be >= 1, --warmup >= 0")
    args.comm = [int(c) for c in args.comm.split(",") if c]
    args.weave_comm = args.comm if args.weave_comm is None else [int(c) for c in args.weave_comm.split(",") if c]
    try:
        args.spec = spec_from_args(args)
        args.routing = args.spec.to_dict()  # recorded in the results' config (weave_kernel.routing.spec_of_config)
        layer_sets = {name: parse_layers(args.layers, args.spec, get_model(name).num_moe_layers)
                      for name in args.models.split(",")}
    except (ValueError, KeyError) as exc:
        raise SystemExit(f"weave_kernel.bench: {exc}")
    rank, world, dev = init_ranks()
    models = {name: bench_model(name, args, world) for name in args.models.split(",")}
    for name, model in models.items():  # a geometry the kernel cannot run fails here, before any GPU work
        try:
            check_geometry(model.hidden_size, model.expert_ffn_size, model.num_experts, model.top_k, world, world,
                           model.num_shared_experts * model.expert_ffn_size if args.shared != "off" else 0)
        except ValueError as exc:
            raise SystemExit(f"weave_kernel.bench: model {name}: {exc}")
    rows = []
    sources = kernel_sources(args)  # hashed once: the sources do not change during the run
    gpu = torch.cuda.get_device_name(dev)

    def dump(final: bool) -> None:  # rank 0, after every config: a killed run still leaves its results
        header = run_header(args, world, gpu)
        config = {k: v for k, v in vars(args).items() if not isinstance(v, RoutingSpec)}
        doc = {"header": header, "complete": final, "config": config, "kernel_sources": sources,
               "results": rows,
               "weave_geomeans": weave_geomeans(rows) if not args.no_weave else None}
        if rows:
            doc["geomean_speedup_best_static"] = geomean([r["speedup_best_static"] for r in rows])
        tmp = args.out + ".tmp"
        with open(tmp, "w") as f:
            json.dump(doc, f, indent=1)
        os.replace(tmp, args.out)

    sampler = None
    if not args.no_gpu_state:
        sampler = GpuStateSampler.for_device(dev)
    warm_gpu(args.warm_gpu_s, dev)
    for name, model in models.items():
        tokens = [int(t) for t in args.tokens.split(",")]
        layer, w13, w2 = make_layer(model, max(tokens), args, world, dev)
        for n, moe_layer in [(n, m) for n in tokens for m in layer_sets[name]]:
            t0 = time.time()
            r = bench_config(model, n, layer, w13, w2, args, rank, world, dev, sampler, moe_layer)
            rows.append(r)
            if rank == 0:
                lat = r["latency_ms"]
                where = "" if moe_layer is None else f" layer {moe_layer}"
                print(f"[{time.time() - t0:5.1f}s] {name} N={n}{where}: " +
                      " ".join(f"{k}={v:.3f}" for k, v in lat.items()) +
                      (f" choice={[(k['c_star'], k['k_star']) if k else None for k in r['weave_choice']['kernel']]}"
                       f" agrees={r['weave_choice']['agrees']}" if "weave_choice" in r else "") +
                      (" sm_mhz_min=" + ",".join(f"{g['sm_mhz_min']:.0f}" if g else "?" for g in r["gpu_state"])
                       if r.get("gpu_state") else ""), flush=True)
                dump(False)
        del layer, w13, w2
        torch.cuda.empty_cache()
    header = run_header(args, world, gpu)
    if rank == 0:
        geo = geomean([r["speedup_best_static"] for r in rows])
        geo_prefill = geomean([r["speedup_best_static"] for r in rows if r["tokens_per_gpu"] >= 2048])
        lb4096 = [r["fraction_of_lower_bound"] for r in rows if r["tokens_per_gpu"] == 4096]
        print(format_table(rows, header))
        if args.ab_csrc or args.ab_cost_profile or args.ab_dispatch:
            print(ab_summary(rows))
        if args.cuda_graph == "ab":
            print(graph_summary(rows))
        print(f"geomean speedup of best static:C over the reference: {geo:.2f}x (all), {geo_prefill:.2f}x "
              f"(>= 2048 tokens per GPU); fraction of the lower bound at 4096: "
              + (f"mean {np.mean(lb4096):.2f}, min {np.min(lb4096):.2f}" if lb4096 else "n/a"))
        dump(True)
        if not args.no_weave:
            print(format_weave_table(rows))
            wg = weave_geomeans(rows)
            for label in ("prefill", "all"):
                g = wg[label]
                print(f"geomean ({label}, {g['points']} points): weave vs best static:C per config "
                      f"{ratio(g['weave_vs_best_static'])}, vs best single {g.get('best_single_static')} "
                      f"{ratio(g.get('weave_vs_best_single_static'))}, vs static:20 {ratio(g['weave_vs_static20'])}, "
                      f"vs reference {ratio(g['weave_vs_reference'])} "
                      f"(best static vs reference {ratio(g['best_static_vs_reference'])})")
            lb = wg["weave_fraction_of_lower_bound_4096_mean"]
            print(f"weave fraction of the lower bound at 4096 (mean): "
                  f"{f'{100 * lb:.1f}%' if lb is not None and math.isfinite(lb) else 'n/a (no 4096-token point)'}; "
                  f"in-kernel choice == weave_sim.costmodel.choose: {wg['choice_agreement']} (rank, config) pairs")
            sus = wg.get("sustained")
            if sus:
                lb = sus["weave_fraction_of_lower_bound_4096_mean"]
                print(f"sustained ({sus['points']} points, each policy back to back): weave vs best static:C per "
                      f"config {ratio(sus['weave_vs_best_static'])} (worst {ratio(sus['weave_vs_best_static_worst'])}), "
                      f"vs static:20 {ratio(sus['weave_vs_static20'])}, vs reference {ratio(sus['weave_vs_reference'])}; "
                      f"fraction of the lower bound at 4096 (mean): "
                      f"{f'{100 * lb:.1f}%' if lb is not None else 'n/a (no 4096-token point)'}")
            if "weave_vs_nosteal" in wg:
                print(f"geomean t(weave-nosteal) / t(weave): {wg['weave_vs_nosteal']:.3f} (above 1: stealing pays)")
    if sampler is not None:
        sampler.stop()
    dist.barrier()
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

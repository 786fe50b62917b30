"""`weave-sim simulate` and `weave-sim sweep`: the discrete-event engine from the command line."""
from __future__ import annotations

import argparse
import dataclasses
import sys
import time

import numpy as np

from . import costmodel as cm
from .config import add_run_arguments, config_from_args, resolve
from .engine.dag import SHARED_ORDERS
from .engine import plot_gantt, plot_latency_vs_c, simulate_layer, simulate_model, sweep, write_chrome_trace
from .placement import placement_for
from .profile import fp8_profile
from .report import write_json
from .workload import EXPERT_DTYPES, layer_workload, model_workloads


def _progress(args) -> bool:
    return not args.quiet and sys.stderr.isatty()


def _lower_bounds_ns(res, shared: str = "off", expert_dtype: str = "bf16") -> np.ndarray:
    """[L]: the lower bound of each layer (costmodel.lower_bound_ns), with the shared experts' FLOPs and weight bytes
    added when they are simulated (the cost model's T(c, K) and the in-kernel choice ignore them); FP8 experts: their
    e4m3 bytes at FP8's peak (res.profile is then the FP8 one, _with_dtype)."""
    workloads = model_workloads(res.routing, res.model, res.placement)
    vol = cm.bound_volumes(workloads, res.profile, shared=shared != "off", expert_dtype=expert_dtype)
    return cm.lower_bound_ns(vol, res.profile).max(axis=1)


def _with_dtype(res, expert_dtype: str):
    """The resolved run with FP8 experts' profile (profile.fp8_profile: tiles at the profile's gemm.fp8_scale, else
    FP8_TILE_SCALE, x its per-SM rates; FP8's GEMM peak), or as it is for bf16."""
    return res if expert_dtype == "bf16" else dataclasses.replace(res, profile=fp8_profile(res.profile))


def _dtype_note(res, expert_dtype: str) -> str:
    if expert_dtype == "bf16":
        return "bf16 experts"
    return (f"fp8 experts (e4m3 weights and dispatch rows, tiles x{res.profile.raw['gemm']['fp8_applied']['scale']:g} "
            f"the profile's per-SM rate)")


def _shared_note(model, shared: str) -> str:
    """The header's word on shared experts."""
    if shared == "off" or not model.num_shared_experts:
        extra = " (the model has none)" if shared != "off" else ""
        return f"shared experts {shared}{extra}"
    return (f"shared experts {shared} ({model.num_shared_experts} x I = one FFN of width {model.shared_ffn_size} "
            f"per GPU)")


def _layer_outputs(res, result, layer_pos: int, oracle: bool, shared: str = "off", expert_dtype: str = "bf16") -> list:
    """Chrome trace, SM Gantt and latency-vs-c plot of one layer (re-simulated with the timeline kept)."""
    out, layer = res.config.out, int(res.layer_ids[layer_pos])
    w = layer_workload(res.routing[:, layer_pos, :], res.model, placement_for(res.placement, layer_pos))
    opts = {"shared": shared, "expert_dtype": expert_dtype}
    chosen = simulate_layer(w, res.profile, result.policy, seed=res.config.seed, record_timeline=True, layer=layer,
                            **opts)
    best = simulate_layer(w, res.profile, "oracle", seed=res.config.seed, layer=layer, **opts) if oracle else None
    return [
        write_chrome_trace(chosen, out / f"timeline-layer{layer}.json"),
        plot_gantt(chosen, out / f"gantt-layer{layer}.png"),
        plot_latency_vs_c(w, res.profile, out / f"latency-vs-c-layer{layer}.png", chosen=chosen, oracle=best,
                          seed=res.config.seed, **opts),
    ]


def cmd_simulate(args: argparse.Namespace) -> int:
    res = _with_dtype(resolve(config_from_args(args)), args.expert_dtype)
    if args.timeline_layer is not None and not args.no_plots and args.timeline_layer not in res.layer_ids:
        raise ValueError(f"--timeline-layer {args.timeline_layer} is not among the simulated layers "
                         f"({', '.join(map(str, res.layer_ids))})")
    t0 = time.perf_counter()
    result = simulate_model(res.routing, res.model, res.placement, res.profile, args.policy,
                            seed=res.config.seed, progress=_progress(args), shared=args.shared,
                            expert_dtype=args.expert_dtype)
    wall_s = time.perf_counter() - t0
    for pos, r in enumerate(result.layers):  # layer numbers of the model, not of the selection
        r.layer = int(res.layer_ids[pos])
    bound = _lower_bounds_ns(res, args.shared, args.expert_dtype)
    print(f"# routing: {res.routing_source}; {res.config.num_gpus} GPUs x {res.config.tokens_per_gpu} tokens, "
          f"{res.config.placement} placement; "
          f"profile {res.profile.name} ({res.profile.version}); {_shared_note(res.model, args.shared)}; "
          f"{_dtype_note(res, args.expert_dtype)}")
    print(result.format())
    total = result.total_ns
    print(f"# lower bound {bound.sum() / 1e3:.1f} us = {bound.sum() / total:.1%} of the simulated {total / 1e3:.1f} us; "
          f"simulated in {wall_s:.1f} s")
    files = []
    if not args.no_plots:
        slowest = int(np.argmax([r.latency_ns for r in result.layers])) if args.timeline_layer is None else \
            int(np.flatnonzero(res.layer_ids == args.timeline_layer)[0])
        if not args.quiet:
            print(f"# writing the Chrome trace and plots of layer {int(res.layer_ids[slowest])} (--no-plots skips them)",
                  flush=True)
        files = _layer_outputs(res, result, slowest, oracle=not args.no_oracle, shared=args.shared,
                               expert_dtype=args.expert_dtype)
    payload = {"config": {**res.describe(), "policy": args.policy, "shared": args.shared,
                          "expert_dtype": args.expert_dtype}, "results": result.to_dict(),
               "lower_bound_us": (bound / 1e3).tolist(), "wall_s": wall_s, "files": [str(f) for f in files]}
    path = write_json(res.config.out / "simulate.json", payload)
    print("wrote " + ", ".join(str(p) for p in [path, *files]))
    return 0


def cmd_sweep(args: argparse.Namespace) -> int:
    res = _with_dtype(resolve(config_from_args(args)), args.expert_dtype)
    policies = [p.strip() for p in args.policies.split(",") if p.strip()]
    if not policies:
        raise ValueError(f"--policies names no policy, got {args.policies!r} (e.g. sequential,static:20,weave)")
    try:
        grid = tuple(int(c) for c in args.static_grid.split(","))
    except ValueError:
        raise ValueError(f"--static-grid must be comma-separated integers, got {args.static_grid!r}") from None
    sms = res.profile.num_sms
    if not grid or min(grid) < 1 or max(grid) >= sms:
        raise ValueError(f"--static-grid values must lie in [1, {sms - 1}] (the profile's {sms} SMs), got {args.static_grid}")
    table = sweep(res.routing, res.model, res.placement, res.profile, policies, static_grid=grid,
                  seed=res.config.seed, progress=_progress(args), shared=args.shared, expert_dtype=args.expert_dtype)
    table.layers = [int(x) for x in res.layer_ids]
    print(f"# {res.model.name}: {res.config.num_gpus} GPUs x {res.config.tokens_per_gpu} tokens, "
          f"routing {res.routing_source}, profile {res.profile.name}, {_shared_note(res.model, args.shared)}, "
          f"{_dtype_note(res, args.expert_dtype)}; latency in us")
    print(table.format())
    path = write_json(res.config.out / "sweep.json", {"config": {**res.describe(), "policies": policies,
                                                                 "shared": args.shared,
                                                                 "expert_dtype": args.expert_dtype},
                                                      "results": table.to_dict()})
    print(f"wrote {path}")
    return 0


def _add_shared_argument(p) -> None:
    p.add_argument("--shared", default="off", choices=list(SHARED_ORDERS),
                   help="simulate the model's shared experts (one FFN of width shared x I per GPU on its own tokens), "
                        "their GEMM tiles first or last in each GPU's tile queue (default off; docs/engine.md)")
    p.add_argument("--expert-dtype", default="bf16", choices=list(EXPERT_DTYPES),
                   help="the experts' format: bf16 (default) or fp8 (the megakernel's e4m3 with 128x128 block scales: "
                        "half the weight and dispatch bytes, tiles at the profile's gemm.fp8_scale, else 1.25, x its "
                        "per-SM rate, their fixed cost at its gemm.fp8_fixed_scale (the EP=1 profiles: fitted to "
                        "measured FP8 layers by weave-sim calibrate --fp8); the lower bound at FP8's peak)")


POLICY_FORMS = "sequential, static:C[:K], weave, oracle[:fast] or kernel:P (docs/engine.md, Policies)"


def add_sim_commands(sub) -> None:
    p = sub.add_parser("simulate", help="simulate every MoE layer of a model under one policy")
    add_run_arguments(p)
    p.add_argument("--policy", default="weave", help=f"{POLICY_FORMS}; default weave")
    p.add_argument("--timeline-layer", type=int, default=None, help="layer for trace and plots (default: slowest)")
    p.add_argument("--no-plots", action="store_true", help="skip the Chrome trace and PNGs")
    p.add_argument("--no-oracle", action="store_true", help="leave the oracle point out of the latency-vs-c plot")
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    _add_shared_argument(p)
    p.set_defaults(func=cmd_simulate)
    p = sub.add_parser("sweep", help="policies x layers table with speedups vs sequential and the best static split")
    add_run_arguments(p)
    p.add_argument("--policies", default="sequential,static:20,weave,oracle:fast",
                   help=f"comma-separated, each {POLICY_FORMS}; default %(default)s")
    p.add_argument("--static-grid", default="4,8,12,16,20,24,32,48,64", help="C values for the best static split (default %(default)s)")
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    _add_shared_argument(p)
    p.set_defaults(func=cmd_sweep)

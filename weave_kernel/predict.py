"""What the simulator expects this megakernel to do at world sizes not measured yet (EP=4, EP=8), next to EP=2.

For each model x tokens per GPU x world size (x MoE layer, with per-layer routing) it rebuilds the routing the
benchmark would use on every rank (`weave_kernel.routing.rank_routing`: the bench's seed and routing options,
Zipf-skewed per rank by default, or `--synthetic KIND` / `--routing-trace FILE` with `--layers`), and simulates
the kernel's scheduling (`kernel:P` engine policies with the expert-packed receive layout, as `weave-sim validate`
does) under
`sequential`, `static:C` for the bench's grid of C, and `weave` ((c*, K*) per GPU from the profile's cost table,
comm CTAs stealing tiles). It prints per configuration the predicted latencies, weave over static:20 and over
the best static:C, and the fraction of the lower bound (weave_sim's `lower_bound_ns` with the seed `h200`
profile, as the benchmark reports it); then geomeans per world size: the issue's targets as the simulator
sees them before any run.

`--shared first|last` simulates the fused shared expert of models that have one (bench --shared: one FFN of width
num_shared_experts x I per GPU on its own tokens, its tiles first or last in the GEMM queue; docs/engine.md,
"Shared experts"), and the lower bound then counts its FLOPs and weights (costmodel.bound_volumes). The in-kernel
(c*, K*) choice, like the kernel's, still ignores it. Models without shared experts run as under off.

    python -m weave_kernel.predict --gpus 2,4,8 --profile h200-megakernel-power --out predict.json

Caveats: the profile was fitted to EP=2 runs (one peer per GPU); at EP=4/8 every GPU pushes to several peers
through NVSwitch, which the profile's per-GPU link model covers only as far as its bandwidth curve does. The
EP=2 rows are the check: compare them with docs/results.md before trusting the others. CPU only; no torch.
"""
from __future__ import annotations

import argparse
import json
import math
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import numpy as np

from weave_sim.costmodel import bound_volumes, lower_bound_ns
from weave_sim.engine import simulate_layer
from weave_sim.engine.dag import SHARED_ORDERS
from weave_sim.placement import expert_loads, make_placement
from weave_sim.presets import WEAVE_EVAL_MODELS, get_model
from weave_sim.profile import load_profile
from weave_sim.traces import DEFAULT_TRACE, load_trace
from weave_sim.validate import KERNEL_LAYOUTS, config_label, kernel_layout_for
from weave_sim.workload import layer_workload, workload_from_counts

from .choice import counts_from_routing
from .geometry import check_geometry
from .routing import RoutingSpec, add_routing_args, parse_layers, rank_routing, spec_from_args
from .whatif import parse_ints

STATIC_GRID = (4, 8, 12, 16, 20, 32, 48)


def config_counts(model, world: int, tokens: int, seed: int = 0, spec: RoutingSpec = RoutingSpec(),
                  layer: int | None = None, placement: str = "contiguous"):
    """The counts and the concatenated routing of every rank, as `python -m weave_kernel.bench` draws them.
    placement: "contiguous" (the benchmark's), or "balanced" (weave_sim.placement.balanced on this layer's pairs per
    expert over all ranks: an upper bound on what a placement from past routing statistics achieves)."""
    ids = [rank_routing(spec, model, world, tokens, seed=seed, rank=r, layer=layer)[0] for r in range(world)]
    if placement not in ("contiguous", "balanced"):
        raise ValueError(f"placement must be contiguous or balanced, got {placement!r}")
    placement = make_placement(placement, model.num_experts, world,
                               loads=expert_loads(np.concatenate(ids), model.num_experts))
    return counts_from_routing(ids, model.num_experts, placement), np.concatenate(ids), placement


def predict_config(model_name: str, world: int, tokens: int, profile_name: str, seed: int = 0,
                   spec: RoutingSpec = RoutingSpec(), static_grid=STATIC_GRID, weave_grid=(), gemm_scale: float = 1.0,
                   layer: int | None = None, nosteal: bool = False, placement: str = "contiguous",
                   shared: str = "off", fp8: float = 0.0) -> dict:
    """One configuration's predicted latencies (ms) and ratios. shared: the model's shared experts fused into the
    layer ('first' / 'last': their tiles' place in the GEMM queue; recorded as 'off' for a model without any).
    fp8 > 0: FP8 experts (not built; whatif's fp8:S), tiles fp8 x the profile's rate; the bound stays the bf16 one."""
    if shared not in SHARED_ORDERS:
        raise ValueError(f"shared must be one of {SHARED_ORDERS}, got {shared!r}")
    model = get_model(model_name)
    shared = shared if model.num_shared_experts else "off"  # what bench --shared runs on such a model
    profile = load_profile(profile_name)
    if gemm_scale != 1.0:  # a kernel whose tiles run gemm_scale x faster inside the layer (whatif's gemm:S)
        from .whatif import rescaled

        profile = rescaled(profile, gemm=gemm_scale)
    if fp8 > 0:
        from .whatif import fp8_profile

        profile = fp8_profile(profile, fp8)
    counts, all_ids, pl = config_counts(model, world, tokens, seed, spec, layer, placement)
    w = workload_from_counts(counts["source_expert_pairs"], counts["dispatch_rows"], model, pl,
                             counts["tokens_per_gpu"])
    layout = kernel_layout_for("fp8" if fp8 > 0 else "bf16", shared != "off")
    opts = {**KERNEL_LAYOUTS[layout], **({"shared": shared} if shared != "off" else {}),
            **({"expert_dtype": "fp8"} if fp8 > 0 else {})}
    ms = {}
    for pol in ["sequential", *(f"static:{c}" for c in static_grid), "weave", *(["weave-nosteal"] if nosteal else []),
                *(f"weave:{c}" for c in weave_grid)]:
        ms[pol] = simulate_layer(w, profile, f"kernel:{pol}", **opts).latency_ns / 1e6
    h200 = load_profile("h200")
    bound = float(lower_bound_ns(bound_volumes([layer_workload(all_ids, model, pl)], h200, shared != "off"),
                                 h200).max()) / 1e6
    best = min((p for p in ms if p.startswith("static:")), key=ms.get)
    sweep = [p for p in ms if p.startswith("weave:")]
    best_weave = min(sweep, key=ms.get) if sweep else None
    return {"model": model_name, "gpus": world, "tokens_per_gpu": tokens, "layer": layer, "profile": profile_name,
            "gemm_scale": gemm_scale, "placement": placement, "shared": shared, "fp8": fp8,
            "inter_shared": model.shared_ffn_size if shared != "off" else 0,
            "predicted_ms": ms, "best_static": best, "bound_ms": bound, "best_weave": best_weave,
            # the in-kernel choice against the best fixed C of the sweep (the regret, predicted)
            "regret": ms["weave"] / ms[best_weave] - 1.0 if best_weave else None,
            "weave_vs_static20": ms["static:20"] / ms["weave"] if "static:20" in ms else None,
            "weave_vs_best_static": ms[best] / ms["weave"], "weave_fraction_of_bound": bound / ms["weave"],
            # above 1: the simulator expects stealing to pay
            "weave_vs_nosteal": ms["weave-nosteal"] / ms["weave"] if nosteal else None}


def geomean(xs) -> float:
    xs = [x for x in xs if x is not None]
    return math.exp(sum(map(math.log, xs)) / len(xs)) if xs else float("nan")


def shared_note(shared: str, rows) -> str:
    """The header's word on shared experts: the order, and which models have none (simulated as off)."""
    if shared == "off":
        return "shared experts off"
    without = sorted({r["model"] for r in rows if r["shared"] == "off"})
    return (f"shared experts {shared} (fused, one FFN of width shared x I per GPU; the bound counts it, the choice "
            f"does not)" + (f"; none in {', '.join(without)}" if without else ""))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--gpus", default="2,4,8", help="world sizes, comma-separated (default %(default)s)")
    ap.add_argument("--models", default=",".join(WEAVE_EVAL_MODELS),
                    help="comma-separated presets or model specs (weave_sim.presets.get_model)")
    ap.add_argument("--tokens", default="2048,4096,8192", help="tokens per GPU, comma-separated (default %(default)s)")
    ap.add_argument("--profile", default="h200-megakernel-power", help="hardware profile (default %(default)s)")
    ap.add_argument("--seed", type=int, default=0)
    add_routing_args(ap)
    ap.add_argument("--jobs", type=int, default=2, help="worker processes (default %(default)s)")
    ap.add_argument("--weave-grid", default="", help="C values of a weave:C sweep (adds the choice's regret)")
    ap.add_argument("--gemm-scale", type=float, default=1.0,
                    help="GEMM tiles this many times faster than the profile's (a kernel newer than the fit)")
    ap.add_argument("--fp8", type=float, default=0.0, metavar="S",
                    help="FP8 experts (not built; whatif --variant fp8:S): e4m3 weights and dispatch rows, tiles S x "
                         "the profile's rate (docs/kernel.md 'FP8 experts'); 'of bound' stays the bf16 bound")
    ap.add_argument("--nosteal", action="store_true",
                    help="also weave's split without bubble stealing (weave-nosteal; weave_vs_nosteal)")
    ap.add_argument("--placement", default="contiguous", choices=["contiguous", "balanced"],
                    help="expert -> GPU map: the benchmark's contiguous one, or balanced per layer from that layer's "
                         "own loads (an upper bound on a placement from past routing statistics)")
    ap.add_argument("--shared", default="off", choices=list(SHARED_ORDERS),
                    help="fuse the shared experts of models that have them (as bench --shared): one FFN of width "
                         "shared x I per GPU, its tiles first or last in the GEMM queue; the bound counts it "
                         "(default off)")
    ap.add_argument("--out", type=Path, default=None, help="write the rows as JSON")
    args = ap.parse_args(argv)
    try:
        num_sms = load_profile(args.profile).num_sms
        if not (np.isfinite(args.gemm_scale) and args.gemm_scale > 0):
            raise ValueError(f"--gemm-scale must be a finite number > 0, got {args.gemm_scale}")
        if args.seed < 0:
            raise ValueError(f"--seed must be >= 0, got {args.seed}")
        if args.fp8 < 0 or not np.isfinite(args.fp8):
            raise ValueError("--fp8 must be a finite number > 0 (0: bf16 experts)")
        worlds = parse_ints(args.gpus, "--gpus")
        tokens = parse_ints(args.tokens, "--tokens")
        if not worlds or not tokens:
            raise ValueError("--gpus and --tokens need at least one value each")
        if min(tokens) < 1:
            raise ValueError(f"--tokens must be >= 1, got {args.tokens}")
        weave_grid = tuple(parse_ints(args.weave_grid, "--weave-grid"))
        if weave_grid and not 1 <= min(weave_grid) <= max(weave_grid) < num_sms:
            raise ValueError(f"--weave-grid values must lie in [1, {num_sms - 1}] (the profile's {num_sms} SMs), "
                             f"got {args.weave_grid}")
        models = args.models.split(",")
        spec = spec_from_args(args)
        layers = {m: parse_layers(args.layers, spec, get_model(m).num_moe_layers) for m in models}
        for m in models:  # the layers this megakernel runs (what bench would refuse is not predicted)
            geo = get_model(m)
            for g in worlds:
                try:
                    check_geometry(geo.hidden_size, geo.expert_ffn_size, geo.num_experts, geo.top_k, g, g,
                                   shared_inter=geo.shared_ffn_size if args.shared != "off" else 0)
                except ValueError as exc:
                    raise ValueError(f"{m} at EP={g}: {exc}") from None
            if spec.source == "trace":  # the trace must be this model's (checked here, not in a worker)
                load_trace(DEFAULT_TRACE if spec.path == "default" else spec.path, model=geo.name)
    except (ValueError, KeyError) as exc:
        ap.error(str(exc))
    jobs = [(m, g, t, lay) for g in worlds for m in models for t in tokens for lay in layers[m]]
    with ProcessPoolExecutor(max_workers=max(1, args.jobs)) as pool:
        futs = [pool.submit(predict_config, m, g, t, args.profile, args.seed, spec, STATIC_GRID, weave_grid,
                            args.gemm_scale, lay, args.nosteal, args.placement, args.shared, args.fp8)
                for m, g, t, lay in jobs]
        try:  # what only a configuration can refuse (e.g. a generator parameter out of range), said once
            rows = [f.result() for f in futs]
        except ValueError as exc:
            pool.shutdown(cancel_futures=True)
            ap.error(str(exc))
    print(f"simulator ({args.profile}{f', GEMM x{args.gemm_scale}' if args.gemm_scale != 1.0 else ''}"
          f"{f', FP8 experts, tiles x{args.fp8}' if args.fp8 else ''}), kernel "
          f"scheduling, routing {spec.describe()}, {args.placement} placement, seed {args.seed}, "
          f"{shared_note(args.shared, rows)}; predicted ms")
    w = max([20] + [len(config_label(r["model"], r["layer"])) for r in rows])
    print(f"{'EP':>3} {'model':>{w}} {'tokens':>6} {'static:20':>10} {'best static':>18} {'weave':>8} "
          f"{'vs s:20':>8} {'vs best':>8} {'of bound':>8} {'regret':>7}")
    for r in rows:
        ms = r["predicted_ms"]
        label = config_label(r["model"], r["layer"])
        best = f"{ms[r['best_static']]:.3f} ({r['best_static']})"
        print(f"{r['gpus']:>3} {label:>{w}} {r['tokens_per_gpu']:>6} {ms['static:20']:>10.3f} "
              f"{best:>18} {ms['weave']:>8.3f} "
              f"{r['weave_vs_static20']:>7.3f}x {r['weave_vs_best_static']:>7.3f}x {r['weave_fraction_of_bound']:>8.1%} "
              + (f"{r['regret']:>6.1%} ({r['best_weave']})" if r["regret"] is not None else ""))
    print("geomeans per world size (the project's targets: >= 1.15x over static:20, >= 70% of the bound at 4096)")
    for g in worlds:
        sel = [r for r in rows if r["gpus"] == g]
        at4096 = [r["weave_fraction_of_bound"] for r in sel if r["tokens_per_gpu"] == 4096]
        regrets = [r["regret"] for r in sel if r["regret"] is not None]
        print(f"  EP={g}: weave vs static:20 {geomean(r['weave_vs_static20'] for r in sel):.3f}x, "
              f"vs best static:C per config {geomean(r['weave_vs_best_static'] for r in sel):.3f}x"
              + (f", of the bound at 4096: mean {np.mean(at4096):.1%}" if at4096 else "")
              + (f", regret of the choice vs the best weave:C: median {np.median(regrets):.1%}, worst "
                 f"{max(regrets):.1%}" if regrets else "")
              + (f", t(weave-nosteal) / t(weave) {geomean(r['weave_vs_nosteal'] for r in sel):.3f}"
                 if args.nosteal else ""))
    if args.out:
        args.out.write_text(json.dumps({"profile": args.profile, "seed": args.seed, "zipf": args.zipf,
                                        "routing": spec.to_dict(), "shared": args.shared, "fp8": args.fp8,
                                        "rows": rows}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

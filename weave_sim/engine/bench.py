"""Engine speed benchmark: how long does one big layer take to simulate, and where does the time go?

    python -m weave_sim.engine.bench [--model deepseek-v3] [--gpus 8] [--tokens-per-gpu 8192]
                                     [--policies weave static:20] [--profile-top 15]

Question answered: wall time, tasks, SimPy events and events/s of one layer per policy (DAG build
included), then a cProfile of the first policy's run. Routing: layer 0 of the synthetic zipf generator
(`weave_sim.traces.routing_for`, max/mean expert load about 2), contiguous placement, H200 profile.
"""
from __future__ import annotations

import argparse
import cProfile
import io
import platform
import pstats
import time

from ..placement import contiguous
from ..presets import get_model
from ..profile import load_profile
from ..workload import layer_workload
from .run import simulate_layer


def _routing(model, num_tokens: int, seed: int):
    try:
        from ..traces import routing_for
    except ImportError:  # the traces package is optional for the engine
        from .testing import gumbel_routing

        return gumbel_routing(num_tokens, model.num_experts, model.top_k, skew=0.5, seed=seed)
    small = type(model)(**{**model.to_dict(), "num_moe_layers": 1})
    return routing_for(small, num_tokens, seed=seed)[:, 0, :]


_COMPONENTS = (  # (label, substring of the function's file or name), first match wins
    ("engine core (claims, deps)", "engine/core.py"), ("NVLink fabric", "engine/hardware.py"),
    ("DAG build", "engine/dag.py"), ("metrics", "engine/metrics.py"), ("SimPy event loop", "simpy"),
    ("heapq", "heapq"), ("numpy", "numpy"),
)


def _by_component(stats: pstats.Stats) -> dict[str, float]:
    out: dict[str, float] = {}
    for (path, _line, func), (_cc, _nc, tottime, _ct, _callers) in stats.stats.items():
        label = next((lab for lab, key in _COMPONENTS if key in path or key in func), "other")
        out[label] = out.get(label, 0.0) + tottime
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="deepseek-v3")
    ap.add_argument("--gpus", type=int, default=8)
    ap.add_argument("--tokens-per-gpu", type=int, default=8192)
    ap.add_argument("--policies", nargs="+", default=["weave", "static:20"])
    ap.add_argument("--profile-top", type=int, default=15, help="cProfile rows to print (0: none)")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)
    model, prof = get_model(args.model), load_profile("h200")
    t0 = time.perf_counter()
    ids = _routing(model, args.gpus * args.tokens_per_gpu, args.seed)
    w = layer_workload(ids, model, contiguous(model.num_experts, args.gpus))
    t_setup = time.perf_counter() - t0
    print(f"# engine benchmark: {model.name}, {args.gpus} GPUs x {args.tokens_per_gpu} tokens, top-{model.top_k},"
          f" profile {prof.name}; python {platform.python_version()} on {platform.machine()}")
    print(f"# routing + workload: {t_setup:.2f} s (not counted below)")
    print(f"{'policy':>12} {'wall s':>8} {'tasks':>8} {'events':>8} {'events/s':>10} {'latency us':>11}")
    for spec in args.policies:
        t0 = time.perf_counter()
        r = simulate_layer(w, prof, spec, seed=args.seed)
        wall = time.perf_counter() - t0
        print(f"{spec:>12} {wall:>8.3f} {r.num_tasks:>8} {r.num_events:>8} {r.num_events / wall:>10.0f}"
              f" {r.latency_ns / 1e3:>11.1f}")
    if args.profile_top:
        pr = cProfile.Profile()
        pr.enable()
        simulate_layer(w, prof, args.policies[0], seed=args.seed)
        pr.disable()
        stats = pstats.Stats(pr)
        print(f"# where the time of {args.policies[0]} goes (cProfile own time by component, s)")
        for part, secs in sorted(_by_component(stats).items(), key=lambda kv: -kv[1]):
            print(f"{part:>34} {secs:8.3f}")
        out = io.StringIO()
        pstats.Stats(pr, stream=out).sort_stats("tottime").print_stats(args.profile_top)
        print(out.getvalue())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

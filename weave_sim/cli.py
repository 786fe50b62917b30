"""`weave-sim`: the simulator's command line.

Commands: models, trace (stats/generate/convert), costmodel, simulate, sweep. Each prints a table and
writes JSON (results plus the resolved configuration) under --out.
"""
from __future__ import annotations

import argparse
import sys
import time

import numpy as np

from . import costmodel as cm
from .config import add_run_arguments, config_from_args, resolve
from .presets import PRESETS, WEAVE_EVAL_MODELS
from .report import format_table, write_json
from .workload import model_workloads


def cmd_models(args: argparse.Namespace) -> int:
    rows = [
        [m.name, m.num_experts, m.top_k, m.hidden_size, m.expert_ffn_size, m.num_shared_experts, m.num_moe_layers,
         "yes" if m.name in WEAVE_EVAL_MODELS else ""]
        for m in PRESETS.values()
    ]
    print(format_table(["model", "experts", "top_k", "hidden", "ffn", "shared", "layers", "weave-eval"], rows))
    return 0


def analytic_table(res) -> tuple[list[str], list[list], dict]:
    """Per-layer analytic choice: c* and K* per GPU, predicted time, static:20, sequential, lower bound."""
    t0 = time.perf_counter()
    vol = cm.Volumes.from_workloads(model_workloads(res.routing, res.model, res.placement), res.profile)
    choice = cm.choose(vol, res.profile)
    decide_s = time.perf_counter() - t0
    static20 = cm.static_time_ns(vol, res.profile, 20).max(axis=1)
    seq = cm.sequential_time_ns(vol, res.profile).max(axis=1)
    lb = choice.lower_bound_ns.max(axis=1)
    weave = choice.layer_time_ns()
    rows = []
    for i, layer in enumerate(res.layer_ids):
        rows.append([
            int(layer), ",".join(map(str, choice.num_comm_sms[i])), ",".join(map(str, choice.num_chunks[i])),
            weave[i] / 1e3, static20[i] / 1e3, seq[i] / 1e3, lb[i] / 1e3, lb[i] / weave[i],
        ])
    headers = ["layer", "c* per GPU", "K* per GPU", "weave us", "static:20 us", "sequential us", "bound us", "bound/weave"]
    payload = {
        "layers": res.layer_ids, "comm_sms": choice.num_comm_sms, "chunks": choice.num_chunks,
        "time_ns": choice.time_ns, "lower_bound_ns": choice.lower_bound_ns, "static20_ns": static20,
        "sequential_ns": seq, "decision_seconds": decide_s,
        "totals_us": {"weave": weave.sum() / 1e3, "static:20": static20.sum() / 1e3,
                      "sequential": seq.sum() / 1e3, "bound": lb.sum() / 1e3},
    }
    return headers, rows, payload


def cmd_costmodel(args: argparse.Namespace) -> int:
    res = resolve(config_from_args(args))
    headers, rows, payload = analytic_table(res)
    title = (f"analytic cost model: {res.model.name}, {res.placement.num_gpus} GPUs x {res.config.tokens_per_gpu} tokens, "
             f"profile {res.profile.name}, routing {res.routing_source}")
    print(format_table(headers, rows, title))
    t = payload["totals_us"]
    print(f"total over layers: weave {t['weave']:.1f} us, static:20 {t['static:20']:.1f} us, "
          f"sequential {t['sequential']:.1f} us, bound {t['bound']:.1f} us; decision took {payload['decision_seconds']*1e3:.1f} ms")
    path = write_json(res.config.out / "costmodel.json", {"config": res.describe(), "results": payload})
    print(f"wrote {path}")
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="weave-sim", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("models", help="list model presets").set_defaults(func=cmd_models)
    p = sub.add_parser("costmodel", help="per-layer (c*, K*) choice of the analytic cost model")
    add_run_arguments(p)
    p.set_defaults(func=cmd_costmodel)
    _add_optional_commands(sub)
    return parser


def _add_optional_commands(sub) -> None:
    """Commands that live beside their subsystems (traces, engine)."""
    from .simcli import add_sim_commands
    from .traces.cli import add_trace_commands

    add_trace_commands(sub)
    add_sim_commands(sub)


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return args.func(args)
    except BrokenPipeError:  # output piped into `head` and friends
        sys.stderr.close()
        return 0
    except (ValueError, KeyError, FileNotFoundError) as exc:
        msg = exc.args[0] if isinstance(exc, KeyError) and exc.args else exc
        print(f"weave-sim {args.command}: error: {msg}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())

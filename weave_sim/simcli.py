"""`weave-sim simulate` and `weave-sim sweep`."""
from __future__ import annotations

import argparse

from .config import add_run_arguments, config_from_args, resolve
from .report import format_table, write_json


def cmd_simulate(args: argparse.Namespace) -> int:
    from .cli import analytic_table

    res = resolve(config_from_args(args))
    headers, rows, payload = analytic_table(res)
    print(format_table(headers, rows, f"{res.model.name}: analytic model (engine pending), routing {res.routing_source}"))
    path = write_json(res.config.out / "simulate.json", {"config": res.describe(), "results": payload})
    print(f"wrote {path}")
    return 0


def add_sim_commands(sub) -> None:
    p = sub.add_parser("simulate", help="simulate every MoE layer of a model under one policy")
    add_run_arguments(p)
    p.set_defaults(func=cmd_simulate)

"""Add the exchanged counts to a kernel benchmark file that predates them, so `weave-sim validate` can read it.

The benchmark's routing is a pure function of its config (seed and routing spec: weave_kernel.routing.result_routing),
so the counts each call exchanged can be rebuilt exactly:

    python -m weave_kernel.recount OLD.json NEW.json
"""
from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np

from weave_sim.jsonfile import read_json
from weave_sim.validate import result_placement

from .routing import result_routing


def counts_for(result: dict, cfg: dict) -> dict:
    """Counts of one benchmark result: pairs per (source rank, expert) and, since this kernel dispatches one
    row per (token, expert) pair, dispatch rows per (source, destination) counted in pairs."""
    world, n, experts = result["gpus"], result["tokens_per_gpu"], result["experts"]
    owner = result_placement(result).owner
    pairs = np.zeros((world, experts), dtype=np.int64)
    for rank in range(world):
        ids, _ = result_routing(cfg, result, rank)
        pairs[rank] = np.bincount(ids.ravel(), minlength=experts)
    rows = np.stack([np.bincount(owner, weights=pairs[s], minlength=world) for s in range(world)]).astype(np.int64)
    return {"source_expert_pairs": pairs.tolist(), "dispatch_rows": rows.tolist(),
            "tokens_per_gpu": [n] * world, "dispatch_rows_kind": "pairs"}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("src", help="kernel benchmark JSON (python -m weave_kernel.bench)")
    ap.add_argument("dst", help="the same with the counts added")
    args = ap.parse_args(argv)
    try:
        data = read_json(args.src, "kernel benchmark results")
    except ValueError as exc:
        ap.error(str(exc))
    if not isinstance(data, dict) or not isinstance(data.get("results"), list):
        ap.error(f"{args.src} is not a kernel benchmark file (python -m weave_kernel.bench writes one: 'results')")
    cfg = data.get("config", {})
    try:
        for r in data["results"]:
            r["counts"] = counts_for(r, cfg)
    except (KeyError, TypeError, ValueError) as exc:
        ap.error(f"{args.src}: cannot rebuild the counts of a result: {exc!r}")
    try:
        Path(args.dst).write_text(json.dumps(data, indent=1))
    except OSError as exc:
        ap.error(f"cannot write {args.dst}: {exc}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

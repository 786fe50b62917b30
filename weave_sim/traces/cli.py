"""`weave-sim trace ...`: stats, generate and convert. `weave_sim/cli.py` mounts these with

    add_trace_commands(subparsers)      # then: args = parser.parse_args(); return args.func(args)

Every subcommand sets `func` to a handler taking the parsed args and returning an exit code; a
TraceError, ValueError or OSError (e.g. an output path that is a folder) becomes a one-line message on stderr and
exit code 2.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np

from weave_sim.presets import PRESETS, SPEC_HELP, get_model
from weave_sim.report import write_text
from weave_sim.traces.format import (NPZ_READ_ERRORS, RoutingTrace, TraceError, choose_model, load_trace,
                                     open_numpy_file, parse_metadata, save_trace, validate_trace)
from weave_sim.traces.generators import GENERATORS, generate
from weave_sim.traces.stats import format_stats_table, trace_stats


def add_trace_commands(subparsers) -> argparse.ArgumentParser:
    """Add `trace {stats,generate,convert}` to an argparse subparsers object; returns the `trace` parser."""
    trace = subparsers.add_parser("trace", help="routing traces: statistics, synthetic generation, conversion")
    commands = trace.add_subparsers(dest="trace_command", metavar="{stats,generate,convert}", required=True)

    stats = commands.add_parser("stats", help="per-layer expert-load imbalance of a trace file")
    stats.add_argument("file", type=Path, help="trace in the interchange format (.npz)")
    stats.add_argument("--model", help="model (preset or spec), if the file's metadata has none")
    stats.add_argument("--json", type=Path, metavar="OUT", help="also write the statistics as JSON")
    stats.set_defaults(func=_guarded(cmd_stats))

    gen = commands.add_parser("generate", help="write a seeded synthetic trace for a model")
    gen.add_argument("--kind", required=True, choices=sorted(GENERATORS), help="generator")
    gen.add_argument("--model", required=True, help=f"model geometry: a preset ({', '.join(PRESETS)}) or a spec {SPEC_HELP}")
    gen.add_argument("--tokens", type=int, required=True, help="number of tokens")
    gen.add_argument("--seed", type=int, default=0, help="random seed (default 0)")
    gen.add_argument("-o", "--output", type=Path, required=True, help="output .npz")
    gen.add_argument("-p", "--param", action="append", default=[], metavar="KEY=VALUE",
                     help="generator parameter, repeatable, e.g. -p s=1.1 or -p imbalance=2.5 "
                          "(values parsed as JSON when possible, e.g. -p 'alpha=[1,2]')")
    gen.set_defaults(func=_guarded(cmd_generate))

    conv = commands.add_parser("convert", help="rewrite an npz or .npy of topk_ids in the interchange format")
    conv.add_argument("input", type=Path, help=".npz with topk_ids (other keys dropped) or .npy of topk_ids")
    conv.add_argument("-o", "--output", type=Path, required=True, help="output .npz")
    conv.add_argument("--model", help="model, preset or spec (required unless the metadata names it)")
    conv.add_argument("--source", help="where the data comes from (metadata 'source')")
    conv.add_argument("--license", help="its license (metadata 'license')")
    conv.set_defaults(func=_guarded(cmd_convert))
    return trace


def _guarded(handler):
    def run(args) -> int:
        try:
            return handler(args)
        except (TraceError, ValueError, KeyError) as exc:
            print(f"weave-sim trace {args.trace_command}: error: {exc}", file=sys.stderr)
            return 2
        except OSError as exc:  # report.OutputError names the file; others: the file and the reason
            where = "" if exc.filename is None or exc.strerror is None else f"{exc.filename}: "
            print(f"weave-sim trace {args.trace_command}: error: {where}{exc.strerror or exc}", file=sys.stderr)
            return 2
    run.__name__ = handler.__name__
    run.__doc__ = handler.__doc__
    return run


def cmd_stats(args) -> int:
    """Print the per-layer table; with --json also write trace_stats' dict."""
    trace = load_trace(args.file, model=args.model)
    stats = trace_stats(trace)
    print(format_stats_table(stats))
    if args.json is not None:
        stats = {"file": str(args.file), **stats}
        write_text(args.json, json.dumps(stats, indent=2, allow_nan=True) + "\n", "statistics file")
    return 0


def parse_params(pairs) -> dict:
    """["s=1.2", "profile=mixtral-8x7b", "alpha=[1,2]"] -> {"s": 1.2, ...}; JSON values, else strings."""
    params = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key:
            raise ValueError(f"parameter {pair!r} is not KEY=VALUE")
        try:
            params[key] = json.loads(value)
        except json.JSONDecodeError:
            params[key] = value
    return params


def cmd_generate(args) -> int:
    """Write `generate(kind, model geometry, tokens, seed, params)` with metadata model set."""
    preset = get_model(args.model)
    trace = generate(args.kind, num_experts=preset.num_experts, top_k=preset.top_k,
                     num_layers=preset.num_moe_layers, num_tokens=args.tokens, seed=args.seed,
                     **parse_params(args.param))
    save_trace(args.output, trace.with_metadata(model=preset.name))
    print(f"wrote {args.output}: {args.kind} routing of {args.tokens} tokens for {preset.name} "
          f"({preset.num_moe_layers} layers, top-{preset.top_k} of {preset.num_experts}), seed {args.seed}")
    return 0


def _read_any(path: Path) -> tuple[dict, dict]:
    """Arrays and metadata of an npz (interchange keys only) or of a .npy holding topk_ids."""
    data = open_numpy_file(path, "input", ".npz or .npy file")
    if isinstance(data, np.ndarray):
        return {"topk_ids": data}, {}
    try:
        with data:
            arrays = {k: data[k] for k in ("topk_ids", "topk_probs", "request_id", "position") if k in data.files}
            dropped = sorted(set(data.files) - set(arrays) - {"metadata"})
            raw_meta = data["metadata"] if "metadata" in data.files else None
    except NPZ_READ_ERRORS as exc:  # a damaged member: bad CRC, a broken deflate stream, a truncated array
        raise TraceError(f"{path}: not a readable npz file ({exc})") from None
    meta = parse_metadata(raw_meta, f"{path}: ")
    if dropped:
        meta["dropped_keys"] = dropped
    return arrays, meta


def cmd_convert(args) -> int:
    """Validate the input against the model and write it in the interchange format."""
    arrays, meta = _read_any(args.input)
    if "topk_ids" not in arrays:
        raise TraceError(f"{args.input}: missing required key 'topk_ids'")
    preset = choose_model(meta.get("model"), args.model, f"{args.input}: ")
    meta.update({"model": preset.name, "converted_from": args.input.name})
    if args.source:
        meta["source"] = args.source
    if args.license:
        meta["license"] = args.license
    trace = RoutingTrace(arrays["topk_ids"], arrays.get("topk_probs"), arrays.get("request_id"),
                         arrays.get("position"), meta)
    validate_trace(trace, preset, f"{args.input}: ")
    save_trace(args.output, trace)
    dropped = f"; dropped keys {', '.join(meta['dropped_keys'])}" if meta.get("dropped_keys") else ""
    print(f"wrote {args.output}: {trace.num_tokens} tokens, {trace.num_layers} layers, top-{trace.top_k}, "
          f"model {preset.name}{dropped}")
    return 0

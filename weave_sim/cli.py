"""`weave-sim`: the simulator's command line.

Commands: models, trace (stats/generate/convert), costmodel, simulate, sweep, validate, calibrate,
timeline-stats. Each prints a table and
writes JSON (results plus the resolved configuration) under --out.
"""
from __future__ import annotations

import argparse
import json
import sys
import textwrap
import time
from pathlib import Path


from . import costmodel as cm
from .config import DEFAULT_OUT, add_run_arguments, config_from_args, resolve
from .presets import PRESETS, SPEC_HELP, WEAVE_EVAL_MODELS
from .report import check_output_dir, check_output_file, format_table, write_json, write_text
from .benchfile import TIMINGS
from .workload import model_workloads


def pct(v) -> str:
    """A fraction as a percentage with one decimal, '-' for None (the tables of validate and calibrate --fp8)."""
    return "-" if v is None else f"{100 * v:.1f}%"


def cmd_models(args: argparse.Namespace) -> int:
    rows = [
        [m.name, m.num_experts, m.top_k, m.hidden_size, m.expert_ffn_size, m.num_shared_experts, m.num_moe_layers,
         "yes" if m.name in WEAVE_EVAL_MODELS else ""]
        for m in PRESETS.values()
    ]
    print(format_table(["model", "experts", "top_k", "hidden", "ffn", "shared", "layers", "weave-eval"], rows))
    print("\nweave-eval: one of the six models of the Weave paper's evaluation (the kernel benchmark's defaults).")
    print(textwrap.fill(f"Any --model / --models flag also takes a spec: {SPEC_HELP}.", 110))
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
    title = (f"analytic cost model: {res.model.name}, {res.config.num_gpus} GPUs x {res.config.tokens_per_gpu} tokens, "
             f"profile {res.profile.name}, routing {res.routing_source}")
    print(format_table(headers, rows, title))
    t = payload["totals_us"]
    print(f"total over layers: weave {t['weave']:.1f} us, static:20 {t['static:20']:.1f} us, "
          f"sequential {t['sequential']:.1f} us, bound {t['bound']:.1f} us; decision took {payload['decision_seconds']*1e3:.1f} ms")
    path = write_json(res.config.out / "costmodel.json", {"config": res.describe(), "results": payload})
    print(f"wrote {path}")
    return 0


def cmd_validate(args: argparse.Namespace) -> int:
    from .profile import load_profile
    from .benchfile import read_bench
    from .validate import dispatch_warning, errors_by_policy, kernel_sources_warning, summarize, validate_file

    if args.workers < 1:
        raise ValueError(f"--workers must be >= 1, got {args.workers}")
    profile = load_profile(args.profile)
    bench = read_bench(args.results, args.timing)
    rows = validate_file(args.results, profile, seed=args.seed,
                         trace_dir=args.out / "traces" if args.traces else None, workers=args.workers, data=bench)
    warnings = [w for w in (kernel_sources_warning(bench, profile), dispatch_warning(bench, profile)) if w]
    for w in warnings:
        print(f"warning: {w}")
    table = []
    for r in rows:
        for pol, meas in r.measured_ms.items():
            pred = r.predicted_ms.get(pol)
            table.append([r.label, r.tokens_per_gpu, pol, meas * 1e3, "-" if pred is None else pred * 1e3,
                          "-" if pred is None else f"{100 * (pred - meas) / meas:+.1f}%"])
    print(format_table(["model", "tokens/GPU", "policy", "measured us", "predicted us", "error"], table,
                       f"simulator (profile {args.profile}) vs kernel measurements in {args.results}"))

    gains = [[r.label, r.tokens_per_gpu, pct(r.regret_static), pct(r.regret_weave),
              "-" if r.gain_predicted is None else r.gain_predicted, "-" if r.gain_measured is None else r.gain_measured]
             for r in rows]
    print(format_table(["model", "tokens/GPU", "regret: sim's static pick", "regret: kernel's c*",
                        "weave gain predicted", "measured"], gains))
    clocks = [[r.label, r.tokens_per_gpu,
               "-" if not r.measured_mhz else "/".join(f"{m:.0f}" if m else "?" for m in r.measured_mhz),
               "/".join(f"{min(v[g] for v in r.predicted_mhz.values()):.0f}-{max(v[g] for v in r.predicted_mhz.values()):.0f}"
                        for g in range(r.gpus))]
              for r in rows if r.predicted_mhz]
    if clocks:
        print(format_table(["model", "tokens/GPU", "measured SM MHz per GPU", "predicted MHz per GPU (over policies)"],
                           clocks, "SM clock: the benchmark's reading (all policies of a configuration) and the "
                                   "power model's (docs/power.md)"))
    for r in rows:
        for note in r.notes:
            print(f"note: {r.label}/{r.tokens_per_gpu}: {note}")
    by_policy = errors_by_policy(rows)
    if by_policy:
        print(format_table(["policy", "points", "median |error|", "worst |error|", "median error", "over 15%"],
                           [[p, v["points"], pct(v["median_abs_error"]), pct(v["worst_abs_error"]),
                             f"{100 * v['median_error']:+.1f}%", v["points_over_15pct"]] for p, v in by_policy.items()],
                           "prediction error by policy (+ = predicted slower than measured)"))
    summary = summarize(rows)
    print("summary: " + ", ".join(f"{k} {v:.3f}" if isinstance(v, float) else f"{k} {'n/a' if v is None else v}"
                                  for k, v in summary.items()))
    path = write_json(args.out / "validate.json", {"config": {k: v for k, v in vars(args).items() if not callable(v)}, "summary": summary,
                                                   "by_policy": by_policy, "warnings": warnings,
                                                   "configs": [r.to_dict() for r in rows]})
    print(f"wrote {path}")
    return 0


def cmd_timeline_stats(args: argparse.Namespace) -> int:
    from .timeline_stats import busy_stats

    kinds = ["count_exchange", "choose", "dispatch", "gemm0", "gemm1", "combine", "reduce", "wait"]
    rows, stats = [], []
    for path in args.traces:
        for gpu, st in busy_stats(path, args.sms, args.start_kind).items():
            stats.append((path, gpu, st))
    shared = any(st["shared_expert_us"] > 0 for _, _, st in stats)  # a column only when a trace has such tiles
    for path, gpu, st in stats:
        area = st["span_us"] * st["num_sms"]
        share = [st["work_us_by_kind"].get(k, 0.0) / area for k in kinds]
        rows.append([path.name, gpu, st["span_us"], f"{100 * st['busy_fraction']:.1f}%",
                     *[f"{100 * x:.1f}%" for x in share]] + ([f"{100 * st['shared_expert_us'] / area:.1f}%"]
                                                              if shared else []))
    print(format_table(["trace", "GPU", "span us", "busy", *kinds] + (["of which shared"] if shared else []), rows,
                       "share of SM time (span x SMs) per task kind; busy excludes waits"
                       + ("; 'of which shared': the shared expert's gemm0 + gemm1 tiles" if shared else "")
                       + (f"; window from each GPU's last {args.start_kind}" if args.start_kind else "")))
    return 0


def cmd_calibrate(args: argparse.Namespace) -> int:
    from .calibrate import amend_decision, calibrate_file, fit_profile

    if args.timing != "bench" and args.fit is None and args.fp8 is None and args.half_tiles is None:
        raise ValueError("--timing applies to fits of kernel benchmarks: --fit BENCH.json, --fp8 BF16.json:FP8.json "
                         "or --half-tiles BENCH.json")
    if args.fp8 is not None and args.amend is None:
        raise ValueError("--fp8 fits the FP8 tile factor of an existing profile: give it with --amend PROFILE")
    if args.half_tiles is not None:
        if args.amend is None or args.measurements is not None or args.fit is not None or args.fp8 or args.decision:
            raise ValueError("--half-tiles BENCH.json fits the half tiles' cost of an existing profile: give it with "
                             "--amend PROFILE alone (no measurements file, --fit, --fp8 or --decision)")
        from .calibrate import amend_half_tile

        prof = amend_half_tile(args.amend, args.half_tiles, args.output, name=args.name, timing=args.timing,
                               workers=args.workers)
        print(f"wrote profile {prof['name']} version {prof['version']} to {args.output}")
        return 0
    if args.amend is not None:
        if (args.measurements is not None or args.fit is not None or args.piece_cost
                or bool(args.decision) == bool(args.fp8)):
            raise ValueError("--amend PROFILE takes either --decision TRACE... or --fp8 BF16.json:FP8.json... (no "
                             "measurements file, --fit or --piece-cost)")
        if args.fp8:
            from .calibrate.fp8 import amend_fp8, parse_pairs

            prof = amend_fp8(args.amend, parse_pairs(args.fp8), args.output, name=args.name,
                             fixed_scale=args.fp8_fixed_scale, workers=max(1, args.workers), timing=args.timing)
            fit = prof["calibration"]["fp8_from"]
            prev = fit["previous"]
            print(f"wrote profile {prof['name']} version {prof['version']} to {args.output}: FP8 tiles x{fit['scale']:g}"
                  + ("" if fit["fixed_scale"] is None else f", their fixed cost x{fit['fixed_scale']:g}")
                  + f", over {fit['points']} points")
            print(format_table(
                ["FP8 factors", "gain error median", "median |.|", "worst |.|", "FP8 latency median |err|", "worst"],
                [[f"x{f['scale']:g}" + ("" if f["fixed_scale"] is None else f" / fixed x{f['fixed_scale']:g}")
                  + (" (before)" if f is prev else ""),
                  f"{100 * f['median_gain_error']:+.1f}%", pct(f["median_abs_gain_error"]),
                  pct(f["worst_abs_gain_error"]), pct(f["median_abs_fp8_latency_error"]),
                  pct(f["worst_abs_fp8_latency_error"])] for f in (prev, fit)],
                "simulated against measured FP8 gain t(bf16) / t(FP8), + = the simulator expects more"))
            return 0
        prof = amend_decision(args.amend, args.decision, args.output, name=args.name)
        print(f"wrote profile {prof['name']} version {prof['version']} to {args.output}: decision "
              f"{prof['fixed_ns']['decision']} ns from {prof['calibration']['decision_from']['records']} choose records")
        return 0
    if (args.measurements is None) == (args.fit is None):
        raise ValueError("give either a measurements file or --fit BENCH.json (or --amend PROFILE --decision TRACE...)")
    if args.fit is None and args.gemm_concurrency not in (None, "-"):
        raise ValueError("--gemm-concurrency takes a file only with --fit (else the curve comes from the measurements)")
    if args.fit is not None and args.gemm_concurrency == "-":
        raise ValueError("with --fit, --gemm-concurrency needs the measurements file to take the curve from")
    if args.fit is not None and args.gemm_k == "-":
        raise ValueError("with --fit, --gemm-k needs the file with the tiles timed at several K")
    if args.fit is not None and args.params_from is not None:
        raise ValueError("--params-from applies an earlier fit to measurements; --fit makes a new one: not both")
    if args.fit is not None:
        policies = args.policies.split(",") if args.policies else None
        kw = {"params": tuple(args.fit_params.split(","))} if args.fit_params else {}
        prof = fit_profile(args.fit, base=args.base, name=args.name, policies=policies, min_tokens=args.min_tokens,
                           power_path=args.power, power=not args.no_power, hbm_power=not args.no_hbm_power,
                           workers=args.workers, concurrency_path=args.gemm_concurrency, k_fixed_path=args.gemm_k,
                           decision_traces=args.decision, piece_cost=args.piece_cost, timing=args.timing, **kw)
        write_text(args.output, json.dumps(prof, indent=1), "profile")
    else:
        prof = calibrate_file(args.measurements, args.output, base=args.base, name=args.name, power_path=args.power,
                              power=not args.no_power, hbm_power=not args.no_hbm_power,
                              concurrency=args.gemm_concurrency is not None, k_fixed_path=args.gemm_k,
                              params_from=args.params_from, decision_traces=args.decision,
                              piece_cost=args.piece_cost)
    print(f"wrote profile {prof['name']} version {prof['version']} to {args.output}\n{prof['source']}")
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="weave-sim", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("models", help="list model presets").set_defaults(func=cmd_models)
    p = sub.add_parser("costmodel", help="per-layer (c*, K*) choice of the analytic cost model")
    add_run_arguments(p)
    p.set_defaults(func=cmd_costmodel)
    p = sub.add_parser("validate", help="simulator predictions vs measured kernel benchmark results")
    p.add_argument("results", type=Path, help="JSON written by python -m weave_kernel.bench")
    p.add_argument("--profile", default="h200",
                   help="hardware profile name or JSON path (default h200; the kernel's fitted ones: h200-megakernel*)")
    p.add_argument("--seed", type=int, default=0, help="seed of the engine's optional jitter (default 0)")
    p.add_argument("--traces", action="store_true", help="write the simulated Chrome trace of each weave run")
    p.add_argument("--workers", type=int, default=1, help="simulate the results in this many processes")
    p.add_argument("--timing", choices=TIMINGS, default="bench",
                   help="the measured times to compare with: bench (each call timed alone, the default) or sustained "
                        "(the results' sustained_ms, from bench --sustained S: the clock a stream of layers holds)")
    p.add_argument("--out", type=Path, default=DEFAULT_OUT, help=f"folder for validate.json (default {DEFAULT_OUT})")
    p.set_defaults(func=cmd_validate)
    p = sub.add_parser("timeline-stats", help="busy SM time by kind from Chrome traces (simulated or measured)")
    p.add_argument("traces", type=Path, nargs="+")
    p.add_argument("--sms", type=int, default=None, help="SMs per GPU (default: highest SM index seen + 1)")
    p.add_argument("--from", dest="start_kind", default=None, metavar="KIND",
                   help="start each GPU's window at its SMs' last KIND event (count_exchange: leave out the wait "
                        "for ranks that entered the layer later)")
    p.set_defaults(func=cmd_timeline_stats)
    p = sub.add_parser("calibrate", help="microbenchmark measurements, or kernel latencies (--fit), -> hardware profile")
    p.add_argument("measurements", type=Path, nargs="?", help="measurements JSON (format in weave_sim/calibrate/__init__.py)")
    p.add_argument("--power", type=Path, default=None,
                   help="take the power block (sustained GEMM, clock, board power) from this measurements file "
                        "(with --fit: add it to the base profile before fitting)")
    p.add_argument("--no-power", action="store_true",
                   help="a fixed-clock profile: leave out the measured power block (and the base's; with --fit: fit "
                        "without the power model, as the kernel's cost table assumes)")
    p.add_argument("--no-hbm-power", action="store_true",
                   help="keep the power model but leave out its HBM term (W per TB/s; differs between boards, "
                        "docs/power.md)")
    p.add_argument("--gemm-concurrency", nargs="?", const="-", default=None, metavar="MEASUREMENTS",
                   help="also the GEMM rate's dependence on how many SMs compute at once (gemm.scale_by_ctas, from "
                        "the GEMM points of >= 1024 rows per expert; with --fit: of this measurements file, added to "
                        "the base before fitting); the engine then times each tile by the SMs running tiles when it "
                        "starts")
    p.add_argument("--gemm-k", nargs="?", const="-", default=None, metavar="MEASUREMENTS",
                   help="also a tile's fixed cost, the part of its time that does not grow with K (gemm.k_fixed, "
                        "from tiles timed at several K: the measurements' gemm_by_k, or this file's, e.g. "
                        "tests/kernel/tile_k_probe.py's; with --fit the file is required and goes into the base)")
    p.add_argument("--fit", type=Path, default=None, help="fit GEMM rate, push rate and fixed cost to a kernel bench JSON")
    p.add_argument("--fit-params", default=None,
                   help="with --fit: comma-separated parameters (default gemm_scale,push_scale,fixed_us,barrier_us; "
                        "add tile_ns to fit a fixed cost per GEMM tile, piece_ns one per kernel dispatch piece, "
                        "conc_exp a power on the base's gemm.scale_by_ctas, power_scale a factor on the power model's W per "
                        "TFLOP/s; leave one out to keep the base's value, "
                        "e.g. push_scale on one GPU)")
    p.add_argument("--params-from", default=None, metavar="PROFILE",
                   help="with measurements: apply this fitted profile's in-layer factors (GEMM rate and push scales, "
                        "fixed costs) to the result instead of refitting, e.g. for the push curve of another "
                        "dispatch mode measured beside the kernel runs (docs/calibration.md)")
    p.add_argument("--decision", type=Path, nargs="+", default=None, metavar="TRACE",
                   help="the cost of weave's in-kernel choice (fixed_ns.decision): the median of the choose records "
                        "in these Chrome traces of weave calls (bench --trace ... --trace-policy weave)")
    p.add_argument("--piece-cost", type=Path, default=None, metavar="FILE",
                   help="the fixed cost of one dispatch piece (fixed_ns.dispatch_piece) from python -m "
                        "weave_kernel.piece_cost --out FILE (a fit of measured traces' dispatch records)")
    p.add_argument("--amend", default=None, metavar="PROFILE",
                   help="with --decision: this existing profile with the measured decision cost (refused for a "
                        "profile fitted to weave latencies, which must be refitted); with --fp8: with its FP8 tile "
                        "factor fitted")
    p.add_argument("--fp8", nargs="+", default=None, metavar="BF16.json:FP8.json",
                   help="with --amend: fit the profile's FP8 tile factor (gemm.fp8_scale) to pairs of kernel "
                        "benchmarks of the same configurations with bf16 and with FP8 experts, run the same way: the "
                        "factor at which the simulated FP8 gain t(bf16) / t(FP8) matches the measured one at the median "
                        "(weave_sim/calibrate/fp8.py)")
    p.add_argument("--half-tiles", type=Path, default=None, metavar="BENCH.json",
                   help="with --amend: fit what a half tile costs as a fraction of a whole one (gemm.half_tile_cost, "
                        "0.5 to 1) to the results of this kernel benchmark that ran half tiles (kernel_layout "
                        "expert-packed-half); results of FP8 experts fit gemm.fp8_half_tile_cost instead; "
                        "--timing sustained fits its sustained times")
    p.add_argument("--fp8-fixed-scale", type=float, default=1.0,
                   help="with --fp8: the factor on a tile's fixed cost (gemm.k_fixed) for FP8 tiles (default 1: it "
                        "does not speed up with the MMAs)")
    p.add_argument("--min-tokens", type=int, default=0, help="with --fit: only configurations with this many tokens per GPU")
    p.add_argument("--timing", choices=TIMINGS, default="bench",
                   help="with --fit or --fp8: fit the benchmarks' bench timings (default) or their sustained ones "
                        "(sustained_ms, from bench --sustained S)")
    p.add_argument("--policies", default=None, help="with --fit: comma-separated kernel policies to fit (default all)")
    p.add_argument("--workers", type=int, default=0,
                   help="with --fit: processes that simulate the points (default 0: one per CPU; the fit is the same)")
    p.add_argument("-o", "--output", type=Path, required=True, help="profile JSON to write")
    p.add_argument("--base", default="h200", help="profile supplying what was not measured")
    p.add_argument("--name", default=None)
    p.set_defaults(func=cmd_calibrate)
    _add_optional_commands(sub)
    return parser


def _add_optional_commands(sub) -> None:
    """Commands that live beside their subsystems (traces, engine)."""
    from .simcli import add_sim_commands
    from .traces.cli import add_trace_commands

    add_trace_commands(sub)
    add_sim_commands(sub)


def check_outputs(args: argparse.Namespace) -> None:
    """Fail before a command's work when where it would write is unusable: its --out folder (simulate, sweep,
    costmodel, validate) an existing file, or its output file (-o, --json) an existing folder (report.OutputError)."""
    if isinstance(getattr(args, "out", None), Path):
        check_output_dir(args.out, "--out folder")
    for attr in ("output", "json"):
        if isinstance(getattr(args, attr, None), Path):
            check_output_file(getattr(args, attr), "output file")


def _os_error(exc: OSError) -> str:
    """An OSError as one line naming the file: report.OutputError's own message, else "<file>: <reason>"."""
    if exc.strerror is None or exc.filename is None:
        return str(exc)
    files = str(exc.filename) + ("" if exc.filename2 is None else f" -> {exc.filename2}")
    return f"{files}: {exc.strerror}"


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    name = " ".join(str(x) for x in (args.command, getattr(args, "trace_command", None)) if x)
    try:
        check_outputs(args)
        return args.func(args)
    except BrokenPipeError:  # output piped into `head` and friends
        sys.stderr.close()
        return 0
    except (ValueError, KeyError) as exc:
        msg = exc.args[0] if isinstance(exc, KeyError) and exc.args else exc
        print(f"weave-sim {name}: error: {msg}", file=sys.stderr)
        return 2
    except OSError as exc:  # FileNotFoundError, IsADirectoryError, PermissionError, a full disk, ...
        print(f"weave-sim {name}: error: {_os_error(exc)}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())

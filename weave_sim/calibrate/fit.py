"""Profiles fitted to measured kernel latencies (weave-sim calibrate --fit): a few in-layer factors on top of the
calibrated curves (scaled_profile), chosen to minimise the mean |log(predicted / measured)| over a benchmark's
points (fit_error, simulated in parallel by a FitPool), and an earlier fit's factors applied to a new calibration
(apply_fit)."""
from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np

from ..benchfile import bench_kernel_sources
from ..profile import load_profile, profile_from_dict
from .measured import (CONCURRENCY_NOTE, K_FIXED_NOTE, CalibrationError, _add_note, gemm_concurrency_curve,
                       gemm_k_fixed, power_model, read_measurements)
from .traces import decision_from_traces, read_piece_cost

FIT_PARAMS = ("gemm_scale", "push_scale", "fixed_us", "barrier_us")
OPTIONAL_FIT_PARAMS = ("tile_ns", "piece_ns", "conc_exp", "power_scale")  # fitted only when asked for (fit_profile(params=...), --fit-params)
_FIT_BOUNDS = {"gemm_scale": (0.2, 1.5), "push_scale": (0.1, 1.5), "fixed_us": (0.0, 600.0), "barrier_us": (0.0, 100.0),
               "tile_ns": (0.0, 5000.0), "piece_ns": (0.0, 20000.0), "conc_exp": (0.0, 1.5),
               "power_scale": (0.5, 3.0)}


def scaled_profile(base: dict, gemm_scale: float, push_scale: float, fixed_us: float,
                   barrier_us: float | None = None, tile_ns: float | None = None,
                   piece_ns: float | None = None, conc_exp: float | None = None,
                   power_scale: float | None = None) -> dict:
    """`base` with per-SM GEMM rates x gemm_scale, the push curve stretched so that c CTAs move what
    c * push_scale CTAs moved (the per-CTA rate scales, the link's plateau stays), the per-layer fixed
    cost of the count exchange set to fixed_us and (unless None) the cost of one grid barrier between the
    fused sequential policy's phases set to barrier_us: a separate number, so that what only the phased
    policy pays does not land in the fixed cost every policy pays. tile_ns (unless None): the fixed cost of every GEMM
    tile (the profile's task_claim: claim, pipeline fill and epilogue beyond the calibrated rate). piece_ns (unless
    None): the megakernel's cost per dispatch piece (fixed_ns "dispatch_piece"; the engine uses `signal` without it).
    conc_exp (unless None; needs the base's gemm.scale_by_ctas): that concurrency factor raised to this power, i.e.
    how much of the calibrated dependence on the number of computing SMs shows inside the layer (0: none).
    power_scale (unless None; needs the base's power model): the power model's watts per TFLOP/s times this, the
    energy per FLOP of a layer's work against the calibration GEMM's (a layer also runs epilogues, row copies and the
    reduction, and its board held lower clocks at the cap than the GEMM-fitted model gives; docs/results.md)."""
    prof = json.loads(json.dumps(base))
    gemm = prof["gemm"]
    gemm["per_sm_tflops_by_rows"] = {k: v * gemm_scale for k, v in gemm["per_sm_tflops_by_rows"].items()}
    gemm["peak_tflops"] = gemm["peak_tflops"] * min(gemm_scale, 1.0)
    nv = prof["nvlink"]
    ctas = np.array(sorted(int(c) for c in nv["push_gbs_by_ctas"]), dtype=np.float64)
    rates = np.array([nv["push_gbs_by_ctas"][str(int(c))] for c in ctas])
    stretched = np.interp(ctas * push_scale, np.concatenate([[0.0], ctas]), np.concatenate([[0.0], rates]))
    nv["push_gbs_by_ctas"] = {str(int(c)): float(r) for c, r in zip(ctas, np.maximum.accumulate(stretched))}
    prof["fixed_ns"]["count_exchange"] = int(round(fixed_us * 1e3))
    if barrier_us is not None:
        prof["fixed_ns"]["grid_barrier"] = int(round(barrier_us * 1e3))
    if tile_ns is not None:
        prof["fixed_ns"]["task_claim"] = int(round(tile_ns))
    if piece_ns is not None:
        prof["fixed_ns"]["dispatch_piece"] = int(round(piece_ns))
    if conc_exp is not None:
        if "scale_by_ctas" not in gemm:
            raise CalibrationError("conc_exp needs a base profile with gemm.scale_by_ctas (calibrate --gemm-concurrency)")
        gemm["scale_by_ctas"] = {k: float(v) ** conc_exp for k, v in gemm["scale_by_ctas"].items()}
    if power_scale is not None:
        if "power" not in prof:
            raise CalibrationError("power_scale needs a base profile with a power model")
        prof["power"]["w_per_tflops"] = float(prof["power"]["w_per_tflops"]) * power_scale
    return prof


def _result_logs(result: dict, prof, policies) -> list[float]:
    """|log(predicted / measured)| of one benchmark result's kernel policies (those in `policies`, or all)."""
    from ..validate import validate_result

    keep = dict(result)
    keep["latency_ms"] = {p: t for p, t in result["latency_ms"].items()
                          if p != "reference" and (policies is None or p in policies)}
    v = validate_result(keep, prof)
    return [abs(np.log(v.predicted_ms[p] / v.measured_ms[p])) for p in v.predicted_ms]


def _result_clock_logs(result: dict, prof, policies) -> list[float]:
    """|log(predicted / measured)| of the SM clock of one benchmark result's kernel policies (those in `policies`,
    or all), per rank, where the result carries each policy's measured clock (benchfile.timed_as 'sustained':
    policy_mhz) and the profile predicts one (a power model)."""
    from ..validate import validate_result

    clocks = result.get("policy_mhz") or {}
    keep = dict(result)
    keep["latency_ms"] = {p: t for p, t in result["latency_ms"].items()
                          if p != "reference" and p in clocks and (policies is None or p in policies)}
    if not keep["latency_ms"]:
        return []
    v = validate_result(keep, prof)
    return [abs(np.log(pred / meas)) for p, per in v.predicted_mhz.items()
            for pred, meas in zip(per, clocks[p]) if meas]


_WORKER_STATE: tuple = ()  # (results, policies) of the fit a worker process serves (FitPool's initializer)


def _worker_init(results: list, policies) -> None:
    global _WORKER_STATE
    _WORKER_STATE = (results, policies)


def _worker_logs(job: tuple) -> list[tuple[int, list[float]]]:
    profile_dict, indices, clocks = job
    results, policies = _WORKER_STATE
    prof = profile_from_dict(profile_dict, origin="fit candidate")
    logs = _result_clock_logs if clocks else _result_logs
    return [(i, logs(results[i], prof, policies)) for i in indices]


class FitPool:
    """Worker processes that evaluate fit_error's simulations in parallel (one benchmark, many candidate
    profiles): the results are sent once, each call sends only the candidate. `with FitPool(bench, workers):`."""

    def __init__(self, bench: dict, workers: int, policies=None):
        from concurrent.futures import ProcessPoolExecutor

        self.results, self.workers = bench["results"], int(workers)
        if self.workers < 2:
            raise ValueError("a FitPool needs at least 2 workers")
        self.executor = ProcessPoolExecutor(max_workers=self.workers, initializer=_worker_init,
                                            initargs=(self.results, policies))

    def logs(self, profile_dict: dict, clocks: bool = False) -> list[float]:
        """_result_logs (clocks: _result_clock_logs) of every result, in the results' order (so the mean is the
        serial one, bit for bit)."""
        # interleaved shares: results come grouped by model and size, and their simulation costs differ
        shares = [list(range(w, len(self.results), 2 * self.workers)) for w in range(2 * self.workers)]
        by_index = dict(pair for part in self.executor.map(_worker_logs, [(profile_dict, s, clocks)
                                                                           for s in shares if s])
                        for pair in part)
        return [x for i in range(len(self.results)) for x in by_index[i]]

    def close(self) -> None:
        self.executor.shutdown(cancel_futures=True)

    def __enter__(self) -> "FitPool":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def fit_error(bench: dict, profile_dict: dict, policies=None, pool: FitPool | None = None,
              clocks: bool = False) -> tuple[float, int]:
    """Mean |log(predicted / measured)| over the benchmark's (config, policy) points, and their number; clocks: of
    the SM clocks instead of the latencies (the points with a measured clock per policy). With a FitPool (built on
    the same benchmark and policies), its worker processes simulate the points."""
    if pool is not None:
        logs = pool.logs(profile_dict, clocks)
    else:
        prof = profile_from_dict(profile_dict, origin="fit candidate")
        one = _result_clock_logs if clocks else _result_logs
        logs = [x for r in bench["results"] for x in one(r, prof, policies)]
    if not logs:
        raise CalibrationError("no measured SM clocks per policy to fit power_scale to (bench --sustained S records "
                               "them; fit with --timing sustained)" if clocks else "no measured points to fit")
    return float(np.mean(logs)), len(logs)


def fit_profile(bench_path: Path, base: str = "h200", name: str | None = None, rounds: int = 2,
                policies=None, min_tokens: int = 0, iters: int = 8, log=print, params=FIT_PARAMS,
                power_path: Path | None = None, power: bool = True, hbm_power: bool = True, workers: int = 1,
                concurrency_path: Path | None = None, k_fixed_path: Path | None = None, decision_traces=None,
                piece_cost=None, timing: str = "bench") -> dict:
    """Coordinate search (golden section per parameter, `rounds` sweeps) of `params` (any of FIT_PARAMS and
    OPTIONAL_FIT_PARAMS; the others keep the base's values: scales 1, the base's fixed costs) minimising fit_error
    on a kernel benchmark file; returns the fitted profile dictionary with its provenance. Fitting a subset is
    for benchmarks that cannot constrain the rest, e.g. one GPU (no NVLink traffic: keep push_scale, refit the GEMM
    rate and the fixed costs on a profile whose push curve was fitted on two). power_path: a measurements file
    whose "power" block (power_model) is added to the base before fitting, so that the fit sees the clock the
    power cap leaves each layer. power=False: drop the base's power model and fit at a fixed clock (the cost
    table the kernel evaluates has no power term, so its profile's GEMM rate should absorb the average clock);
    hbm_power=False: drop the power model's HBM term (w_per_tbs; board-dependent, docs/power.md). workers:
    processes that simulate the points (FitPool; 0 = one per CPU); the fit is the same for any number.
    concurrency_path: a measurements file whose GEMM points give the base a gemm.scale_by_ctas
    (gemm_concurrency_curve) before fitting (fit conc_exp to weigh it). k_fixed_path: a file with tiles timed at
    several K (gemm_by_k) that gives the base a gemm.k_fixed (gemm_k_fixed) before fitting. decision_traces:
    Chrome traces of weave calls that give the base fixed_ns.decision (decision_from_traces) before fitting.
    piece_cost: a weave_kernel.piece_cost file that gives the base fixed_ns.dispatch_piece before fitting.
    timing: the benchmark's times to fit, 'bench' (latency_ms) or 'sustained' (sustained_ms; benchfile.timed_as)."""
    if not power and power_path is not None:
        raise CalibrationError("a power file and no power model contradict each other")
    unknown = set(params) - set(FIT_PARAMS) - set(OPTIONAL_FIT_PARAMS)
    if unknown or not params:
        raise CalibrationError(f"fit parameters must be some of {FIT_PARAMS + OPTIONAL_FIT_PARAMS}; "
                               f"got {tuple(params)}")
    from ..benchfile import read_bench
    from ..validate import bench_results

    bench = read_bench(bench_path, timing, CalibrationError)  # every result's times and fields checked
    bench = {**bench, "results": [r for r in bench_results(bench, bench_path, CalibrationError)
                                  if r["tokens_per_gpu"] >= min_tokens]}
    if not bench["results"]:
        raise CalibrationError(f"{bench_path}: no configuration with at least {min_tokens} tokens per GPU (--min-tokens)")
    measured = sorted({p for r in bench["results"] for p in r["latency_ms"] if p != "reference"})
    if policies is not None and not set(policies) & set(measured):
        raise CalibrationError(f"{bench_path}: no measured latencies of {', '.join(policies)} (--policies); "
                               f"it has {', '.join(measured)}")
    base_raw = json.loads(json.dumps(load_profile(base).raw))
    if not power:
        base_raw.pop("power", None)
    if power_path is not None:
        pm = read_measurements(power_path)
        if "power" not in pm:
            raise CalibrationError(f"{power_path} has no power block")
        base_raw["power"] = {**power_model(pm["power"]), "from": str(power_path)}
    if not hbm_power and "power" in base_raw:
        base_raw["power"].pop("w_per_tbs", None)
    if concurrency_path is not None:
        curve = gemm_concurrency_curve(read_measurements(concurrency_path).get("gemm", []))
        if curve is None:
            raise CalibrationError(f"{concurrency_path}: no GEMM points at two CTA counts for a concurrency curve")
        base_raw["gemm"]["scale_by_ctas"] = curve
        _add_note(base_raw["gemm"], CONCURRENCY_NOTE)
    if k_fixed_path is not None:
        base_raw["gemm"]["k_fixed"] = gemm_k_fixed(read_measurements(k_fixed_path))
        _add_note(base_raw["gemm"], K_FIXED_NOTE)
    decision = decision_from_traces(decision_traces) if decision_traces else None
    if decision is not None:
        base_raw["fixed_ns"]["decision"] = int(round(decision["ns"]))
    piece = read_piece_cost(piece_cost) if piece_cost is not None else None
    if piece is not None:
        base_raw["fixed_ns"]["dispatch_piece"] = int(round(piece["ns"]))
    x = {"gemm_scale": 1.0, "push_scale": 1.0, "fixed_us": base_raw["fixed_ns"]["count_exchange"] / 1e3,
         "barrier_us": base_raw["fixed_ns"]["grid_barrier"] / 1e3}
    if "tile_ns" in params:
        x["tile_ns"] = float(base_raw["fixed_ns"]["task_claim"])
    if "piece_ns" in params:
        x["piece_ns"] = float(base_raw["fixed_ns"].get("dispatch_piece", base_raw["fixed_ns"]["signal"]))
    if "conc_exp" in params:
        x["conc_exp"] = 1.0
    if "power_scale" in params:
        if "power" not in base_raw:
            raise CalibrationError("power_scale needs a power model: a base profile with one, or --power")
        x["power_scale"] = 1.0

    if workers < 0:
        raise CalibrationError(f"workers must be >= 0, got {workers}")
    workers = min((os.cpu_count() or 1) if workers == 0 else workers, len(bench["results"]))
    pool = FitPool(bench, workers, policies) if workers > 1 else None

    def err(params: dict) -> float:
        return fit_error(bench, scaled_profile(base_raw, **params), policies, pool)[0]

    clock_fit = None
    clock_points = []

    def clock_err(v: float) -> float:
        e, n = fit_error(bench, scaled_profile(base_raw, **{**x, "power_scale": v}), policies, pool, clocks=True)
        clock_points.append(n)
        return e

    try:
        best = None
        for _ in range(rounds):
            if "power_scale" in params:
                # the clock is what power_scale sets, and the latencies alone cannot tell it from the GEMM rate: it
                # is fitted to the measured SM clocks, the other parameters to the latencies (each round both, as
                # the power drawn depends on the GEMM rate)
                before = clock_err(x["power_scale"])
                lo, hi = _FIT_BOUNDS["power_scale"]
                val, e = _golden(clock_err, lo, hi, iters=iters)
                if e < before:
                    x["power_scale"] = val
                if clock_fit is None:
                    clock_fit = {"points": clock_points[0], "mean_abs_log_error_before": round(before, 4)}
                clock_fit["mean_abs_log_error"] = round(min(e, before), 4)
                log(f"fit: power_scale = {x['power_scale']:.4g} on {clock_fit['points']} measured SM clocks, "
                    f"mean |log error| {clock_fit['mean_abs_log_error']:.4f}")
                best = None  # the latencies' error changed with it
            if best is None:
                best = err(x)
            for key in params:
                if key == "power_scale":
                    continue
                lo, hi = _FIT_BOUNDS[key]
                val, e = _golden(lambda v: err({**x, key: v}), lo, hi, iters=iters)
                if e < best:
                    x[key], best = val, e
                log(f"fit: {key} = {x[key]:.4g}, mean |log error| {best:.4f}")
        prof = scaled_profile(base_raw, **x)
        _, n = fit_error(bench, prof, policies, pool)
    finally:
        if pool is not None:
            pool.close()
    prof["name"] = name or f"{base}-fitted"
    prof["version"] = f"fit-{Path(bench_path).stem}"
    prof["measured_by"] = "weave-sim calibrate --fit (kernel benchmark latencies)"
    prof["source"] = (f"Base profile {base} fitted to {n} measured (config, policy) "
                      f"{'sustained ' if timing == 'sustained' else ''}latencies of {bench_path} "
                      f"({bench.get('header', 'kernel benchmark')}; fitted: {', '.join(params)}): "
                      f"per-SM GEMM rate x {x['gemm_scale']:.3f}, "
                      f"push bandwidth per CTA x {x['push_scale']:.3f}, count exchange {x['fixed_us']:.1f} us, "
                      f"grid barrier {x['barrier_us']:.1f} us"
                      + (f", per GEMM tile {x['tile_ns']:.0f} ns" if "tile_ns" in x else "")
                      + (f", per dispatch piece {x['piece_ns']:.0f} ns" if "piece_ns" in x else "")
                      + (f", concurrency factor ^ {x['conc_exp']:.2f}" if "conc_exp" in x else "")
                      + (f", power per TFLOP/s x {x['power_scale']:.3f} (fitted to {clock_fit['points']} measured "
                         "SM clocks)" if clock_fit is not None else "")
                      + (", GEMM rate by computing SMs (gemm.scale_by_ctas)"
                         if "scale_by_ctas" in base_raw["gemm"] else "")
                      + (", tile time by K (gemm.k_fixed share "
                         f"{base_raw['gemm']['k_fixed']['share']:.3f} at K {base_raw['gemm']['k_fixed']['k']})"
                         if "k_fixed" in base_raw["gemm"] else "")
                      + (", SM clock from the power model" if "power" in base_raw else "")
                      + (f", decision {base_raw['fixed_ns']['decision']} ns from {decision['records']} measured "
                         "choose records" if decision is not None else "")
                      + (f", {base_raw['fixed_ns']['dispatch_piece']} ns per dispatch piece from measured dispatch "
                         "records" if piece is not None else "") + "; "
                      f"mean |log(predicted/measured)| {best:.4f} on the fitted points.")
    prof["calibration"] = {"base": base, "power_from": None if power_path is None else str(power_path),
                           **({} if concurrency_path is None else {"concurrency_from": str(concurrency_path)}),
                           **({} if k_fixed_path is None else {"k_fixed_from": str(k_fixed_path)}),
                           **({} if decision is None else {"decision_from": decision}),
                           **({} if piece is None else {"dispatch_piece_from": piece}),
                           **({} if clock_fit is None else {"power_scale_from_clocks": clock_fit}),
                           "fitted_to": str(bench_path), "timing": timing, "params": x, "fitted": list(params),
                           "mean_abs_log_error": best,
                           "points": n, "min_tokens": min_tokens, "policies": policies,
                           # the kernel the latencies came from (weave_kernel.build.sources_digest), if recorded
                           "kernel_sources": bench_kernel_sources(bench)}
    profile_from_dict(prof, origin="fitted profile")
    return prof


def _golden(f, lo: float, hi: float, iters: int) -> tuple[float, float]:
    """Minimise a unimodal-ish f on [lo, hi] by golden-section search; returns (argmin, min)."""
    r = (np.sqrt(5) - 1) / 2
    a, b = lo, hi
    c, d = b - r * (b - a), a + r * (b - a)
    fc, fd = f(c), f(d)
    for _ in range(iters):
        if fc <= fd:
            b, d, fd = d, c, fc
            c = b - r * (b - a)
            fc = f(c)
        else:
            a, c, fc = c, d, fd
            d = a + r * (b - a)
            fd = f(d)
    return (c, fc) if fc <= fd else (d, fd)


def apply_fit(prof: dict, fitted: str | Path) -> dict:
    """`prof` (a calibrated profile dictionary) with the in-layer factors of an earlier fit applied, not refitted:
    the fitted profile's calibration.params (GEMM rate and push scales, fixed costs) through scaled_profile, as
    fit_profile applied them to its base. For a measurement that the fit did not see but whose in-layer behaviour
    is expected to match, e.g. the push curve of another dispatch mode (calibrate --dispatch bulk) measured in the
    same session as the kernel runs: a cost table for it in seconds instead of a refit. The result mirrors the
    fit's structure: no power model if the fit had none, no HBM power term if it had none, its gemm.k_fixed."""
    src = load_profile(fitted).raw
    cal = src.get("calibration") or {}
    params = cal.get("params")
    if not isinstance(params, dict) or not params:
        raise CalibrationError(f"{fitted} is not a fitted profile (no calibration.params): nothing to apply")
    unknown = set(params) - set(FIT_PARAMS) - set(OPTIONAL_FIT_PARAMS)
    if unknown:
        raise CalibrationError(f"{fitted}: unknown fit parameters {sorted(unknown)}")
    prof = json.loads(json.dumps(prof))
    if "power" not in src:
        prof.pop("power", None)
    elif "power" in prof and "w_per_tbs" not in src["power"]:
        prof["power"].pop("w_per_tbs", None)
    if "k_fixed" in src["gemm"] and "k_fixed" not in prof["gemm"]:
        prof["gemm"]["k_fixed"] = src["gemm"]["k_fixed"]
        _add_note(prof["gemm"], K_FIXED_NOTE)
    if "scale_by_ctas" in src["gemm"] and "scale_by_ctas" not in prof["gemm"]:
        raise CalibrationError(f"{fitted} models the GEMM rate by computing SMs: calibrate with --gemm-concurrency")
    out = scaled_profile(prof, **params)
    out["calibration"] = {**prof.get("calibration", {}), "params_from": src.get("name", str(fitted)),
                          "params_from_version": src.get("version"), "params": params}
    out["source"] = (prof.get("source", "") + f" In-layer factors of the fitted profile {src.get('name', fitted)} "
                     f"applied, not refitted: " + ", ".join(f"{k} {v:.4g}" for k, v in params.items()) + ".")
    profile_from_dict(out, origin="calibrated profile with applied fit")  # validates
    return out

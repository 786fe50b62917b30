"""Existing profiles amended with one measured number, everything else unchanged (weave-sim calibrate --amend):
weave's decision cost from traces (amend_decision) and the cost of a half tile fitted to a benchmark's half-tile
results (amend_half_tile); write_amended finishes and records each."""
from __future__ import annotations

import json
import os
from pathlib import Path

from ..profile import load_profile, profile_from_dict
from ..report import write_text
from .fit import FitPool, _golden, fit_error
from .measured import CalibrationError
from .traces import decision_from_traces


def _weave_policies(policies) -> list[str]:
    return [p for p in (policies or []) if str(p).split(":")[0].split("@")[0] in ("weave", "weave-nosteal")]


def write_amended(prof: dict, out_path: Path, name: str | None, suffix: str, note: str, key: str, record,
                  origin: str) -> dict:
    """Finish an amended profile (--amend): rename it if asked, add `suffix` to its version once, append `note` to
    its source, record `record` as calibration[key], validate it and write it to out_path. Returns it."""
    if name:
        prof["name"] = name
    version = str(prof.get("version", "?"))
    prof["version"] = version if version.endswith(suffix) else version + suffix
    prof["source"] = prof.get("source", "") + note
    prof["calibration"] = {**(prof.get("calibration") or {}), key: record}
    profile_from_dict(prof, origin=origin)  # validates
    write_text(out_path, json.dumps(prof, indent=1), "profile")
    return prof


def amend_decision(profile: str | Path, traces, out_path: Path, name: str | None = None) -> dict:
    """An existing profile with fixed_ns.decision measured from `traces` (decision_from_traces), written to
    out_path; everything else unchanged. Refused for a profile fitted to weave latencies: the decision cost was
    part of that fit, so refit it with --fit ... --decision instead. Its version gains "+decision"."""
    src = load_profile(profile)
    prof = json.loads(json.dumps(src.raw))
    cal = prof.get("calibration") or {}
    fitted_weave = []
    if "fitted_to" in cal:  # a fit to every policy of its benchmark (policies None) may have had weave in it
        pols = cal.get("policies")
        fitted_weave = ["all the policies of its benchmark"] if pols is None else _weave_policies(pols)
    if fitted_weave:
        raise CalibrationError(f"{src.name} was fitted to latencies of {', '.join(fitted_weave)}, which pay the "
                               "decision: refit it (weave-sim calibrate --fit ... --decision TRACE...) instead")
    dec = decision_from_traces(traces)
    old = prof["fixed_ns"].get("decision")
    prof["fixed_ns"]["decision"] = int(round(dec["ns"]))
    return write_amended(prof, out_path, name, "+decision",
                         f" Decision cost {int(round(dec['ns']))} ns (was {old}): median of {dec['records']} measured "
                         f"choose records ({', '.join(dec['median_ns_by_trace'])}).",
                         "decision_from", dec, "profile with measured decision cost")


def amend_half_tile(profile: str | Path, bench_path: Path, out_path: Path, name: str | None = None,
                    timing: str = "bench", workers: int = 1, iters: int = 10, log=print) -> dict:
    """An existing profile with gemm.half_tile_cost (what a half tile costs as a fraction of a whole one) fitted to
    the results of `bench_path` that ran half tiles (kernel_layout "expert-packed-half"), by golden section on
    [0.5, 1] of fit_error (mean |log(predicted / measured)| over their kernel policies); written to out_path,
    everything else unchanged. Results of FP8 experts fit gemm.fp8_half_tile_cost instead (what fp8_profile
    applies to FP8 tiles; it starts from the bf16 value), and a file with both kinds is refused: bench runs one
    kind per process. timing: 'bench' or 'sustained' (benchfile.timed_as). Its version gains "+half" ("+half8")."""
    from ..benchfile import read_bench
    from ..validate import bench_results

    src = load_profile(profile)
    bench = read_bench(bench_path, timing, CalibrationError)  # every result's times and fields checked
    results = [r for r in bench_results(bench, bench_path, CalibrationError)
               if r.get("kernel_layout") == "expert-packed-half"]
    if not results:
        raise CalibrationError(f"{bench_path}: no result ran half tiles (kernel_layout 'expert-packed-half'; bench "
                               "records it since sources eb48d782, for FP8 experts since 0f660e73)")
    dtypes = {r.get("expert_dtype", "bf16") for r in results}
    if len(dtypes) > 1:
        raise CalibrationError(f"{bench_path}: half-tile results of both bf16 and FP8 experts; fit each kind from "
                               "a file of its own")
    fp8 = dtypes == {"fp8"}
    key = "fp8_half_tile_cost" if fp8 else "half_tile_cost"
    bench = {**bench, "results": results}
    prof = json.loads(json.dumps(src.raw))
    old = float(prof["gemm"].get(key, prof["gemm"].get("half_tile_cost", 0.5)))
    workers = min((os.cpu_count() or 1) if workers == 0 else max(1, workers), len(results))
    pool = FitPool(bench, workers) if workers > 1 else None

    seen: dict[float, tuple[float, int]] = {}  # half_tile_cost -> (fit_error, points): each value simulated once

    def err(v: float) -> float:
        if float(v) not in seen:
            cand = {**prof, "gemm": {**prof["gemm"], key: float(v)}}
            seen[float(v)] = fit_error(bench, cand, None, pool)
        return seen[float(v)][0]

    try:
        before, at_mma = err(old), err(0.5)
        best, e = _golden(err, 0.5, 1.0, iters)
        for edge in (0.5, 1.0):  # golden section never evaluates the ends
            if (ee := err(edge)) < e:
                best, e = edge, ee
        points = seen[float(old)][1]
    finally:
        if pool is not None:
            pool.close()
    prof["gemm"][key] = round(float(best), 4)
    log(f"{key} {prof['gemm'][key]:g} over {points} points: mean |log error| {e:.4f} "
        f"(MMAs only, 0.5: {at_mma:.4f}; before, {old:g}: {before:.4f})")
    fit = {"bench": str(bench_path), "timing": timing, "configs": len(results), "points": points,
           key: prof["gemm"][key], "mean_abs_log_error": e,
           "mean_abs_log_error_at_0.5": at_mma, "previous": old, "mean_abs_log_error_before": before}
    kind = "FP8 half tiles" if fp8 else "Half tiles"
    return write_amended(prof, out_path, name, "+half8" if fp8 else "+half",
                         f" {kind} cost {prof['gemm'][key]:g} of a whole tile: fitted to {points} "
                         "measured points (weave-sim calibrate --half-tiles).",
                         "fp8_half_tile_from" if fp8 else "half_tile_from", fit,
                         "profile with fitted FP8 half tiles" if fp8 else "profile with fitted half tiles")

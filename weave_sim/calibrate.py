"""Turn calibration measurements into a versioned hardware profile.

The GPU side (`python -m weave_kernel.calibrate`, run on the GPU machine) writes a measurements JSON:

    {"gpu_name": str, "driver": str, "date": "YYYY-MM-DD", "commit": str, "num_sms": int,
     "nvlink_push": [{"ctas": int, "peers": int, "gbs": float}, ...],          # push GB/s vs comm CTAs
     "gemm": [{"ctas": int, "rows_per_expert": int, "tflops": float}, ...],    # kernel's own tiles
     "chunks": [{"chunks": int, "time_ns": float}, ...],                      # same work, K chunks
     "task_claim_ns": float, "signal_ns": float,                              # optional fixed costs
     "hbm_gbs": float, "gemm_peak_tflops": float}                             # optional ceilings

`weave-sim calibrate MEASUREMENTS --base h200 -o PROFILE.json` keeps the base profile's fields that were
not measured and records where every number came from.
"""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from .profile import load_profile, profile_from_dict

REQUIRED = ("gpu_name", "date", "num_sms", "nvlink_push", "gemm")


class CalibrationError(ValueError):
    """Measurements are missing or inconsistent."""


def nvlink_curve(points: list[dict]) -> dict[str, float]:
    """GB/s by CTA count: per count the slowest peer count's rate (a layer pushes to all peers), made
    non-decreasing (more CTAs never predict less bandwidth) by a running maximum."""
    by_ctas: dict[int, float] = {}
    for p in points:
        c, gbs = int(p["ctas"]), float(p["gbs"])
        if c < 1 or gbs <= 0:
            raise CalibrationError(f"bad nvlink_push point {p}")
        by_ctas[c] = min(by_ctas.get(c, gbs), gbs)
    if len(by_ctas) < 2:
        raise CalibrationError("nvlink_push needs at least two CTA counts")
    ctas = sorted(by_ctas)
    rates = np.maximum.accumulate([by_ctas[c] for c in ctas])
    return {str(c): round(float(r), 3) for c, r in zip(ctas, rates)}


def gemm_curve(points: list[dict]) -> dict[str, float]:
    """Per-SM TFLOP/s by rows per expert: the median over CTA counts of tflops / ctas, made
    non-decreasing in rows."""
    by_rows: dict[int, list[float]] = {}
    for p in points:
        n, rows, tf = int(p["ctas"]), int(p["rows_per_expert"]), float(p["tflops"])
        if n < 1 or rows < 1 or tf <= 0:
            raise CalibrationError(f"bad gemm point {p}")
        by_rows.setdefault(rows, []).append(tf / n)
    if len(by_rows) < 2:
        raise CalibrationError("gemm needs at least two rows-per-expert values")
    rows = sorted(by_rows)
    rates = np.maximum.accumulate([float(np.median(by_rows[r])) for r in rows])
    return {str(r): round(float(x), 6) for r, x in zip(rows, rates)}


def chunk_efficiency(points: list[dict]) -> dict[str, float]:
    """eff(K) = time(K=1) / time(K), capped at 1 (chunking never counts as a speedup of the GEMMs)."""
    times = {int(p["chunks"]): float(p["time_ns"]) for p in points}
    if 1 not in times:
        raise CalibrationError("chunks measurements need K=1")
    return {str(k): round(min(1.0, times[1] / t), 6) for k, t in sorted(times.items())}


def build_profile(measurements: dict, base: str = "h200", name: str | None = None) -> dict:
    """A profile dictionary from measurements, falling back to `base` for what was not measured."""
    missing = [k for k in REQUIRED if k not in measurements]
    if missing:
        raise CalibrationError(f"measurements lack {missing}")
    prof = json.loads(json.dumps(load_profile(base).raw))
    m = measurements
    prof["name"] = name or f"{base}-calibrated"
    prof["gpu"] = m["gpu_name"]
    prof["num_sms"] = int(m["num_sms"])
    prof["version"] = f"{m['date']}-{str(m.get('commit', 'unknown'))[:12]}"
    prof["measured_by"] = "weave-sim calibrate (python -m weave_kernel.calibrate)"
    measured = ["nvlink", "gemm per-SM rate"]
    prof["nvlink"]["push_gbs_by_ctas"] = nvlink_curve(m["nvlink_push"])
    prof["nvlink"]["peak_gbs"] = max(prof["nvlink"]["push_gbs_by_ctas"].values())
    prof["nvlink"]["note"] = ("Push GB/s per GPU vs comm CTAs, all ranks pushing at once with the kernel's own copy "
                              "code; per CTA count the slowest peer count, made non-decreasing in CTAs.")
    prof["gemm"]["per_sm_tflops_by_rows"] = gemm_curve(m["gemm"])
    prof["gemm"]["note"] = ("Per-SM rate of the kernel's own tiles vs rows per expert: median over compute CTA "
                            "counts of TFLOP/s / CTAs, made non-decreasing in rows.")
    if "gemm_peak_tflops" in m:
        prof["gemm"]["peak_tflops"] = float(m["gemm_peak_tflops"])
        measured.append("gemm peak")
    if "hbm_gbs" in m:
        prof["hbm_gbs"] = float(m["hbm_gbs"])
        measured.append("hbm")
    if "chunks" in m:
        prof["chunk_eff"] = chunk_efficiency(m["chunks"])
        measured.append("chunk efficiency")
    for key, slot in (("task_claim_ns", "task_claim"), ("signal_ns", "signal")):
        if key in m:
            prof["fixed_ns"][slot] = int(round(float(m[key])))
            measured.append(slot)
    prof["source"] = (
        f"Measured on {m['gpu_name']} (driver {m.get('driver', '?')}) on {m['date']} at commit "
        f"{m.get('commit', '?')}: {', '.join(measured)}; other fields from base profile {base}."
    )
    prof["calibration"] = {"base": base, "measured": measured}
    profile_from_dict(prof, origin="calibrated profile")  # validates
    return prof


def calibrate_file(measurements_path: Path, out_path: Path, base: str = "h200", name: str | None = None) -> dict:
    try:
        m = json.loads(Path(measurements_path).read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise CalibrationError(f"cannot read measurements {measurements_path}: {exc}") from None
    prof = build_profile(m, base=base, name=name)
    Path(out_path).parent.mkdir(parents=True, exist_ok=True)
    Path(out_path).write_text(json.dumps(prof, indent=1))
    return prof


# --- fitting the profile to measured kernel latencies ------------------------------------------------
FIT_PARAMS = ("gemm_scale", "push_scale", "fixed_us", "barrier_us")
_FIT_BOUNDS = {"gemm_scale": (0.2, 1.5), "push_scale": (0.1, 1.5), "fixed_us": (0.0, 600.0), "barrier_us": (0.0, 100.0)}


def scaled_profile(base: dict, gemm_scale: float, push_scale: float, fixed_us: float,
                   barrier_us: float | None = None) -> dict:
    """`base` with per-SM GEMM rates x gemm_scale, the push curve stretched so that c CTAs move what
    c * push_scale CTAs moved (the per-CTA rate scales, the link's plateau stays), the per-layer fixed
    cost of the count exchange set to fixed_us and (unless None) the cost of one grid barrier between the
    fused sequential policy's phases set to barrier_us: a separate number, so that what only the phased
    policy pays does not land in the fixed cost every policy pays."""
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
    return prof


def fit_error(bench: dict, profile_dict: dict, policies=None) -> tuple[float, int]:
    """Mean |log(predicted / measured)| over the benchmark's (config, policy) points, and their number."""
    from .validate import validate_result

    prof = profile_from_dict(profile_dict, origin="fit candidate")
    logs = []
    for r in bench["results"]:
        keep = dict(r)
        keep["latency_ms"] = {p: t for p, t in r["latency_ms"].items()
                              if p != "reference" and (policies is None or p in policies)}
        v = validate_result(keep, prof)
        logs += [abs(np.log(v.predicted_ms[p] / v.measured_ms[p])) for p in v.predicted_ms]
    if not logs:
        raise CalibrationError("no measured points to fit")
    return float(np.mean(logs)), len(logs)


def fit_profile(bench_path: Path, base: str = "h200", name: str | None = None, rounds: int = 2,
                policies=None, min_tokens: int = 0, iters: int = 8, log=print) -> dict:
    """Coordinate search (golden section per parameter, `rounds` sweeps) of FIT_PARAMS minimising
    fit_error on a kernel benchmark file; returns the fitted profile dictionary with its provenance."""
    try:
        bench = json.loads(Path(bench_path).read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise CalibrationError(f"cannot read kernel benchmark {bench_path}: {exc}") from None
    bench = {**bench, "results": [r for r in bench.get("results", []) if r["tokens_per_gpu"] >= min_tokens]}
    base_raw = load_profile(base).raw
    x = {"gemm_scale": 1.0, "push_scale": 1.0, "fixed_us": base_raw["fixed_ns"]["count_exchange"] / 1e3,
         "barrier_us": base_raw["fixed_ns"]["grid_barrier"] / 1e3}

    def err(params: dict) -> float:
        return fit_error(bench, scaled_profile(base_raw, **params), policies)[0]

    best = err(x)
    for _ in range(rounds):
        for key in FIT_PARAMS:
            lo, hi = _FIT_BOUNDS[key]
            val, e = _golden(lambda v: err({**x, key: v}), lo, hi, iters=iters)
            if e < best:
                x[key], best = val, e
            log(f"fit: {key} = {x[key]:.4g}, mean |log error| {best:.4f}")
    prof = scaled_profile(base_raw, **x)
    _, n = fit_error(bench, prof, policies)
    prof["name"] = name or f"{base}-fitted"
    prof["version"] = f"fit-{Path(bench_path).stem}"
    prof["measured_by"] = "weave-sim calibrate --fit (kernel benchmark latencies)"
    prof["source"] = (f"Base profile {base} fitted to {n} measured (config, policy) latencies of {bench_path} "
                      f"({bench.get('header', 'kernel benchmark')}): per-SM GEMM rate x {x['gemm_scale']:.3f}, "
                      f"push bandwidth per CTA x {x['push_scale']:.3f}, count exchange {x['fixed_us']:.1f} us, "
                      f"grid barrier {x['barrier_us']:.1f} us; "
                      f"mean |log(predicted/measured)| {best:.4f} on the fitted points.")
    prof["calibration"] = {"base": base, "fitted_to": str(bench_path), "params": x, "mean_abs_log_error": best,
                           "points": n, "min_tokens": min_tokens, "policies": policies}
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

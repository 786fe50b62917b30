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
    prof["gemm"]["per_sm_tflops_by_rows"] = gemm_curve(m["gemm"])
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

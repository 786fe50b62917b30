"""Turn calibration measurements into a versioned hardware profile.

Modules: measured (the measurements' curves and build_profile), traces (fixed costs read from the kernel's own
records), fit (profiles fitted to measured kernel latencies), amend (an existing profile with one number
measured or fitted), fp8 (the FP8 tile factor fitted to bf16 / FP8 pairs). This module: calibrate_file, the
command's whole path, and the names the rest of the project imports.

The GPU side (`python -m weave_kernel.calibrate`, run on the GPU machine) writes a measurements JSON:

    {"gpu_name": str, "driver": str, "date": "YYYY-MM-DD", "commit": str, "num_sms": int,
     "nvlink_push": [{"ctas": int, "peers": int, "gbs": float}, ...],          # push GB/s vs comm CTAs
     "gemm": [{"ctas": int, "rows_per_expert": int, "tflops": float}, ...],    # kernel's own tiles
     "chunks": [{"chunks": int, "time_ns": float}, ...],                      # same work, K chunks
     "task_claim_ns": float, "signal_ns": float,                              # optional fixed costs
     "hbm_gbs": float, "gemm_peak_tflops": float,                             # optional ceilings
     "power": {"limit_w": float, "points": [{"ctas": int, "tflops": float,    # optional: sustained GEMM
                "sm_mhz": float, "power_w": float}, ...],                     # with clock and board power,
               "hbm": {"tbs": float, "power_w": float, "sm_mhz": float}},     # and a sustained HBM copy
     "dispatch": "threads" | "bulk" | "bulk:W",                               # optional: the push points' copy code
     "decision_ns": float, "decision_from": {...},                            # optional: weave's in-kernel choice
     "dispatch_piece_ns": float, "dispatch_piece_from": {...}}                # optional: a dispatch piece's fixed cost

`weave-sim calibrate MEASUREMENTS --base h200 -o PROFILE.json` keeps the base profile's fields that were
not measured and records where every number came from (a push curve measured with bulk copies as
nvlink.dispatch; `--gemm-concurrency` adds gemm.scale_by_ctas from the GEMM points, `--gemm-k` gemm.k_fixed from
tiles timed at several K: "gemm_by_k": [{"k", "ctas", "rows_per_expert", "tile_us"}, ...] with "gemm_k", the K of
the "gemm" points). `--decision TRACE...` takes the cost of weave's in-kernel choice (fixed_ns.decision) from the
`choose` records of measured Chrome traces of `weave` (decision_from_traces); `--amend PROFILE --decision TRACE...`
sets it on an existing profile whose fit it cannot have changed (amend_decision). `--piece-cost FILE` takes the
fixed cost of one dispatch piece (fixed_ns.dispatch_piece) from `python -m weave_kernel.piece_cost --out FILE`, a
fit of the dispatch records of measured traces.
"""
from __future__ import annotations

import json
from pathlib import Path

from ..report import write_text
from .amend import amend_decision, amend_half_tile, write_amended
from .fit import FIT_PARAMS, OPTIONAL_FIT_PARAMS, FitPool, apply_fit, fit_error, fit_profile, scaled_profile
from .measured import (REQUIRED, CalibrationError, build_profile, chunk_efficiency, gemm_concurrency_curve,
                       gemm_curve, gemm_k_fixed, nvlink_curve, pad_energy, power_model, read_measurements)
from .traces import decision_from_traces, read_piece_cost, with_decision, with_piece_cost

__all__ = [
    "REQUIRED", "CalibrationError", "nvlink_curve", "gemm_curve", "gemm_concurrency_curve", "gemm_k_fixed",
    "chunk_efficiency", "power_model", "pad_energy", "build_profile", "read_measurements", "decision_from_traces",
    "read_piece_cost", "with_decision", "with_piece_cost", "write_amended", "amend_decision", "amend_half_tile",
    "FIT_PARAMS", "OPTIONAL_FIT_PARAMS", "scaled_profile", "FitPool", "fit_error", "fit_profile", "apply_fit",
    "calibrate_file",
]


def calibrate_file(measurements_path: Path, out_path: Path, base: str = "h200", name: str | None = None,
                   power_path: Path | None = None, power: bool = True, hbm_power: bool = True,
                   concurrency: bool = False, k_fixed_path: Path | str | None = None,
                   params_from: str | Path | None = None, decision_traces=None, piece_cost=None) -> dict:
    """measurements -> profile JSON; k_fixed_path: gemm.k_fixed from this file's gemm_by_k ("-": from the
    measurements themselves); power_path: take the "power" block from that measurements file instead
    (e.g. measured on a one-GPU machine, where the main file needs two GPUs for nvlink_push); power=False: leave
    the measured power block out (a fixed-clock profile); hbm_power=False: leave out its HBM term (w_per_tbs), which
    differs from board to board (docs/power.md); concurrency: add gemm.scale_by_ctas (build_profile); params_from:
    a fitted profile whose in-layer factors are applied to the result (apply_fit); decision_traces: Chrome traces
    of weave calls whose choose records give fixed_ns.decision (decision_from_traces; else the measurements'
    decision_ns, else the base's); piece_cost: a weave_kernel.piece_cost file for fixed_ns.dispatch_piece."""
    if not power and power_path is not None:
        raise CalibrationError("a power file and no power model contradict each other")
    m = read_measurements(measurements_path)
    if power_path is not None:
        pm = read_measurements(power_path)
        if "power" not in pm:
            raise CalibrationError(f"{power_path} has no power block")
        m = {**m, "power": {**pm["power"], "from": f"{power_path} ({pm.get('gpu_name', '?')}, {pm.get('date', '?')}, "
                                                  f"commit {str(pm.get('commit', '?'))[:12]})"}}
    if not power:
        m = {k: v for k, v in m.items() if k != "power"}
    if decision_traces:
        m = with_decision(m, decision_traces)
    if piece_cost is not None:
        m = with_piece_cost(m, piece_cost)
    kf = None if k_fixed_path is None else (m if str(k_fixed_path) == "-" else read_measurements(k_fixed_path))
    prof = build_profile(m, base=base, name=name, concurrency=concurrency, k_fixed_from=kf)
    if not power:
        prof.pop("power", None)  # nor the base's
    elif not hbm_power and "power" in prof:
        prof["power"].pop("w_per_tbs", None)
    if params_from is not None:
        prof = apply_fit(prof, params_from)
    write_text(out_path, json.dumps(prof, indent=1), "profile")
    return prof

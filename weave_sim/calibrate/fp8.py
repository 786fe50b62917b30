"""The FP8 tile factor of a profile, fitted to kernel benchmarks of the same layers with bf16 and with FP8 experts.

The engine runs FP8 experts as bf16 ones with e4m3 bytes and GEMM tiles `gemm.fp8_scale` times faster
(profile.fp8_profile); `gemm.fp8_fixed_scale` is the factor on a tile's fixed cost (gemm.k_fixed: claim, pipeline
fill, epilogue), which need not speed up with the MMAs. This module fits fp8_scale to measurements: pairs of
`python -m weave_kernel.bench` files, one with `--expert-dtype bf16` and one with `--expert-dtype fp8`, of the same
models, token counts and policies, run the same way (the same harness: an FP8 factor measured under other power
conditions than its bf16 partner is not the tiles' own; docs/kernel.md, "The FP8 tile factor, measured in one
harness").

What is fitted is the FP8 gain, not the FP8 latency: for every (configuration, policy) measured in both files,
g = t(bf16) / t(FP8), measured and simulated, and fp8_scale is the value at which the median of
log(g_simulated / g_measured) is 0. The profile's error on the bf16 layers then does not leak into the factor, as it
would in a fit of the FP8 latencies alone. The simulated gain grows with fp8_scale, so the fit is a bisection.

    weave-sim calibrate --amend h200-megakernel-power-ep1 --fp8 bf16.json:fp8.json [...] -o profile.json
"""
from __future__ import annotations

import json
import math
import statistics
from dataclasses import dataclass
from pathlib import Path

from ..profile import FP8_TILE_SCALE, HardwareProfile, fp8_profile, load_profile, profile_from_dict
from ..benchfile import read_bench
from ..validate import ConfigValidation, bench_results, config_label, result_fp8, validate_file

SCALE_RANGE = (1.0, 3.0)  # where the bisection looks for fp8_scale
LOG_TOLERANCE = 1e-3  # |median log gain error| at which the bisection stops
DEFAULT_FIXED_SCALE = 1.0  # a tile's fixed cost at bf16's speed unless asked otherwise


@dataclass
class GainPoint:
    """One (configuration, policy) measured with both expert formats."""

    config: tuple  # (label, tokens per GPU, GPUs), as validate names a configuration
    policy: str
    measured_bf16_ms: float
    measured_fp8_ms: float
    predicted_bf16_ms: float

    @property
    def measured_gain(self) -> float:
        return self.measured_bf16_ms / self.measured_fp8_ms


def parse_pairs(specs) -> list[tuple[Path, Path]]:
    """'BF16.json:FP8.json' strings -> path pairs (a clear error for anything else)."""
    pairs = []
    for spec in specs:
        bf, sep, f8 = str(spec).rpartition(":")
        if not sep or not bf or not f8:
            raise ValueError(f"--fp8 {spec!r}: give BF16_BENCH.json:FP8_BENCH.json")
        pairs.append((Path(bf), Path(f8)))
    if not pairs:
        raise ValueError("--fp8: give at least one BF16_BENCH.json:FP8_BENCH.json pair")
    return pairs


def _check_dtype(path: Path, data: dict, fp8: bool) -> None:
    wrong = [f"{r.get('model')}/{r.get('tokens_per_gpu')}" for r in bench_results(data) if result_fp8(r) != fp8]
    if wrong:
        want = "FP8" if fp8 else "bf16"
        raise ValueError(f"{path}: expected {want} experts in every result, not in {', '.join(wrong[:4])}")


def _key(v: ConfigValidation) -> tuple:
    """A configuration as validate names it: (label, tokens per GPU, GPUs)."""
    return (v.label, v.tokens_per_gpu, v.gpus)


def _result_key(r: dict) -> tuple:
    """_key of a benchmark result (before it is simulated)."""
    return (config_label(r["model"], r.get("layer")), int(r["tokens_per_gpu"]), int(r["gpus"]))


class Fp8Data:
    """The FP8 benchmark files and their bf16 partners, simulated once in bf16 (the FP8 side per trial factor)."""

    def __init__(self, pairs, profile: HardwareProfile, workers: int = 1, timing: str = "bench"):
        self.profile, self.workers = profile, workers
        self.pairs = [(Path(b), Path(f)) for b, f in pairs]
        self.fp8_data, self.points = [], []
        for bf_path, f8_path in self.pairs:
            bf, f8 = read_bench(bf_path, timing), read_bench(f8_path, timing)
            _check_dtype(bf_path, bf, False)
            _check_dtype(f8_path, f8, True)
            bf_rows = {_key(v): v for v in validate_file(bf_path, profile, workers=workers, data=bf)}
            pts = []
            for r in bench_results(f8):
                key = _result_key(r)
                v = bf_rows.get(key)
                for pol, f8_ms in sorted(r["latency_ms"].items()):
                    if v is not None and pol in v.predicted_ms:
                        pts.append(GainPoint(key, pol, v.measured_ms[pol], float(f8_ms), v.predicted_ms[pol]))
            if not pts:
                raise ValueError(f"{bf_path} and {f8_path} share no (model, tokens, policy): benchmark the same "
                                 "configurations with --expert-dtype bf16 and fp8")
            self.fp8_data.append((f8_path, f8))
            self.points.append(pts)

    def gain_errors(self, scale: float, fixed_scale: float) -> tuple[list[float], list[float]]:
        """(log(g_sim / g_measured) per point, |FP8 latency error| per point) with FP8 tiles x scale."""
        raw = json.loads(json.dumps(self.profile.raw))
        raw["gemm"]["fp8_scale"] = float(scale)
        raw["gemm"]["fp8_fixed_scale"] = float(fixed_scale)
        trial = profile_from_dict(raw, origin=f"{self.profile.name}, trial FP8 x{scale:g}")
        logs, lat = [], []
        for (path, data), pts in zip(self.fp8_data, self.points):
            sim = {_key(v): v.predicted_ms for v in validate_file(path, trial, workers=self.workers, data=data)}
            for p in pts:
                f8_pred = sim.get(p.config, {}).get(p.policy)
                if f8_pred is None:  # not simulated (validate's notes say why)
                    continue
                logs.append(math.log((p.predicted_bf16_ms / f8_pred) / p.measured_gain))
                lat.append(abs(f8_pred - p.measured_fp8_ms) / p.measured_fp8_ms)
        if not logs:
            raise ValueError("no FP8 configuration could be simulated (see weave-sim validate on the FP8 files)")
        return logs, lat


def fit_fp8_scale(pairs, profile: HardwareProfile, fixed_scale: float = DEFAULT_FIXED_SCALE,
                  workers: int = 1, timing: str = "bench") -> dict:
    """fp8_scale at which the median simulated FP8 gain equals the measured one (module docstring), with a tile's
    fixed cost at fixed_scale; the result with the fit's errors at that factor and at the profile's previous ones
    ("previous"). fixed_scale is None in the result for a profile without gemm.k_fixed (nothing it applies to).
    timing: the pairs' times to compare, 'bench' or 'sustained' (benchfile.timed_as)."""
    if not fixed_scale > 0:
        raise ValueError(f"the FP8 fixed-cost factor must be > 0, got {fixed_scale}")
    data = Fp8Data(pairs, profile, workers, timing)
    lo, hi = SCALE_RANGE

    def median_log(s):
        return statistics.median(data.gain_errors(s, fixed_scale)[0])

    m_lo, m_hi = median_log(lo), median_log(hi)
    if m_lo > 0 or m_hi < 0:
        raise ValueError(f"the measured FP8 gains lie outside what FP8 tiles x{lo:g} .. x{hi:g} predict "
                         f"(median log error {m_lo:+.3f} .. {m_hi:+.3f}): are the files a bf16 / FP8 pair?")
    while hi - lo > 1e-3:
        mid = 0.5 * (lo + hi)
        m = median_log(mid)
        if abs(m) < LOG_TOLERANCE:
            lo = hi = mid
            break
        lo, hi = (mid, hi) if m < 0 else (lo, mid)
    scale = round(0.5 * (lo + hi), 3)
    logs, lat = data.gain_errors(scale, fixed_scale)
    gain = [math.exp(x) - 1.0 for x in logs]
    old = profile.raw["gemm"]  # what the profile gave FP8 tiles before: its own factors, else the defaults
    old_scale = float(old.get("fp8_scale", FP8_TILE_SCALE))
    old_fixed = float(old.get("fp8_fixed_scale", old_scale))
    b_logs, b_lat = data.gain_errors(old_scale, old_fixed)
    before = {"scale": old_scale, "fixed_scale": old_fixed, **_stats([math.exp(x) - 1.0 for x in b_logs], b_lat)}
    if not profile.raw["gemm"].get("k_fixed"):  # no fixed cost in the profile: the factor applies to the whole tile
        fixed_scale = None
        before["fixed_scale"] = None
    return {"scale": scale, "fixed_scale": fixed_scale, "timing": timing, "points": len(gain), **_stats(gain, lat),
            "previous": before, "pairs": [[str(b), str(f)] for b, f in data.pairs]}


def _stats(gain: list[float], lat: list[float]) -> dict:
    return {"median_gain_error": round(statistics.median(gain), 4),
            "median_abs_gain_error": round(statistics.median(abs(g) for g in gain), 4),
            "worst_abs_gain_error": round(max(abs(g) for g in gain), 4),
            "median_abs_fp8_latency_error": round(statistics.median(lat), 4),
            "worst_abs_fp8_latency_error": round(max(lat), 4)}


def amend_fp8(profile: str | Path, pairs, out_path: Path, name: str | None = None,
              fixed_scale: float = DEFAULT_FIXED_SCALE, workers: int = 1, timing: str = "bench") -> dict:
    """An existing profile with gemm.fp8_scale and gemm.fp8_fixed_scale fitted to `pairs` (fit_fp8_scale), written
    to out_path; everything else unchanged (the bf16 model is not refitted). Its version gains "+fp8"."""
    src = load_profile(profile)
    fit = fit_fp8_scale(pairs, src, fixed_scale, workers, timing)
    prof = json.loads(json.dumps(src.raw))
    prof["gemm"]["fp8_scale"] = fit["scale"]
    prof["gemm"].pop("fp8_fixed_scale", None)
    fixed = ""
    if fit["fixed_scale"] is not None:
        prof["gemm"]["fp8_fixed_scale"] = fit["fixed_scale"]
        fixed = f", their fixed cost x{fit['fixed_scale']:g}"
    from .amend import write_amended

    fp8_profile(profile_from_dict(prof, origin="profile with fitted FP8 tiles"))  # its FP8 form validates too
    return write_amended(prof, out_path, name, "+fp8",
                         f" FP8 tiles x{fit['scale']:g}{fixed}: the median FP8 gain of {fit['points']} measured "
                         "(configuration, policy) points (weave-sim calibrate --fp8).",
                         "fp8_from", fit, "profile with fitted FP8 tiles")

"""Measurements of the GPU calibration (python -m weave_kernel.calibrate) to profile curves: the push curve, the
GEMM rate by rows per expert (and by computing SMs, and by K), eff(K), the power model, padding's energy, and the
profile built from them (build_profile). The measurement format is in weave_sim.calibrate's docstring."""
from __future__ import annotations

import json

import numpy as np

from ..jsonfile import is_number, read_json
from ..profile import load_profile, profile_from_dict

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


CONCURRENCY_NOTE = (" scale_by_ctas: the factor on that rate while n SMs run tiles at once (rows per expert >= 1024, "
                    "rate at n over the median over n; the engine applies it per tile, with HBM shared by the n SMs).")


def gemm_concurrency_curve(points: list[dict], min_rows: int = 1024) -> dict[str, float] | None:
    """Factor on the per-SM rate by the number of CTAs computing at once (gemm.scale_by_ctas): for each
    rows-per-expert value >= min_rows (tiles bound by their MMAs, not by streaming weights from HBM), the rate at
    each CTA count over the median over CTA counts (gemm_curve's value), averaged over those rows values and made
    non-increasing in CTAs. None when fewer than two CTA counts were measured there."""
    by: dict[int, dict[int, float]] = {}
    for p in points:
        n, rows, tf = int(p["ctas"]), int(p["rows_per_expert"]), float(p["tflops"])
        if rows >= min_rows and n >= 1 and tf > 0:
            by.setdefault(rows, {})[n] = tf / n
    ratios: dict[int, list[float]] = {}
    for per_n in by.values():
        med = float(np.median(list(per_n.values())))
        for n, r in per_n.items():
            ratios.setdefault(n, []).append(r / med)
    if len(ratios) < 2:
        return None
    ctas = sorted(ratios)
    scale = np.minimum.accumulate([float(np.mean(ratios[n])) for n in ctas])
    return {str(n): round(float(x), 6) for n, x in zip(ctas, scale)}


K_FIXED_NOTE = (" k_fixed: the share of a tile's time at K = k (the K of the rate above) that does not grow with K "
                "(claim, pipeline fill, epilogue), from tiles timed at several K; the engine charges a tile of K "
                "(share k / K + 1 - share) times its FLOPs at the rate above.")


def gemm_k_fixed(measurements: dict) -> dict:
    """gemm.k_fixed from tiles timed at several K ("gemm_by_k": [{"k", "ctas", "rows_per_expert", "tile_us"}],
    python -m weave_kernel.calibrate or tests/kernel/tile_k_probe.py) and the K of the measurements' GEMM curve
    ("gemm_k"): per (rows, CTAs) with at least three K values a least-squares line tile_us = a + b K, taken at the
    fewest CTAs measured (no contention, no tail: the cleanest lines); share = a / (a + b gemm_k), the median over
    rows values, a clipped at 0."""
    pts = measurements.get("gemm_by_k") or []
    k_cal = measurements.get("gemm_k")
    if not pts or not k_cal:
        raise CalibrationError("gemm_by_k needs tiles timed at several K and the GEMM curve's K (gemm_k)")
    groups: dict[tuple[int, int], list[tuple[float, float]]] = {}
    for p in pts:
        k, t = float(p["k"]), float(p["tile_us"])
        if not (k > 0 and t > 0):
            raise CalibrationError(f"bad gemm_by_k point {p}")
        groups.setdefault((int(p["rows_per_expert"]), int(p["ctas"])), []).append((k, t))
    groups = {g: v for g, v in groups.items() if len({k for k, _ in v}) >= 3}
    if not groups:
        raise CalibrationError("gemm_by_k: no (rows, CTAs) group with tiles at three or more K")
    fewest = min(c for _, c in groups)
    fits = []
    for (rows, ctas), v in sorted(groups.items()):
        if ctas != fewest:
            continue
        b, a = np.polyfit([k for k, _ in v], [t for _, t in v], 1)
        if not b > 0:
            raise CalibrationError(f"gemm_by_k: tile time does not grow with K at {rows} rows, {ctas} CTAs")
        a = max(float(a), 0.0)
        fits.append((a, float(b), a / (a + b * float(k_cal))))
    share = float(np.median([f[2] for f in fits]))
    return {"share": round(share, 4), "k": int(k_cal), "fixed_us": round(float(np.median([f[0] for f in fits])), 3),
            "us_per_k": round(float(np.median([f[1] for f in fits])), 6), "ctas": fewest}


def chunk_efficiency(points: list[dict]) -> dict[str, float]:
    """eff(K) = time(K=1) / time(K), capped at 1 (chunking never counts as a speedup of the GEMMs); K an integer
    >= 1 and the time > 0 at every point."""
    times = {}
    for p in points:
        k, t = p.get("chunks"), p.get("time_ns")
        if not (is_number(k) and float(k).is_integer() and k >= 1 and is_number(t) and t > 0):
            raise CalibrationError(f"bad chunks point {p} (chunks an integer >= 1, time_ns > 0)")
        times[int(k)] = float(t)
    if 1 not in times:
        raise CalibrationError("chunks measurements need K=1")
    return {str(k): round(min(1.0, times[1] / t), 6) for k, t in sorted(times.items())}


def power_model(power: dict) -> dict:
    """The profile's power section (weave_sim.profile.PowerModel) from sustained GEMM points: base_w and
    w_per_tflops by least squares over the points at full clock below the limit (P = base + w R), exponent the
    median over the throttled points of log((P - base) / (w R)) / log(f), f = clock / the highest clock seen;
    cap_w = the board's limit (else the highest power seen); w_per_tbs = (P - base) / TB/s of the sustained HBM
    copy (the "hbm" point; 0 without one); pad_energy from the "pad_points", runs with zero rows in A, where
    measured (`pad_energy`). The GEMM points' own HBM traffic is not separated out."""
    pts = [p for p in power.get("points", []) if p.get("sm_mhz") and p.get("power_w") and p.get("tflops")]
    if not pts:
        raise CalibrationError("power: no points with clock, power and TFLOP/s")
    f_max = max(float(p["sm_mhz"]) for p in pts)
    cap = float(power.get("limit_w") or max(float(p["power_w"]) for p in pts))
    full = [p for p in pts if p["sm_mhz"] >= 0.99 * f_max and p["power_w"] < 0.98 * cap]
    slow = [p for p in pts if p["sm_mhz"] < 0.97 * f_max]
    if len({round(float(p["tflops"])) for p in full}) < 2:
        raise CalibrationError("power: need points at full clock with at least two different rates")
    if not slow:
        raise CalibrationError("power: no point where the clock fell (the cap never held): nothing to fit")
    r = np.array([float(p["tflops"]) for p in full])
    w, base = np.polyfit(r, np.array([float(p["power_w"]) for p in full]), 1)
    if not (w > 0 and 0 <= base < cap):
        raise CalibrationError(f"power: implausible fit (base {base:.0f} W, {w:.3f} W per TFLOP/s)")
    expo = [np.log((p["power_w"] - base) / (w * p["tflops"])) / np.log(p["sm_mhz"] / f_max) for p in slow]
    out = {"cap_w": round(cap, 1), "base_w": round(float(base), 1), "w_per_tflops": round(float(w), 4),
           "exponent": round(float(np.median(expo)), 3), "clock_mhz": f_max, "points": len(pts),
           "note": ("Board power P = base_w + w_per_tflops * R * f^exponent + w_per_tbs * B computing R TFLOP/s "
                    "and moving B TB/s through HBM at clock fraction f; above cap_w the clock falls "
                    "(weave_sim.profile.PowerModel). Fitted to sustained GEMM runs and a sustained HBM copy.")}
    hbm = power.get("hbm")
    if hbm:
        if not (hbm.get("tbs", 0) > 0 and hbm.get("power_w", 0) > base):
            raise CalibrationError(f"power: bad hbm point {hbm}")
        if hbm.get("sm_mhz", f_max) < 0.97 * f_max:
            raise CalibrationError("power: the HBM copy ran throttled; its W per TB/s would be too low")
        out["w_per_tbs"] = round(float((float(hbm["power_w"]) - base) / float(hbm["tbs"])), 3)
    if power.get("pad_points"):
        out.update(pad_energy(power["pad_points"], pts, base=float(base), w=float(w), exponent=float(np.median(expo)),
                              f_max=f_max))
    return out


def pad_energy(pad_points: list[dict], points: list[dict], *, base: float, w: float, exponent: float,
               f_max: float) -> dict:
    """power.pad_energy from sustained GEMM runs whose A has a fraction z of every 128-row block zeroed
    (`pad_points`: ctas, pad_fraction, tflops counting every row, sm_mhz, power_w), each against the point of
    `points` (A random throughout) at the same CTA count. Under the model a point's dynamic power per FLOP at
    unit clock is g = (P - base) / (w R f^exponent); padding rows' energy e relative to routed rows' then gives
    g_pad / g_random = 1 - z + z e, so e = (g_pad / g_random - (1 - z)) / z. The ratio cancels what the fit
    leaves in the random point. The median over the pad points, clipped to [0, 1] (the per-point values are kept
    unclipped in pad_energy_points)."""
    by_ctas = {int(p["ctas"]): p for p in points}

    def g(p: dict) -> float:
        return (float(p["power_w"]) - base) / (w * float(p["tflops"]) * (float(p["sm_mhz"]) / f_max) ** exponent)

    vals = []
    for p in pad_points:
        if not all(p.get(k) for k in ("ctas", "tflops", "sm_mhz", "power_w", "pad_fraction")):
            raise CalibrationError(f"power: pad point without ctas, tflops, sm_mhz, power_w and pad_fraction: {p}")
        z = float(p["pad_fraction"])
        if not 0.0 < z <= 1.0:
            raise CalibrationError(f"power: pad_fraction {z} outside (0, 1]")
        ref = by_ctas.get(int(p["ctas"]))
        if ref is None:
            raise CalibrationError(f"power: no point without padding at {p['ctas']} CTAs to compare the pad point with")
        if not (float(p["power_w"]) > base and float(ref["power_w"]) > base):
            raise CalibrationError(f"power: a pad point or its reference draws no more than base_w ({base:.0f} W)")
        vals.append((g(p) / g(ref) - (1.0 - z)) / z)
    e = float(np.median(vals))
    return {"pad_energy": round(min(1.0, max(0.0, e)), 3), "pad_energy_points": [round(float(v), 3) for v in vals]}


def build_profile(measurements: dict, base: str = "h200", name: str | None = None,
                  concurrency: bool = False, k_fixed_from: dict | None = None) -> dict:
    """A profile dictionary from measurements, falling back to `base` for what was not measured.
    concurrency: also the GEMM rate's dependence on the number of computing SMs (gemm.scale_by_ctas).
    k_fixed_from: measurements with tiles timed at several K (gemm_k_fixed) for gemm.k_fixed."""
    check_measurements(measurements)
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
    prof["nvlink"].pop("dispatch", None)
    if m.get("dispatch", "threads") != "threads":  # the copy code the push points ran (calibrate --dispatch)
        prof["nvlink"]["dispatch"] = str(m["dispatch"])
    prof["gemm"]["per_sm_tflops_by_rows"] = gemm_curve(m["gemm"])
    prof["gemm"]["note"] = ("Per-SM rate of the kernel's own tiles vs rows per expert: median over compute CTA "
                            "counts of TFLOP/s / CTAs, made non-decreasing in rows.")
    prof["gemm"].pop("scale_by_ctas", None)
    prof["gemm"].pop("k_fixed", None)
    if k_fixed_from is not None:
        prof["gemm"]["k_fixed"] = gemm_k_fixed(k_fixed_from)
        prof["gemm"]["note"] += K_FIXED_NOTE
        measured.append("gemm fixed cost per tile")
    conc = gemm_concurrency_curve(m["gemm"]) if concurrency else None
    if conc:
        prof["gemm"]["scale_by_ctas"] = conc
        prof["gemm"]["note"] += CONCURRENCY_NOTE
        measured.append("gemm concurrency")
    if "gemm_peak_tflops" in m:
        prof["gemm"]["peak_tflops"] = float(m["gemm_peak_tflops"])
        measured.append("gemm peak")
    if "hbm_gbs" in m:
        prof["hbm_gbs"] = float(m["hbm_gbs"])
        measured.append("hbm")
    if "chunks" in m:
        prof["chunk_eff"] = chunk_efficiency(m["chunks"])
        measured.append("chunk efficiency")
    if "power" in m:
        prof["power"] = power_model(m["power"])
        measured.append(f"power (from {m['power']['from']})" if "from" in m["power"] else "power")
    for key, slot in (("task_claim_ns", "task_claim"), ("signal_ns", "signal"), ("decision_ns", "decision"),
                      ("dispatch_piece_ns", "dispatch_piece")):
        if key in m:
            prof["fixed_ns"][slot] = int(round(float(m[key])))
            measured.append(slot if slot != "decision" or "decision_from" not in m
                            else f"decision (median of {m['decision_from']['records']} choose records in weave traces)")
    prof["source"] = (
        f"Measured on {m['gpu_name']} (driver {m.get('driver', '?')}) on {m['date']} at commit "
        f"{m.get('commit', '?')}: {', '.join(measured)}; other fields from base profile {base}."
    )
    prof["calibration"] = {"base": base, "measured": measured}
    for key in ("decision_from", "dispatch_piece_from"):
        if key in m:
            prof["calibration"][key] = m[key]
    profile_from_dict(prof, origin="calibrated profile")  # validates
    return prof


def _add_note(section: dict, note: str) -> None:
    """Append `note` to section["note"] once (a base that already carries it keeps one copy)."""
    if note not in section.get("note", ""):
        section["note"] = section.get("note", "") + note


#: The lists of points a measurements file may hold, and the numbers each point must carry.
POINT_FIELDS = {"nvlink_push": ("ctas", "gbs"), "gemm": ("ctas", "rows_per_expert", "tflops"),
                "chunks": ("chunks", "time_ns"), "gemm_by_k": ("k", "ctas", "rows_per_expert", "tile_us")}
#: The power block's lists of points, and the numbers their points may carry (absent or null: left out of the fit).
POWER_POINT_FIELDS = {"points": ("ctas", "tflops", "sm_mhz", "power_w"),
                      "pad_points": ("ctas", "pad_fraction", "tflops", "sm_mhz", "power_w")}
#: Single numbers of a measurements file (each finite and >= 0 where present).
SCALAR_FIELDS = ("task_claim_ns", "signal_ns", "hbm_gbs", "gemm_peak_tflops", "decision_ns", "dispatch_piece_ns",
                 "gemm_k")


def check_measurements(m, where: str = "measurements") -> dict:
    """`m` if its fields have the types the profile is built from, else a CalibrationError naming `where` (the
    file), the field and the bad value: an object; num_sms an integer >= 1; the SCALAR_FIELDS finite numbers >= 0;
    each list of POINT_FIELDS a list of objects with those fields finite numbers (chunks: an integer >= 1 with a
    time_ns > 0); power an object whose limit_w is a number and whose points and pad_points are lists of objects
    with numbers (or nulls) in POWER_POINT_FIELDS, hbm an object of numbers. Only the fields present are checked
    (a power file, a piece-cost file or a gemm_by_k file holds a few of them); the curves check the rest."""
    if not isinstance(m, dict):
        raise CalibrationError(f"{where}: measurements must be a JSON object, got {type(m).__name__}")
    if "num_sms" in m and not (is_number(m["num_sms"]) and float(m["num_sms"]).is_integer() and m["num_sms"] >= 1):
        raise CalibrationError(f"{where}: num_sms {m['num_sms']!r} is not an integer >= 1")
    for key in SCALAR_FIELDS:
        if m.get(key) is not None and not (is_number(m[key]) and m[key] >= 0):
            raise CalibrationError(f"{where}: {key} {m[key]!r} is not a finite number >= 0")

    def points(pts, name: str, fields: tuple, optional: bool = False) -> None:
        if not isinstance(pts, list):
            raise CalibrationError(f"{where}: {name} must be a list of points {{{', '.join(fields)}}}, got "
                                   f"{str(pts)[:80]}")
        for i, p in enumerate(pts):
            if not isinstance(p, dict):
                raise CalibrationError(f"{where}: {name}[{i}] is {str(p)[:80]}, not a point {{{', '.join(fields)}}}")
            for f in fields:
                v = p.get(f)
                if not (is_number(v) or (optional and v is None)):
                    raise CalibrationError(f"{where}: {name}[{i}] {f} {v!r} is not a finite number (point {p})")

    for key, fields in POINT_FIELDS.items():
        if key in m:
            points(m[key], key, fields)
    for i, p in enumerate(m.get("chunks") or []):
        if not (float(p["chunks"]).is_integer() and p["chunks"] >= 1 and p["time_ns"] > 0):
            raise CalibrationError(f"{where}: chunks[{i}] {p}: chunks must be an integer >= 1 and time_ns > 0")
    if "power" in m:
        power = m["power"]
        if not isinstance(power, dict):
            raise CalibrationError(f"{where}: power must be an object (limit_w, points, hbm, pad_points), got "
                                   f"{str(power)[:80]}")
        if power.get("limit_w") is not None and not (is_number(power["limit_w"]) and power["limit_w"] > 0):
            raise CalibrationError(f"{where}: power.limit_w {power['limit_w']!r} is not a number > 0")
        for key, fields in POWER_POINT_FIELDS.items():
            if power.get(key) is not None:
                points(power[key], f"power.{key}", fields, optional=True)
        hbm = power.get("hbm")
        if hbm is not None:
            if not isinstance(hbm, dict):
                raise CalibrationError(f"{where}: power.hbm must be an object (tbs, power_w, sm_mhz), got {hbm!r}")
            for f in ("tbs", "power_w", "sm_mhz"):
                if hbm.get(f) is not None and not is_number(hbm[f]):
                    raise CalibrationError(f"{where}: power.hbm {f} {hbm[f]!r} is not a finite number")
    return m


def read_measurements(path) -> dict:
    """A measurements (or benchmark) JSON file, or a CalibrationError naming it: unreadable, or a field of the
    wrong type (check_measurements)."""
    return check_measurements(read_json(path, "measurements", CalibrationError), str(path))

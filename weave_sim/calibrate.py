"""Turn calibration measurements into a versioned hardware profile.

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
import os
from pathlib import Path

import numpy as np

from .jsonfile import read_json
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
    """eff(K) = time(K=1) / time(K), capped at 1 (chunking never counts as a speedup of the GEMMs)."""
    times = {int(p["chunks"]): float(p["time_ns"]) for p in points}
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


def _trace_sources(path: str):
    """(name, events or None) for a Chrome trace file, or for each JSON member of a tar archive (.tgz, .tar.gz,
    .tar: e.g. the results_TAG.tgz a device run brings back); None for JSON that is not a Chrome trace."""
    from .timeline_stats import load_events

    if path.endswith((".tgz", ".tar.gz", ".tar")):
        import tarfile

        try:
            with tarfile.open(path) as tar:
                for member in sorted((m for m in tar.getmembers() if m.isfile() and m.name.endswith(".json")),
                                     key=lambda m: m.name):
                    try:
                        doc = json.loads(tar.extractfile(member).read())
                        yield f"{Path(path).name}:{Path(member.name).name}", load_events(doc)
                    except (ValueError, AttributeError):
                        yield member.name, None
        except (OSError, tarfile.TarError) as exc:
            raise CalibrationError(f"decision: cannot read archive {path}: {exc}") from None
        return
    try:
        yield Path(path).name, load_events(path)
    except ValueError as exc:
        raise CalibrationError(f"decision: {exc}") from None


def decision_from_traces(paths) -> dict:
    """The cost of weave's in-kernel choice from Chrome traces of `weave` calls (bench --trace ... --trace-policy
    weave; the simulator writes the same records), given as files or tar archives of them: the median duration of
    every `choose` record, i.e. of one deciding SM from the end of its count exchange to its choice. Returns {"ns",
    "records", "median_ns_by_trace", "traces"}; a CalibrationError when a file cannot be read or no trace holds a
    choose record (a static policy's trace, or a kernel built before the choice was recorded)."""
    paths = [str(p) for p in paths]
    if not paths:
        raise CalibrationError("decision: give at least one Chrome trace of a weave call")
    durs, by_trace = [], {}
    for path in paths:
        for name, events in _trace_sources(path):
            d = [float(e.get("dur", 0.0)) * 1e3 for e in events or () if e.get("name") == "choose"]
            if d:
                by_trace[name] = round(float(np.median(d)), 1)
                durs += d
    if not durs:
        raise CalibrationError(f"decision: no 'choose' records in {', '.join(paths)} (traces of weave calls needed)")
    if not all(np.isfinite(durs)) or min(durs) < 0:
        raise CalibrationError("decision: choose records with negative or non-finite durations")
    return {"ns": round(float(np.median(durs)), 1), "records": len(durs), "median_ns_by_trace": by_trace,
            "traces": paths}


def read_piece_cost(path) -> dict:
    """The fixed cost of one dispatch piece from `python -m weave_kernel.piece_cost --out FILE`: {"ns", "from"}."""
    d = read_measurements(path)
    ns = d.get("dispatch_piece_ns")
    if not isinstance(ns, (int, float)) or not ns >= 0:
        raise CalibrationError(f"{path}: no dispatch_piece_ns >= 0 (write it with python -m weave_kernel.piece_cost --out)")
    return {"ns": float(ns), "from": str(path), "traces": [t.get("trace") for t in d.get("traces", [])],
            "cta_gbs": (d.get("all") or {}).get("cta_gbs")}


def with_piece_cost(measurements: dict, path) -> dict:
    """Measurements with dispatch_piece_ns (and its provenance) from a piece_cost file."""
    pc = read_piece_cost(path)
    return {**measurements, "dispatch_piece_ns": pc["ns"], "dispatch_piece_from": pc}


def with_decision(measurements: dict, traces) -> dict:
    """Measurements with decision_ns (and its provenance, decision_from) taken from Chrome traces of weave calls."""
    dec = decision_from_traces(traces)
    return {**measurements, "decision_ns": dec["ns"], "decision_from": dec}


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
    Path(out_path).parent.mkdir(parents=True, exist_ok=True)
    Path(out_path).write_text(json.dumps(prof, indent=1))
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
    kind per process. timing: 'bench' or 'sustained' (validate.timed_as). Its version gains "+half" ("+half8")."""
    from .validate import bench_results, timed_as

    src = load_profile(profile)
    bench = timed_as(read_json(bench_path, "kernel benchmark", CalibrationError), timing, bench_path)
    results = [r for r in bench_results(bench) if r.get("kernel_layout") == "expert-packed-half"]
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


def _add_note(section: dict, note: str) -> None:
    """Append `note` to section["note"] once (a base that already carries it keeps one copy)."""
    if note not in section.get("note", ""):
        section["note"] = section.get("note", "") + note


def read_measurements(path) -> dict:
    """A measurements (or benchmark) JSON file, or a CalibrationError naming it."""
    return read_json(path, "measurements", CalibrationError)


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
    Path(out_path).parent.mkdir(parents=True, exist_ok=True)
    Path(out_path).write_text(json.dumps(prof, indent=1))
    return prof


# --- fitting the profile to measured kernel latencies ------------------------------------------------
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
    from .validate import validate_result

    keep = dict(result)
    keep["latency_ms"] = {p: t for p, t in result["latency_ms"].items()
                          if p != "reference" and (policies is None or p in policies)}
    v = validate_result(keep, prof)
    return [abs(np.log(v.predicted_ms[p] / v.measured_ms[p])) for p in v.predicted_ms]


def _result_clock_logs(result: dict, prof, policies) -> list[float]:
    """|log(predicted / measured)| of the SM clock of one benchmark result's kernel policies (those in `policies`,
    or all), per rank, where the result carries each policy's measured clock (validate.timed_as 'sustained':
    policy_mhz) and the profile predicts one (a power model)."""
    from .validate import validate_result

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


def bench_kernel_sources(bench: dict) -> str | None:
    """The fingerprint of the kernel a benchmark file measured (its "kernel_sources" "main" entry), or None."""
    ks = bench.get("kernel_sources")
    return ks.get("main") if isinstance(ks, dict) else None


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
    timing: the benchmark's times to fit, 'bench' (latency_ms) or 'sustained' (sustained_ms; validate.timed_as)."""
    if not power and power_path is not None:
        raise CalibrationError("a power file and no power model contradict each other")
    unknown = set(params) - set(FIT_PARAMS) - set(OPTIONAL_FIT_PARAMS)
    if unknown or not params:
        raise CalibrationError(f"fit parameters must be some of {FIT_PARAMS + OPTIONAL_FIT_PARAMS}; "
                               f"got {tuple(params)}")
    bench = read_json(bench_path, "kernel benchmark", CalibrationError)
    from .validate import bench_results, timed_as

    bench = timed_as(bench, timing, bench_path)

    bench = {**bench, "results": [r for r in bench_results(bench) if r["tokens_per_gpu"] >= min_tokens]}
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

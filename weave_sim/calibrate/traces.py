"""Fixed costs read from the kernel's own records: weave's in-kernel choice from the `choose` records of Chrome traces
(decision_from_traces), a dispatch piece's cost from a weave_kernel.piece_cost file (read_piece_cost), and the
measurements with either added (with_decision, with_piece_cost)."""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from .measured import CalibrationError, read_measurements


def _trace_sources(path: str):
    """(name, events or None) for a Chrome trace file, or for each JSON member of a tar archive (.tgz, .tar.gz,
    .tar: e.g. the results_TAG.tgz a device run brings back); None for JSON that is not a Chrome trace. A Chrome
    trace with an event that cannot be read (timeline_stats.TraceEventError) is a CalibrationError naming it."""
    from ..timeline_stats import TraceEventError, load_events

    if path.endswith((".tgz", ".tar.gz", ".tar")):
        import tarfile

        try:
            with tarfile.open(path) as tar:
                for member in sorted((m for m in tar.getmembers() if m.isfile() and m.name.endswith(".json")),
                                     key=lambda m: m.name):
                    name = f"{Path(path).name}:{Path(member.name).name}"
                    try:
                        events = load_events(json.loads(tar.extractfile(member).read()), name)
                    except TraceEventError as exc:
                        raise CalibrationError(f"decision: {exc}") from None
                    except (ValueError, AttributeError):
                        events, name = None, member.name
                    yield name, events
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

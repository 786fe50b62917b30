"""Per-GPU busy time by role and task kind from a Chrome trace, simulated or measured.

The simulator (`engine/timeline.py`) and the megakernel (`weave_kernel/timeline.py`) write the same format:
`{"traceEvents": [...]}` with `ph: "X"` events, `pid` = GPU, `tid` = SM, `name` = task kind, `cat` = role
("comm" / "compute"), `ts` / `dur` in microseconds. Events named "wait" are time spent spinning, not work.
"""
from __future__ import annotations

from .jsonfile import read_json

IDLE_KINDS = ("wait",)


def load_events(trace) -> list[dict]:
    """The `X` events of a trace given as a path or an already loaded dictionary."""
    if not isinstance(trace, dict):
        trace = read_json(trace, "Chrome trace")
    events = trace.get("traceEvents") if isinstance(trace, dict) else None
    if not isinstance(events, list):
        raise ValueError("not a Chrome trace: no traceEvents list")
    return [e for e in events if e.get("ph") == "X"]


def busy_stats(trace, num_sms: int | None = None, start_kind: str | None = None) -> dict[int, dict]:
    """Per GPU (pid): span_us (first start to last end), busy fraction = work / (span x SMs), and work
    by role and by kind in microseconds; shared_expert_us: the part of the gemm0 / gemm1 work that was the shared
    expert's tiles (events with args "shared"). SMs: `num_sms`, else the highest SM index seen + 1.

    start_kind: begin each GPU's window where the first of its SMs starts its last event of that kind, and
    clip events to the window. With "count_exchange" on a megakernel trace that is the moment the GPU holds
    every rank's counts, so a rank that entered the layer earlier and waited for its peers (launch skew of a
    single traced call) is measured over the layer proper. A GPU without such an event keeps its full span."""
    if num_sms is not None and num_sms < 1:
        raise ValueError(f"the SM count must be >= 1, got {num_sms}")
    events = load_events(trace)
    if start_kind is not None and not any(e["name"] == start_kind for e in events):
        raise ValueError(f"no event named {start_kind!r} in the trace to start from (kinds: "
                         f"{', '.join(sorted({e['name'] for e in events}))})")
    starts: dict[int, float] = {}
    if start_kind is not None:
        last: dict[tuple[int, int], float] = {}
        for e in events:
            if e["name"] == start_kind:
                key = (int(e["pid"]), int(e["tid"]))
                last[key] = max(last.get(key, float("-inf")), float(e["ts"]))
        for (pid, _), ts in last.items():
            starts[pid] = min(starts.get(pid, float("inf")), ts)
    per: dict[int, dict] = {}
    for e in events:
        pid = int(e["pid"])
        g = per.setdefault(pid, {"t0": float("inf"), "t1": 0.0, "sms": 0, "by_kind": {}, "by_role": {}, "shared": 0.0})
        ts, end = float(e["ts"]), float(e["ts"]) + float(e.get("dur", 0.0))
        g["sms"] = max(g["sms"], int(e["tid"]) + 1)
        if pid in starts:
            ts = max(ts, starts[pid])
            if end <= ts:
                continue
        dur = end - ts
        g["t0"], g["t1"] = min(g["t0"], ts), max(g["t1"], end)
        g["by_kind"][e["name"]] = g["by_kind"].get(e["name"], 0.0) + dur
        if (e.get("args") or {}).get("shared"):  # a shared expert's GEMM tile (also counted under its kind)
            g["shared"] += dur
        if e["name"] not in IDLE_KINDS:
            role = e.get("cat", "?")
            g["by_role"][role] = g["by_role"].get(role, 0.0) + dur
    out = {}
    for pid, g in sorted(per.items()):
        span = g["t1"] - g["t0"] if g["t1"] > g["t0"] else 0.0
        if num_sms is not None and num_sms < g["sms"]:
            raise ValueError(f"GPU {pid} has events on SM {g['sms'] - 1}, so it has more than the {num_sms} SMs given")
        sms = num_sms or g["sms"]
        work = sum(v for k, v in g["by_kind"].items() if k not in IDLE_KINDS)
        out[pid] = {"span_us": span, "num_sms": sms, "busy_fraction": work / (span * sms) if span > 0 else 0.0,
                    "work_us_by_role": g["by_role"], "work_us_by_kind": g["by_kind"], "shared_expert_us": g["shared"]}
    return out

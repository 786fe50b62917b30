"""Per-GPU busy time by role and task kind from a Chrome trace, simulated or measured.

The simulator (`engine/timeline.py`) and the megakernel (`weave_kernel/timeline.py`) write the same format:
`{"traceEvents": [...]}` with `ph: "X"` events, `pid` = GPU, `tid` = SM, `name` = task kind, `cat` = role
("comm" / "compute"), `ts` / `dur` in microseconds. Events named "wait" are time spent spinning, not work.
"""
from __future__ import annotations

import math

from .jsonfile import is_number, read_json

IDLE_KINDS = ("wait",)


class TraceEventError(ValueError):
    """A Chrome trace holds an event the statistics cannot use (not an object, a missing or mistyped field, a negative
    duration); the message names the file, the event and the field."""


def _check_event(e: dict, i: int, where: str) -> None:
    """TraceEventError unless `e` (the i-th event, ph "X") has what busy_stats reads: a string name; pid and tid
    integers, tid >= 0 (an SM); ts a finite number; dur, if given, a finite number >= 0; cat, if given, a string;
    args, if given, an object."""
    def bad(why: str):
        return TraceEventError(f"{where}: event {i} ({e.get('name', '?')!r}) {why} (event: {str(e)[:200]})")

    for key in ("name", "pid", "tid", "ts"):
        if key not in e:
            raise bad(f"has no {key!r}")
    if not isinstance(e["name"], str):
        raise bad(f"has name {e['name']!r}, not a string")
    for key in ("pid", "tid"):
        v = e[key]
        if not (is_number(v) and float(v).is_integer()):
            raise bad(f"has {key} {v!r}, not an integer")
    if e["tid"] < 0:
        raise bad(f"has tid {e['tid']!r}: an SM index must be >= 0")
    if not is_number(e["ts"]):
        raise bad(f"has ts {e['ts']!r}, not a finite number")
    if "dur" in e and not (is_number(e["dur"]) and e["dur"] >= 0):
        raise bad(f"has dur {e['dur']!r}, not a finite number >= 0")
    if e.get("cat") is not None and not isinstance(e["cat"], str):
        raise bad(f"has cat {e['cat']!r}, not a string")
    if e.get("args") is not None and not isinstance(e["args"], dict):
        raise bad(f"has args {e['args']!r}, not an object")


def load_events(trace, where: str | None = None) -> list[dict]:
    """The `X` events of a trace given as a path or an already loaded dictionary, each checked to carry what
    busy_stats reads (TraceEventError naming the event otherwise); ValueError when it is not a Chrome trace.
    where: the trace's name in messages (default: its path, or "the trace")."""
    where = where or ("the trace" if isinstance(trace, dict) else str(trace))
    if not isinstance(trace, dict):
        trace = read_json(trace, "Chrome trace")
    events = trace.get("traceEvents") if isinstance(trace, dict) else None
    if not isinstance(events, list):
        raise ValueError(f"{where}: not a Chrome trace: no traceEvents list")
    out = []
    for i, e in enumerate(events):
        if not isinstance(e, dict):
            raise TraceEventError(f"{where}: event {i} is {str(e)[:100]}, not an object")
        if e.get("ph") == "X":
            _check_event(e, i, where)
            out.append(e)
    return out


def _union_us(spans: list[tuple[float, float]]) -> float:
    """Length of the union of [start, end) intervals: time covered at least once."""
    total, end = 0.0, -math.inf
    for a, b in sorted(spans):
        if b > end:
            total += b - max(a, end)
            end = b
    return total


def busy_stats(trace, num_sms: int | None = None, start_kind: str | None = None) -> dict[int, dict]:
    """Per GPU (pid): span_us (first start to last end), busy fraction = work / (span x SMs), and work
    by role and by kind in microseconds; shared_expert_us: the part of the gemm0 / gemm1 work that was the shared
    expert's tiles (events with args "shared"). SMs: `num_sms`, else the highest SM index seen + 1.

    Time is counted once per SM: events that overlap on one SM (the kernel records its `choose` inside its
    `count_exchange`) count their union in the work (the busy fraction never exceeds 1), in each role and in each
    kind; an event nested in another of a different kind is in both kinds' time.

    start_kind: begin each GPU's window where the first of its SMs starts its last event of that kind, and
    clip events to the window. With "count_exchange" on a megakernel trace that is the moment the GPU holds
    every rank's counts, so a rank that entered the layer earlier and waited for its peers (launch skew of a
    single traced call) is measured over the layer proper. A GPU without such an event keeps its full span.

    A trace that is no Chrome trace, an event without what is read here (TraceEventError), and a GPU whose events
    span no time (every duration 0 or none) are ValueErrors naming the file."""
    if num_sms is not None and num_sms < 1:
        raise ValueError(f"the SM count must be >= 1, got {num_sms}")
    where = "the trace" if isinstance(trace, dict) else str(trace)
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
        pid, sm = int(e["pid"]), int(e["tid"])
        g = per.setdefault(pid, {"t0": float("inf"), "t1": float("-inf"), "sms": 0, "spans": {}})
        ts, end = float(e["ts"]), float(e["ts"]) + float(e.get("dur", 0.0))
        g["sms"] = max(g["sms"], sm + 1)
        if pid in starts:
            ts = max(ts, starts[pid])
            if end <= ts:
                continue
        g["t0"], g["t1"] = min(g["t0"], ts), max(g["t1"], end)
        keys = [("kind", e["name"])]
        if (e.get("args") or {}).get("shared"):  # a shared expert's GEMM tile (also counted under its kind)
            keys.append(("shared",))
        if e["name"] not in IDLE_KINDS:
            keys += [("role", e.get("cat") or "?"), ("work",)]
        for key in keys:
            g["spans"].setdefault(key + (sm,), []).append((ts, end))
    out = {}
    for pid, g in sorted(per.items()):
        span = g["t1"] - g["t0"] if g["t1"] > g["t0"] else 0.0
        if span <= 0:
            window = f" from its last {start_kind!r} event on" if pid in starts else ""
            raise ValueError(f"{where}: GPU {pid}'s events{window} span no time (every duration 0 or none): no "
                             "busy fraction to give")
        if num_sms is not None and num_sms < g["sms"]:
            raise ValueError(f"GPU {pid} has events on SM {g['sms'] - 1}, so it has more than the {num_sms} SMs given")
        sms = num_sms or g["sms"]
        total: dict[tuple, float] = {}
        for key, spans in g["spans"].items():
            total[key[:-1]] = total.get(key[:-1], 0.0) + _union_us(spans)
        by_kind = {k[1]: v for k, v in total.items() if k[0] == "kind"}
        by_role = {k[1]: v for k, v in total.items() if k[0] == "role"}
        work = total.get(("work",), 0.0)
        out[pid] = {"span_us": span, "num_sms": sms, "busy_fraction": work / (span * sms),
                    "work_us_by_role": by_role, "work_us_by_kind": by_kind,
                    "shared_expert_us": total.get(("shared",), 0.0)}
    return out

"""Per-SM timeline: the record layout (mirror of weave::TimelineRecord in csrc/params.h) and the Chrome trace
writer. Format shared with the simulator: {"traceEvents": [...]}, pid = rank, tid = SM, ph "X", ts/dur in us.
"""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np

#: Mirror of weave::TimelineRecord (32 bytes); tests/kernel/test_timeline.py checks it against params.h.
RECORD_DTYPE = np.dtype([
    ("start_ns", "<u8"),
    ("end_ns", "<u8"),
    ("sm", "<u4"),
    ("role", "<u2"),
    ("kind", "<u2"),
    ("arg0", "<i4"),
    ("arg1", "<i4"),
])
#: Index = weave::TaskKind value.
KIND_NAMES = ("count_exchange", "dispatch", "gemm0", "gemm1", "combine", "reduce", "wait", "choose", "shared_gemm0",
              "shared_gemm1")
#: Record kinds written to the Chrome trace under another event name (with args "shared": 1): the shared expert's
#: tiles are GEMM tiles like the routed experts' (the simulator's trace names them the same way).
EVENT_NAME = {"shared_gemm0": "gemm0", "shared_gemm1": "gemm1"}
#: Index = weave::Role value.
ROLE_NAMES = ("comm", "compute")


def records_to_events(records: np.ndarray, rank: int, base_ns: int) -> list[dict]:
    """Chrome 'X' events for one rank's records (structured array of RECORD_DTYPE)."""
    events = []
    for r in records:
        kind = KIND_NAMES[int(r["kind"])] if int(r["kind"]) < len(KIND_NAMES) else f"kind{int(r['kind'])}"
        args = ({"c_star": int(r["arg0"]), "k_star": int(r["arg1"])}
                if kind in ("count_exchange", "choose") and int(r["arg0"]) >= 0  # weave: the choice
                else {"row_block": int(r["arg0"]), "col_block_or_rank": int(r["arg1"])})
        if kind in EVENT_NAME:
            args["shared"] = 1
        events.append({
            "name": EVENT_NAME.get(kind, kind),
            "cat": ROLE_NAMES[int(r["role"])] if int(r["role"]) < len(ROLE_NAMES) else "unknown",
            "ph": "X",
            "pid": rank,
            "tid": int(r["sm"]),
            "ts": (int(r["start_ns"]) - base_ns) / 1000.0,
            "dur": max(0, int(r["end_ns"]) - int(r["start_ns"])) / 1000.0,
            "args": args,
        })
    return events


def process_metadata(rank: int, label: str) -> dict:
    return {"name": "process_name", "ph": "M", "pid": rank, "args": {"name": label}}


def write_chrome_trace(path, events: list[dict], metadata: dict | None = None) -> Path:
    """Write {"traceEvents": events, "metadata": ...} as JSON; returns the path."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    doc = {"traceEvents": events, "displayTimeUnit": "ns"}
    if metadata:
        doc["metadata"] = metadata
    path.write_text(json.dumps(doc))
    return path

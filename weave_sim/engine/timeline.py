"""Chrome trace event JSON of one simulated layer (opens in Perfetto and chrome://tracing).

Layout: one process per GPU (pid = GPU index), one thread per SM (tid = SM index). Every task an SM ran
is a complete event (ph 'X', ts and dur in microseconds) named by its kind (count_exchange, dispatch,
gemm0, gemm1, combine, reduce, and 'choose' for the tail of Weave's count exchange that decides (c*, K*),
args c_star and k_star: the names and args of weave_kernel/timeline.py; a shared expert's gemm0/gemm1 has the
arg shared = 'first' or 'last') with cat = the SM's role ('comm' or
'compute'; under `sequential`, where SMs have no fixed role, the task's own nature). Gaps between an SM's
tasks up to its GPU's end are 'wait' events. NVLink rates are counter tracks (ph 'C', 'nvlink GB/s',
args egress and ingress) per GPU: sampled at every rate change when the run recorded them
(record_timeline=True), else each transfer's average rate over its lifetime.
"""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from .dag import C_COMM, C_CTRL, C_VIRTUAL, K_CTRL, KIND_NAMES, SHARED_FIRST, SHARED_LAST

SHARED_NAMES = {SHARED_FIRST: "first", SHARED_LAST: "last"}
from .hardware import ROLE_ANY, ROLE_NAMES
from .metrics import LayerResult


def chrome_trace_events(result: LayerResult) -> list[dict]:
    """The traceEvents list (see module docstring)."""
    if not result.has_records:
        raise ValueError("this LayerResult's per-task records were dropped; re-simulate the layer for a trace")
    g_ = result.graph
    G, N = result.roles.shape
    cls = g_.cls
    events: list[dict] = []
    for g in range(G):
        events.append({"ph": "M", "name": "process_name", "pid": g, "args": {"name": f"GPU {g}"}})
        for sm in range(N):
            events.append({"ph": "M", "name": "thread_name", "pid": g, "tid": sm,
                           "args": {"name": f"SM {sm} ({ROLE_NAMES[result.roles[g, sm]]})"}})
    ran = np.flatnonzero(cls != C_VIRTUAL)
    for t in ran.tolist():
        g, sm = int(g_.gpu[t]), int(result.sm[t])
        role = result.roles[g, sm]
        cat = ROLE_NAMES[role] if role != ROLE_ANY else ("comm" if cls[t] in (C_COMM, C_CTRL) else "compute")
        args = {"task": t}
        if g_.peer[t] >= 0:
            args.update(peer=int(g_.peer[t]), bytes=int(g_.nbytes[t]))
        if g_.tiles[t] > 1:
            args["tiles"] = int(g_.tiles[t])
        if g_.shared is not None and g_.shared[t]:
            args["shared"] = SHARED_NAMES[int(g_.shared[t])]
        start, end = int(result.start_ns[t]), int(result.end_ns[t])
        decision = result.plan.decision_ns if g_.kind[t] == K_CTRL and not result.plan.decision_sms else 0
        if decision:  # the kernel records its in-kernel (c*, K*) decision as a separate 'choose' event
            events.append({"ph": "X", "name": "choose", "cat": cat, "pid": g, "tid": sm,
                           "ts": (end - decision) / 1e3, "dur": decision / 1e3,
                           "args": {"c_star": int(result.plan.num_comm_sms[g]),
                                    "k_star": int(result.plan.num_chunks[g])}})
            end -= decision
        events.append({"ph": "X", "name": KIND_NAMES[g_.kind[t]], "cat": cat, "pid": g, "tid": sm,
                       "ts": start / 1e3, "dur": (end - start) / 1e3, "args": args})
    extra = _decisions(result)
    for g, sm, a, b in extra:
        events.append({"ph": "X", "name": "choose", "cat": ROLE_NAMES[result.roles[g, sm]], "pid": g, "tid": sm,
                       "ts": a / 1e3, "dur": (b - a) / 1e3,
                       "args": {"c_star": int(result.plan.num_comm_sms[g]), "k_star": int(result.plan.num_chunks[g])}})
    events += _waits(result, ran, extra)
    events += _counters(result)
    return events


def _decisions(result: LayerResult) -> list[tuple[int, int, int, int]]:
    """(gpu, sm, start, end) of the decision on the SMs that make it after the count exchange (plan.decision_sms)."""
    plan, g_ = result.plan, result.graph
    if not plan.decision_sms or not plan.decision_ns:
        return []
    out = []
    for t in np.flatnonzero(g_.kind == K_CTRL).tolist():
        g, end = int(g_.gpu[t]), int(result.end_ns[t])
        out += [(g, sm, end, end + plan.decision_ns) for sm in range(min(plan.decision_sms[g], result.roles.shape[1]))]
    return out


def _waits(result: LayerResult, ran: np.ndarray, extra=()) -> list[dict]:
    """Gaps between an SM's tasks (and `extra` busy intervals (gpu, sm, start, end)) up to its GPU's end."""
    out = []
    x = np.array(extra, dtype=np.int64).reshape(-1, 4)
    gpu = np.r_[result.graph.gpu[ran].astype(np.int64), x[:, 0]]
    sm = np.r_[result.sm[ran].astype(np.int64), x[:, 1]]
    st, en = np.r_[result.start_ns[ran], x[:, 2]], np.r_[result.end_ns[ran], x[:, 3]]
    order = np.lexsort((st, sm, gpu))
    key = gpu[order] * 1_000_000 + sm[order]
    starts, ends = st[order], en[order]
    G, N = result.roles.shape
    for g in range(G):
        for s in range(N):
            lo, hi = np.searchsorted(key, [g * 1_000_000 + s, g * 1_000_000 + s + 1])
            free = np.r_[0, ends[lo:hi]]
            busy = np.r_[starts[lo:hi], result.gpu_latency_ns[g]]
            for a, b in zip(free.tolist(), busy.tolist()):
                if b > a:
                    out.append({"ph": "X", "name": "wait", "cat": ROLE_NAMES[result.roles[g, s]], "pid": g,
                                "tid": s, "ts": a / 1e3, "dur": (b - a) / 1e3})
    return out


def _counters(result: LayerResult) -> list[dict]:
    G = result.roles.shape[0]
    if result.nvlink_samples:
        samples = result.nvlink_samples
    else:
        g_ = result.graph
        tx = np.flatnonzero(g_.cls == C_COMM)
        times = np.unique(np.r_[result.start_ns[tx], result.end_ns[tx]])
        samples = []
        rate = g_.nbytes[tx] / np.maximum(result.end_ns[tx] - result.start_ns[tx], 1)
        for t in times.tolist():
            on = (result.start_ns[tx] <= t) & (result.end_ns[tx] > t)
            samples.append((t, np.bincount(g_.gpu[tx][on], rate[on], G), np.bincount(g_.peer[tx][on], rate[on], G)))
    out = []
    for t, egress, ingress in samples:
        for g in range(G):
            out.append({"ph": "C", "name": "nvlink GB/s", "pid": g, "ts": t / 1e3,
                        "args": {"egress": round(float(egress[g]), 3), "ingress": round(float(ingress[g]), 3)}})
    return out


def write_chrome_trace(result: LayerResult, path) -> Path:
    """Write {"traceEvents": [...], "displayTimeUnit": "ns", "otherData": {...}} to `path`; return the path."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    doc = {"traceEvents": chrome_trace_events(result), "displayTimeUnit": "ns",
           "otherData": {"policy": result.policy, "layer": result.layer, "latency_us": result.latency_ns / 1e3,
                         "plan": result.plan.to_dict()}}
    path.write_text(json.dumps(doc, separators=(",", ":")))
    return path

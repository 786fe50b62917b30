"""Results of a simulated layer or model, and the metrics derived from a run's task records.

Definitions (per GPU g, N SMs, latency L_g = end of g's last task, layer latency = max_g L_g):
    busy[g, role]     sum of task durations on SMs of that role (claim costs included)
    busy_by_kind      the same by task kind; with shared experts simulated also 'shared_expert', the time of
                      their GEMM tasks (a part of gemm0 + gemm1, not on top of it)
    idle[g, role]     L_g * SMs of that role - busy; so busy + idle = L_g * N
    bubble_fraction   idle / (L_g * N)
    overlap_fraction  time with >= 1 transfer pushed by g AND >= 1 GEMM task on g running,
                      over time with either running (0 when neither runs)
    nvlink_util_out   bytes g pushed / (L_g * NVLink peak); nvlink_util_in likewise for bytes g received
    critical_path_ns  longest dependency chain with the realised task durations, signal latencies and barrier
                      delays but no queueing for an SM: a lower bound of the latency
    binding_path      the realised chain that ended last, walked back through each task's latest-ending
                      dependency; its time by kind, plus 'wait' (ready but no free SM) and 'signal'
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from .dag import C_COMM, C_GEMM, C_VIRTUAL, KIND_NAMES, TaskGraph
from .hardware import ROLE_NAMES
from .plan import Plan


@dataclass(eq=False)
class LayerResult:
    """One layer under one policy. Arrays are per GPU unless stated; times in integer ns."""

    policy: str
    plan: Plan
    latency_ns: int
    gpu_latency_ns: np.ndarray
    busy_ns: np.ndarray  # [G, 3] by role (comm, compute, any)
    idle_ns: np.ndarray  # [G, 3]
    busy_by_kind_ns: dict  # kind name -> [G]
    bubble_fraction: np.ndarray
    overlap_fraction: np.ndarray
    nvlink_util_out: np.ndarray
    nvlink_util_in: np.ndarray
    bytes_out: np.ndarray
    bytes_in: np.ndarray
    critical_path_ns: int
    critical_path_gpu_ns: np.ndarray  # [G]: the longest chain ending in a task of that GPU
    binding_path_ns: dict
    num_tasks: int
    num_events: int
    wall_s: float
    graph: TaskGraph | None = field(repr=False)  # per-task records: None after drop_records()
    start_ns: np.ndarray | None = field(repr=False)
    end_ns: np.ndarray | None = field(repr=False)
    sm: np.ndarray | None = field(repr=False)
    roles: np.ndarray = field(repr=False)  # [G, N] role of each SM
    nvlink_samples: list = field(repr=False, default_factory=list)
    layer: int = 0
    candidates: list = field(default_factory=list)  # (label, latency_ns) tried by a searching policy
    gemm_clock: np.ndarray | None = None  # per GPU: SM clock / the profile's GEMM clock (power model), else None

    @property
    def num_sms(self) -> int:
        return int(self.roles.shape[1])

    @property
    def has_records(self) -> bool:
        """False after drop_records(): the metrics remain, the trace and Gantt need a re-run."""
        return self.graph is not None

    def drop_records(self) -> "LayerResult":
        """Free the per-task records (graph, start/end/SM, NVLink samples; ~10 MB on a DeepSeek-V3 layer)."""
        self.graph = self.start_ns = self.end_ns = self.sm = None
        self.nvlink_samples = []
        return self

    def to_dict(self) -> dict:
        """JSON-ready summary (no per-task records)."""
        return {
            "layer": self.layer, "policy": self.policy, "plan": self.plan.to_dict(),
            "latency_us": self.latency_ns / 1e3,
            "gpu_latency_us": (self.gpu_latency_ns / 1e3).tolist(),
            "busy_us": {r: (self.busy_ns[:, i] / 1e3).tolist() for i, r in enumerate(ROLE_NAMES)},
            "idle_us": {r: (self.idle_ns[:, i] / 1e3).tolist() for i, r in enumerate(ROLE_NAMES)},
            "busy_by_kind_us": {k: (v / 1e3).tolist() for k, v in self.busy_by_kind_ns.items()},
            "bubble_fraction": self.bubble_fraction.tolist(),
            "overlap_fraction": self.overlap_fraction.tolist(),
            "nvlink_util_out": self.nvlink_util_out.tolist(),
            "nvlink_util_in": self.nvlink_util_in.tolist(),
            "critical_path_us": self.critical_path_ns / 1e3,
            "critical_path_gpu_us": (self.critical_path_gpu_ns / 1e3).tolist(),
            "binding_path_us": {k: v / 1e3 for k, v in self.binding_path_ns.items()},
            "num_tasks": self.num_tasks, "num_events": self.num_events, "wall_s": self.wall_s,
            "candidates": [{"label": lab, "latency_us": t / 1e3} for lab, t in self.candidates],
            "gemm_clock": None if self.gemm_clock is None else [round(float(c), 4) for c in self.gemm_clock],
        }


def summarize(policy: str, plan: Plan, graph: TaskGraph, start, end, sm, roles: np.ndarray,
              nvlink_peak_gbs: float, signal_ns: int, *, num_events: int = 0, wall_s: float = 0.0,
              samples=None) -> LayerResult:
    """Build a LayerResult from one run's per-task records (start/end/sm, -1 sm for barriers)."""
    start, end, sm = (np.asarray(x, dtype=np.int64) for x in (start, end, sm))
    G, N = roles.shape
    cls = graph.cls
    gpu = graph.gpu.astype(np.int64)
    lat = np.zeros(G, dtype=np.int64)
    np.maximum.at(lat, gpu, end)
    ran = cls != C_VIRTUAL
    d = end - start
    role = np.where(ran, roles[gpu, np.maximum(sm, 0)], 0)
    busy = np.zeros((G, 3), dtype=np.int64)
    np.add.at(busy, (gpu[ran], role[ran]), d[ran])
    per_role = np.stack([(roles == r).sum(axis=1) for r in range(3)], axis=1)
    idle = lat[:, None] * per_role - busy
    by_kind = {}
    for k, name in enumerate(KIND_NAMES[:-1]):
        m = ran & (graph.kind == k)
        by_kind[name] = np.bincount(gpu[m], weights=d[m], minlength=G)
    if graph.shared is not None:
        m = ran & (graph.shared > 0)
        by_kind["shared_expert"] = np.bincount(gpu[m], weights=d[m], minlength=G)
    span = np.maximum(lat, 1)
    is_tx = cls == C_COMM
    bytes_out = np.bincount(gpu[is_tx], weights=graph.nbytes[is_tx], minlength=G)
    bytes_in = np.bincount(graph.peer[is_tx], weights=graph.nbytes[is_tx], minlength=G)
    overlap = np.array([_overlap(start, end, is_tx & (gpu == g), (cls == C_GEMM) & (gpu == g)) for g in range(G)])
    chain = chain_end_ns(graph, start, end, signal_ns)
    cp_gpu = np.zeros(G, dtype=np.int64)
    np.maximum.at(cp_gpu, gpu, chain)
    return LayerResult(
        policy=policy, plan=plan, latency_ns=int(lat.max()), gpu_latency_ns=lat, busy_ns=busy, idle_ns=idle,
        busy_by_kind_ns=by_kind, bubble_fraction=idle.sum(axis=1) / (span * N), overlap_fraction=overlap,
        nvlink_util_out=bytes_out / (span * nvlink_peak_gbs), nvlink_util_in=bytes_in / (span * nvlink_peak_gbs),
        bytes_out=bytes_out, bytes_in=bytes_in,
        critical_path_ns=int(cp_gpu.max(initial=0)), critical_path_gpu_ns=cp_gpu,
        binding_path_ns=binding_path(graph, start, end, signal_ns),
        num_tasks=graph.num_tasks, num_events=num_events, wall_s=wall_s, graph=graph, start_ns=start,
        end_ns=end, sm=sm, roles=roles, nvlink_samples=samples or [],
    )


def _overlap(start, end, a_mask, b_mask) -> float:
    """|A and B| / |A or B| for the unions of intervals A (a_mask) and B (b_mask)."""
    if not a_mask.any() or not b_mask.any():
        return 0.0
    grid = np.unique(np.concatenate([start[a_mask | b_mask], end[a_mask | b_mask]]))
    seg = np.diff(grid)

    def covered(mask):
        cnt = np.zeros(grid.size, dtype=np.int64)
        np.add.at(cnt, np.searchsorted(grid, start[mask]), 1)
        np.add.at(cnt, np.searchsorted(grid, end[mask]), -1)
        return np.cumsum(cnt)[:-1] > 0

    ca, cb = covered(a_mask), covered(b_mask)
    union = seg[ca | cb].sum()
    return float(seg[ca & cb].sum() / union) if union else 0.0


def _edge_delay(graph: TaskGraph, signal_ns: int) -> np.ndarray:
    """Delay on each dependent edge (CSR order): the signal latency where it crosses GPUs."""
    return np.where(graph.gpu[graph.edge_src] != graph.gpu[graph.dep_idx], signal_ns, 0)


def chain_end_ns(graph: TaskGraph, start, end, signal_ns: int) -> np.ndarray:
    """[T]: length of the longest dependency chain ending with each task, with realised durations, signal
    latencies and barrier delays but no queueing for an SM (its max is the critical path)."""
    dur = np.asarray(end) - np.asarray(start)
    if graph.dep_idx.size == 0:
        return dur
    order = np.argsort(graph.dep_idx, kind="stable")
    dst = graph.dep_idx[order]
    src = graph.edge_src[order]
    w = _edge_delay(graph, signal_ns)[order]
    heads = np.flatnonzero(np.r_[True, dst[1:] != dst[:-1]])
    targets = dst[heads]
    fin = dur.copy()
    for _ in range(graph.num_tasks + 1):  # Bellman-Ford style relaxation; converges in (DAG depth) rounds
        new = dur.copy()
        new[targets] += np.maximum.reduceat(fin[src] + w, heads)
        if np.array_equal(new, fin):
            break
        fin = new
    return fin


def binding_path(graph: TaskGraph, start, end, signal_ns: int) -> dict:
    """Time of the realised critical chain by kind, plus 'wait' and 'signal' (see module docstring)."""
    ptr, preds = graph.preds()
    cross = graph.gpu
    out = {name: 0 for name in (*KIND_NAMES, "wait", "signal")}
    t = int(np.argmax(end))
    while True:
        out[KIND_NAMES[graph.kind[t]]] += int(end[t] - start[t])
        p = preds[ptr[t]:ptr[t + 1]]
        if p.size == 0:
            out["wait"] += int(start[t])
            break
        delay = np.where(cross[p] != cross[t], signal_ns, 0)
        i = int(np.argmax(end[p] + delay))
        ready = int(end[p[i]] + delay[i])
        out["signal"] += int(delay[i])
        out["wait"] += int(start[t]) - ready
        t = int(p[i])
    return out

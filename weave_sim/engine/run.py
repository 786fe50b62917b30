"""Entry points: simulate one layer, a whole model, or sweep policies over layers.

    simulate_layer(workload, profile, "weave") -> LayerResult
    simulate_model(routing [N, L, k], model, placement, profile, "static:20") -> ModelResult
    sweep(routing, model, placement, profile, ["sequential", "static:20", "weave", "oracle"]) -> SweepTable
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field

import numpy as np

from ..placement import Placement, placement_for
from ..presets import ModelPreset
from ..profile import HardwareProfile
from ..workload import EXPERT_DTYPES, LayerWorkload, layer_workload
from .core import LayerSim
from .dag import SHARED_ORDERS, build_graph
from .metrics import LayerResult, summarize
from .plan import Plan
from .policies import parse_policy

DEFAULT_STATIC_GRID = (4, 8, 12, 16, 20, 24, 32, 48, 64)
POWER_ITERATIONS = 6     # simulations per layer at most under a power model
POWER_TOLERANCE = 0.004  # clock fraction: stop once no GPU's clock moves more


DECIDER_MODES = ("table", "all")  # SimOptions.kernel_deciders
PIECE_DEALS = ("round-robin", "queue")


@dataclass(frozen=True)
class SimOptions:
    """Knobs of one simulation.

    seed: seeds the optional GEMM-time jitter (runs are deterministic for a given seed).
    jitter: sigma of a log-normal factor on each GEMM task's time (0 = exact profile times).
    tile_rows, tile_cols: GEMM output tile shape.
    comm_chunk_rows: rows per dispatch/combine transfer (None = tile_rows).
    gemm_tasks_per_sm: GEMM tile batching target (see dag.py); None = one tile per task.
    dispatch_order: 'token', 'expert' or 'piece', the order of rows in each dispatch stream and, for 'piece',
        the megakernel's transfers (see dag.py).
    fairness: 'shares' or 'maxmin', how transfers share NVLink (see hardware.py).
    segment_pad_rows: None, or cut row blocks per (expert, source) segment, as the first megakernel laid out
        its receive buffer, and charge each GEMM tile its rows rounded up to this many (the MMA granularity).
    expert_pad_rows: None, or (row blocks cut over an expert's rows from all sources, as the megakernel packs
        them now) charge each GEMM tile its rows rounded up to this many. Excludes segment_pad_rows.
    record_timeline: keep NVLink rate samples for the Chrome trace counters.
    piece_deal: with dispatch_order 'piece', how the comm SMs get the pieces: 'round-robin' (the megakernel: comm
        SM i of C pushes pieces i, i + C, ... one after another) or 'queue' (whichever comm SM is free takes the
        next piece, as from an atomic ticket).
    kernel_deciders: which SMs make weave's in-kernel decision under `kernel:weave*` (policies/kernel.py):
        'table' (the megakernel since 9caebac: the SMs below the cost table's max_comm_sms, one under a fixed C;
        the others start at once) or 'all' (the kernels before it: every SM decides, and waits for it).
    shared: the model's shared experts (one FFN of width num_shared_experts * I per GPU, on its own tokens, no
        dispatch or combine; dag.py "Shared experts"): 'off' (not simulated), 'first' (their tiles ahead of every
        routed tile in the GPU's GEMM queue) or 'last' (after every routed tile). A no-op for a model without
        shared experts.
    expert_dtype: 'bf16' (the megakernel) or 'fp8' (not built; weave_kernel.whatif --variant fp8:S): e4m3 expert
        weights with one fp32 scale per 128 x 128 block, streamed at 1 byte per element, and dispatch rows of 1 byte
        per element plus one fp32 scale per 128 (the combine rows, the reduction and the tiles' outputs stay bf16).
        The tiles' FLOP rate is the profile's; the FP8 rate is the what-if's to give.
    """

    seed: int = 0
    jitter: float = 0.0
    tile_rows: int = 128
    tile_cols: int = 128
    comm_chunk_rows: int | None = None
    gemm_tasks_per_sm: int | None = 32
    dispatch_order: str = "token"
    fairness: str = "shares"
    segment_pad_rows: int | None = None
    expert_pad_rows: int | None = None
    record_timeline: bool = False
    kernel_deciders: str = "table"
    piece_deal: str = "round-robin"
    shared: str = "off"
    expert_dtype: str = "bf16"

    def __post_init__(self) -> None:
        from .dag import DISPATCH_ORDERS
        from .hardware import FAIRNESS

        if self.tile_rows < 1 or self.tile_cols < 1:
            raise ValueError(f"tile sizes must be >= 1, got {self.tile_rows} x {self.tile_cols}")
        for name in ("comm_chunk_rows", "gemm_tasks_per_sm", "segment_pad_rows", "expert_pad_rows"):
            v = getattr(self, name)
            if v is not None and v < 1:
                raise ValueError(f"{name} must be None or >= 1, got {v}")
        if self.segment_pad_rows is not None and self.expert_pad_rows is not None:
            raise ValueError("segment_pad_rows and expert_pad_rows exclude each other")
        if not self.jitter >= 0:
            raise ValueError(f"jitter must be >= 0, got {self.jitter}")
        if self.dispatch_order not in DISPATCH_ORDERS:
            raise ValueError(f"dispatch_order must be one of {DISPATCH_ORDERS}, got {self.dispatch_order!r}")
        if self.piece_deal not in PIECE_DEALS:
            raise ValueError(f"piece_deal must be one of {PIECE_DEALS}, got {self.piece_deal!r}")
        if self.kernel_deciders not in DECIDER_MODES:
            raise ValueError(f"kernel_deciders must be one of {DECIDER_MODES}, got {self.kernel_deciders!r}")
        if self.shared not in SHARED_ORDERS:
            raise ValueError(f"shared must be one of {SHARED_ORDERS}, got {self.shared!r}")
        if self.expert_dtype not in EXPERT_DTYPES:
            raise ValueError(f"expert_dtype must be one of {EXPERT_DTYPES}, got {self.expert_dtype!r}")
        if self.fairness not in FAIRNESS:
            raise ValueError(f"fairness must be one of {FAIRNESS}, got {self.fairness!r}")


class SimContext:
    """One layer plus options; `simulate(plan)` runs the engine (policies call it, possibly many times)."""

    def __init__(self, workload: LayerWorkload, profile: HardwareProfile, options: SimOptions):
        self.workload, self.profile, self.options = workload, profile, options
        self._graphs: dict = {}
        self.last_sim: LayerSim | None = None  # the most recent run (tests read its per-task counters)

    @property
    def num_gpus(self) -> int:
        return self.workload.num_gpus

    def graph(self, plan: Plan, clock=None):
        ck = None if clock is None else tuple(np.round(clock, 4))
        key = (plan.num_chunks, plan.sequential, plan.decision_ns, bool(plan.decision_sms), plan.fused, ck)
        if self.options.dispatch_order == "piece" and self.options.piece_deal == "round-robin":
            key += (plan.num_comm_sms,)  # the pieces' chains depend on C (oracle simulates several C in one context)
        if key not in self._graphs:
            o = self.options
            self._graphs[key] = build_graph(self.workload, self.profile, plan, tile_rows=o.tile_rows,
                                            tile_cols=o.tile_cols, comm_chunk_rows=o.comm_chunk_rows,
                                            gemm_tasks_per_sm=o.gemm_tasks_per_sm,
                                            dispatch_order=o.dispatch_order, segment_pad_rows=o.segment_pad_rows,
                                            expert_pad_rows=o.expert_pad_rows, piece_deal=o.piece_deal,
                                            gemm_clock=None if ck is None else np.array(ck), shared=o.shared,
                                            expert_dtype=o.expert_dtype)
        return self._graphs[key]

    @property
    def weight_bytes(self) -> np.ndarray:
        """int64 [G]: weight bytes each GPU streams: its active routed experts', plus the shared experts' when
        simulated."""
        w = self.workload
        return w.weight_bytes + (w.shared_weight_bytes if self.options.shared != "off" else 0)

    def simulate(self, plan: Plan) -> LayerResult:
        """One run of the engine; with a power model in the profile, runs until the SM clock is consistent with
        the layer's load (POWER_ITERATIONS at most): the layer is simulated at a clock, its GEMM FLOPs and the
        weight bytes it streams from HBM (each active expert's once) over its latency give the power and so the
        clock the cap allows, and the layer is simulated again at that clock (the shared experts' weights count too
        when they are simulated). The power a layer draws is taken
        to be what a stream of such layers averages to (the cap is held over many layers). From full clock the
        clocks only fall and settle. The result's `gemm_clock` is the clock per GPU it ran at (None without a
        power model)."""
        t0 = time.perf_counter()
        power = self.profile.power
        clock = None if power is None else np.ones(self.num_gpus)
        for _ in range(POWER_ITERATIONS):
            res = self._simulate_once(plan, clock, t0)
            if power is None:
                return res
            tbs = np.asarray(self.weight_bytes, dtype=np.float64) / max(res.latency_ns, 1) / 1e3
            new = power.clock(gemm_power_tflops(res, power.pad_energy), clock, tbs)
            if np.max(np.abs(new - clock)) < POWER_TOLERANCE:
                break
            clock = new
        return res

    def _simulate_once(self, plan: Plan, clock, t0: float) -> LayerResult:
        graph = self.graph(plan, clock)
        o = self.options
        sim = LayerSim(graph, plan, self.profile, seed=o.seed, jitter=o.jitter,
                       record_timeline=o.record_timeline, fairness=o.fairness).run()
        self.last_sim = sim
        res = summarize(plan.label, plan, graph, sim.start_ns, sim.end_ns, sim.sm, sim.roles,
                        self.profile.nvlink_peak_gbs, sim.signal_ns, num_events=sim.num_events,
                        wall_s=time.perf_counter() - t0, samples=sim.fabric.samples)
        res.gemm_clock = None if clock is None else np.array(clock)
        return res


def simulate_layer(workload: LayerWorkload, profile: HardwareProfile, policy: str, *, seed: int = 0,
                   tile_rows: int = 128, tile_cols: int = 128, record_timeline: bool = False,
                   layer: int = 0, **options) -> LayerResult:
    """Simulate one layer under a policy spec ('sequential', 'static:C[:K]', 'weave', 'oracle[:fast]').

    Extra keyword options are SimOptions fields (jitter, comm_chunk_rows, gemm_tasks_per_sm).
    """
    run_policy, arg = parse_policy(policy)
    opts = SimOptions(seed=seed, tile_rows=tile_rows, tile_cols=tile_cols, record_timeline=record_timeline,
                      **options)
    result = run_policy(SimContext(workload, profile, opts), arg)
    result.policy, result.layer = policy, layer
    return result


def gemm_tflops(res: LayerResult) -> np.ndarray:
    """Per GPU: the FLOPs its GEMM tasks computed (padding included: the MMAs run on it) over the layer latency."""
    from .dag import K_GEMM0, K_GEMM1

    g = res.graph
    sel = (g.kind == K_GEMM0) | (g.kind == K_GEMM1)
    flops = np.bincount(g.gpu[sel], weights=g.flops[sel], minlength=g.num_gpus)
    return flops / max(res.latency_ns, 1) / 1e3  # FLOP per ns is GFLOP/s


def gemm_power_tflops(res: LayerResult, pad_energy: float = 1.0) -> np.ndarray:
    """Per GPU: the GEMM FLOP rate the power model charges, padding rows' MMAs weighted by pad_energy (1: as routed
    rows' MMAs; 0: free, their A operands being zeros)."""
    t = gemm_tflops(res)
    g = res.graph
    if pad_energy == 1.0 or g.pad_flops is None:
        return t
    pad = np.bincount(g.gpu, weights=g.pad_flops, minlength=g.num_gpus) / max(res.latency_ns, 1) / 1e3
    return t - (1.0 - pad_energy) * pad


@dataclass(eq=False)
class ModelResult:
    """Per-layer results of one policy over a model's layers; the model's MoE time is their sum."""

    model: str
    policy: str
    layers: list[LayerResult] = field(default_factory=list)

    @property
    def total_ns(self) -> int:
        return int(sum(r.latency_ns for r in self.layers))

    def to_dict(self) -> dict:
        return {"model": self.model, "policy": self.policy, "total_us": self.total_ns / 1e3,
                "layers": [r.to_dict() for r in self.layers]}

    def format(self) -> str:
        """One line per layer: latency, comm SMs (min-max over GPUs), chunks, bubbles, overlap, critical path."""
        rows = [f"# {self.model}, policy {self.policy}: total {self.total_ns / 1e3:.1f} us over "
                f"{len(self.layers)} layers",
                f"{'layer':>5} {'latency us':>11} {'comm SMs':>9} {'K':>5} {'bubble':>7} {'overlap':>8} {'crit us':>9}"]
        for r in self.layers:
            c, k = r.plan.num_comm_sms, r.plan.num_chunks
            cs = "all" if r.plan.sequential else (f"{min(c)}" if min(c) == max(c) else f"{min(c)}-{max(c)}")
            ks = f"{min(k)}" if min(k) == max(k) else f"{min(k)}-{max(k)}"
            rows.append(f"{r.layer:>5} {r.latency_ns / 1e3:>11.1f} {cs:>9} {ks:>5} {r.bubble_fraction.mean():>7.3f}"
                        f" {r.overlap_fraction.mean():>8.3f} {r.critical_path_ns / 1e3:>9.1f}")
        return "\n".join(rows)


def _progress(it, enabled: bool, total: int, desc: str):
    if not enabled:
        return it
    try:
        from tqdm import tqdm
    except ImportError:  # the bar is a nicety; sweeps run the same without it
        return it
    return tqdm(it, total=total, desc=desc)


def _layer_ids(routing: np.ndarray, layers) -> list[int]:
    return list(range(routing.shape[1])) if layers is None else [int(x) for x in layers]


def _layer_job(job) -> list[LayerResult]:
    """Every policy spec of one layer (runs in a worker process when workers > 1)."""
    ids, model, placement, profile, specs, layer, seed, keep_records, options = job
    w = layer_workload(ids, model, placement)
    out = []
    for spec in specs:
        r = simulate_layer(w, profile, spec, seed=seed, layer=layer, **options)
        out.append(r if keep_records else r.drop_records())
    return out


def _run_layers(routing, model, placement, profile, specs, ids, *, seed, keep_records, options, workers,
                progress, desc) -> dict:
    """{(layer, spec): LayerResult} for every layer in `ids`; layers run in `workers` processes.

    Each simulation is a pure function of its inputs, so the results do not depend on `workers`.
    """
    SimOptions(seed=seed, **options)  # validate before any work is spread out
    jobs = [(routing[:, layer, :], model, placement_for(placement, layer), profile, specs, layer, seed, keep_records,
             options) for layer in ids]
    if workers <= 1 or len(jobs) <= 1:
        done = [_layer_job(j) for j in _progress(jobs, progress, len(jobs), desc)]
    else:
        from concurrent.futures import ProcessPoolExecutor

        with ProcessPoolExecutor(max_workers=workers) as pool:
            done = list(_progress(pool.map(_layer_job, jobs), progress, len(jobs), desc))
    return {(layer, spec): r for layer, rs in zip(ids, done) for spec, r in zip(specs, rs)}


def simulate_model(routing, model: ModelPreset, placement: Placement | list[Placement], profile: HardwareProfile, policy: str,
                   *, layers=None, seed: int = 0, progress: bool = False, keep_records: bool = False,
                   workers: int = 1, **options) -> ModelResult:
    """Simulate `policy` on every layer of routing int [num_tokens, num_layers, top_k] (or `layers` only).

    placement: one Placement for every layer, or a sequence of one per layer of `routing` (placement_for).
    keep_records: keep each layer's per-task records (for traces and Gantt charts of any layer); by default
    they are dropped after the metrics are computed, so a 58-layer model does not hold ~0.6 GB.
    workers: processes to spread the layers over (results are identical for any value).
    """
    routing = np.asarray(routing)
    if routing.ndim != 3:
        raise ValueError(f"routing must be [num_tokens, num_layers, top_k], got shape {routing.shape}")
    ids = _layer_ids(routing, layers)
    res = _run_layers(routing, model, placement, profile, [policy], ids, seed=seed, keep_records=keep_records,
                      options=options, workers=workers, progress=progress, desc=policy)
    return ModelResult(model.name, policy, [res[layer, policy] for layer in ids])


@dataclass(eq=False)
class SweepTable:
    """Layer latencies (ns) of several policies, with speedups.

    latency_ns: [L, P] for `policies`; static_ns: [L, len(static_grid)] for static:C over the grid;
    best_static: the C whose *total* over the layers is smallest (a single split chosen after the fact).
    """

    model: str
    layers: list[int]
    policies: list[str]
    latency_ns: np.ndarray
    sequential_ns: np.ndarray
    static_grid: tuple
    static_ns: np.ndarray
    results: dict = field(repr=False, default_factory=dict)  # (layer, policy) -> LayerResult

    @property
    def best_static(self) -> int:
        return int(self.static_grid[int(np.argmin(self.static_ns.sum(axis=0)))])

    @property
    def best_static_ns(self) -> np.ndarray:
        return self.static_ns[:, int(np.argmin(self.static_ns.sum(axis=0)))]

    def speedup_vs_sequential(self) -> np.ndarray:
        return self.sequential_ns[:, None] / self.latency_ns

    def speedup_vs_best_static(self) -> np.ndarray:
        return self.best_static_ns[:, None] / self.latency_ns

    def to_dict(self) -> dict:
        tot = self.latency_ns.sum(axis=0)
        return {
            "model": self.model, "layers": self.layers, "policies": self.policies,
            "latency_us": (self.latency_ns / 1e3).tolist(), "total_us": (tot / 1e3).tolist(),
            "static_grid": list(self.static_grid), "static_total_us": (self.static_ns.sum(axis=0) / 1e3).tolist(),
            "best_static": self.best_static,
            "speedup_vs_sequential_total": (self.sequential_ns.sum() / tot).tolist(),
            "speedup_vs_best_static_total": (self.best_static_ns.sum() / tot).tolist(),
            "plans": {p: [self.results[l, p].plan.to_dict() for l in self.layers] for p in self.policies
                      if all((l, p) in self.results for l in self.layers)},
        }

    def format(self) -> str:
        """A plain-text table: one row per layer, latency in us per policy, then totals and speedups."""
        head = f"{'layer':>5} " + " ".join(f"{p:>14}" for p in self.policies)
        rows = [head]
        for i, layer in enumerate(self.layers):
            rows.append(f"{layer:>5} " + " ".join(f"{t / 1e3:>14.1f}" for t in self.latency_ns[i]))
        tot = self.latency_ns.sum(axis=0)
        rows.append(f"{'total':>5} " + " ".join(f"{t / 1e3:>14.1f}" for t in tot))
        rows.append(f"{'xseq':>5} " + " ".join(f"{self.sequential_ns.sum() / t:>14.2f}" for t in tot))
        rows.append(f"{'xbst':>5} " + " ".join(f"{self.best_static_ns.sum() / t:>14.2f}" for t in tot)
                    + f"   (best single static split: C={self.best_static})")
        return "\n".join(rows)


def sweep(routing, model: ModelPreset, placement: Placement | list[Placement], profile: HardwareProfile, policies, *,
          layers=None, static_grid=DEFAULT_STATIC_GRID, seed: int = 0, progress: bool = False,
          keep_records: bool = False, workers: int = 1, **options) -> SweepTable:
    """Every policy on every layer, plus sequential and static:C over `static_grid` for the speedup columns.

    `results[(layer, spec)]` holds each LayerResult (per-task records dropped unless keep_records).
    workers: processes to spread the layers over (results are identical for any value).
    """
    routing = np.asarray(routing)
    ids = _layer_ids(routing, layers)
    grid = tuple(c for c in static_grid if c < profile.num_sms)
    specs = list(dict.fromkeys([*policies, "sequential", *(f"static:{c}" for c in grid)]))
    results = _run_layers(routing, model, placement, profile, specs, ids, seed=seed, keep_records=keep_records,
                          options=options, workers=workers, progress=progress, desc="sweep")
    lat = np.array([[results[l, p].latency_ns for p in policies] for l in ids], dtype=np.int64)
    seq = np.array([results[l, "sequential"].latency_ns for l in ids], dtype=np.int64)
    st = np.array([[results[l, f"static:{c}"].latency_ns for c in grid] for l in ids], dtype=np.int64)
    return SweepTable(model.name, ids, list(policies), lat.reshape(len(ids), len(policies)), seq, grid,
                      st.reshape(len(ids), len(grid)), results)

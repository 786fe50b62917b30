"""The analytic cost model of one MoE layer on one GPU, and the spatial choice (c*, K*) it implies.

For GPU g with c communication SMs out of N and K combine chunks (all times in ns, bytes/ns = GB/s):
    T_comm = max((D_out + C_out) / BW(c), (D_in + C_in) / BW_peak)     pushes by this GPU's comm SMs,
                                                                      ingress limited by the link
    T_comp = max(F / (TFLOPS(min(N - c, tiles), rows) * eff(K)), W / HBM)
    T_tail = (1 - rho) * C_out / (BW(c) * K)                          exposed combine tail
    T(c, K) = max(T_comp + T_tail, T_comm)
This is the Weave paper's model (D = X_in_uniq*2H, C = X_in*2H) with both link directions kept, a
parallelism cap (no more compute SMs than output tiles) and weight streaming, so that it can never
predict a time below the physical lower bound max(F / peak, bytes / NVLink peak, W / HBM).
The same formulas, evaluated from the exported table, run inside the kernel (weave_kernel).
"""
from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np

from .costtable import DEFAULT_CHUNKS, NUM_ROW_BUCKETS, row_bucket, table_for
from .profile import HardwareProfile
from .workload import LayerWorkload, expert_bytes
_TFLOPS_TO_FLOP_PER_NS = 1e3  # 1 TFLOP/s = 1e12 FLOP / 1e9 ns


@dataclass(frozen=True)
class Volumes:
    """Per-(layer, GPU) inputs of the cost model; every field is float64 [L, G]."""

    flops: np.ndarray
    dispatch_bytes_in: np.ndarray
    dispatch_bytes_out: np.ndarray
    combine_bytes_in: np.ndarray
    combine_bytes_out: np.ndarray
    weight_bytes: np.ndarray
    rows_per_expert: np.ndarray  # integer-valued: pairs // active experts
    gemm_tiles: np.ndarray

    @property
    def shape(self) -> tuple[int, int]:
        return self.flops.shape

    @classmethod
    def from_workloads(cls, workloads: list[LayerWorkload], profile: HardwareProfile) -> "Volumes":
        def stack(fn):
            return np.stack([np.asarray(fn(w), dtype=np.float64) for w in workloads])

        return cls(
            flops=stack(lambda w: w.flops),
            dispatch_bytes_in=stack(lambda w: w.dispatch_bytes_in),
            dispatch_bytes_out=stack(lambda w: w.dispatch_bytes_out),
            combine_bytes_in=stack(lambda w: w.combine_bytes_in),
            combine_bytes_out=stack(lambda w: w.combine_bytes_out),
            weight_bytes=stack(lambda w: w.weight_bytes),
            rows_per_expert=stack(lambda w: w.computed_pairs // np.maximum(w.active_local_experts, 1)),
            gemm_tiles=stack(lambda w: w.gemm_tiles(profile.tile_rows, profile.tile_cols)),
        )


def bound_volumes(workloads: list[LayerWorkload], profile: HardwareProfile, shared: bool = False,
                  expert_dtype: str = "bf16") -> Volumes:
    """Volumes for lower_bound_ns. shared: the layers compute their shared experts too, so their FLOPs and weight bytes
    join the bound's (T(c, K) below, like the in-kernel choice, leaves them out). expert_dtype 'fp8': the experts'
    weights and the dispatched rows in e4m3 with their scales (workload.expert_bytes), combine rows bf16; pair it with
    a profile whose GEMM peak is FP8's (profile.fp8_profile)."""
    vol = Volumes.from_workloads(workloads, profile)
    if shared:
        def stack(name):
            return np.stack([np.asarray(getattr(w, name), dtype=np.float64) for w in workloads])

        vol = replace(vol, flops=vol.flops + stack("shared_flops"),
                      weight_bytes=vol.weight_bytes + stack("shared_weight_bytes"))
    if expert_dtype == "bf16":
        return vol
    hidden = {w.model.hidden_size for w in workloads}
    if len(hidden) != 1:
        raise ValueError(f"bound_volumes with expert_dtype {expert_dtype!r} needs layers of one hidden size, got {hidden}")
    h = hidden.pop()
    row, elem = expert_bytes(expert_dtype, h)
    row16, elem16 = expert_bytes("bf16", h)
    return replace(vol, dispatch_bytes_in=vol.dispatch_bytes_in * (row / row16),
                   dispatch_bytes_out=vol.dispatch_bytes_out * (row / row16),
                   weight_bytes=vol.weight_bytes * (elem / elem16))


@dataclass(frozen=True)
class Choice:
    """The cost model's decision per layer and GPU (arrays [L, G])."""

    num_comm_sms: np.ndarray
    num_chunks: np.ndarray
    time_ns: np.ndarray
    lower_bound_ns: np.ndarray

    def layer_time_ns(self) -> np.ndarray:
        """[L]: a layer ends when its slowest GPU ends."""
        return self.time_ns.max(axis=1)


def per_sm_tflops(table, rows_per_expert) -> np.ndarray:
    """The table's per-SM TFLOP/s at an integer-valued rows-per-expert count r: linear in r between the rates at
    2^b and 2^(b+1), b = row_bucket(r) (the last bucket flat). A tile computes 128 rows whatever it holds, so below
    a tile the useful rate grows in proportion to r; between buckets this keeps the choice from jumping when r
    crosses a power of two (126 rows were rated as 64 before, at half the rate of 128). The kernel computes the
    same, operation for operation (csrc/cost_model.cuh)."""
    r = np.maximum(np.asarray(rows_per_expert, dtype=np.float64), 1.0)
    b = row_bucket(r.astype(np.int64))
    nxt = np.minimum(b + 1, NUM_ROW_BUCKETS - 1)
    lo, hi = table.per_sm_tflops[b], table.per_sm_tflops[nxt]
    base = np.ldexp(1.0, b)
    frac = np.where(b + 1 < NUM_ROW_BUCKETS, (r - base) / base, 0.0)
    return lo + (hi - lo) * frac


def lower_bound_ns(vol: Volumes, profile: HardwareProfile) -> np.ndarray:
    """[L, G]: max(F / peak, max(bytes in, bytes out) / NVLink peak, weight bytes / HBM)."""
    t_flops = vol.flops / (profile.gemm_peak_tflops * _TFLOPS_TO_FLOP_PER_NS)
    link_bytes = np.maximum(
        vol.dispatch_bytes_in + vol.combine_bytes_in, vol.dispatch_bytes_out + vol.combine_bytes_out
    )
    return np.maximum.reduce([t_flops, link_bytes / profile.nvlink_peak_gbs, vol.weight_bytes / profile.hbm_gbs])


def layer_time_ns(vol: Volumes, profile: HardwareProfile, comm_sms, chunks=DEFAULT_CHUNKS) -> np.ndarray:
    """T(c, K) for every layer, GPU, c in `comm_sms` and K in `chunks`: float64 [L, G, len(c), len(K)].

    Evaluated from the exported CostTable only; the kernel's header does the same arithmetic in the
    same order (keep the two in step: tests/sim/test_costtable.py compares their choices).
    """
    table = table_for(profile, chunks)
    c_int = np.asarray(comm_sms, dtype=np.int64).reshape(1, 1, -1, 1)
    if np.any(c_int < 1) or np.any(c_int >= table.num_sms):
        raise ValueError(f"comm SM counts must lie in [1, {table.num_sms - 1}]")
    c = c_int.astype(np.float64)
    k = np.asarray(table.chunks, dtype=np.float64).reshape(1, 1, 1, -1)
    eff = table.eff.reshape(1, 1, 1, -1)
    v = {name: getattr(vol, name)[:, :, None, None] for name in vol.__dataclass_fields__}
    bw = table.bw_gbs[c_int]
    peak_link = table.header("nvlink_peak_gbs")
    t_push = (v["dispatch_bytes_out"] + v["combine_bytes_out"]) / bw
    t_ingress = (v["dispatch_bytes_in"] + v["combine_bytes_in"]) / peak_link
    t_comm = np.maximum(t_push, t_ingress)
    sms = np.minimum(table.num_sms - c, np.maximum(v["gemm_tiles"], 1.0))
    per_sm = per_sm_tflops(table, v["rows_per_expert"])
    rate = np.minimum(sms * per_sm, table.header("gemm_peak_tflops")) * _TFLOPS_TO_FLOP_PER_NS
    t_comp = np.maximum(v["flops"] / (rate * eff), v["weight_bytes"] / table.header("hbm_gbs"))
    t_tail = (1.0 - table.header("rho")) * v["combine_bytes_out"] / (bw * k)
    return np.maximum(t_comp + t_tail, t_comm)


def choose(vol: Volumes, profile: HardwareProfile, comm_sms=None, chunks=DEFAULT_CHUNKS) -> Choice:
    """argmin of T(c, K) per layer and GPU over the grid (default: c in [1, the table's max_comm_sms], the
    kernel's grid); ties go to the smaller c, then the smaller K."""
    table = table_for(profile, chunks)
    comm = np.arange(1, table.max_comm_sms + 1) if comm_sms is None else np.asarray(comm_sms)
    chunks = table.chunks
    t = layer_time_ns(vol, profile, comm, chunks)
    num_layers, num_gpus = vol.shape
    flat = t.reshape(num_layers, num_gpus, -1)
    best = flat.argmin(axis=2)
    ci, ki = np.unravel_index(best, t.shape[2:])
    return Choice(
        num_comm_sms=comm[ci].astype(np.int64),
        num_chunks=np.asarray(chunks)[ki].astype(np.int64),
        time_ns=np.take_along_axis(flat, best[..., None], axis=2)[..., 0],
        lower_bound_ns=lower_bound_ns(vol, profile),
    )


def static_time_ns(vol: Volumes, profile: HardwareProfile, num_comm_sms: int, num_chunks: int = 1) -> np.ndarray:
    """[L, G]: T(C, K) of one fixed split for every layer and GPU (a static baseline)."""
    return layer_time_ns(vol, profile, [num_comm_sms], [num_chunks])[:, :, 0, 0]


def sequential_time_ns(vol: Volumes, profile: HardwareProfile) -> np.ndarray:
    """[L, G]: no overlap: all SMs dispatch, then compute, then combine, plus launch and host sync."""
    n = profile.num_sms
    bw = profile.bandwidth_gbs(n)
    t_dispatch = np.maximum(vol.dispatch_bytes_out / bw, vol.dispatch_bytes_in / profile.nvlink_peak_gbs)
    t_combine = np.maximum(vol.combine_bytes_out / bw, vol.combine_bytes_in / profile.nvlink_peak_gbs)
    table = table_for(profile)
    sms = np.minimum(n, np.maximum(vol.gemm_tiles, 1.0))
    per_sm = per_sm_tflops(table, vol.rows_per_expert)
    rate = np.minimum(sms * per_sm, profile.gemm_peak_tflops) * _TFLOPS_TO_FLOP_PER_NS
    t_comp = np.maximum(vol.flops / rate, vol.weight_bytes / profile.hbm_gbs)
    fixed = 3 * profile.fixed_ns["launch"] + profile.fixed_ns["host_sync"]
    return fixed + t_dispatch + t_comp + t_combine

"""Host side of the megakernel: buffers (symmetric memory, allocated once), per-call checks, launch, errors.

One object per rank and layer geometry:

    layer = MoEMegakernel(hidden=H, inter=I, num_experts=E, top_k=k, placement=contiguous(E, G),
                          max_tokens=8192)                  # collective: every rank, same arguments
    y = layer(x, topk_ids, topk_weights, w13, w2, policy="static:24")
    y = layer(x, topk_ids, topk_weights, w13, w2, policy="weave")   # (c*, K*) chosen in the kernel
    layer.last_choice()                                              # {"c_star": .., "k_star": .., ...}

x [N, H] bf16, topk_ids [N, k] int32/int64 global ids, topk_weights [N, k] fp32, w13 [E_loc, 2I, H] bf16,
w2 [E_loc, H, I] bf16 (this rank's experts, local order = placement.local_experts(rank)); y [N, H] bf16.

FP8 experts (`expert_dtype="fp8"`, weave_kernel/fp8.py): w13 and w2 are pairs (e4m3 weights, fp32 scales per 128 x 128
block), e.g. from `fp8.quantize_experts`; x stays bf16, and the kernel quantizes it per (row, 128 columns) as
fp8.quantize_act does, dispatches e4m3 rows, runs both GEMMs in e4m3 and stores h in e4m3; outputs are bf16. A shared
expert is FP8 too: shared=((w13s_q [2Is, H], w13s_s [2Is/128, H/128]), (w2s_q [H, Is], w2s_s [H/128, Is/128])).
With bulk dispatch (`dispatch="bulk"`) the e4m3 rows go by bulk copies and their scales by the threads.

A shared expert (always on, this rank's own tokens; no dispatch, no combine) is computed inside the same launch when
the layer is built with `shared_inter=Is` and called with `shared=(w13s [2Is, H], w2s [H, Is])`: its tiles take the
tickets before (`shared_order="first"`) or after (`"last"`, the default) the routed experts' and its output is added
in the reduction, y = shared(x) + sum_j w_j expert_j(x).
"""
from __future__ import annotations

import numpy as np
import torch

from .choice import DEFAULT_COST_PROFILE  # noqa: F401 - part of this module's interface (bench, virtual)
from .policies import BULK_ISSUERS, DISPATCH_MODES, MAX_BULK_ISSUERS, dispatch_issuers, parse_policy  # noqa: F401
from .fp8 import BLOCK as FP8_BLOCK  # columns per activation scale, rows and columns per weight scale
from .symm import SymmetricBuffer
from .timeline import RECORD_DTYPE, records_to_events
from .buffers import (BLOCK_M, CHOICE_LEN, COST_TABLE_LEN, DEFAULT_TIMEOUT_S, check_expert_dtype, check_fits,
                      check_options, fp8_scale_stride, plan_buffers, recv_pairs_of, workspace_bytes)
from .geometry import check_geometry
from .validate import check_layer_inputs, check_shared_scale, check_shared_weights, full_device

COST_TABLE_VERSION = 3       # weave::cost_table::kVersion
CHOICE_SLOTS = ("c_star", "k_star", "time_ns", "comm_ctas_used", "epoch")

ERROR_TEXT = {
    1: "topk_ids[pair {0}] = {1} is not a valid expert id",
    2: "receive buffer overflow on rank {0}: {1} rows needed (max_tokens or recv_capacity too small?)",
    3: "timeout in grid barrier {0} (a CTA never arrived)",
    4: "timeout waiting for the expert counts of rank {0} (is every rank calling the layer?)",
    5: "timeout waiting for the rows of row block {0} from rank {1}",
    6: "timeout waiting for GEMM0 of row block {0} (column block {1})",
    7: "timeout waiting for the combine rows of rank {0}",
    8: "timeout waiting for a TMA load (pipeline stage {0}, k step {1}; stage -1: dispatch row copy piece {1})",
    9: "timeout waiting for GEMM0 of the shared expert's row block {0} (column block {1})",
    10: "timeout waiting for the shared expert's GEMM1 tiles ({1} expected) before the reduction",
}
ERR_RECV_OVERFLOW = 2  # kErrRecvOverflow (csrc/params.h)


class ReceiveOverflow(RuntimeError):
    """A call's routing sends some rank more rows than its receive buffer holds (MoEMegakernel's recv_capacity).
    Raised on every rank alike; `owner` is the rank that would overflow, `rows` the rows it would need."""

    def __init__(self, msg: str, *, owner: int, rows: int):
        super().__init__(msg)
        self.owner, self.rows = owner, rows


SHARED_ORDERS = ("first", "last")  # where the shared expert's tiles sit in the ticket order (Params::shared_first)


def build_cost_table(profile=DEFAULT_COST_PROFILE) -> np.ndarray:
    """The float64 cost table the kernel's spatial scheduler reads: weave_sim.costtable.table_for(profile).

    `profile`: a weave_sim HardwareProfile, a shipped profile name ("h200") or a profile JSON path."""
    from weave_sim.costtable import TABLE_LEN, TABLE_VERSION, table_for
    from weave_sim.profile import HardwareProfile, load_profile

    prof = profile if isinstance(profile, HardwareProfile) else load_profile(profile)
    data = np.array(table_for(prof).data, dtype=np.float64, copy=True)
    if TABLE_LEN != COST_TABLE_LEN or data.shape != (COST_TABLE_LEN,):
        raise ValueError(f"cost table has {data.shape} slots; this kernel reads {COST_TABLE_LEN}")
    if TABLE_VERSION != COST_TABLE_VERSION or int(data[0]) != COST_TABLE_VERSION:
        raise ValueError(f"cost table version {int(data[0])}; this kernel reads version {COST_TABLE_VERSION}")
    return data


_RAW_STREAM = getattr(torch._C, "_cuda_getCurrentRawStream", None)  # torch's own fast path (used by inductor)


def _current_raw_stream(device: torch.device) -> int:
    """The current CUDA stream's handle on `device`, as an integer (a few microseconds cheaper per call through
    torch's raw accessor than torch.cuda.current_stream(device).cuda_stream, which it falls back to)."""
    if _RAW_STREAM is not None and device.type == "cuda":
        return _RAW_STREAM(device.index if device.index is not None else torch.cuda.current_device())
    return torch.cuda.current_stream(device).cuda_stream


class MoEMegakernel:
    """The persistent cross-GPU MoE layer on one rank. Construction is collective over `group`."""

    fp8 = False  # expert_dtype "fp8" (set by __init__)
    h_scale = x_q = x_s = hs_scale = None  # FP8 only: h's scales, x quantized and its scales, hs's scales

    def __init__(self, *, hidden: int, inter: int, num_experts: int, top_k: int, placement, max_tokens: int,
                 group=None, device=None, timeout_s: float = DEFAULT_TIMEOUT_S, timeline_per_cta: int = 0,
                 cost_profile=DEFAULT_COST_PROFILE, ext=None, virtual: tuple[int, int] | None = None,
                 num_ctas: int | None = None, dispatch: str = "threads", shared_inter: int = 0,
                 recv_capacity: int | None = None, expert_dtype: str = "bf16"):
        """`ext`: an already loaded extension (build.load_extension(csrc=...): another kernel version); default the
        package's own. `virtual=(rank, world)`: one of `world` ranks that share this process and GPU
        (`weave_kernel.virtual.VirtualRanks` builds them; not collective, plain buffers, the peers' addresses
        set by `connect`). `num_ctas`: the grid (default: one CTA per SM). `dispatch`: how a comm CTA copies its
        rows, "threads" (all threads, 16-byte loads and stores) or "bulk" / "bulk:W" (bulk copies through the CTA's
        operand stages issued by W warps, csrc/bulk_copy.cuh; measured on one GPU only, docs/kernel.md).
        `shared_inter`: the shared expert's FFN width Is (num_shared_experts x I for the presets; 0: none), which
        sizes its scratch; calls may then pass `shared=(w13s, w2s)`.
        `recv_capacity`: the (token, expert) pairs this rank can receive in one call, from every rank, its own
        included (default world x max_tokens x top_k: every pair of every rank, so a call never overflows). The
        receive rows and the SwiGLU scratch are sized by it, the largest part of the buffers at EP >= 2; e.g.
        2 x max_tokens x top_k holds twice a balanced load. A call whose routing sends some rank more raises
        ReceiveOverflow on every rank before any row moves; with check=True (or VirtualRanks' check) the layer
        stays usable, so the caller can split the batch and call again.
        `expert_dtype`: "bf16", or "fp8" (module docstring): hidden, inter and shared_inter multiples of 128,
        dispatch "threads"."""
        import torch.distributed as dist

        from .build import load_extension

        check_options(timeout_s=timeout_s, num_ctas=num_ctas, timeline_per_cta=timeline_per_cta)
        self.cost_table_np = build_cost_table(cost_profile)  # a bad profile refused before anything is built
        self.virtual = virtual is not None
        self.distributed = not self.virtual and dist.is_available() and dist.is_initialized()
        self.group = group
        if self.virtual:
            self.rank, self.world = (int(v) for v in virtual)
            if not 0 <= self.rank < self.world:
                raise ValueError(f"virtual rank {self.rank} outside [0, {self.world})")
        else:
            self.world = dist.get_world_size(group) if self.distributed else 1
            self.rank = dist.get_rank(group) if self.distributed else 0
        check_geometry(hidden, inter, num_experts, top_k, self.world, placement.num_gpus, shared_inter)
        self.fp8 = check_expert_dtype(expert_dtype) == "fp8"
        if self.fp8:
            if hidden % FP8_BLOCK or inter % FP8_BLOCK or shared_inter % FP8_BLOCK:
                raise ValueError(f"FP8 experts need hidden, inter and shared_inter multiples of {FP8_BLOCK} (their "
                                 f"scale blocks), got hidden {hidden}, inter {inter}, shared_inter {shared_inter}")
        if placement.num_experts != num_experts:
            raise ValueError(f"placement has {placement.num_experts} experts, the layer {num_experts}")
        if max_tokens < 1:
            raise ValueError("max_tokens must be >= 1")
        self.hidden, self.inter, self.num_experts, self.top_k = hidden, inter, num_experts, top_k
        self.num_local_experts = num_experts // self.world
        self.max_tokens = max_tokens
        self.device = full_device(device if device is not None else "cuda")  # "cuda": the current device, named
        self.timeout_ns = int(timeout_s * 1e9)
        dispatch_issuers(dispatch)  # checked here, before anything is built
        self.dispatch = dispatch
        self.ext = ext if ext is not None else load_extension()
        if self.fp8 and not getattr(self.ext, "fp8_experts", 0):
            raise ValueError("expert_dtype='fp8' needs an extension built from sources with FP8 experts")
        max_ctas = self.ext.max_ctas(self.device.index)
        if max_ctas <= 0:
            raise RuntimeError("the megakernel does not fit one CTA per SM on this device")
        self.num_ctas = max_ctas if num_ctas is None else int(num_ctas)
        if not max(2, self.world) <= self.num_ctas <= max_ctas:
            raise ValueError(f"num_ctas {self.num_ctas} must be in [{max(2, self.world)}, {max_ctas}] (at least 2 "
                             f"and the world size, at most one per SM)")
        self.cooperative = not self.virtual  # virtual ranks' grids must run at once: plain launches

        dev = self.device
        owner, owner_experts = self._placement_tables(placement)
        self.expert_owner = torch.as_tensor(owner, dtype=torch.int32, device=dev)
        self.owner_experts = torch.as_tensor(owner_experts, dtype=torch.int32, device=dev).contiguous()

        self.placement = placement
        self.recv_capacity = recv_pairs_of(self.world, max_tokens, top_k, recv_capacity)
        self.plan = plan_buffers(hidden, num_experts, top_k, self.world, max_tokens, recv_capacity, self.fp8)
        self._check_memory(workspace_bytes(hidden=hidden, inter=inter, num_experts=num_experts, top_k=top_k,
                                           world=self.world, max_tokens=max_tokens, shared_inter=shared_inter,
                                           num_ctas=self.num_ctas, timeline_per_cta=timeline_per_cta,
                                           recv_capacity=recv_capacity, expert_dtype=expert_dtype))
        self._alloc_symmetric(self.plan.total_bytes)
        i32 = dict(dtype=torch.int32, device=dev)
        self.expert_ctr = torch.zeros(2 * num_experts, **i32)  # the kernel clears the parity the next call uses
        self.pair_slot = torch.empty(max_tokens * top_k, **i32)
        self.sorted_pair = torch.empty(max_tokens * top_k, **i32)
        rows = self.plan.recv_cap_rows
        if self.fp8:  # h in e4m3 with its scales; this rank's x as the kernel quantizes it (scale rows padded)
            self.h = torch.empty(rows * inter, dtype=torch.uint8, device=dev)
            self.h_scale = torch.empty(rows * fp8_scale_stride(inter), dtype=torch.float32, device=dev)
            self.x_q = torch.empty(max_tokens * hidden, dtype=torch.uint8, device=dev)
            self.x_s = torch.empty(max_tokens * fp8_scale_stride(hidden), dtype=torch.float32, device=dev)
        else:
            self.h = torch.empty(rows * inter, dtype=torch.bfloat16, device=dev)
        self.g0_done = torch.zeros(2 * self.plan.max_row_blocks, **i32)
        self.sched = torch.zeros(8, **i32)
        # the shared expert's scratch (a 1-element placeholder when the layer has none: the kernel never reads it)
        self.shared_inter = int(shared_inter)
        self.max_shared_blocks = (max_tokens + BLOCK_M - 1) // BLOCK_M
        ns = max_tokens if self.shared_inter else 1
        if self.fp8 and self.shared_inter:  # the shared expert's h in e4m3 with its scales
            self.hs = torch.empty(ns * self.shared_inter, dtype=torch.uint8, device=dev)
            self.hs_scale = torch.empty(ns * fp8_scale_stride(self.shared_inter), dtype=torch.float32, device=dev)
        else:
            self.hs = torch.empty(ns * max(1, self.shared_inter), dtype=torch.bfloat16, device=dev)
        self.ys = torch.empty(ns * hidden, dtype=torch.bfloat16, device=dev)
        self.g0s_done = torch.zeros(2 * self.max_shared_blocks, **i32)
        self.grid_bar = torch.zeros(2, **i32)
        self.err = torch.zeros(4, **i32)
        self.timeline_per_cta = timeline_per_cta
        self.timeline = torch.zeros(max(1, self.num_ctas * timeline_per_cta) * RECORD_DTYPE.itemsize,
                                    dtype=torch.uint8, device=dev)
        self.timeline_count = torch.zeros(self.num_ctas, **i32)
        # weave policy: the cost model's table (read by every CTA) and the per-call choice output
        if int(self.ext.cost_table_len) != COST_TABLE_LEN or int(self.ext.choice_len) != CHOICE_LEN:
            raise RuntimeError("built extension and megakernel.py disagree on the cost table / choice layout")
        self.cost_table = torch.as_tensor(self.cost_table_np, dtype=torch.float64).to(dev)
        self.choice = torch.full((CHOICE_LEN,), -1.0, dtype=torch.float64, device=dev)
        # The epoch (the value every cross-GPU flag of a call carries) is counted on the device: each call reads
        # the last one and stores its own, so graph replays advance it like calls issued from the host do.
        self.epoch_ctr = torch.zeros(1, dtype=torch.int64, device=dev)
        self.epoch = 0  # calls issued from the host (kernels before the device counter read it as their epoch)
        self.broken: str | None = None
        self._unread = 0  # launches since the error word was last read (raise_if_error)
        self._captured = False  # a call was captured in a CUDA graph: its replays launch unseen by the host
        self._launcher, self._launcher_key = None, None  # the extension's Launcher (_launch)
        torch.cuda.synchronize(dev)
        if self.distributed:
            dist.barrier(group=group)

    def _check_memory(self, need: dict) -> None:
        check_fits(need, self.device, group=self.group if self.distributed else None, distributed=self.distributed,
                   world=self.world, rank=self.rank, what="the megakernel's buffers", hint=(
                       f"lower max_tokens (now {self.max_tokens}; the receive buffer holds world x max_tokens x top_k "
                       f"rows unless recv_capacity sizes it for less), or let the layers of one geometry share one "
                       f"MoEMegakernel (WeaveMoE(kernel=...); hf.replace_moe_blocks shares by default)"))

    def workspace_bytes(self) -> dict[str, int]:
        """Bytes this object allocated on its device, by part (as the module function workspace_bytes reports)."""
        nb = lambda *ts: sum(t.numel() * t.element_size() for t in ts)  # noqa: E731
        f8 = (self.x_q, self.x_s) if self.fp8 else ()
        parts = {"symmetric": nb(self.symm), "h": nb(self.h, *((self.h_scale,) if self.fp8 else ())),
                 "shared": nb(self.hs, self.ys, self.g0s_done, *((self.hs_scale,) if self.hs_scale is not None else ())),
                 "other": nb(self.expert_ctr, self.pair_slot, self.sorted_pair, self.g0_done, self.sched,
                             self.grid_bar, self.err, self.timeline, self.timeline_count, self.cost_table,
                             self.choice, self.epoch_ctr, self.expert_owner, self.owner_experts, self.peer_base, *f8)}
        parts["total"] = sum(parts.values())
        return parts

    def _placement_tables(self, placement) -> tuple[np.ndarray, np.ndarray]:
        """(owner [E], owner_experts [G, E/G]) of a placement this layer can run: its experts and world size, and
        the same number of experts on every rank."""
        if placement.num_experts != self.num_experts or placement.num_gpus != self.world:
            raise ValueError(f"placement of {placement.num_experts} experts over {placement.num_gpus} GPUs; this layer "
                             f"has {self.num_experts} experts over {self.world} ranks")
        owner = np.asarray(placement.owner)
        if not np.all(np.bincount(owner, minlength=self.world) == self.num_local_experts):
            raise ValueError("placement must give every rank the same number of experts")
        return owner, np.stack([placement.local_experts(g) for g in range(self.world)])

    def set_placement(self, placement) -> None:
        """Move experts between ranks for the next calls: every rank of the group must set the same placement before
        its next call, and pass w13 / w2 in the new local order (placement.local_experts(rank)). The tables are
        overwritten in place, so a captured CUDA graph replays with the new placement."""
        owner, owner_experts = self._placement_tables(placement)
        self.placement = placement
        self.expert_owner.copy_(torch.as_tensor(owner, dtype=torch.int32))
        self.owner_experts.copy_(torch.as_tensor(owner_experts, dtype=torch.int32))

    def _alloc_symmetric(self, nbytes: int) -> None:
        if self.virtual:  # plain memory; the peers' addresses come with connect()
            self._symm_buf = None
            self.symm = torch.zeros(nbytes, dtype=torch.uint8, device=self.device)
            self.peer_base = torch.zeros(self.world, dtype=torch.int64, device=self.device)
            return
        self._symm_buf = SymmetricBuffer(nbytes, self.device, self.world, self.rank, self.group)
        self.symm = self._symm_buf.tensor
        self.peer_base = self._symm_buf.peer_base(self.device)

    def connect(self, peers: list["MoEMegakernel"]) -> None:
        """Virtual ranks: address the buffers of `peers` (every virtual rank of this world, in rank order, this
        one included). This layer keeps the peers' buffers alive (not the peers: layers that held each other
        would form a reference cycle, and their GPU memory would wait for Python's garbage collector)."""
        if not self.virtual:
            raise RuntimeError("connect() is for virtual ranks; real ranks rendezvous through symmetric memory")
        if [p.rank for p in peers] != list(range(self.world)) or peers[self.rank] is not self:
            raise ValueError("connect() needs every virtual rank of the world, in rank order")
        for p in peers:
            if (p.world, p.plan, p.device) != (self.world, self.plan, self.device):
                raise ValueError("virtual ranks must share world size, buffer plan and device")
        self.peer_base.copy_(torch.tensor([p.symm.data_ptr() for p in peers], dtype=torch.int64))
        self._peer_bufs = [p.symm for p in peers]  # the buffers this layer's peer_base points into

    # ---------------------------------------------------------------------------------------------------
    def __call__(self, x, topk_ids, topk_weights, w13, w2, *, policy: str = "static:24", check: bool = True,
                 record_timeline: bool = False, out: torch.Tensor | None = None, shared=None,
                 shared_order: str = "last", shared_scale: torch.Tensor | None = None) -> torch.Tensor:
        """Run the layer. check=True scans topk_ids and reads the error word after the launch (two host
        syncs); benchmarks pass check=False and call `raise_if_error()` once at the end.
        out: optional [N, H] bf16 contiguous output tensor (tests poison it first).
        shared: None, or the shared expert's (w13s [2Is, H], w2s [H, Is]) bf16 weights (the layer built with
        shared_inter=Is; FP8 layers: two (e4m3, scales) pairs, module docstring); shared_order: "first" or "last",
        where its tiles sit in the tickets (module docstring).

        The call can be captured in a CUDA graph (torch.cuda.graph) with check=False: every rank captures the
        same calls and replays them the same number of times; the replays read the captured tensors (copy new
        inputs into them) and weave still chooses its split in the kernel, from each replay's routing.
        Call `raise_if_error()` after replays."""
        if self.broken:
            raise RuntimeError(f"megakernel layer is unusable after an earlier failure: {self.broken}")
        capturing = torch.cuda.is_available() and torch.cuda.is_current_stream_capturing()
        if check and capturing:
            raise ValueError("check=True synchronises with the host, which a CUDA graph capture cannot do: capture "
                             "with check=False and call raise_if_error() after the replays")
        check_layer_inputs(x, topk_ids, topk_weights, w13, w2, hidden=self.hidden, inter=self.inter,
                           num_experts=self.num_experts, num_local_experts=self.num_local_experts,
                           top_k=self.top_k, max_tokens=self.max_tokens, device=self.device, check_ids=check,
                           fp8=self.fp8)
        if shared is not None:
            if self.shared_inter <= 0:
                raise ValueError("shared= needs the layer built with shared_inter > 0 (the shared expert's width)")
            if not isinstance(shared, (tuple, list)) or len(shared) != 2:
                raise ValueError("shared must be a pair (w13s [2*Is, H], w2s [H, Is])")
            check_shared_weights(shared[0], shared[1], hidden=self.hidden, inter_shared=self.shared_inter, fp8=self.fp8,
                                 device=self.device)
        if shared_order not in SHARED_ORDERS:
            raise ValueError(f"shared_order must be one of {SHARED_ORDERS}, got {shared_order!r}")
        if shared_scale is not None:
            if shared is None:
                raise ValueError("shared_scale weighs the shared expert's rows: pass shared= with it")
            check_shared_scale(shared_scale, x.shape[0], device=self.device)
        pol = parse_policy(policy, self.num_ctas)
        if record_timeline and self.timeline_per_cta <= 0:
            raise ValueError("record_timeline needs the layer built with timeline_per_cta > 0")
        ids = topk_ids if topk_ids.dtype == torch.int32 else topk_ids.to(torch.int32)
        if out is None:
            y = torch.empty(x.shape[0], self.hidden, dtype=torch.bfloat16, device=self.device)
        else:
            y = out
            if y.dtype != torch.bfloat16 or tuple(y.shape) != (x.shape[0], self.hidden) or not y.is_contiguous() \
                    or y.device != self.device:
                raise ValueError(f"out must be a contiguous bf16 [{x.shape[0]}, {self.hidden}] tensor on {self.device}")
        if check and (self._unread or self._captured):
            # an error word that unchecked calls or graph replays left is theirs, and never recoverable: read it first
            # (one more host sync), so that a ReceiveOverflow after this call is this call's own
            self.raise_if_error()
        if self.fp8 and x.data_ptr() % 16:
            raise ValueError("FP8 experts read x in 16-byte pieces: x must be 16-byte aligned (x.clone() is)")
        # (kernels before the device counter: an epoch whose launch never happened must not count)
        self.epoch += 1
        try:
            self._launch(x, ids, topk_weights, w13, w2, y, pol, record_timeline, shared, shared_order, shared_scale)
        except BaseException:
            self.epoch -= 1
            raise
        self._unread += 1
        self._captured = self._captured or capturing
        if check:
            self.raise_if_error(_just_called=True)
        return y

    def _launch(self, x, ids, tw, w13, w2, y, pol, record_timeline: bool, shared=None, shared_order: str = "last",
                shared_scale=None) -> None:
        """One launch on the current stream. Through the extension's Launcher when it has one: built from a full
        _params dict the first time (and again whenever an option or buffer the dict reads was replaced), it then
        takes only the call's own values. Extensions without it (other sources' builds, bench --ab-csrc) get the
        whole dict every call."""
        stream = _current_raw_stream(self.device)
        if not hasattr(self.ext, "Launcher"):
            self.ext.launch(self._params(x, ids, tw, w13, w2, y, pol, record_timeline, shared, shared_order,
                                         shared_scale), stream)
            return
        key = (self.ext, self.num_ctas, self.dispatch, self.timeout_ns, self.cooperative, self.timeline_per_cta,
               self.cost_table.data_ptr(), self.peer_base.data_ptr(), self.expert_owner.data_ptr(),
               self.owner_experts.data_ptr(), self.symm.data_ptr())
        if self._launcher is None or self._launcher_key != key:
            self._launcher = None
            self._launcher = self.ext.Launcher(self._params(x, ids, tw, w13, w2, y, pol, record_timeline, shared,
                                                            shared_order, shared_scale))
            self._launcher_key = key
        sh = shared is not None
        xp, w13p, w2p, xs, w13s, w2s = self._operand_ptrs(x, w13, w2)
        # (extensions from sources before FP8 experts, e.g. bench --ab-csrc's, take five arguments fewer; those before
        # FP8 shared experts two)
        version = getattr(self.ext, "fp8_experts", 0)
        s13, s2, ss13, ss2 = self._shared_ptrs(shared)
        f8 = (xs, w13s, w2s, ss13, ss2) if version >= 2 else (xs, w13s, w2s) if version == 1 else ()
        self._launcher.launch(
            xp, ids.data_ptr(), tw.data_ptr(), w13p, w2p, y.data_ptr(), x.shape[0],
            pol.policy_id, pol.num_comm_ctas, int(pol.steal), self.timeline.data_ptr() if record_timeline else 0,
            s13, s2,
            shared_scale.data_ptr() if sh and shared_scale is not None else 0, self.shared_inter if sh else 0,
            int(shared_order == "first"), *f8, stream)

    def _operand_ptrs(self, x, w13, w2) -> tuple[int, int, int, int, int, int]:
        """Addresses of (x, w13, w2, x_scale, w13_scale, w2_scale) as the kernel reads them: bf16 tensors and no
        scales, or (FP8) the weight pairs' e4m3 tensors and scales, and the buffer the kernel quantizes x's scales
        into."""
        if not self.fp8:
            return x.data_ptr(), w13.data_ptr(), w2.data_ptr(), 0, 0, 0
        return (x.data_ptr(), w13[0].data_ptr(), w2[0].data_ptr(), self.x_s.data_ptr(), w13[1].data_ptr(),
                w2[1].data_ptr())

    def _shared_ptrs(self, shared) -> tuple[int, int, int, int]:
        """(w13s, w2s, w13s_scale, w2s_scale) addresses of a call's shared expert (zeros without one; bf16: no
        scales)."""
        if shared is None:
            return 0, 0, 0, 0
        if not self.fp8:
            return shared[0].data_ptr(), shared[1].data_ptr(), 0, 0
        return shared[0][0].data_ptr(), shared[1][0].data_ptr(), shared[0][1].data_ptr(), shared[1][1].data_ptr()

    def quantized_x(self, n: int) -> tuple[torch.Tensor, torch.Tensor]:
        """FP8 layers: this rank's last n rows as the kernel quantized them, (e4m3 [n, H], scales fp32 [n, H / 128])
        (views of the layer's buffers; tests compare them with fp8.quantize_act)."""
        if not self.fp8:
            raise ValueError("quantized_x is for layers built with expert_dtype='fp8'")
        if not 0 <= n <= self.max_tokens:
            raise ValueError(f"quantized_x: n must be in [0, max_tokens = {self.max_tokens}], got {n}")
        q = self.x_q[: n * self.hidden].view(n, self.hidden).view(torch.float8_e4m3fn)
        st = fp8_scale_stride(self.hidden)
        return q, self.x_s[: n * st].view(n, st)[:, : self.hidden // FP8_BLOCK]

    def _params(self, x, ids, tw, w13, w2, y, pol, record_timeline: bool, shared=None,
                shared_order: str = "last", shared_scale=None) -> dict:
        pl = self.plan
        xp, w13p, w2p, xs, w13s_, w2s_ = self._operand_ptrs(x, w13, w2)
        s13, s2, ss13, ss2 = self._shared_ptrs(shared)
        fp8 = self.fp8
        return {
            "fp8": int(fp8), "x_q": self.x_q.data_ptr() if fp8 else 0, "x_scale": xs, "w13_scale": w13s_, "w2_scale": w2s_,
            "off_recv_xs": pl.off_recv_xs, "h_scale": self.h_scale.data_ptr() if fp8 else 0,
            "shared_scale": shared_scale.data_ptr() if shared is not None and shared_scale is not None else 0,
            "w13s": s13, "w2s": s2, "w13s_scale": ss13, "w2s_scale": ss2,
            "hs_scale": self.hs_scale.data_ptr() if self.hs_scale is not None else 0,
            "hs": self.hs.data_ptr(), "ys": self.ys.data_ptr(), "g0s_done": self.g0s_done.data_ptr(),
            "inter_shared": self.shared_inter if shared is not None else 0,
            "shared_first": int(shared_order == "first"), "max_shared_blocks": self.max_shared_blocks,
            "x": xp, "topk_ids": ids.data_ptr(), "topk_weights": tw.data_ptr(),
            "w13": w13p, "w2": w2p, "y": y.data_ptr(),
            "expert_owner": self.expert_owner.data_ptr(), "owner_experts": self.owner_experts.data_ptr(),
            "peer_base": self.peer_base.data_ptr(),
            "off_count_flag": pl.off_count_flag, "off_comb_flag": pl.off_comb_flag,
            "off_gcounts": pl.off_gcounts, "off_blk_flag": pl.off_blk_flag, "off_recv_meta": pl.off_recv_meta,
            "off_comb": pl.off_comb, "off_recv_x": pl.off_recv_x,
            "expert_ctr": self.expert_ctr.data_ptr(), "pair_slot": self.pair_slot.data_ptr(),
            "sorted_pair": self.sorted_pair.data_ptr(), "h": self.h.data_ptr(),
            "g0_done": self.g0_done.data_ptr(), "sched": self.sched.data_ptr(),
            "grid_bar": self.grid_bar.data_ptr(), "err": self.err.data_ptr(),
            "timeline": self.timeline.data_ptr() if record_timeline else 0,
            "timeline_count": self.timeline_count.data_ptr(),
            "cost_table": self.cost_table.data_ptr(), "choice": self.choice.data_ptr(),
            "rank": self.rank, "world": self.world, "num_tokens": x.shape[0], "top_k": self.top_k,
            "hidden": self.hidden, "inter": self.inter, "num_experts": self.num_experts,
            "num_local_experts": self.num_local_experts, "max_tokens": self.max_tokens,
            "recv_cap_rows": pl.recv_cap_rows, "max_row_blocks": pl.max_row_blocks,
            "num_ctas": self.num_ctas, "num_comm_ctas": pol.num_comm_ctas, "policy": pol.policy_id,
            "timeline_per_cta": self.timeline_per_cta, "epoch_ctr": self.epoch_ctr.data_ptr(), "epoch": self.epoch,
            "timeout_ns": self.timeout_ns,
            "cooperative": int(self.cooperative), "dispatch_bulk": dispatch_issuers(self.dispatch),
            "steal": int(pol.steal),
        }

    def last_choice(self) -> dict | None:
        """The weave policy's decision of the last call on this rank (synchronises), or None if the last call
        was not a weave call: {"c_star", "k_star", "time_ns" (predicted), "comm_ctas_used", "epoch"}."""
        v = self.choice.cpu().tolist()
        last = int(self.epoch_ctr.item())  # the last call's epoch, replays of a CUDA graph included
        if int(v[4]) != last or last == 0:
            return None
        out = {k: (float(v[i]) if k == "time_ns" else int(v[i])) for i, k in enumerate(CHOICE_SLOTS)}
        return out

    def poison_scratch(self) -> None:
        """Fill receive rows, combine rows and h with NaN (tests: catches reads of rows nothing wrote this call).
        Only between calls, after every rank synchronised (peers write into these regions during a call)."""
        pl = self.plan
        nan = torch.full((1,), float("nan"), dtype=torch.bfloat16).view(torch.uint8)  # 2 bytes
        for start, end in ((pl.off_comb, pl.off_recv_x), (pl.off_recv_x, pl.total_bytes)):
            region = self.symm[start:end]
            if self.fp8 and start == pl.off_recv_x:  # 0xFF: NaN as e4m3, as fp32 scales, and as bf16 output rows
                region.fill_(0xFF)
            else:
                region.view(-1, 2).copy_(nan.to(self.device).expand(region.numel() // 2, 2))
        for t in (self.h, self.hs, self.x_q):  # e4m3 / bf16 buffers: 0xFF bytes are NaN as e4m3, 0xFFFF as bf16
            if t is not None:
                t.view(torch.uint8).fill_(0xFF)
        for t in (self.h_scale, self.hs_scale, self.x_s, self.ys):  # (the kernel writes x_q / x_s before reading them)
            if t is not None:
                t.fill_(float("nan"))

    def raise_if_error(self, _just_called: bool = False) -> None:
        """Synchronise and raise RuntimeError if the kernel flagged an error (the layer is then unusable).
        The exception: a receive overflow found by the check of the call that overflowed (__call__'s check=True,
        VirtualRanks' check; `_just_called`) raises ReceiveOverflow and leaves the layer usable. Every rank finds
        it from the same gathered counts before any row moves, and the call leaves every counter as a finished
        call does. After further calls (check=False, graph replays) those would have started on the raised error
        word, so there the layer is unusable as after any error; a check=True call after unchecked calls (or on a
        layer captured in a CUDA graph) therefore reads the error word before it launches too."""
        err = self.err.cpu().tolist()
        just = _just_called and self._unread <= 1  # the word is that call's only if no other launch is unread
        self._unread = 0
        if err[0] == ERR_RECV_OVERFLOW and just:
            self.err.zero_()
            raise ReceiveOverflow(
                f"rank {self.rank}: " + ERROR_TEXT[ERR_RECV_OVERFLOW].format(err[2], err[3])
                + f"; this layer receives at most {self.plan.recv_cap_rows} rows (recv_capacity {self.recv_capacity} "
                  f"pairs, plus a partial 128-row block per local expert): split the batch, or build the layer with a "
                  f"larger recv_capacity. The layer stays usable.", owner=err[2], rows=err[3])
        if err[0] != 0:
            text = ERROR_TEXT.get(err[0], "unknown error {0} {1}").format(err[2], err[3])
            self.broken = f"rank {self.rank}, CTA {err[1]}: {text}"
            raise RuntimeError(f"weave megakernel failed on {self.broken}")

    def timeline_events(self, base_ns: int | None = None) -> tuple[list[dict], int]:
        """Chrome events of the last call that recorded a timeline; returns (events, base_ns used)."""
        counts = self.timeline_count.cpu().numpy()
        raw = self.timeline.cpu().numpy().view(RECORD_DTYPE).reshape(self.num_ctas, self.timeline_per_cta)
        recs = np.concatenate([raw[b, : min(int(c), self.timeline_per_cta)] for b, c in enumerate(counts)])
        if base_ns is None:
            base_ns = int(recs["start_ns"].min()) if recs.size else 0
        return records_to_events(recs, self.rank, base_ns), base_ns

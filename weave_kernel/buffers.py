"""The megakernel's buffers, sized without a GPU: the symmetric buffer's layout (plan_buffers), the bytes one rank
allocates (workspace_bytes), the receive capacity, the scalar options, and the check that a layer fits the GPUs'
free memory on every rank alike (check_fits). MoEMegakernel (megakernel.py) allocates what these plan."""
from __future__ import annotations

import numbers
from dataclasses import dataclass

import torch
from weave_sim.workload import EXPERT_DTYPES  # the formats an expert can take (one definition)

from .fp8 import BLOCK as FP8_BLOCK  # columns per activation scale, rows and columns per weight scale
from .geometry import check_geometry
from .timeline import RECORD_DTYPE

BLOCK_M = 128                # rows per dispatch block and GEMM tile (csrc/config.cuh kBlockM)
INT32_MAX = 2**31 - 1        # pair ids and receive rows are int32 in the kernel (csrc/params.h)
COST_TABLE_LEN = 305         # weave::cost_table::kLen (csrc/cost_model.cuh), = weave_sim.costtable.TABLE_LEN
CHOICE_LEN = 8               # weave::kChoiceLen (csrc/params.h); slots: ChoiceSlot
DEFAULT_TIMEOUT_S = 2.0


def fp8_scale_stride(k: int) -> int:
    """Floats per row of the kernel's activation-scale arrays over k columns: k / 128 padded to whole 128-byte lines
    (csrc/params.h fp8_scale_stride)."""
    return (k // FP8_BLOCK + 31) // 32 * 32


def check_expert_dtype(expert_dtype) -> str:
    if expert_dtype not in EXPERT_DTYPES:
        raise ValueError(f"expert_dtype must be one of {EXPERT_DTYPES}, got {expert_dtype!r}")
    return expert_dtype


def _align(n: int, a: int = 256) -> int:
    return (n + a - 1) // a * a


@dataclass(frozen=True)
class BufferPlan:
    """Byte offsets inside the symmetric buffer (identical on every rank) and scratch sizes."""

    recv_cap_rows: int
    max_row_blocks: int
    off_count_flag: int
    off_comb_flag: int
    off_gcounts: int
    off_blk_flag: int
    off_recv_meta: int
    off_comb: int
    off_recv_x: int
    total_bytes: int
    off_recv_xs: int = 0  # FP8 experts: the received rows' scales (fp32 [rows, hidden / 128]); 0 for bf16


def recv_pairs_of(world: int, max_tokens: int, top_k: int, recv_capacity: int | None) -> int:
    """The (token, expert) pairs one rank's receive buffer holds: recv_capacity, or the worst case world x
    max_tokens x top_k (every pair of every rank on one owner) when None; checked, and never above the worst case."""
    worst = world * max_tokens * top_k
    if recv_capacity is None:
        return worst
    if isinstance(recv_capacity, bool) or not isinstance(recv_capacity, numbers.Integral) or recv_capacity < 1:
        raise ValueError(f"recv_capacity must be a positive integer (pairs a rank receives per call), got "
                         f"{recv_capacity!r}")
    return min(int(recv_capacity), worst)


def plan_buffers(hidden: int, num_experts: int, top_k: int, world: int, max_tokens: int,
                 recv_capacity: int | None = None, fp8: bool = False) -> BufferPlan:
    """Receive rows for recv_capacity pairs (default the worst case: every pair of every rank lands on one owner)
    plus one partial row block per local expert (an expert's rows from all sources are packed, then padded once).
    One row flag per (row block, source). fp8: e4m3 rows land in the first half of each bf16-sized receive row (the
    sequential policy writes its bf16 outputs over them), their scales after them."""
    num_local = num_experts // world
    rows = recv_pairs_of(world, max_tokens, top_k, recv_capacity) + num_local * (BLOCK_M - 1)
    rows = (rows + BLOCK_M - 1) // BLOCK_M * BLOCK_M
    # the kernel holds pair ids (token x top_k + j) and receive row numbers in 32-bit integers
    if max_tokens * top_k > INT32_MAX or rows > INT32_MAX:
        raise ValueError(f"max_tokens {max_tokens} x top_k {top_k} pairs or {rows} receive rows exceed the kernel's "
                         f"32-bit indices ({INT32_MAX}); use fewer tokens per call or a smaller recv_capacity")
    blocks = rows // BLOCK_M
    off = 0
    layout = {}
    for name, nbytes in (
        ("count_flag", 8 * world),
        ("comb_flag", 8 * world),
        ("gcounts", 4 * 2 * world * num_experts),
        ("blk_flag", 8 * blocks * world),
        ("recv_meta", 4 * rows),
        ("comb", 2 * max_tokens * top_k * hidden),
        ("recv_x", 2 * rows * hidden),
        ("recv_xs", 4 * rows * fp8_scale_stride(hidden) if fp8 else 0),
    ):
        layout[name] = off
        off = _align(off + nbytes)
    return BufferPlan(rows, blocks, *(layout[n] for n in
                      ("count_flag", "comb_flag", "gcounts", "blk_flag", "recv_meta", "comb", "recv_x")), off,
                      layout["recv_xs"] if fp8 else 0)


def workspace_bytes(*, hidden: int, inter: int, num_experts: int, top_k: int, world: int, max_tokens: int,
                    shared_inter: int = 0, num_ctas: int = 132, timeline_per_cta: int = 0,
                    recv_capacity: int | None = None, expert_dtype: str = "bf16") -> dict[str, int]:
    """Bytes of device memory one MoEMegakernel allocates on each rank, by part: "symmetric" (the buffer the peers
    write into: received rows, combine rows, flags), "h" (the SwiGLU outputs of every received row), "shared" (the
    shared expert's scratch), "other" (pair lists, counters, tables, timeline) and "total". Nothing here depends on
    the weights: calls run one after another, so one object serves every layer of its geometry (WeaveMoE's
    kernel=, hf.replace_moe_blocks shares one per geometry). `MoEMegakernel.workspace_bytes()` sums what an
    object did allocate; the GPU tests check that the two agree. expert_dtype "fp8": h in e4m3 with its scales,
    the received rows' scales, and the quantized x with its scales ("other")."""
    sizes = {"hidden": hidden, "inter": inter, "num_experts": num_experts, "top_k": top_k, "world": world,
             "max_tokens": max_tokens, "shared_inter": shared_inter, "num_ctas": num_ctas}
    for name, v in sizes.items():
        least = 0 if name == "shared_inter" else 1
        if isinstance(v, bool) or not isinstance(v, numbers.Integral) or v < least:
            raise ValueError(f"{name} must be an integer >= {least}, got {v!r}")
    check_geometry(hidden, inter, num_experts, top_k, world, world, shared_inter)
    check_options(num_ctas=num_ctas, timeline_per_cta=timeline_per_cta)
    fp8 = check_expert_dtype(expert_dtype) == "fp8"
    if fp8 and (hidden % FP8_BLOCK or inter % FP8_BLOCK or shared_inter % FP8_BLOCK):
        raise ValueError(f"FP8 experts need hidden, inter and shared_inter multiples of {FP8_BLOCK}, got "
                         f"hidden {hidden}, inter {inter}, shared_inter {shared_inter}")
    plan = plan_buffers(hidden, num_experts, top_k, world, max_tokens, recv_capacity, fp8)
    ns = max_tokens if shared_inter else 1
    shared_blocks = (max_tokens + BLOCK_M - 1) // BLOCK_M
    other = (4 * 2 * num_experts                      # expert_ctr
             + 2 * 4 * max_tokens * top_k             # pair_slot, sorted_pair
             + 4 * 2 * plan.max_row_blocks            # g0_done
             + 4 * 8 + 4 * 2 + 4 * 4                  # sched, grid_bar, err
             + max(1, num_ctas * timeline_per_cta) * RECORD_DTYPE.itemsize + 4 * num_ctas
             + 8 * COST_TABLE_LEN + 8 * CHOICE_LEN + 8  # cost table, choice, epoch counter
             + 4 * num_experts * 2                    # expert_owner, owner_experts
             + 8 * world)                             # peer_base
    if fp8:
        other += max_tokens * hidden + 4 * max_tokens * fp8_scale_stride(hidden)  # x in e4m3, its scales
    h_bytes = (plan.recv_cap_rows * inter + 4 * plan.recv_cap_rows * fp8_scale_stride(inter) if fp8
               else 2 * plan.recv_cap_rows * inter)
    parts = {"symmetric": plan.total_bytes,
             "h": h_bytes,
             "shared": ((ns * max(1, shared_inter) + 4 * ns * fp8_scale_stride(shared_inter) if fp8 and shared_inter
                         else 2 * ns * max(1, shared_inter)) + 2 * ns * hidden + 4 * 2 * shared_blocks),
             "other": other}
    parts["total"] = sum(parts.values())
    return parts


def check_options(*, timeout_s=DEFAULT_TIMEOUT_S, num_ctas=None, timeline_per_cta=0) -> None:
    """MoEMegakernel's scalar options, checked before anything is built (WeaveMoE checks them on either backend):
    a timeout of 0 or NaN made every wait fail at once (or int() raise), a grid below 2 CTAs or a negative timeline
    failed later with another library's message."""
    if isinstance(timeout_s, bool) or not isinstance(timeout_s, numbers.Real) or not 0 < timeout_s < 3600:
        raise ValueError(f"timeout_s must be a number of seconds in (0, 3600), got {timeout_s!r}")
    if num_ctas is not None and (isinstance(num_ctas, bool) or not isinstance(num_ctas, numbers.Integral)
                                 or num_ctas < 2):
        raise ValueError(f"num_ctas must be None (one CTA per SM) or an integer >= 2, got {num_ctas!r}")
    if isinstance(timeline_per_cta, bool) or not isinstance(timeline_per_cta, numbers.Integral) or timeline_per_cta < 0:
        raise ValueError(f"timeline_per_cta must be an integer >= 0, got {timeline_per_cta!r}")


def _gib(n: int) -> str:
    return f"{n / 2**30:.2f} GiB"


def check_fits(need: dict, device, *, group=None, distributed: bool = False, world: int = 1, rank: int = 0,
               what: str = "this layer", hint: str = "") -> None:
    """Raise MemoryError on every rank alike if `need` ({part: bytes, "total": bytes}) exceeds the free memory of some
    rank's GPU (the driver's free memory plus what torch's cache holds unused). Collective when distributed: the
    ranks exchange their figures first, because a rank whose allocation failed alone would leave its peers waiting
    in the next collective (the symmetric-memory rendezvous) instead of failing with it."""
    device = torch.device(device)
    if device.type != "cuda":
        return
    free, _ = torch.cuda.mem_get_info(device)
    free += torch.cuda.memory_reserved(device) - torch.cuda.memory_allocated(device)
    mine = (rank, int(need["total"]), int(free))
    if distributed:
        import torch.distributed as dist

        every = [None] * world
        dist.all_gather_object(every, mine, group=group)
    else:
        every = [mine]
    short = [(r, n, f) for r, n, f in every if n > f]
    if short:
        r, n, f = short[0]
        parts = ", ".join(f"{k} {_gib(v)}" for k, v in need.items() if k != "total")
        raise MemoryError(f"{what} need {_gib(n)} per rank ({parts}) and rank {r}'s GPU has {_gib(f)} free"
                          + (f": {hint}" if hint else ""))

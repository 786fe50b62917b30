"""The layer geometries the megakernel runs, checked without torch (bench, predict and the fuzz worker share it)."""
from __future__ import annotations

DIM_ALIGN = 64        # H and I must be multiples of this (one GEMM0 tile owns 64 h columns; K steps of 64)
MAX_EXPERTS = 512     # shared-memory layout tables in the kernel
MAX_RANKS = 8
MAX_RANK_EXPERTS = 2048  # world x num_experts: the count matrix the kernel keeps in shared memory


MAX_SHARED_INTER = 131072  # the shared expert's width Is (num_shared_experts x I for the presets)


def check_geometry(hidden: int, inter: int, num_experts: int, top_k: int, world: int, placement_gpus: int,
                   shared_inter: int = 0) -> None:
    """Raise ValueError when the layer geometry is outside what the kernel supports. shared_inter: the shared
    expert's FFN width (0: none)."""
    if shared_inter < 0 or shared_inter % DIM_ALIGN or shared_inter > MAX_SHARED_INTER:
        raise ValueError(f"the shared expert's width ({shared_inter}) must be 0 (none) or a positive multiple of "
                         f"{DIM_ALIGN} up to {MAX_SHARED_INTER}")
    if hidden <= 0 or inter <= 0 or hidden % DIM_ALIGN or inter % DIM_ALIGN:
        raise ValueError(f"hidden ({hidden}) and expert_ffn ({inter}) must be positive multiples of {DIM_ALIGN}")
    if placement_gpus != world:
        raise ValueError(f"placement is for {placement_gpus} GPUs but the process group has {world} ranks")
    if not 1 <= world <= MAX_RANKS:
        raise ValueError(f"world size {world} outside [1, {MAX_RANKS}]")
    if num_experts > MAX_EXPERTS or num_experts % world:
        raise ValueError(f"num_experts {num_experts} must be <= {MAX_EXPERTS} and a multiple of the world size {world}")
    if world * num_experts > MAX_RANK_EXPERTS:
        raise ValueError(f"world size x num_experts = {world} x {num_experts} exceeds {MAX_RANK_EXPERTS} (the kernel's "
                         f"shared-memory count matrix); use fewer experts per layer or fewer ranks")
    if not 1 <= top_k <= num_experts:
        raise ValueError(f"top_k {top_k} must be in [1, num_experts={num_experts}]")

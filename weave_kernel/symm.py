"""Device buffers the ranks address directly: one symmetric-memory allocation per user, and CUDA-event timing.

Shared by the megakernel (`MoEMegakernel`), the calibration microbenchmarks (`calib_runs.py`), the benchmark
and the GEMM probe, so that they allocate and time the same way.
"""
from __future__ import annotations

import random
import statistics

import torch


class SymmetricBuffer:
    """`nbytes` of zeroed device memory that every rank of `group` can address: PyTorch symmetric memory
    (`empty` + `rendezvous`) for several ranks, a plain allocation for one. `tensor` is this rank's bytes,
    `peer_ptrs[g]` rank g's base address; keep the object alive as long as a kernel may use them."""

    def __init__(self, nbytes: int, device, world: int, rank: int, group=None):
        if world == 1:
            self.tensor = torch.zeros(nbytes, dtype=torch.uint8, device=device)
            self.handle = None
            self.peer_ptrs = [self.tensor.data_ptr()]
            return
        import torch.distributed as dist
        import torch.distributed._symmetric_memory as symm_mem

        self.tensor = symm_mem.empty(nbytes, dtype=torch.uint8, device=device)
        self.tensor.zero_()  # flags start below every epoch
        torch.cuda.synchronize(device)
        self.handle = symm_mem.rendezvous(self.tensor, (group or dist.group.WORLD).group_name)
        self.peer_ptrs = [int(p) for p in self.handle.buffer_ptrs]
        if self.peer_ptrs[rank] != self.tensor.data_ptr():
            raise RuntimeError("symmetric memory: own buffer pointer does not match the handle")

    def peer_base(self, device) -> torch.Tensor:
        """int64 [world] device tensor of the peers' base addresses (the kernels' `peer_base`)."""
        return torch.tensor(self.peer_ptrs, dtype=torch.int64, device=device)


def cuda_time_ms(fn, warmup: int, repeats: int, calls: int = 1, before=None) -> float:
    """Median over `repeats` of the CUDA-event time of `calls` back-to-back fn() calls, divided by `calls`,
    after `warmup` untimed calls; `before()` (e.g. a device sync and a barrier of the ranks) runs before each
    repetition."""
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(repeats):
        if before is not None:
            before()
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        for _ in range(calls):
            fn()
        b.record()
        b.synchronize()
        times.append(a.elapsed_time(b) / calls)
    return statistics.median(times)


def interleaved_time_ms(fns: dict, warmup: int, repeats: int, calls: int = 1, before=None,
                        alternate: bool = False, shuffle_seed: int | None = None) -> dict:
    """cuda_time_ms for several functions at once, their repetitions interleaved: `warmup` untimed calls of
    each, then `repeats` rounds, each timing every function once (one untimed call, then `calls` back-to-back
    calls). Any drift of the GPU over the rounds (clocks, temperature) reaches every function alike. Returns
    {name: median ms}.
    Within a round the order is fixed, so a function's place in it is not: on a GPU at its power cap the
    functions timed later in a round run after more of the round's load. With `alternate` the rounds go forward
    and backward in turn (`repeats` rounded up to even), and each function's figure is the median over round
    pairs of its mean in the pair, so a bias that grows along the round cancels within each pair.
    That does not remove a bias from the function timed before: at the power cap a function timed right after a
    light one (the reference) presumably starts at a higher clock, and forward and backward rounds give each function the
    same neighbours. With `shuffle_seed` every round times the functions in a fresh random order (drawn from that
    seed, so every rank draws the same orders), and each figure is the median over rounds."""
    if repeats < 1 or not fns:
        raise ValueError(f"interleaved_time_ms: need repeats >= 1 and at least one function (got {repeats}, {len(fns)})")
    if alternate and shuffle_seed is not None:
        raise ValueError("interleaved_time_ms: alternate and shuffle_seed exclude each other")
    for fn in fns.values():
        for _ in range(warmup):
            fn()
    names = list(fns)
    rounds = repeats + (repeats % 2) if alternate else repeats
    times = {name: [] for name in fns}
    rng = random.Random(shuffle_seed) if shuffle_seed is not None else None
    for r in range(rounds):
        order = names[::-1] if alternate and r % 2 else names
        if rng is not None:
            order = rng.sample(names, len(names))
        for name in order:
            times[name].append(cuda_time_ms(fns[name], 1, 1, calls, before=before))
    if alternate:
        return {name: statistics.median((t[i] + t[i + 1]) / 2 for i in range(0, len(t), 2))
                for name, t in times.items()}
    return {name: statistics.median(t) for name, t in times.items()}


def init_ranks() -> tuple[int, int, torch.device]:
    """Under torchrun: bind this process to GPU LOCAL_RANK, then join the NCCL group with that device (NCCL
    then knows each rank's GPU instead of guessing it from the global rank). Returns (rank, world, device)."""
    import os

    import torch.distributed as dist

    if not torch.cuda.is_available():
        raise SystemExit("the megakernel needs CUDA GPUs (Hopper) and this torch sees none; the simulator side "
                         "(weave-sim, python -m weave_kernel.predict / whatif / gap) runs on any CPU machine")
    dev = torch.device("cuda", int(os.environ.get("LOCAL_RANK", os.environ.get("RANK", 0))))
    if dev.index >= torch.cuda.device_count():
        raise SystemExit(f"LOCAL_RANK {dev.index} but this machine has {torch.cuda.device_count()} GPUs: "
                         f"torchrun --nproc_per_node must not exceed them")
    torch.cuda.set_device(dev)
    dist.init_process_group("nccl", device_id=dev)
    return dist.get_rank(), dist.get_world_size(), dev

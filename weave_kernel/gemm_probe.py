"""Tile GEMM rate of the megakernel on one GPU (world size 1, one expert, top-1): nearly all the time is the
expert GEMMs, so 6*N*H*I / latency is the mma.sync tile throughput (dispatch is a local copy).

    torchrun --nproc_per_node=1 -m weave_kernel.gemm_probe
"""
from __future__ import annotations


import torch
import torch.distributed as dist

from weave_sim.placement import contiguous

from .megakernel import MoEMegakernel
from .reference import grouped_ffn
from .symm import cuda_time_ms, init_ranks


def main() -> int:
    _, world, dev = init_ranks()
    assert world == 1, "run with --nproc_per_node=1"
    print(f"{'N':>6}{'H':>6}{'I':>7}{'kernel ms':>11}{'TF/s':>7}{'grouped_mm ms':>15}{'TF/s':>7}")
    for n, h, i in ((8192, 4096, 14336), (8192, 7168, 2048), (16384, 2048, 1408)):
        layer = MoEMegakernel(hidden=h, inter=i, num_experts=1, top_k=1, placement=contiguous(1, 1), max_tokens=n)
        w13 = (torch.randn(1, 2 * i, h, device=dev) / h**0.5).to(torch.bfloat16)
        w2 = (torch.randn(1, h, i, device=dev) / i**0.5).to(torch.bfloat16)
        x = torch.randn(n, h, device=dev).to(torch.bfloat16)
        ids = torch.zeros(n, 1, dtype=torch.int32, device=dev)
        w = torch.ones(n, 1, device=dev)
        flops = 6.0 * n * h * i

        def timeit(fn):
            return cuda_time_ms(fn, 3, 10)

        t_k = timeit(lambda: layer(x, ids, w, w13, w2, policy="static:8", check=False))
        layer.raise_if_error()
        cnt = torch.tensor([n], device=dev)
        t_g = timeit(lambda: grouped_ffn(x, cnt, w13, w2))
        print(f"{n:>6}{h:>6}{i:>7}{t_k:>11.3f}{flops / t_k / 1e9:>7.0f}{t_g:>15.3f}{flops / t_g / 1e9:>7.0f}")
        del layer
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

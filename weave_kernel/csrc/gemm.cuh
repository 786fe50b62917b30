// One BM x BN output tile of C = A * B^T on tensor cores, bf16 in, fp32 accumulate: the wgmma mainloop
// (wgmma.cuh) over the cp.async operand pipeline (gemm_common.cuh). The first version used mma.sync
// m16n8k16 + ldmatrix with the same 128 x 256 tiles (git history, commit "128x256 mma.sync tiles"); its
// measured rate is in docs/kernel.md.
#pragma once
#include "wgmma.cuh"

// The tile GEMM's building blocks: wgmma m64n256k16 and the accumulator layout (wgmma.cuh), swizzle and TMA
// helpers (gemm_common.cuh). The loop that runs them is pipeline.cuh's warp-specialised run_tiles. Earlier
// versions (mma.sync m16n8k16 + ldmatrix; a 256-thread loop where every thread loaded and computed) are in git
// history with their measured rates in docs/kernel.md.
#pragma once
#include "wgmma.cuh"

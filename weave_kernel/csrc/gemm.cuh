// One BM x BN output tile of C = A * B^T on tensor cores, bf16 in, fp32 accumulate. Picks the mainloop:
// wgmma (sm_90a, default) or mma.sync (-DWEAVE_MMA_SYNC). Both provide TileAcc, tile_mainloop, gemm0_h_col,
// stage_swiglu and stage_plain with the same contracts.
#pragma once
#ifdef WEAVE_MMA_SYNC
#include "mma_sync.cuh"
#else
#include "wgmma.cuh"
#endif

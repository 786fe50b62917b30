// Compile-time configuration of the megakernel. Framework-free.
#pragma once
#include <cuda_bf16.h>
#include <cstdint>

#include "params.h"

namespace weave {

struct Config {
  static constexpr int kThreads = 256;                 // one CTA per SM, 8 warps
  static constexpr int kWarps = kThreads / 32;
  static constexpr int kBlockM = 128;                  // rows per GEMM tile == rows per dispatch block
  static constexpr int kBlockN = 256;                  // output columns per tile (GEMM0: 128 gate + 128 up)
  static constexpr int kBlockK = 64;                   // 128 bytes of bf16: one swizzle row
  static constexpr int kStages = 3;                    // cp.async pipeline depth (3 x 48 KB)
  static constexpr int kHalfN = kBlockN / 2;           // h columns per GEMM0 tile
  static constexpr int kWarpsM = 2, kWarpsN = 4;       // warp grid over the tile
  static constexpr int kWarpTileM = kBlockM / kWarpsM; // 64
  static constexpr int kWarpTileN = kBlockN / kWarpsN; // 64
  static constexpr int kFragsM = kWarpTileM / 16;      // m16 fragments per warp
  static constexpr int kFragsN = kWarpTileN / 8;       // n8 fragments per warp
  static constexpr int kDimAlign = 64;                 // H and I must be multiples of this (K steps; 16-byte rows)
  static constexpr int kMaxExperts = 512;
  static constexpr int kMaxRanks = 8;
  static constexpr int kSmemA = kBlockM * kBlockK * 2;
  static constexpr int kSmemB = kBlockN * kBlockK * 2;
  static constexpr int kSmemStage = kSmemA + kSmemB;
  static constexpr int kSmemPipe = kStages * kSmemStage;       // pipeline stages (1024-byte aligned)
  static constexpr int kSmemBarOffset = kSmemPipe;             // the stages' TMA mbarriers (tma.cuh)
  static constexpr int kSmemBarBytes = 64;
  static constexpr int kSmemDynamic = kSmemPipe + kSmemBarBytes + 1024;  // + slack to align the base to 1024
  static constexpr int kBoxRows = 128;                         // weight rows per TMA box (two boxes per B stage)
  static constexpr int kEpiStride = kBlockN + 8;               // bf16 per staged output row (padded)
  static constexpr int kCopyUnroll = 8;                        // 16-byte loads in flight per thread

  static_assert(kWarpsM * kWarpsN == kWarps, "warp grid must cover the CTA");
  static_assert(kBlockK * 2 == 128, "swizzle assumes 128-byte smem rows (8 chunks of 16 bytes)");
  static_assert(kFragsN == 8, "GEMM0 epilogue pairs n-frags {0..3} (gate) with {4..7} (up)");
  static_assert(kFragsM == 4, "warp tile is 64 rows");
  static_assert(kBlockN == 2 * kBoxRows && kBoxRows * kBlockK * 2 % 1024 == 0, "B stage = two SW128 boxes");
  static_assert(kBlockM <= kThreads, "one thread per row loads the pair ids of a block");
  static_assert((kBlockM * kBlockK / 8) % kThreads == 0, "A stage must split evenly into 16-byte chunks");
  static_assert((kBlockN * kBlockK / 8) % kThreads == 0, "B stage must split evenly into 16-byte chunks");
  static_assert(kBlockM * kEpiStride * 2 <= kSmemPipe, "epilogue staging must fit in the pipeline smem");
  static_assert(kHalfN % 8 == 0 && kDimAlign % 8 == 0, "h columns are predicated in 16-byte chunks");
  static_assert(kDimAlign % kBlockK == 0, "K loops assume K % kBlockK == 0");
  static_assert(kMaxRanks * kMaxExperts <= 8 * kThreads * 16, "block scan handles at most 16 items/thread");
};

using bf16 = __nv_bfloat16;

}  // namespace weave

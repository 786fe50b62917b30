// Compile-time configuration of the megakernel. Framework-free.
#pragma once
#include <cuda_bf16.h>
#include <cstdint>

#include "params.h"

namespace weave {

struct Config {
  // Warp-specialised CTA (pipeline.cuh): inside the GEMM phases warpgroup 0 produces (claims tiles, waits for
  // their rows, gathers A with cp.async, issues B by TMA) and warpgroups 1-2 consume (wgmma, epilogue); every
  // other phase (routing, dispatch, combine, reduce) runs on all threads alike.
  static constexpr int kThreads = 384;                 // one CTA per SM, 12 warps
  static constexpr int kWarps = kThreads / 32;
  static constexpr int kProducerThreads = 128;         // warpgroup 0
  static constexpr int kConsumerThreads = 256;         // warpgroups 1 and 2: 64 tile rows each
  static constexpr int kBlockM = 128;                  // rows per GEMM tile == rows per dispatch block
  static constexpr int kBlockN = 256;                  // output columns per tile (GEMM0: 128 gate + 128 up)
  static constexpr int kBlockK = 64;                   // 128 bytes of bf16: one swizzle row
  static constexpr int kStages = 4;                    // operand ring depth (4 x 48 KB; the warp-specialised
                                                       // handoff needs 3 stages in flight to hide the loads)
  static constexpr int kSlots = 2;                     // tile descriptors in flight (producer runs a tile ahead)
  static constexpr int kHalfN = kBlockN / 2;           // h columns per GEMM0 tile
  static constexpr int kDimAlign = 64;                 // H and I must be multiples of this (K steps; 16-byte rows)
  static constexpr int kMaxExperts = 512;
  static constexpr int kMaxRanks = 8;
  static constexpr int kMaxRankExperts = 2048;         // world x experts: the count matrix in shared memory (a
                                                       // fourth pipeline stage left room for 2048, not 8 x 512)
  static constexpr int kSmemA = kBlockM * kBlockK * 2;
  static constexpr int kSmemB = kBlockN * kBlockK * 2;
  static constexpr int kSmemStage = kSmemA + kSmemB;
  static constexpr int kSmemPipe = kStages * kSmemStage;       // operand stages (1024-byte aligned)
  static constexpr int kStageCols = 128;                       // epilogue staging: kBlockM rows x 128 columns,
  static constexpr int kStagingRow = kStageCols * 2 + 16;      // bytes per staged row (padded: wgmma.cuh), in the
  static constexpr int kSmemStaging = kBlockM * kStagingRow;   // tile's last operand stage (pipeline.cuh)
  static constexpr int kSmemSlotOffset = kSmemPipe;            // TileSlot[kSlots], then PipeState
  static constexpr int kSmemCtrlBytes = 3584;                  // slots + pipeline state (pipeline.cuh checks; the
                                                               // FP8 tiles' per-stage scales are 2 KB of it)
  static constexpr int kSmemDynamic = kSmemSlotOffset + kSmemCtrlBytes + 1024;  // + slack to align the base
  static constexpr int kBoxRows = 128;                         // weight rows per TMA box (two boxes per B stage)
  static constexpr int kCopyUnroll = 4;                        // 16-byte loads in flight per thread
  static constexpr int kAChunks = kBlockM * kBlockK / 8 / kProducerThreads;  // A chunks per producer thread
  // FP8 experts (weave_kernel/fp8.py): e4m3's largest value, and the smallest scale (an all-zero block's)
  static constexpr float kFp8Max = 448.f;
  static constexpr float kFp8ScaleFloor = 0x1p-40f;

  static_assert(kProducerThreads + kConsumerThreads == kThreads, "producer + consumer warpgroups = the CTA");
  static_assert(kConsumerThreads == 2 * 128 && kBlockM == 2 * 64, "two consumer warpgroups x m64 rows");
  static_assert(kBlockK * 2 == 128, "swizzle assumes 128-byte smem rows (8 chunks of 16 bytes)");
  static_assert(kBlockN == 2 * kBoxRows && kBoxRows * kBlockK * 2 % 1024 == 0, "B stage = two SW128 boxes");
  static_assert(kBlockM == kProducerThreads, "one producer thread per row loads the pair ids of a block");
  static_assert(kAChunks * kProducerThreads * 8 == kBlockM * kBlockK, "A stage splits evenly over the producers");
  static_assert(kHalfN == kStageCols && kBlockN == 2 * kStageCols, "GEMM0 stages once, GEMM1 in two halves");
  static_assert(kHalfN % 8 == 0 && kDimAlign % 8 == 0, "h columns are predicated in 16-byte chunks");
  static_assert(kDimAlign % kBlockK == 0, "K loops assume K % kBlockK == 0");
  static_assert(kSmemStaging <= kSmemStage, "the epilogue stages its outputs in one operand stage");
  static_assert(kMaxRankExperts <= kThreads * 16, "block scan handles at most 16 items/thread");
  static_assert(kMaxRankExperts >= kMaxExperts, "one rank with the most experts");
};

using bf16 = __nv_bfloat16;

}  // namespace weave

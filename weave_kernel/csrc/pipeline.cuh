// The warp-specialised GEMM tile pipeline every GEMM phase runs (megakernel GEMM0 / GEMM1, calibration tiles).
//
//   producer  warpgroup 0. Thread 0 claims the next tile (Tiles::next: a ticket, then the wait until the tile's
//             input rows exist) and publishes its descriptor in one of kSlots tile slots; the warpgroup loads the
//             tile's pair ids into the slot, then streams its k-steps through a kStages-deep ring: A gathered by
//             all 128 threads with cp.async (8 threads per 128-byte row: coalesced; rows past the block's end
//             zero-filled), each thread's completion counted on the stage's "full" mbarrier; B (the weights) as
//             two TMA boxes armed by thread 0 on the same barrier.
//   consumers warpgroups 1-2 (64 tile rows each; in a half tile, a block of at most 64 rows, both take rows
//             [0, 64) and half the columns each: wgmma.cuh mma_stage_half, mma_stage_half_e4m3). Wait for a slot,
//             then per k-step wait for the stage, issue its wgmmas (4, or 8 of half the width), keep one group in
//             flight (FP8: none, for the scales) and hand the previous stage back through its "empty" mbarrier;
//             then the epilogue (Tiles::epilogue: outputs staged as bf16 in the tile's last stage, which the
//             consumers keep until then, and copied out in 16-byte stores) and the tile's signal
//             (Tiles::tile_done); the last stage and the slot go back to the producer.
//
// The producer runs up to a tile ahead: while the consumers finish tile i (last MMAs, epilogue), it has already
// claimed tile i + 1, waited for its rows and filled the other kStages - 1 stages, so the next tile's MMAs start
// on loaded operands, and no CTA-wide barrier sits in the loop. The ring and slot
// positions persist in shared memory across calls (PipeState::it / tiles), so the mbarrier phase parities stay
// consistent from one GEMM phase to the next.
//
// Failure handling: every mbarrier wait and every spin has a deadline (error 8 / the spin's own error) and ends
// early once any error was raised. Waits that fail inside a tile do not change the control flow (the tile runs
// on with garbage, the call's result is discarded); the decision to stop is taken once per tile by one thread
// and broadcast, so the warpgroups never split at a named barrier. Framework-free.
#pragma once
#include <cstdint>
#include <type_traits>

#include "config.cuh"
#include "gemm_common.cuh"
#include "layout.cuh"
#include "sync.cuh"
#include "tma.cuh"
#include "wgmma.cuh"

namespace weave {

enum TileKind : int {
  kTileLost = -1,  // the slot could not be handed over (the partner stopped after an error)
  kTileEnd = 0,    // no tickets left
  kTileAbort = 1,  // the producer gave up (an error was raised)
  kTileGemm0 = 2,
  kTileGemm1 = 3,
};

struct TileDesc {
  int kind;
  int col;    // column block
  int num_k;  // k steps (K / kBlockK)
  RowBlock b; // the row block (calibration: le = expert, row0 = first row inside the expert's rows)
};

// One tile in flight: its descriptor and its rows' pair ids / source ranks (the GEMM1 epilogue pushes by them).
struct TileSlot {
  int pair[Config::kBlockM];
  TileDesc d;
  uint8_t psrc[Config::kBlockM];  // ranks < kMaxRanks
};
static_assert(Config::kMaxRanks <= 256, "TileSlot::psrc holds a rank in a byte");

struct PipeState {
  uint64_t full[Config::kStages];       // 128 cp.async arrivals + 1 expect_tx arrival (+ the TMA bytes)
  uint64_t empty[Config::kStages];      // one arrival per consumer warpgroup
  uint64_t slot_full[Config::kSlots];   // the producer published the slot
  uint64_t slot_empty[Config::kSlots];  // the consumers are done with it
  // FP8 tiles: each stage's scales, copied by the producers with the stage (cp.async, counted on its full barrier):
  // A row m's for the stage's k step, and the two 128-column halves' of B
  float a_scale[Config::kStages][Config::kBlockM];
  float b_scale[Config::kStages][2];
  uint32_t it;                          // k-steps through the ring so far (all calls of this launch)
  uint32_t tiles;                       // descriptors through the slots so far
  int prod_kind, cons_kind;             // per-tile decisions, broadcast inside a role
};

static_assert(Config::kSmemPipe % 1024 == 0 && Config::kSmemSlotOffset % 16 == 0, "stage / slot alignment");
static_assert((Config::kSmemSlotOffset + Config::kSlots * sizeof(TileSlot)) % alignof(PipeState) == 0,
              "PipeState alignment");
static_assert(Config::kSlots * sizeof(TileSlot) + sizeof(PipeState) <= Config::kSmemCtrlBytes,
              "tile slots + pipeline state must fit Config::kSmemCtrlBytes");

__device__ __forceinline__ uint8_t* pipe_stage(uint8_t* smem, int s) { return smem + s * Config::kSmemStage; }
__device__ __forceinline__ TileSlot* tile_slot(uint8_t* smem, int slot) {
  return reinterpret_cast<TileSlot*>(smem + Config::kSmemSlotOffset) + slot;
}
__device__ __forceinline__ PipeState* pipe_state(uint8_t* smem) {
  return reinterpret_cast<PipeState*>(tile_slot(smem, Config::kSlots));
}

// Thread 0 once per launch, before any tile; the caller follows with __syncthreads.
__device__ __forceinline__ void init_pipeline(uint8_t* smem) {
  if (threadIdx.x != 0) return;
  PipeState* ps = pipe_state(smem);
  for (int s = 0; s < Config::kStages; ++s) {
    mbar_init(&ps->full[s], Config::kProducerThreads + 1);
    mbar_init(&ps->empty[s], Config::kConsumerThreads / 128);
  }
  for (int s = 0; s < Config::kSlots; ++s) {
    mbar_init(&ps->slot_full[s], 1);
    mbar_init(&ps->slot_empty[s], 1);
  }
  ps->it = 0;
  ps->tiles = 0;
  mbar_init_fence();
}

// Consumers: copy the staged [kBlockM][kStageCols] block out, 16 bytes per thread and step: row m's first
// `cols` columns (a multiple of 8) to dst_row(m), for rows m < num_rows.
template <typename DstRow>
__device__ __forceinline__ void store_staged(const uint8_t* staging, int num_rows, int cols, DstRow dst_row) {
  constexpr int kChunks = Config::kStageCols / 8;
  const int ct = threadIdx.x - Config::kProducerThreads;
#pragma unroll 1  // unrolled, the loads in flight pushed the consumers past their register budget (spills)
  for (int c = ct; c < Config::kBlockM * kChunks; c += Config::kConsumerThreads) {
    const int m = c / kChunks, chunk = c % kChunks;
    if (m < num_rows && chunk * 8 < cols)
      *reinterpret_cast<int4*>(dst_row(m) + chunk * 8) =
          *reinterpret_cast<const int4*>(staging + staging_offset(m, chunk * 8));
  }
}

// Consumers: a plain (no activation) tile's 256 output columns c0 .. c0 + 255 to global memory, staged in two
// 128-column passes; dst(m, c) is the address of row m's column c (dst(m, 0) + c), and columns >= limit do not exist
// (N). Ends with a consumer barrier (the staging is free again).
// Each row's address is computed once per tile, by one thread per row, into the stage past the staged block; the
// store loop then reads it from shared memory. Computed in the loop, the combine's scatter address (the peer's base
// from the global peer_base array, indexed by the row's source rank) was a dependent global load ahead of every
// 16-byte store, and the stores of a 32 KB half took about 1.5 us against 1.0 for GEMM0's (docs/kernel.md,
// "A GEMM1 tile's stores").
// half: the tile ran as a half tile (mma_stage_half, mma_stage_half_e4m3).
template <typename Dst>
__device__ __forceinline__ void store_tile_plain(const TileAcc& acc, uint8_t* staging, int num_rows, int c0, int limit,
                                                 bool half, Dst dst) {
  using Row = decltype(dst(0, 0));
  static_assert(Config::kSmemStaging % alignof(Row) == 0 &&
                    Config::kSmemStaging + Config::kBlockM * sizeof(Row) <= Config::kSmemStage,
                "the row addresses fit the staging stage past the staged block");
  Row* row_dst = reinterpret_cast<Row*>(staging + Config::kSmemStaging);
  const int ct = threadIdx.x - Config::kProducerThreads;
  if (ct < num_rows) row_dst[ct] = dst(ct, 0);  // num_rows <= kBlockM <= kConsumerThreads; the next barrier orders it
  TileOut out;
  pack_plain(acc, out);
  stage_pairs<0>(out, staging, half);
  named_sync(kBarConsumers, Config::kConsumerThreads);
  store_staged(staging, num_rows, min(Config::kStageCols, limit - c0), [&](int m) { return row_dst[m] + c0; });
  named_sync(kBarConsumers, Config::kConsumerThreads);
  const int c1 = c0 + Config::kStageCols;
  if (c1 < limit) {
    stage_pairs<32>(out, staging, half);
    named_sync(kBarConsumers, Config::kConsumerThreads);
    store_staged(staging, num_rows, min(Config::kStageCols, limit - c1), [&](int m) { return row_dst[m] + c1; });
    named_sync(kBarConsumers, Config::kConsumerThreads);
  }
}

// Producer warpgroup: claim, publish, load. Returns false if it stopped on an error.
template <typename Tiles>
__device__ __forceinline__ bool produce_tiles(const Params& p, uint8_t* smem, Tiles& T, uint32_t it, uint32_t tiles) {
  PipeState* ps = pipe_state(smem);
  const int pt = threadIdx.x;  // 0 .. kProducerThreads - 1
  bool ok = true;
  for (;; ++tiles) {
    const int slot = static_cast<int>(tiles % Config::kSlots);
    TileSlot* ts = tile_slot(smem, slot);
    if (pt == 0) {
      // The slot first, then the ticket: a tile is claimed only once the consumers have started the one before
      // it, so a CTA holds at most one claimed tile beyond the one it computes (claiming further ahead left
      // tiles queued behind busy CTAs at the end of a phase while others ran dry).
      TileDesc d;
      if (tiles >= Config::kSlots &&
          !mbar_wait(p, &ps->slot_empty[slot], ((tiles / Config::kSlots) - 1) & 1u, 100 + slot, static_cast<int>(tiles))) {
        d.kind = kTileLost;
      } else {
        if (!ok || !T.next(d)) d.kind = kTileAbort;
        ts->d = d;
      }
      ps->prod_kind = d.kind;
    }
    named_sync(kBarProducer, Config::kProducerThreads);
    const int kind = ps->prod_kind;
    if (kind < kTileGemm0) {
      if (pt == 0 && kind != kTileLost) mbar_arrive(&ps->slot_full[slot]);
      return ok && kind == kTileEnd;
    }
    const TileDesc d = ts->d;
    T.prepare(d, *ts);
    named_sync(kBarProducer, Config::kProducerThreads);  // the slot's pair ids are complete (and prod_kind read)
    if (pt == 0) mbar_arrive(&ps->slot_full[slot]);
    // A: chunk c = pt + 128 i of the 128 x 8 chunks of a stage, i.e. row c / 8, 16-byte chunk c % 8
    const bf16* a_row[Config::kAChunks];
    const int nrows = d.b.num_rows;
#pragma unroll
    for (int i = 0; i < Config::kAChunks; ++i) {
      const int m = (pt + Config::kProducerThreads * i) >> 3;
      a_row[i] = T.a_row(d, *ts, m < nrows ? m : 0);  // row 0 always exists: a valid address for zero-fill
    }
    const void* b_map;
    int by[2], bz[2];
    T.b_boxes(d, &b_map, by, bz);
    // FP8: producer thread pt copies row pt's scale (a padding row: row 0's, any positive value; its A is zeros),
    // thread 0 also the weights' two
    const float* a_sc = nullptr;
    const float* b_sc[2] = {nullptr, nullptr};
    if constexpr (Tiles::kF8) {
      static_assert(Config::kProducerThreads == Config::kBlockM, "one producer thread per row's scale");
      a_sc = T.a_scales(d, *ts, pt < nrows ? pt : 0);
      b_sc[0] = T.b_scales(d, 0);
      b_sc[1] = T.b_scales(d, 1);
    }
    for (int k = 0; k < d.num_k; ++k, ++it) {
      const int st = static_cast<int>(it % Config::kStages);
      const uint32_t use = it / Config::kStages;
      if (use > 0 && !mbar_wait(p, &ps->empty[st], (use - 1) & 1u, st, k)) ok = false;
      const uint32_t sa = smem_u32(pipe_stage(smem, st));
#pragma unroll
      for (int i = 0; i < Config::kAChunks; ++i) {
        const int c = pt + Config::kProducerThreads * i, m = c >> 3, chunk = c & 7;
        cp_async_16(sa + swz(m, chunk), a_row[i] + k * Config::kBlockK + chunk * 8, m < nrows);
      }
      if constexpr (Tiles::kF8) {
        cp_async_4(smem_u32(&ps->a_scale[st][pt]), a_sc + k);
        if (pt < 2) cp_async_4(smem_u32(&ps->b_scale[st][pt]), b_sc[pt] + k);
      }
      mbar_arrive_cp_async(&ps->full[st]);
      if (pt == 0) {
        mbar_arrive_expect_tx(&ps->full[st], Config::kSmemB);
#pragma unroll
        for (int i = 0; i < 2; ++i)
          tma_load_3d(sa + Config::kSmemA + i * Config::kBoxRows * 128, b_map, &ps->full[st], k * Config::kBlockK,
                      by[i], bz[i]);
      }
    }
  }
}

// The MMA form of a tile, chosen once per tile because a branch between forms inside one k loop made ptxas serialise
// every wgmma (C7511). A block of at most 64 rows (is_half_tile) skips the MMAs of its padding rows in one of two forms:
// - the split form (Tiles::kHalf): k_loop(std::true_type), a second copy of the k loop in which both warpgroups
//   compute rows [0, 64), half of the columns each (wgmma.cuh mma_stage_half);
// - the idle form (Tiles::kIdleHalf): the first warpgroup runs the full tile's loop on its 64 rows and the second,
//   whose rows are all padding, runs idle_loop (no wgmma). The branch is on the warpgroup and the tile, both uniform
//   over a warpgroup, so ptxas keeps the wgmma pipeline; it costs fewer registers than a second MMA loop (the split
//   form serialised the kernel with the shared expert's code), but one warpgroup alone cannot cover the FP8 loop's
//   wait for each step's MMAs (docs/kernel.md "Half tiles with the shared expert").
// Everything else: k_loop(std::false_type).
template <typename Tiles, typename Loop, typename Idle>
__device__ __forceinline__ void with_mma_form(const TileDesc& d, Loop& k_loop, Idle& idle_loop, int cw) {
  if constexpr (Tiles::kIdleHalf) {
    if (is_half_tile(d.b.num_rows) && cw == 1) {
      idle_loop();
    } else {
      k_loop(std::false_type{});
    }
  } else if constexpr (Tiles::kHalf) {
    if (is_half_tile(d.b.num_rows)) {
      k_loop(std::true_type{});
    } else {
      k_loop(std::false_type{});
    }
  } else {
    k_loop(std::false_type{});
  }
}

// Consumer warpgroups: MMAs and epilogues. Writes the ring / slot positions back. Returns false on an error.
template <typename Tiles>
__device__ __forceinline__ bool consume_tiles(const Params& p, uint8_t* smem, Tiles& T, uint32_t it, uint32_t tiles) {
  PipeState* ps = pipe_state(smem);
  const int ct = threadIdx.x - Config::kProducerThreads, cw = ct / 128;
  const bool leader = ct == 0;
  const uint32_t smem_base = smem_u32(smem);
  bool ok = true;
  auto release = [&](uint32_t i) {  // this warpgroup retired the MMAs that read ring position i
    named_sync(kBarConsumerWg0 + cw, 128);
    if (ct % 128 == 0) mbar_arrive(&ps->empty[i % Config::kStages]);
  };
  for (;; ++tiles) {
    const int slot = static_cast<int>(tiles % Config::kSlots);
    TileSlot* ts = tile_slot(smem, slot);
    const uint64_t t_wait = leader ? T.now() : 0;
    if (leader)
      ps->cons_kind = mbar_wait(p, &ps->slot_full[slot], (tiles / Config::kSlots) & 1u, 200 + slot,
                                static_cast<int>(tiles))
                          ? ts->d.kind
                          : static_cast<int>(kTileLost);
    named_sync(kBarConsumers, Config::kConsumerThreads);
    const int kind = ps->cons_kind;
    if (kind < kTileGemm0) {
      if (leader && kind != kTileLost) mbar_arrive(&ps->slot_empty[slot]);
      if (kind != kTileLost) ++tiles;
      ok = ok && kind == kTileEnd;
      break;
    }
    const TileDesc& d = ts->d;  // read where used: a copy would hold 11 registers through the MMAs
    const int num_k = d.num_k;
    const uint64_t t_start = leader ? T.now() : 0;
    TileAcc acc;
#pragma unroll
    for (int i = 0; i < Config::kBlockN / 2; ++i) acc.d[i] = 0.f;
    // The idle form's second warpgroup (Tiles::kIdleHalf, with_mma_form): its rows are all padding, so it takes each
    // stage and hands it back without MMAs, one step behind as bf16's k loop does (the last stays for the epilogue);
    // its accumulators stay 0 and the epilogue stores none of its rows.
    auto idle_loop = [&] {
      for (int k = 0; k < num_k; ++k, ++it) {
        const int st = static_cast<int>(it % Config::kStages);
        if (!mbar_wait(p, &ps->full[st], (it / Config::kStages) & 1u, st, k)) ok = false;
        if (k > 0) release(it - 1);
      }
    };
    if constexpr (Tiles::kF8) {
      // FP8: 128 of K per step, block scales by rescaling the accumulators (wgmma.cuh scale_acc), so each step
      // waits for the previous one's MMAs (the other warpgroup's run meanwhile). q: the accumulators' units.
      // The stage's scales come with it (the producers' cp.async, counted on the full barrier). A half tile
      // (mma_stage_half_e4m3) has both warpgroups on rows [0, 64): their rows' scales are those rows'.
      float q[4] = {1.f, 1.f, 1.f, 1.f};
      auto k_loop = [&](auto half) {
        const int m0 = acc_row(0) - (decltype(half)::value ? 64 * cw : 0);
        for (int k = 0; k < num_k; ++k, ++it) {
          const int st = static_cast<int>(it % Config::kStages);
          if (!mbar_wait(p, &ps->full[st], (it / Config::kStages) & 1u, st, k)) ok = false;
          fence_proxy_async_smem();
          float f[4];
          {
            const float a0 = ps->a_scale[st][m0], a1 = ps->a_scale[st][m0 + 8];
            const float b0 = ps->b_scale[st][0], b1 = ps->b_scale[st][1];
            const float nq[4] = {a0 * b0, a1 * b0, a0 * b1, a1 * b1};
#pragma unroll
            for (int j = 0; j < 4; ++j) {
              f[j] = __fdividef(q[j], nq[j]);  // no IEEE slow path: its branch would serialise the wgmmas
              q[j] = nq[j];
            }
          }
          const uint32_t stage = smem_base + st * Config::kSmemStage;
          scale_acc<decltype(half)::value>(acc, f);
          if constexpr (decltype(half)::value)
            mma_stage_half_e4m3(acc, stage, stage + Config::kSmemA + cw * 64 * 128);
          else
            mma_stage_e4m3(acc, stage + cw * 64 * 128, stage + Config::kSmemA);
          wgmma_wait<0>();
          // (a half tile's accumulators pinned here: without it ptxas serialised every wgmma of the FP8 kernel,
          // C7511; the full tile's loop is left as it was)
          if constexpr (decltype(half)::value) fence_acc(acc);
          // This step's MMAs are done and its scales were read before them: its stage goes back at once (all 4
          // stages can then be loading while the consumers wait for the next), except the tile's last, kept for
          // the epilogue.
          if (k + 1 < num_k) release(it);
        }
      };
      with_mma_form<Tiles>(d, k_loop, idle_loop, cw);
      fence_acc(acc);
      scale_acc(acc, q);  // into the product's own units
    } else {
      // A block of at most 64 rows: half the MMAs (wgmma.cuh), in a copy of the k loop of its own (with_mma_form).
      auto k_loop = [&](auto half) {
        for (int k = 0; k < num_k; ++k, ++it) {
          const int st = static_cast<int>(it % Config::kStages);
          if (!mbar_wait(p, &ps->full[st], (it / Config::kStages) & 1u, st, k)) ok = false;
          fence_proxy_async_smem();  // A was written by cp.async (generic proxy); wgmma reads through the async proxy
          const uint32_t stage = smem_base + st * Config::kSmemStage;
          if constexpr (decltype(half)::value)  // both warpgroups read A rows [0, 64), each its own 64 + 64 B rows
            mma_stage_half(acc, stage, stage + Config::kSmemA + cw * 64 * 128);
          else
            mma_stage(acc, stage + cw * 64 * 128, stage + Config::kSmemA);
          wgmma_wait<1>();  // the MMAs of step k - 1 retired; those of step k keep running
          if (k > 0) release(it - 1);
        }
      };
      with_mma_form<Tiles>(d, k_loop, idle_loop, cw);
      wgmma_wait<0>();
      fence_acc(acc);
    }
    // The tile's last stage stays with the consumers: once both warpgroups' MMAs are done with it, the epilogue
    // stages the outputs there, while the producer fills the other stages with the next tile; then it goes back.
    uint8_t* staging = pipe_stage(smem, static_cast<int>((it - 1) % Config::kStages));
    fence_proxy_async_smem();  // the MMAs read it through the async proxy; the staging writes are generic
    named_sync(kBarConsumers, Config::kConsumerThreads);
    T.epilogue(d, *ts, acc, staging);  // ends with a consumer barrier: the tile's outputs are all written
    fence_proxy_async_smem();  // the staging accesses before the producer's next (async-proxy) writes there
    release(it - 1);
    if (leader) {
      T.tile_done(d, t_wait, t_start);
      mbar_arrive(&ps->slot_empty[slot]);
    }
  }
  if (leader) {
    ps->it = it;
    ps->tiles = tiles;
  }
  return ok;
}

// All threads: run tiles until Tiles::next has none left. true if no error was raised on the way.
template <typename Tiles>
__device__ __forceinline__ bool run_tiles(const Params& p, uint8_t* smem, Tiles& T) {
  PipeState* ps = pipe_state(smem);
  __syncthreads();  // the previous call's positions were written back
  const uint32_t it = ps->it, tiles = ps->tiles;
  __syncthreads();  // everyone read them before the consumers' leader overwrites them
  const bool ok = threadIdx.x < Config::kProducerThreads ? produce_tiles(p, smem, T, it, tiles)
                                                         : consume_tiles(p, smem, T, it, tiles);
  return cta_all(ok);
}

}  // namespace weave

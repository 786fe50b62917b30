// Calibration microbenchmark kernels (python -m weave_kernel.calibrate): the megakernel's own pieces timed in
// isolation, so that weave-sim's hardware profile describes this kernel rather than cuBLAS or a copy engine.
//   calib_push_kernel    dispatch-style row pushes into peers' symmetric buffers (copy_rows + block flag, or bulk
//                        copies through the operand stages when sync.dispatch_bulk, as the megakernel's dispatch)
//   calib_gemm_kernel    expert-grouped GEMM of the megakernel's tiles (run_tiles) claimed from an atomic ticket,
//                        optionally in K chunks separated by the kernel's grid barrier
//   calib_claim_kernel   ticket claims, all CTAs at once
//   calib_signal_kernel  release/acquire flag ping-pong (cross-GPU or within one GPU)
// Framework-free: raw pointers only; arguments in calib_params.h.
#pragma once
#include <cstdint>

#include "calib_params.h"
#include "config.cuh"
#include "gemm.cuh"
#include "sync.cuh"
#include "tasks.cuh"

namespace weave {
namespace calib {

// A CTA-wide ticket claim: thread 0 takes the ticket, two barriers share it with the CTA. This is how the
// 256-thread megakernel claimed until 01d1c29; the warp-specialised one claims with its producer thread alone
// and hands the tile over through a slot (pipeline.cuh), so task_claim_ns is now an upper bound of its claim.
__device__ __forceinline__ int claim(int* s_ticket, uint32_t* counter) {
  __syncthreads();
  if (threadIdx.x == 0) *s_ticket = static_cast<int>(atomicAdd(counter, 1u));
  __syncthreads();
  return *s_ticket;
}

__device__ __forceinline__ uint8_t* aligned_smem(uint8_t* raw) {
  return raw + ((1024u - (smem_u32(raw) & 1023u)) & 1023u);  // SW128 tiles need 1024-byte aligned bases
}

// Every CTA waits until every rank's CTA 0 posted `epoch` into this rank's start flags (CTA 0 posts first, so no
// CTA waits on a CTA of its own grid). Call from all threads.
__device__ __forceinline__ bool meet_ranks(const CalibPushArgs& a) {
  const Params& p = a.sync;
  if (blockIdx.x == 0 && threadIdx.x == 0)
    for (int g = 0; g < a.world; ++g) st_release_sys_u64(sym<uint64_t>(p, g, a.off_start_flag) + a.rank, a.epoch);
  bool ok = true;
  if (threadIdx.x == 0) {
    for (int g = 0; g < a.world && ok; ++g) {
      const uint64_t* f = sym<const uint64_t>(p, a.rank, a.off_start_flag) + g;
      ok = spin_until(p, [&] { return ld_acquire_sys_u64(f) >= a.epoch; }, kErrTimeoutCounts, g, 0);
    }
  }
  return cta_all(ok);
}

// The calibration GEMM's tiles for run_tiles (pipeline.cuh): C[e] = A[e] B[e]^T per expert, expert-major, column
// block, then row block (the megakernel's order), claimed from chunk ch's ticket; stored to C instead of pushed.
struct CalibTiles {
  static constexpr bool kF8 = false;  // bf16 tiles (pipeline.cuh)
  static constexpr bool kHalf = true;  // blocks of <= 64 rows as half tiles, the split form (pipeline.cuh)
  static constexpr bool kIdleHalf = false;
  const CalibGemmArgs& a;
  uint32_t* ticket;
  int rb0, nrb, per_expert, total;

  __device__ __forceinline__ bool next(TileDesc& d) {
    const int t = static_cast<int>(atomicAdd(ticket, 1u));
    if (t >= total) {
      d.kind = kTileEnd;
      return true;
    }
    const int off = t % per_expert;
    d.kind = kTileGemm1;
    d.col = off / nrb;
    d.num_k = a.k / Config::kBlockK;
    d.b.le = t / per_expert;
    d.b.row0 = (rb0 + off % nrb) * Config::kBlockM;
    d.b.num_rows = min(Config::kBlockM, a.rows_per_expert - d.b.row0);
    return true;
  }
  __device__ __forceinline__ void prepare(const TileDesc&, TileSlot&) {}
  __device__ __forceinline__ const bf16* a_row(const TileDesc& d, const TileSlot&, int m) const {
    return reinterpret_cast<const bf16*>(a.a) +
           (static_cast<int64_t>(d.b.le) * a.rows_per_expert + d.b.row0 + m) * a.k;
  }
  __device__ __forceinline__ void b_boxes(const TileDesc& d, const void** map, int* y, int* z) const {
    *map = &a.tmap_b;
    y[0] = d.col * Config::kBlockN;
    y[1] = y[0] + Config::kBoxRows;
    z[0] = z[1] = d.b.le;
  }
  __device__ __forceinline__ void epilogue(const TileDesc& d, const TileSlot&, const TileAcc& acc, uint8_t* staging) const {
    const int N = a.n;
    bf16* c = reinterpret_cast<bf16*>(a.c) + (static_cast<int64_t>(d.b.le) * a.rows_per_expert + d.b.row0) * N;
    store_tile_plain(acc, staging, d.b.num_rows, d.col * Config::kBlockN, N, is_half_tile(d.b.num_rows),
                     [&](int m, int col) { return c + static_cast<int64_t>(m) * N + col; });
  }
  __device__ __forceinline__ void tile_done(const TileDesc&, uint64_t, uint64_t) const {}
  __device__ __forceinline__ uint64_t now() const { return 0; }
};

}  // namespace calib

__global__ void __launch_bounds__(Config::kThreads, 1) calib_push_kernel(const __grid_constant__ CalibPushArgs a) {
  extern __shared__ __align__(1024) uint8_t smem_raw[];
  __shared__ BulkRing ring;
  uint8_t* smem = calib::aligned_smem(smem_raw);
  if (threadIdx.x == 0) {
    bulk_ring_init(ring);
    mbar_init_fence();
  }
  __syncthreads();
  if (!calib::meet_ranks(a)) return;
  const Params& p = a.sync;
  const uint64_t t0 = globaltimer_ns();
  const int4* src = reinterpret_cast<const int4*>(a.src);
  const int rc = a.row_chunks;
  for (int b = blockIdx.x; b < a.num_blocks; b += gridDim.x) {
    const int dst = (a.rank + 1 + b % a.num_peers) % a.world, j = b / a.num_peers;
    int4* recv = sym<int4>(p, dst, a.off_dst + a.rank * a.slot_bytes);
    const int64_t s0 = static_cast<int64_t>(b) * a.block_rows, d0 = static_cast<int64_t>(j) * a.block_rows;
    auto src_row = [&](int m) { return src + (s0 + m) * rc; };
    auto dst_row = [&](int m) { return recv + (d0 + m) * rc; };
    if (p.dispatch_bulk) {
      if (!bulk_copy_rows_cta(p, ring, smem, a.block_rows, rc * 16, src_row, dst_row)) return;
    } else {
      copy_rows(a.block_rows, rc, src_row, dst_row);
      __syncthreads();
    }
    if (threadIdx.x == 0) {  // as dispatch_block: the block's rows are visible before its flag
      __threadfence_system();
      st_release_sys_u64(sym<uint64_t>(p, dst, a.off_blk_flag) + a.rank * kCalibMaxBlocks + j, a.epoch);
    }
  }
  if (threadIdx.x == 0) {
    a.times[2 * blockIdx.x] = t0;
    a.times[2 * blockIdx.x + 1] = globaltimer_ns();
  }
}

__global__ void __launch_bounds__(Config::kThreads, 1) calib_gemm_kernel(const __grid_constant__ CalibGemmArgs a) {
  extern __shared__ __align__(1024) uint8_t smem_raw[];
  uint8_t* smem = calib::aligned_smem(smem_raw);
  init_pipeline(smem);
  __syncthreads();
  const int nb = ceil_div(a.n, Config::kBlockN), rb_all = ceil_div(a.rows_per_expert, Config::kBlockM);
  for (int ch = 0; ch < a.num_chunks; ++ch) {
    // chunk ch: row blocks [rb0, rb1) of every expert
    const int rb0 = ch * rb_all / a.num_chunks, nrb = (ch + 1) * rb_all / a.num_chunks - rb0;
    calib::CalibTiles tiles{a, a.tickets + ch, rb0, nrb, nrb * nb, a.num_experts * nrb * nb};
    if (!run_tiles(a.sync, smem, tiles)) return;
    if (ch + 1 < a.num_chunks && !grid_barrier(a.sync, ch)) return;
  }
}

__global__ void __launch_bounds__(Config::kThreads, 1) calib_claim_kernel(const __grid_constant__ CalibClaimArgs a) {
  __shared__ int s_ticket;
  const uint64_t t0 = globaltimer_ns();
  int n = 1;  // the last, failed claim costs the same
  while (calib::claim(&s_ticket, a.counter) < a.total_tickets) ++n;
  if (threadIdx.x == 0) {
    a.times[2 * blockIdx.x] = t0;
    a.times[2 * blockIdx.x + 1] = globaltimer_ns();
    a.claims[blockIdx.x] = n;
  }
}

// One warp per CTA; thread 0 plays the role (the kernel's flags are set and polled by one thread too).
__global__ void calib_signal_kernel(const __grid_constant__ CalibSignalArgs a) {
  if (threadIdx.x != 0) return;
  const Params& p = a.sync;
  const int role = a.role0 + static_cast<int>(blockIdx.x);
  const uint64_t* wait = a.wait[blockIdx.x];
  uint64_t* post = a.post[blockIdx.x];
  uint64_t t0 = 0;
  for (int r = 1; r <= a.rounds; ++r) {
    const uint64_t v = a.base + static_cast<uint64_t>(r);
    if (role == 0 && r == a.warmup + 1) t0 = globaltimer_ns();
    if (role == 0) st_release_sys_u64(post, v);
    if (!spin_until(p, [&] { return ld_acquire_sys_u64(wait) >= v; }, kErrTimeoutRows, r, role)) return;
    if (role == 1) st_release_sys_u64(post, v);
  }
  if (role == 0) {
    a.times[0] = t0;
    a.times[1] = globaltimer_ns();
  }
}

}  // namespace weave

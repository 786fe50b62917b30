// Row copies by the copy engine (cp.async.bulk), the dispatch's alternative to copy_rows (tasks.cuh).
//
// copy_rows keeps what 384 threads x kCopyUnroll 16-byte loads hold in flight (24 KB) per CTA, so a comm CTA's
// push rate is bound by that over the round trip (about 20 GB/s per CTA over NVLink, docs/kernel.md). Here one
// thread streams the rows through the CTA's idle operand stages (a dispatching CTA runs no GEMM tile yet): slots
// of one row each (192 KB of them), each filled by a bulk load (global -> shared, completing the slot's mbarrier)
// and drained by a bulk store (shared -> global, the owner's receive buffer, local or a peer's); a slot is refilled
// once its store has read it, while kLag later stores may still be reading theirs. So most of 192 KB of loads and
// kLag stores are in flight per CTA, without registers.
//
// Ordering: the stores are async-proxy writes. Before the caller publishes them (fence + release of a flag, in
// the generic proxy) every bulk group is waited for (cp.async.bulk.wait_group 0: the writes are complete) and a
// proxy fence orders them before the thread's later generic operations; the same fence orders the last reads
// of the slots before whatever the CTA writes there next (the GEMM pipeline). Framework-free.
#pragma once
#include <cstdint>

#include "config.cuh"
#include "params.h"
#include "sync.cuh"
#include "tma.cuh"

namespace weave {

struct BulkRing {
  static constexpr int kMaxSlotBytes = 16384;  // longer rows go in pieces of this size
  static constexpr int kMaxSlots = 48;         // over all issuers
  static constexpr int kMaxIssuers = kMaxDispatchIssuers;  // lane 0 of warps [0, issuers) issue, each its share
  uint64_t bar[kMaxSlots];                     // one arrival (the issuing thread's expect_tx) + the load's bytes
  uint64_t phase[kMaxIssuers];                 // per issuer, bit i: parity of its slot i's next completion
};
static_assert(BulkRing::kMaxSlots <= 64, "phase bits");
static_assert(BulkRing::kMaxIssuers == Config::kWarps, "one issuer per warp at most (params.h kMaxDispatchIssuers)");
static_assert(Config::kSmemPipe / BulkRing::kMaxIssuers >= BulkRing::kMaxSlotBytes, "every issuer has a slot");
static_assert(BulkRing::kMaxSlotBytes % 128 == 0, "slot alignment");

// Thread 0, before the kernel's mbar_init_fence (init_pipeline issues it).
__device__ __forceinline__ void bulk_ring_init(BulkRing& r) {
  for (int i = 0; i < BulkRing::kMaxSlots; ++i) mbar_init(&r.bar[i], 1);
  for (int i = 0; i < BulkRing::kMaxIssuers; ++i) r.phase[i] = 0;
}

__device__ __forceinline__ void bulk_load(uint32_t dst_smem, const void* src, uint32_t bytes, uint64_t* bar) {
  asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];" ::"r"(dst_smem),
               "l"(src), "r"(bytes), "r"(smem_u32(bar))
               : "memory");
}

__device__ __forceinline__ void bulk_store(void* dst, uint32_t src_smem, uint32_t bytes) {
  asm volatile("cp.async.bulk.global.shared::cta.bulk_group [%0], [%1], %2;" ::"l"(dst), "r"(src_smem), "r"(bytes)
               : "memory");
}

__device__ __forceinline__ void bulk_commit() { asm volatile("cp.async.bulk.commit_group;" ::: "memory"); }

// Until at most N of this thread's bulk groups still read shared memory.
template <int N>
__device__ __forceinline__ void bulk_wait_read() {
  asm volatile("cp.async.bulk.wait_group.read %0;" ::"n"(N) : "memory");
}
__device__ __forceinline__ void bulk_wait_read(int n) {  // n clamped to [0, 7]
  switch (n <= 0 ? 0 : (n >= 7 ? 7 : n)) {
    case 0: bulk_wait_read<0>(); break;
    case 1: bulk_wait_read<1>(); break;
    case 2: bulk_wait_read<2>(); break;
    case 3: bulk_wait_read<3>(); break;
    case 4: bulk_wait_read<4>(); break;
    case 5: bulk_wait_read<5>(); break;
    case 6: bulk_wait_read<6>(); break;
    default: bulk_wait_read<7>(); break;
  }
}

// Generic-proxy writes to global memory (this thread's, and those made visible to it) before this thread's later
// async-proxy accesses there: FP8's x_q, written by quantize_x in this launch and read by the dispatch's bulk loads.
__device__ __forceinline__ void fence_proxy_async_global() {
  asm volatile("fence.proxy.async.global;" ::: "memory");
}

// Until every bulk group of this thread is complete (its writes done), then order them before this thread's
// later generic-proxy operations.
__device__ __forceinline__ void bulk_wait_all() {
  asm volatile("cp.async.bulk.wait_group 0;" ::: "memory");
  asm volatile("fence.proxy.async;" ::: "memory");
}

// Issuer w of W (lane 0 of warp w; W <= kMaxIssuers): copy rows m = w, w + W, ... < num_rows of row_bytes bytes
// (a multiple of 16, 16-byte aligned) from src_row(m) to dst_row(m) through its share of the ring at `smem`
// (Config::kSmemPipe / W bytes, 128-byte aligned): slots of one row (128-byte aligned; rows longer than
// kMaxSlotBytes in pieces of that size), as many as fit (at most kMaxSlots / W), a slot refilled once the store
// lag = slots / 2 pieces back has read it. Returns with every write of this issuer complete (bulk_wait_all). False
// if a load never landed (kErrTimeoutTma raised, detail -1 and the piece's index); the ring's parities are then
// stale, which is harmless: an error ends the launch, and every launch initialises the ring afresh.
template <typename SrcRow, typename DstRow>
__device__ __forceinline__ bool bulk_copy_rows(const Params& p, BulkRing& r, uint8_t* smem, int num_rows,
                                               int row_bytes, SrcRow src_row, DstRow dst_row, int w, int W) {
  constexpr int PB = BulkRing::kMaxSlotBytes;
  const int per_row = (row_bytes + PB - 1) / PB;
  const int slot_bytes = (min(row_bytes, PB) + 127) / 128 * 128;
  const int region = Config::kSmemPipe / W / 128 * 128;
  const int S = max(1, min(BulkRing::kMaxSlots / W, region / slot_bytes));
  const int L = S / 2;
  const int n = (num_rows > w ? (num_rows - w + W - 1) / W : 0) * per_row;  // this issuer's pieces
  const uint32_t base = smem_u32(smem) + w * region;
  uint64_t* bar = r.bar + w * (BulkRing::kMaxSlots / W);
  uint64_t phase = r.phase[w];
  auto piece = [&](int u, int& m, int& off) -> uint32_t {
    const int j = u / per_row;
    m = w + j * W;
    off = (u - j * per_row) * PB;
    return static_cast<uint32_t>(min(PB, row_bytes - off));
  };
  auto load = [&](int u) {
    int m, off;
    const uint32_t bytes = piece(u, m, off);
    const int slot = u % S;
    mbar_arrive_expect_tx(&bar[slot], bytes);
    bulk_load(base + slot * slot_bytes, reinterpret_cast<const uint8_t*>(src_row(m)) + off, bytes, &bar[slot]);
  };
  fence_proxy_async_global();  // rows written in this launch (FP8's x_q) before the loads read them
  for (int u = 0; u < min(S, n); ++u) load(u);
  bool ok = true;
  for (int u = 0; u < n; ++u) {
    const int slot = u % S;
    if (ok) ok = mbar_wait(p, &bar[slot], static_cast<uint32_t>(phase >> slot) & 1u, -1, u);
    phase ^= 1ull << slot;
    int m, off;
    const uint32_t bytes = piece(u, m, off);
    if (ok) bulk_store(reinterpret_cast<uint8_t*>(dst_row(m)) + off, base + slot * slot_bytes, bytes);
    bulk_commit();
    const int v = u - L;  // the store L pieces back has read its slot: refill the slot with piece v + S
    if (ok && v >= 0 && v + S < n) {
      bulk_wait_read(L);
      load(v + S);
    }
  }
  r.phase[w] = phase;
  bulk_wait_all();
  return ok;
}

// The CTA's issuers (params' dispatch_bulk = W warps): every thread calls; returns whether all issuers succeeded,
// after a CTA barrier (so the caller's thread 0 can publish the rows).
template <typename SrcRow, typename DstRow>
__device__ __noinline__ bool bulk_copy_rows_cta(const Params& p, BulkRing& r, uint8_t* smem, int num_rows,
                                                   int row_bytes, SrcRow src_row, DstRow dst_row) {
  const int W = max(1, min(static_cast<int>(p.dispatch_bulk), BulkRing::kMaxIssuers));
  const int warp = static_cast<int>(threadIdx.x) / 32;
  bool ok = true;
  if (warp < W && (threadIdx.x & 31) == 0) ok = bulk_copy_rows(p, r, smem, num_rows, row_bytes, src_row, dst_row, warp, W);
  return cta_all(ok);
}

}  // namespace weave

// Tensor Memory Accelerator (TMA) loads of the weight tiles and the mbarriers they complete. Framework-free.
//
// The expert weights are contiguous, so one thread per CTA loads a GEMM tile's B operand (256 weight rows x
// 64 k = 32 KB per k-step) with two cp.async.bulk.tensor boxes instead of 2048 16-byte cp.async issued by all
// threads; the boxes land in the same 128-byte-swizzled layout the wgmma descriptors read. Every pipeline stage
// has a "full" mbarrier: the issuing thread arms it with the stage's byte count, the copy engine completes it,
// and every thread waits on its phase parity before the stage's MMAs. The tensor maps (host side: tma_host.h)
// travel inside the kernel's __grid_constant__ arguments.
#pragma once
#include <cstdint>

#include "config.cuh"
#include "params.h"
#include "sync.cuh"

namespace weave {

// Shared-memory window address of a generic pointer to shared memory (what PTX's .shared operands take).
__device__ __forceinline__ uint32_t smem_u32(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

__device__ __forceinline__ void mbar_init(uint64_t* bar, uint32_t count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" ::"r"(smem_u32(bar)), "r"(count) : "memory");
}

// After the initialisations: make them visible to the async proxy (the copy engine completes the barriers).
__device__ __forceinline__ void mbar_init_fence() {
  asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
  asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
}

// One arrival (release semantics at CTA scope: this thread's earlier writes are visible to the waiters).
__device__ __forceinline__ void mbar_arrive(uint64_t* bar) {
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];" ::"r"(smem_u32(bar)) : "memory");
}

// One arrival once every cp.async this thread issued so far has landed (counted in the barrier's init count).
__device__ __forceinline__ void mbar_arrive_cp_async(uint64_t* bar) {
  asm volatile("cp.async.mbarrier.arrive.noinc.shared::cta.b64 [%0];" ::"r"(smem_u32(bar)) : "memory");
}

__device__ __forceinline__ void mbar_arrive_expect_tx(uint64_t* bar, uint32_t bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(smem_u32(bar)), "r"(bytes)
               : "memory");
}

// kCluster: acquire at cluster scope (a barrier that a peer CTA of the cluster arrives on); else CTA scope.
template <bool kCluster = false>
__device__ __forceinline__ bool mbar_try_wait(uint64_t* bar, uint32_t parity) {
  uint32_t done;
  if constexpr (kCluster)
    asm volatile(
        "{\n.reg .pred p;\nmbarrier.try_wait.parity.acquire.cluster.shared::cta.b64 p, [%1], %2;\n"
        "selp.u32 %0, 1, 0, p;\n}\n"
        : "=r"(done)
        : "r"(smem_u32(bar)), "r"(parity)
        : "memory");
  else
    asm volatile(
        "{\n.reg .pred p;\nmbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\nselp.u32 %0, 1, 0, p;\n}\n"
        : "=r"(done)
        : "r"(smem_u32(bar)), "r"(parity)
        : "memory");
  return done != 0;
}

// Wait until the barrier completed the phase of `parity`. Returns false instead of hanging: a completion that
// never comes (a faulting tensor map, which the launcher rules out, or a pipeline partner that stopped after an
// error) raises kErrTimeoutTma once the deadline passed, and an error raised anywhere else ends the wait early.
template <bool kCluster = false>
__device__ __forceinline__ bool mbar_wait(const Params& p, uint64_t* bar, uint32_t parity, int32_t d0, int32_t d1) {
  if (mbar_try_wait<kCluster>(bar, parity)) return true;
  const uint64_t deadline = globaltimer_ns() + p.timeout_ns;
  for (uint32_t n = 1;; ++n) {
    if (mbar_try_wait<kCluster>(bar, parity)) return true;
    if ((n & 63) == 0) {
      if (ld_volatile_i32(p.err) != 0) return false;
      if (globaltimer_ns() > deadline) {
        raise_error(p, kErrTimeoutTma, d0, d1);
        return false;
      }
    }
  }
}

// One box of a 3-D tensor map (x = k, y = row, z = expert or expert half) into smem, completing `bar`.
__device__ __forceinline__ void tma_load_3d(uint32_t dst, const void* map, uint64_t* bar, int x, int y, int z) {
  asm volatile(
      "cp.async.bulk.tensor.3d.shared::cluster.global.tile.mbarrier::complete_tx::bytes [%0], [%1, {%3, %4, %5}], "
      "[%2];" ::"r"(dst),
      "l"(reinterpret_cast<uint64_t>(map)), "r"(smem_u32(bar)), "r"(x), "r"(y), "r"(z)
      : "memory");
}

}  // namespace weave

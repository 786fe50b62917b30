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

// Lives right after the pipeline stages in dynamic shared memory (Config::kSmemBarOffset).
struct PipeBarriers {
  uint64_t full[Config::kStages];  // completed once per use of the stage: 32 KB of B landed
  uint32_t phase;                  // bit s: parity of stage s's next completion (thread 0 writes it back)
};
static_assert(sizeof(PipeBarriers) <= Config::kSmemBarBytes, "PipeBarriers must fit its smem slot");

__device__ __forceinline__ PipeBarriers* pipe_barriers(uint8_t* smem) {
  return reinterpret_cast<PipeBarriers*>(smem + Config::kSmemBarOffset);
}

// Shared-memory window address of a generic pointer to shared memory (what PTX's .shared operands take).
__device__ __forceinline__ uint32_t smem_u32(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

// Thread 0 once per launch, before any tile; the caller follows with __syncthreads.
__device__ __forceinline__ void init_pipe_barriers(uint8_t* smem) {
  if (threadIdx.x != 0) return;
  PipeBarriers* b = pipe_barriers(smem);
#pragma unroll
  for (int s = 0; s < Config::kStages; ++s)
    asm volatile("mbarrier.init.shared::cta.b64 [%0], 1;" ::"r"(smem_u32(&b->full[s])) : "memory");
  b->phase = 0;
  // make the initialised barriers visible to the async proxy (the copy engine completes them)
  asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
  asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
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

// Every thread: wait until the barrier completed the phase of `parity`. A copy that never lands (it would take
// a faulting tensor map, which the launcher rules out) raises kErrTimeoutTma instead of hanging.
template <bool kCluster = false>
__device__ __forceinline__ void mbar_wait(const Params& p, uint64_t* bar, uint32_t parity, int32_t d0, int32_t d1) {
  if (mbar_try_wait<kCluster>(bar, parity)) return;
  const uint64_t deadline = globaltimer_ns() + p.timeout_ns;
  for (uint32_t n = 1;; ++n) {
    if (mbar_try_wait<kCluster>(bar, parity)) return;
    if ((n & 63) == 0 && globaltimer_ns() > deadline) {
      raise_error(p, kErrTimeoutTma, d0, d1);
      return;  // the stage's contents are garbage; the host sees the error and discards the call
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

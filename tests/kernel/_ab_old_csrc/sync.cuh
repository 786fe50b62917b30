// Ordering and signalling primitives: release/acquire at system scope for cross-GPU flags, GPU scope for
// on-chip counters, %globaltimer deadlines on every spin, a timeout-aware grid barrier. Framework-free.
#pragma once
#include <cstdint>

#include "config.cuh"

namespace weave {

__device__ __forceinline__ uint64_t globaltimer_ns() {
  uint64_t t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}

__device__ __forceinline__ uint32_t smid() {
  uint32_t s;
  asm volatile("mov.u32 %0, %%smid;" : "=r"(s));
  return s;
}

__device__ __forceinline__ uint64_t ld_acquire_sys_u64(const uint64_t* p) {
  uint64_t v;
  asm volatile("ld.acquire.sys.global.u64 %0, [%1];" : "=l"(v) : "l"(p) : "memory");
  return v;
}

__device__ __forceinline__ void st_release_sys_u64(uint64_t* p, uint64_t v) {
  asm volatile("st.release.sys.global.u64 [%0], %1;" ::"l"(p), "l"(v) : "memory");
}

__device__ __forceinline__ uint32_t ld_acquire_gpu_u32(const uint32_t* p) {
  uint32_t v;
  asm volatile("ld.acquire.gpu.global.u32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
  return v;
}

__device__ __forceinline__ void st_release_gpu_u32(uint32_t* p, uint32_t v) {
  asm volatile("st.release.gpu.global.u32 [%0], %1;" ::"l"(p), "r"(v) : "memory");
}

__device__ __forceinline__ void red_release_gpu_add_u32(uint32_t* p, uint32_t v) {
  asm volatile("red.release.gpu.global.add.u32 [%0], %1;" ::"l"(p), "r"(v) : "memory");
}

__device__ __forceinline__ int32_t ld_volatile_i32(const int32_t* p) {
  return *reinterpret_cast<const volatile int32_t*>(p);
}

// First error wins; the rest of the kernel sees err[0] != 0 and leaves.
__device__ __forceinline__ void raise_error(const Params& p, int32_t code, int32_t d0, int32_t d1) {
  if (atomicCAS(p.err, 0, code) == 0) {
    p.err[1] = static_cast<int32_t>(blockIdx.x);
    p.err[2] = d0;
    p.err[3] = d1;
    __threadfence_system();
  }
}

// Spin helper: true once ready() holds; false (error raised or seen) once the deadline passed.
template <typename Ready>
__device__ __forceinline__ bool spin_until(const Params& p, Ready ready, int32_t code, int32_t d0, int32_t d1) {
  if (ready()) return true;
  const uint64_t deadline = globaltimer_ns() + p.timeout_ns;
  for (uint32_t n = 1;; ++n) {
    if (ready()) return true;
    if ((n & 31) == 0) {
      if (ld_volatile_i32(p.err) != 0) return false;
      if (globaltimer_ns() > deadline) {
        raise_error(p, code, d0, d1);
        return false;
      }
    }
    __nanosleep(32);
  }
}

// A CTA barrier that also tells every thread whether `ok` held in every thread (threads with nothing to report
// pass true). A barrier reduction (bar.red.and) with __syncthreads' memory ordering: what thread 0 acquired
// before it is visible to all threads after it, and no shared flag is written, read and fenced again.
__device__ __forceinline__ bool cta_all(bool ok) { return __syncthreads_and(ok) != 0; }

// Sense-reversing grid barrier over all CTAs (cooperative launch makes them co-resident). count returns to 0
// inside every barrier; gen only grows, so nothing is reset between calls. Call from all threads.
__device__ __forceinline__ bool grid_barrier(const Params& p, int32_t index) {
  __syncthreads();
  bool ok = true;
  if (threadIdx.x == 0) {
    uint32_t* count = p.grid_bar;
    uint32_t* gen = p.grid_bar + 1;
    const uint32_t my_gen = ld_acquire_gpu_u32(gen);
    __threadfence();
    const uint32_t arrived = atomicAdd(count, 1u);
    if (arrived == static_cast<uint32_t>(p.num_ctas) - 1) {
      atomicExch(count, 0u);
      __threadfence();
      st_release_gpu_u32(gen, my_gen + 1);
    } else {
      ok = spin_until(p, [&] { return ld_acquire_gpu_u32(gen) != my_gen; }, kErrTimeoutGridBarrier, index, 0);
    }
    ok = ok && ld_volatile_i32(p.err) == 0;
  }
  return cta_all(ok);
}

}  // namespace weave

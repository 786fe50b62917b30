// Operand staging primitives of the GEMM tiles: 16-byte cp.async (A rows are gathered per row: GEMM0 reads them
// from x and the receive buffer) into 128-byte XOR-swizzled smem rows, the SW128 K-major layout wgmma reads.
// The pipeline that uses them is pipeline.cuh. Framework-free.
#pragma once
#include <cstdint>

#include "config.cuh"
#include "tma.cuh"

namespace weave {

using C = Config;

// 16-byte async copy global -> shared; src_bytes = 0 zero-fills the destination.
__device__ __forceinline__ void cp_async_16(uint32_t dst, const void* src, bool valid) {
  const int src_bytes = valid ? 16 : 0;
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;" ::"r"(dst), "l"(src), "r"(src_bytes) : "memory");
}
// 4-byte async copy global -> shared (FP8 tiles: a row's scale for one k step, pipeline.cuh)
__device__ __forceinline__ void cp_async_4(uint32_t dst, const void* src) {
  asm volatile("cp.async.ca.shared.global [%0], [%1], 4;" ::"r"(dst), "l"(src) : "memory");
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;" ::: "memory"); }
template <int N>
__device__ __forceinline__ void cp_async_wait() { asm volatile("cp.async.wait_group %0;" ::"n"(N) : "memory"); }

// Named barriers of the tile pipeline (0 is __syncthreads): the producer warpgroup, both consumer warpgroups, and
// each consumer warpgroup alone (kBarConsumerWg0 + w).
constexpr int kBarProducer = 1, kBarConsumers = 2, kBarConsumerWg0 = 3;

__device__ __forceinline__ void named_sync(int id, int threads) {
  asm volatile("bar.sync %0, %1;" ::"r"(id), "r"(threads) : "memory");
}

// Byte offset of 16-byte chunk `chunk` (0..7) of smem row `row` (128-byte rows, XOR swizzle on row % 8).
__device__ __forceinline__ uint32_t swz(int row, int chunk) {
  return static_cast<uint32_t>(row * 128 + ((chunk ^ (row & 7)) << 4));
}

}  // namespace weave

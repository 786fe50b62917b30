// Operand staging shared by the GEMM tiles: a kStages-deep pipeline of 128-byte XOR-swizzled smem rows (the SW128
// K-major layout wgmma reads). A rows are given per row (a pointer + valid bit: GEMM0 gathers them from x and the
// receive buffer) and copied with cp.async by all threads, rows past the block's end zero-filled; B (the expert
// weights, contiguous) comes as two TMA boxes of a tensor map per stage (tma.cuh). Framework-free.
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
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;" ::: "memory"); }
template <int N>
__device__ __forceinline__ void cp_async_wait() { asm volatile("cp.async.wait_group %0;" ::"n"(N) : "memory"); }

// Byte offset of 16-byte chunk `chunk` (0..7) of smem row `row` (128-byte rows, XOR swizzle on row % 8).
__device__ __forceinline__ uint32_t swz(int row, int chunk) {
  return static_cast<uint32_t>(row * 128 + ((chunk ^ (row & 7)) << 4));
}

// Operands of one tile, resolved once per tile. A: a pointer per A row this thread copies every stage (rows may
// be gathered from different tensors: a GEMM0 block mixes the owner's own token rows, read from x, with received
// rows) and a valid bit per row. B: a 3-D weight tensor map and the (row, z) coordinates of its two boxes; box i
// fills tile rows [kBoxRows i, kBoxRows (i + 1)) at k0 (rows past the tensor's end arrive as zeros).
struct TileOperands {
  static constexpr int kAChunks = C::kBlockM * C::kBlockK / 8 / C::kThreads;  // 4
  static_assert(kAChunks <= 32, "valid bits live in one word");
  const bf16* a_base;  // base of set_a's offsets (and the harmless address of invalid rows)
  const bf16* a_row[kAChunks];
  uint32_t valid;      // bit i: A chunk i
  const void* b_map;   // TensorMapBytes in the kernel's __grid_constant__ arguments
  int32_t b_y[2], b_z[2];
  __device__ __forceinline__ void set_a(int i, bool ok, int64_t off) { set_a_row(i, ok, a_base + (ok ? off : 0)); }
  __device__ __forceinline__ void set_a_row(int i, bool ok, const bf16* row) {
    a_row[i] = ok ? row : a_base;
    valid |= ok ? 1u << i : 0u;
  }
};

// Operands of a tile whose A rows are contiguous: out[m, n] = sum_k a_rows[m * K + k] * B_z[n, k] for the first
// num_rows rows and the kBlockN columns [col * kBlockN, ...) of weight matrix z of b_map (GEMM1 over h, the
// calibration tiles).
__device__ __forceinline__ TileOperands plain_tile_operands(const bf16* a_rows, const void* b_map, int z,
                                                            int num_rows, int K, int col) {
  TileOperands op;
  op.valid = 0;
  op.a_base = a_rows;
#pragma unroll
  for (int i = 0; i < TileOperands::kAChunks; ++i) {
    const int m = (threadIdx.x + i * C::kThreads) >> 3;
    op.set_a(i, m < num_rows, static_cast<int64_t>(m) * K);
  }
  op.b_map = b_map;
  op.b_y[0] = col * C::kBlockN;
  op.b_y[1] = col * C::kBlockN + C::kBoxRows;
  op.b_z[0] = op.b_z[1] = z;
  return op;
}

// All threads: this thread's A chunks of the stage (cp.async, one commit group per stage by the caller).
__device__ __forceinline__ void load_stage_a(const TileOperands& op, uint8_t* smem, int stage, int k0) {
  uint8_t* sa = smem + stage * C::kSmemStage;
#pragma unroll
  for (int i = 0; i < TileOperands::kAChunks; ++i) {
    const int c = threadIdx.x + i * C::kThreads;
    const int row = c >> 3, chunk = c & 7;
    const bool ok = (op.valid >> i) & 1u;
    const bf16* src = op.a_row[i] + (ok ? k0 + chunk * 8 : 0);
    cp_async_16(smem_u32(sa + swz(row, chunk)), src, ok);
  }
}

// Thread 0: arm the stage's full barrier with the B bytes and start both boxes.
__device__ __forceinline__ void issue_stage_b(const TileOperands& op, uint8_t* smem, int stage, int k0) {
  uint64_t* bar = &pipe_barriers(smem)->full[stage];
  mbar_arrive_expect_tx(bar, C::kSmemB);
  const uint32_t sb = smem_u32(smem + stage * C::kSmemStage + C::kSmemA);
#pragma unroll
  for (int i = 0; i < 2; ++i) tma_load_3d(sb + i * C::kBoxRows * 128, op.b_map, bar, k0, op.b_y[i], op.b_z[i]);
}

}  // namespace weave

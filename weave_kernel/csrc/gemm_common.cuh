// Operand staging shared by both tile mainloops: a kStages-deep cp.async pipeline that fills 128-byte
// XOR-swizzled smem rows (the SW128 K-major layout wgmma reads). A and B rows are given per row (offset + valid
// bit) so that the same loop serves GEMM0 (gate/up rows) and GEMM1, with rows past the end zero-filled.
// Framework-free.
#pragma once
#include <cstdint>

#include "config.cuh"

namespace weave {

using C = Config;

__device__ __forceinline__ uint32_t smem_u32(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

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

// Rows of A and B that this thread copies every stage, resolved once per tile: a pointer per A row (rows may
// be gathered from different tensors: a GEMM0 block mixes the owner's own token rows, read from x, with
// received rows), a 32-bit element offset from one base pointer for B (a weight tensor never spans more than
// 2^31 elements), and a valid bit per row. This thread's B chunk i sits at b_off0 + (i % 4) * b_step +
// (i / 4) * b_hi (rows n0 + 32 i of the tile, see the two tile builders).
struct TileOperands {
  static constexpr int kAChunks = C::kBlockM * C::kBlockK / 8 / C::kThreads;  // 4
  static constexpr int kBChunks = C::kBlockN * C::kBlockK / 8 / C::kThreads;  // 8
  static_assert(kAChunks + kBChunks <= 32, "valid bits live in one word");
  static_assert(kBChunks == 8 && C::kThreads / 8 == 32, "B chunk i covers tile row tid / 8 + 32 i");
  const bf16* a_base;  // base of set_a's offsets (and the harmless address of invalid rows)
  const bf16* b_base;
  const bf16* a_row[kAChunks];
  int32_t b_off0, b_step, b_hi;
  uint32_t valid;  // bit i: A chunk i; bit kAChunks + i: B chunk i
  __device__ __forceinline__ void set_a(int i, bool ok, int64_t off) { set_a_row(i, ok, a_base + (ok ? off : 0)); }
  __device__ __forceinline__ void set_a_row(int i, bool ok, const bf16* row) {
    a_row[i] = ok ? row : a_base;
    valid |= ok ? 1u << i : 0u;
  }
  __device__ __forceinline__ void set_b_valid(int i, bool ok) { valid |= ok ? 1u << (kAChunks + i) : 0u; }
  __device__ __forceinline__ int32_t b_off(int i) const { return b_off0 + (i & 3) * b_step + (i >> 2) * b_hi; }
};

// Operands of a tile whose A rows are contiguous: out[m, n] = sum_k a_rows[m * K + k] * b[n * K + k] for the
// first num_rows rows and the kBlockN columns [col * kBlockN, ...) below N (GEMM1 over h, the calibration tiles).
__device__ __forceinline__ TileOperands plain_tile_operands(const bf16* a_rows, const bf16* b, int num_rows, int K,
                                                            int N, int col) {
  TileOperands op;
  op.valid = 0;
  op.a_base = a_rows;
  op.b_base = b;
#pragma unroll
  for (int i = 0; i < TileOperands::kAChunks; ++i) {
    const int m = (threadIdx.x + i * C::kThreads) >> 3;
    op.set_a(i, m < num_rows, static_cast<int64_t>(m) * K);
  }
  const int n0 = col * C::kBlockN + (threadIdx.x >> 3);  // B chunk i: output column n0 + 32 i
  op.b_off0 = n0 * K;
  op.b_step = 32 * K;
  op.b_hi = 128 * K;
#pragma unroll
  for (int i = 0; i < TileOperands::kBChunks; ++i) op.set_b_valid(i, n0 + 32 * i < N);
  return op;
}

__device__ __forceinline__ void load_stage(const TileOperands& op, uint8_t* smem, int stage, int k0) {
  uint8_t* sa = smem + stage * C::kSmemStage;
  uint8_t* sb = sa + C::kSmemA;
#pragma unroll
  for (int i = 0; i < TileOperands::kAChunks; ++i) {
    const int c = threadIdx.x + i * C::kThreads;
    const int row = c >> 3, chunk = c & 7;
    const bool ok = (op.valid >> i) & 1u;
    const bf16* src = op.a_row[i] + (ok ? k0 + chunk * 8 : 0);
    cp_async_16(smem_u32(sa + swz(row, chunk)), src, ok);
  }
#pragma unroll
  for (int i = 0; i < TileOperands::kBChunks; ++i) {
    const int c = threadIdx.x + i * C::kThreads;
    const int row = c >> 3, chunk = c & 7;
    const bool ok = (op.valid >> (TileOperands::kAChunks + i)) & 1u;
    const bf16* src = op.b_base + (ok ? op.b_off(i) + k0 + chunk * 8 : 0);
    cp_async_16(smem_u32(sb + swz(row, chunk)), src, ok);
  }
}

}  // namespace weave

// mma.sync m16n8k16 tile mainloop fed by ldmatrix (the first, portable step; kept for comparison and built
// with -DWEAVE_MMA_SYNC). 8 warps as 2 x 4, 64 x 64 warp tiles. Framework-free.
#pragma once
#include <cstdint>

#include "config.cuh"
#include "gemm_common.cuh"

namespace weave {

__device__ __forceinline__ void ldmatrix_x4(uint32_t addr, uint32_t& r0, uint32_t& r1, uint32_t& r2, uint32_t& r3) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];"
               : "=r"(r0), "=r"(r1), "=r"(r2), "=r"(r3)
               : "r"(addr));
}

__device__ __forceinline__ void mma_bf16_16816(float* c, const uint32_t* a, uint32_t b0, uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
      "{%0,%1,%2,%3};"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

struct TileAcc {
  float c[C::kFragsM][C::kFragsN][4];
};

// acc = A[BM, K] * B[BN, K]^T. K % kBlockK == 0. Ends with a __syncthreads (smem free for the epilogue).
__device__ __forceinline__ void tile_mainloop(const TileOperands& op, int K, uint8_t* smem, TileAcc& acc) {
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int wm = warp / C::kWarpsN, wn = warp % C::kWarpsN;
#pragma unroll
  for (int i = 0; i < C::kFragsM; ++i)
#pragma unroll
    for (int j = 0; j < C::kFragsN; ++j)
#pragma unroll
      for (int q = 0; q < 4; ++q) acc.c[i][j][q] = 0.f;

  const int num_k = K / C::kBlockK;
#pragma unroll
  for (int s = 0; s < C::kStages - 1; ++s) {
    if (s < num_k) load_stage(op, smem, s, s * C::kBlockK);
    cp_async_commit();
  }
  for (int kt = 0; kt < num_k; ++kt) {
    cp_async_wait<C::kStages - 2>();
    __syncthreads();
    const int next = kt + C::kStages - 1;
    if (next < num_k) load_stage(op, smem, next % C::kStages, next * C::kBlockK);
    cp_async_commit();

    const uint8_t* sa = smem + (kt % C::kStages) * C::kSmemStage;
    const uint8_t* sb = sa + C::kSmemA;
#pragma unroll
    for (int kk = 0; kk < C::kBlockK / 16; ++kk) {
      uint32_t a[C::kFragsM][4];
      uint32_t b[C::kFragsN][2];
#pragma unroll
      for (int i = 0; i < C::kFragsM; ++i) {
        const int row = wm * C::kWarpTileM + i * 16 + (lane & 15);
        const int chunk = kk * 2 + (lane >> 4);
        ldmatrix_x4(smem_u32(sa + swz(row, chunk)), a[i][0], a[i][1], a[i][2], a[i][3]);
      }
#pragma unroll
      for (int j = 0; j < C::kFragsN / 2; ++j) {
        const int row = wn * C::kWarpTileN + j * 16 + (lane & 7) + ((lane >> 4) << 3);
        const int chunk = kk * 2 + ((lane >> 3) & 1);
        ldmatrix_x4(smem_u32(sb + swz(row, chunk)), b[2 * j][0], b[2 * j][1], b[2 * j + 1][0], b[2 * j + 1][1]);
      }
#pragma unroll
      for (int i = 0; i < C::kFragsM; ++i)
#pragma unroll
        for (int j = 0; j < C::kFragsN; ++j) mma_bf16_16816(acc.c[i][j], a[i], b[j][0], b[j][1]);
    }
  }
  cp_async_wait<0>();
  __syncthreads();
}

// Position of accumulator element q (0..3) of fragment (i, j) inside the tile.
__device__ __forceinline__ int acc_row(int i, int q) {
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  return (warp / C::kWarpsN) * C::kWarpTileM + i * 16 + (lane >> 2) + ((q >> 1) << 3);
}
__device__ __forceinline__ int acc_col(int j, int q) {
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  return (warp % C::kWarpsN) * C::kWarpTileN + j * 8 + ((lane & 3) << 1) + (q & 1);
}

// GEMM0 B-row interleave: smem B row n holds w13 row gate_or_up * I + h column, so that every warp holds the
// gate and up values of the same h column in its n-frags {0..3} and {4..7}: SwiGLU stays in registers.
// Returns the h column (in [0, I) when valid); the w13 row is h_col + (up ? I : 0).
__device__ __forceinline__ int gemm0_h_col(int n, int col_block, bool* up) {
  constexpr int kHalfFrags = C::kFragsN / 2;
  const int warp_n = n / C::kWarpTileN;
  const int frag = (n % C::kWarpTileN) / 8;
  *up = frag >= kHalfFrags;
  return col_block * C::kHalfN + warp_n * (C::kWarpTileN / 2) + (frag % kHalfFrags) * 8 + (n % 8);
}

__device__ __forceinline__ float silu(float g) { return g / (1.f + __expf(-g)); }

// Stage SwiGLU(acc) as bf16 [BM][kHalfN] into smem (row stride kEpiStride).
__device__ __forceinline__ void stage_swiglu(const TileAcc& acc, bf16* s_out) {
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int wm = warp / C::kWarpsN, wn = warp % C::kWarpsN;
  constexpr int kHalfFrags = C::kFragsN / 2;
#pragma unroll
  for (int i = 0; i < C::kFragsM; ++i)
#pragma unroll
    for (int j = 0; j < kHalfFrags; ++j)
#pragma unroll
      for (int half = 0; half < 2; ++half) {
        const int row = wm * C::kWarpTileM + i * 16 + (lane >> 2) + half * 8;
        const int col = wn * (C::kWarpTileN / 2) + j * 8 + ((lane & 3) << 1);
        const float g0 = acc.c[i][j][half * 2], g1 = acc.c[i][j][half * 2 + 1];
        const float u0 = acc.c[i][j + kHalfFrags][half * 2], u1 = acc.c[i][j + kHalfFrags][half * 2 + 1];
        *reinterpret_cast<__nv_bfloat162*>(s_out + row * C::kEpiStride + col) =
            __floats2bfloat162_rn(silu(g0) * u0, silu(g1) * u1);
      }
}

// Stage acc as bf16 [BM][BN] into smem.
__device__ __forceinline__ void stage_plain(const TileAcc& acc, bf16* s_out) {
#pragma unroll
  for (int i = 0; i < C::kFragsM; ++i)
#pragma unroll
    for (int j = 0; j < C::kFragsN; ++j)
#pragma unroll
      for (int half = 0; half < 2; ++half) {
        const int row = acc_row(i, half * 2), col = acc_col(j, half * 2);
        *reinterpret_cast<__nv_bfloat162*>(s_out + row * C::kEpiStride + col) =
            __floats2bfloat162_rn(acc.c[i][j][half * 2], acc.c[i][j][half * 2 + 1]);
      }
}

}  // namespace weave

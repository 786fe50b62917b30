// Hopper tensor-core pieces of the GEMM tiles: wgmma.mma_async m64n256k16 (sm_90a), bf16 in, fp32 accumulators
// in registers; the two consumer warpgroups each own 64 rows of the 128 x 256 tile and read A and B from
// 128-byte-swizzled smem stages (the SW128 K-major canonical layout, so the stage bases are 1024-byte aligned).
// The epilogue stages accumulators as bf16 in a swizzled [kBlockM][kStageCols] buffer. The loop that drives
// them is pipeline.cuh. Framework-free.
//
// No wgmma instruction may sit under a branch that depends on the thread in a way ptxas cannot prove
// warpgroup-uniform (e.g. "this warpgroup's 64 rows are all padding, skip"): ptxas then inserts a warpgroup
// dependency barrier (WG.DP) in the divergent path and serialises every wgmma of the kernel (warning C7518: each
// HGMMA gets its own WARPGROUP.ARRIVE / DEPBAR.LE gsb0, 0x0, so no MMA overlaps anything). The producer /
// consumer split on threadIdx.x / 128 is provably uniform, and so is a choice between two copies of the whole k
// loop made once per tile on the warpgroup and the tile's row count (pipeline.cuh with_mma_form's idle form);
// tests/kernel/test_csrc.py asserts no C7518.
#pragma once
#include <cstdint>

#include <cuda_fp8.h>

#include "config.cuh"
#include "gemm_common.cuh"

namespace weave {

// Operand lists of the wgmma wrappers below. An m64nN fp32 accumulator is N / 2 registers per thread: named
// "{%0, ..., %(N/2 - 1)}" in the instruction and bound by N / 2 "+f" constraints (asm takes both only literally).
#define WEAVE_REGS32 "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31}"
#define WEAVE_REGS128 \
  "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63, %64, %65, %66, %67, %68, %69, %70, %71, %72, %73, %74, %75, %76, %77, %78, %79, %80, %81, %82, %83, %84, %85, %86, %87, %88, %89, %90, %91, %92, %93, %94, %95, %96, %97, %98, %99, %100, %101, %102, %103, %104, %105, %106, %107, %108, %109, %110, %111, %112, %113, %114, %115, %116, %117, %118, %119, %120, %121, %122, %123, %124, %125, %126, %127}"
#define WEAVE_F8(d, i)                                                                                         \
  "+f"(d[i]), "+f"(d[i + 1]), "+f"(d[i + 2]), "+f"(d[i + 3]), "+f"(d[i + 4]), "+f"(d[i + 5]), "+f"(d[i + 6]), \
      "+f"(d[i + 7])
#define WEAVE_F32(d, i) WEAVE_F8(d, i), WEAVE_F8(d, i + 8), WEAVE_F8(d, i + 16), WEAVE_F8(d, i + 24)
#define WEAVE_F128(d) WEAVE_F32(d, 0), WEAVE_F32(d, 32), WEAVE_F32(d, 64), WEAVE_F32(d, 96)

struct TileAcc {
  float d[Config::kBlockN / 2];  // m64n256: 128 fp32 per thread
};

// Shared-memory matrix descriptor: K-major operand, 128-byte swizzle, 8-row atoms 1024 bytes apart.
__device__ __forceinline__ uint64_t wgmma_desc_sw128(uint32_t smem_addr) {
  uint64_t desc = 0;
  desc |= static_cast<uint64_t>((smem_addr & 0x3FFFF) >> 4);  // start address
  desc |= static_cast<uint64_t>(1) << 16;                      // leading byte offset (unused for SW128 K-major)
  desc |= static_cast<uint64_t>(1024 >> 4) << 32;              // stride byte offset: 8 rows x 128 B
  desc |= static_cast<uint64_t>(1) << 62;                      // layout: 128-byte swizzle
  return desc;
}

__device__ __forceinline__ void wgmma_fence() { asm volatile("wgmma.fence.sync.aligned;" ::: "memory"); }
__device__ __forceinline__ void wgmma_commit() { asm volatile("wgmma.commit_group.sync.aligned;" ::: "memory"); }
template <int N>
__device__ __forceinline__ void wgmma_wait() { asm volatile("wgmma.wait_group.sync.aligned %0;" ::"n"(N) : "memory"); }
__device__ __forceinline__ void fence_proxy_async_smem() {
  asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
}

__device__ __forceinline__ void wgmma_m64n256k16(float* d, uint64_t desc_a, uint64_t desc_b, int scale_d) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %130, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n256k16.f32.bf16.bf16 "
      WEAVE_REGS128 ", %128, %129, p, 1, 1, 0, 0;\n}\n"
      : WEAVE_F128(d)
      : "l"(desc_a), "l"(desc_b), "r"(scale_d));
}

// One k step of a consumer warpgroup: its 64 A rows at sa times the stage's B at sb (both SW128), 4 x
// m64n256k16 committed as one group (the caller waits on it). Every tile loop issues its MMAs through here.
__device__ __forceinline__ void mma_stage(TileAcc& acc, uint32_t sa, uint32_t sb) {
  wgmma_fence();
#pragma unroll
  for (int kk = 0; kk < Config::kBlockK / 16; ++kk)
    wgmma_m64n256k16(acc.d, wgmma_desc_sw128(sa + kk * 32), wgmma_desc_sw128(sb + kk * 32), 1);
  wgmma_commit();
}

// wgmma m64n64k16, bf16 -> fp32, accumulating into d[0, 32) (half tiles, mma_stage_half).
__device__ __forceinline__ void wgmma_m64n64k16(float* d, uint64_t desc_a, uint64_t desc_b) {
  asm volatile(
      "{\n"
      "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 "
      WEAVE_REGS32 ", %32, %33, 1, 1, 1, 0, 0;\n}\n"
      : WEAVE_F32(d, 0)
      : "l"(desc_a), "l"(desc_b));
}

// Half tiles: a block of at most 64 rows (is_half_tile) needs only A rows [0, 64), so the two consumer warpgroups
// split the columns instead of the rows. Warpgroup w computes tile columns [64 w, 64 w + 64) and [128 + 64 w,
// 192 + 64 w) of rows [0, 64) (for GEMM0: the gate and up columns of the same 64 h columns), as 2 x m64n64k16 per
// k16 step into the accumulators of columns [0, 64) and [128, 192), i.e. acc.d[0, 32) and acc.d[64, 96); the others
// stay 0. Half the MMAs of a full tile, and none on the padding rows [64, 128). sa: A rows [0, 64); sb_w: B row 64 w
// of the stage. The epilogues stage these accumulators with stage_pairs(..., half = true). The caller chooses
// between this and mma_stage on a tile-uniform value (a branch that is not would serialise the wgmmas).
__device__ __forceinline__ bool is_half_tile(int num_rows) { return num_rows <= Config::kBlockM / 2; }
__device__ __forceinline__ void mma_stage_half(TileAcc& acc, uint32_t sa, uint32_t sb_w) {
  wgmma_fence();
#pragma unroll
  for (int kk = 0; kk < Config::kBlockK / 16; ++kk) {
    const uint64_t da = wgmma_desc_sw128(sa + kk * 32);
    wgmma_m64n64k16(acc.d, da, wgmma_desc_sw128(sb_w + kk * 32));
    wgmma_m64n64k16(acc.d + Config::kBlockN / 4, da,
                    wgmma_desc_sw128(sb_w + Config::kHalfN * Config::kBlockK * 2 + kk * 32));
  }
  wgmma_commit();
}

// wgmma m64n256k32, e4m3 x e4m3 -> fp32, accumulating (FP8 experts). Both operands K-major from SW128 smem (FP8
// takes no transpose bits); a 128-byte smem row holds 128 of K, so a stage is 4 of these.
__device__ __forceinline__ void wgmma_m64n256k32_e4m3(float* d, uint64_t desc_a, uint64_t desc_b) {
  asm volatile(
      "{\n"
      "wgmma.mma_async.sync.aligned.m64n256k32.f32.e4m3.e4m3 "
      WEAVE_REGS128 ", %128, %129, 1, 1, 1;\n}\n"
      : WEAVE_F128(d)
      : "l"(desc_a), "l"(desc_b));
}

// One FP8 k step (128 of K) of a consumer warpgroup, the stage layout of mma_stage.
__device__ __forceinline__ void mma_stage_e4m3(TileAcc& acc, uint32_t sa, uint32_t sb) {
  wgmma_fence();
#pragma unroll
  for (int kk = 0; kk < 4; ++kk)
    wgmma_m64n256k32_e4m3(acc.d, wgmma_desc_sw128(sa + kk * 32), wgmma_desc_sw128(sb + kk * 32));
  wgmma_commit();
}

// wgmma m64n64k32, e4m3 x e4m3 -> fp32, accumulating into d[0, 32) (FP8 half tiles, mma_stage_half_e4m3).
__device__ __forceinline__ void wgmma_m64n64k32_e4m3(float* d, uint64_t desc_a, uint64_t desc_b) {
  asm volatile(
      "{\n"
      "wgmma.mma_async.sync.aligned.m64n64k32.f32.e4m3.e4m3 "
      WEAVE_REGS32 ", %32, %33, 1, 1, 1;\n}\n"
      : WEAVE_F32(d, 0)
      : "l"(desc_a), "l"(desc_b));
}

// One FP8 k step of a half tile: mma_stage_half's split (warpgroup w: rows [0, 64), tile columns [64 w, 64 w + 64)
// and [128 + 64 w, 192 + 64 w), into acc.d[0, 32) and acc.d[64, 96)) with e4m3 operands, 128 of K per stage row.
__device__ __forceinline__ void mma_stage_half_e4m3(TileAcc& acc, uint32_t sa, uint32_t sb_w) {
  wgmma_fence();
#pragma unroll
  for (int kk = 0; kk < 4; ++kk) {
    const uint64_t da = wgmma_desc_sw128(sa + kk * 32);
    wgmma_m64n64k32_e4m3(acc.d, da, wgmma_desc_sw128(sb_w + kk * 32));
    wgmma_m64n64k32_e4m3(acc.d + Config::kBlockN / 4, da, wgmma_desc_sw128(sb_w + Config::kHalfN * 128 + kk * 32));
  }
  wgmma_commit();
}

// FP8 block scales without a second accumulator set: the accumulators are kept in units of the current k step's
// scale a(row, k) * b(column half, k). Before step k's MMAs they are multiplied by (previous scale / this one); the
// epilogue multiplies by the last step's. f[2 * half + (row + 8)] are the four factors of a thread (its two rows
// and the tile's two 128-column halves). The empty asm pins each product before the wgmma.fence that follows: a
// multiply scheduled after the fence makes ptxas insert its own and serialise every wgmma
// (tests/kernel/tile_limits.cu modes 17 and 18; docs/kernel.md "FP8 experts").
// kHalf: a half tile's (mma_stage_half_e4m3): only acc.d[0, 32) and [64, 96) hold products, the rest stay 0.
template <bool kHalf = false>
__device__ __forceinline__ void scale_acc(TileAcc& acc, const float* f) {
#pragma unroll
  for (int i = 0; i < Config::kBlockN / 2; ++i) {
    if (kHalf && (i & 63) >= 32) continue;
    acc.d[i] *= f[2 * (i / 64) + ((i & 3) >> 1)];
    asm volatile("" : "+f"(acc.d[i])::"memory");
  }
}

// Pin the accumulators after wgmma_wait: the compiler sees them as outputs of the wgmma asm only, and could
// otherwise schedule reads of them before the wait that makes them final.
__device__ __forceinline__ void fence_acc(TileAcc& acc) {
#pragma unroll
  for (int i = 0; i < Config::kBlockN / 2; ++i) asm volatile("" : "+f"(acc.d[i])::"memory");
}

// Accumulator element r of a consumer thread: row and column inside the tile (m64nNk16 fragment layout; consumer
// warpgroup w owns rows [64 w, 64 w + 64)).
__device__ __forceinline__ int acc_row(int r) {
  const int ct = threadIdx.x - Config::kProducerThreads;
  const int wg = ct / 128, w4 = (ct / 32) % 4, lane = ct & 31;
  return wg * 64 + w4 * 16 + (lane >> 2) + (((r & 3) >> 1) << 3);
}
__device__ __forceinline__ int acc_col(int r) { return (r >> 2) * 8 + ((threadIdx.x & 3) << 1) + (r & 1); }

// The epilogue staging buffer: kBlockM rows of kStageCols bf16, each row padded by 16 bytes (kStagingRow bytes =
// 68 words, so the 8 rows a warp writes per accumulator pair start 4 banks apart: conflict-free; a pair's address
// is the thread's base plus a compile-time offset, so no per-element address stays live in registers).
__device__ __forceinline__ uint32_t staging_offset(int row, int col) {
  return static_cast<uint32_t>(row * Config::kStagingRow + col * 2);
}

// GEMM0 B rows: [0, kHalfN) gate columns, [kHalfN, kBlockN) up columns of the same h columns (the producer
// loads them so), so every thread holds gate and up of the same h column in accumulators r and r + kBlockN / 4:
// SwiGLU stays in registers. silu(g) = g sigmoid(g) = (g / 2)(1 + tanh(g / 2)), with tanh.approx.f32: one MUFU per
// element. The epilogue's SwiGLU is a latency-bound chain per warp, and the former EX2 -> RCP pair (__fdividef(g,
// 1 + __expf(-g))) made a GEMM0 tile's epilogue about 5 us; this one takes it to 2.6-3.5 us and layers 1-3% faster
// (docs/kernel.md, "SwiGLU by tanh.approx"). Accuracy (tests/kernel/silu_probe.cu, measured on an H200): at most
// 1.1e-5 absolute anywhere in [-64, 64], i.e. under 0.08 of half a bf16 ulp of silu(g) for g >= -8; below -8 silu
// is under 3e-3 in size and its relative error grows (to 0.3 in [-16, -8), up to 1 below -16), still within the
// same absolute bound. No IEEE `/` here: its slow-path subroutine made ptxas spill around the epilogue
// (docs/kernel.md, "The SwiGLU division").
__device__ __forceinline__ float silu(float g) {
  const float h = 0.5f * g;
  float t;
  asm("tanh.approx.f32 %0, %1;" : "=f"(t) : "f"(h));
  return fmaf(h, t, h);
}

// A thread's outputs as bf16 pairs: pair j holds accumulators (2j, 2j + 1), i.e. row acc_row(2j), columns
// acc_col(2j) and + 1. Packing first halves the registers the epilogue holds across its barriers (the 128 fp32
// accumulators are dead once packed).
struct TileOut {
  uint32_t v[Config::kBlockN / 4];
};
__device__ __forceinline__ uint32_t pack_bf16x2(float lo, float hi) {
  const __nv_bfloat162 h = __floats2bfloat162_rn(lo, hi);
  return *reinterpret_cast<const uint32_t*>(&h);
}
// GEMM1: all 64 pairs.
__device__ __forceinline__ void pack_plain(const TileAcc& acc, TileOut& out) {
#pragma unroll
  for (int j = 0; j < Config::kBlockN / 4; ++j) out.v[j] = pack_bf16x2(acc.d[2 * j], acc.d[2 * j + 1]);
}
// GEMM0: pairs [0, 32) = SwiGLU(gate, up) of h columns [0, kHalfN).
__device__ __forceinline__ void pack_swiglu(const TileAcc& acc, TileOut& out) {
  constexpr int kUp = Config::kBlockN / 4;  // accumulator offset of the up half
#pragma unroll
  for (int j = 0; j < kUp / 2; ++j) {
    const int r = 2 * j;
    out.v[j] = pack_bf16x2(silu(acc.d[r]) * acc.d[r + kUp], silu(acc.d[r + 1]) * acc.d[r + kUp + 1]);
  }
}
// Stage pairs [kFirst, kFirst + 32) (tile columns [4 kFirst, 4 kFirst + 128)) as bf16 [BM][kStageCols].
// half (a half tile, mma_stage_half): only pairs [kFirst, kFirst + 16) hold outputs; warpgroup w's are rows
// [0, 64) and staging columns [64 w, 64 w + 64).
template <int kFirst>
__device__ __forceinline__ void stage_pairs(const TileOut& out, uint8_t* staging, bool half) {
  constexpr int kPairs = Config::kStageCols / 4;  // 32 pairs of a thread cover 128 tile columns
  const int shift = half ? 64 * ((static_cast<int>(threadIdx.x) - Config::kProducerThreads) / 128) : 0;
  uint8_t* base = staging + staging_offset(acc_row(0) - shift, acc_col(0) + shift);
#pragma unroll
  for (int j = kFirst; j < kFirst + kPairs; ++j)  // pair j: row + 8 (j & 1), column 8 (j / 2) (acc_row / acc_col)
    if (!half || j < kFirst + kPairs / 2)
      *reinterpret_cast<uint32_t*>(base + (j & 1) * 8 * Config::kStagingRow + ((j - kFirst) >> 1) * 16) = out.v[j];
}

// FP8 GEMM0 epilogue: SwiGLU of the thread's 32 gate / up pairs (already in the product's units), then e4m3 with one
// scale per row of the tile's 128 h columns (fp8.py quantize_act: s = max(amax x fp32(1 / 448), floor), q = x / s
// saturated; here x times 1 / s to 2 ulp, which moves a value across an e4m3 rounding boundary only within a few
// fp32 ulp of it). The four threads of a quad hold a row's columns: their amax is
// reduced by shuffles. Bytes go to the staging rows (byte column = h column), scales to scale[m * stride] for the
// tile rows m < num_rows. A NaN input stays NaN (fmaxf skips it in the amax; the conversion keeps it).
// half (a half tile, mma_stage_half_e4m3): a thread holds 16 pairs, h columns [64 w, 64 w + 64) of rows [0, 64) for
// warpgroup w, so a row's amax is the larger of the two warpgroups': exchanged through xch (2 x 64 floats of shared
// memory outside the staged block), with a consumer barrier between the writes and the reads. Warpgroup 0 writes the
// scales.
__device__ __forceinline__ void stage_swiglu_e4m3(const TileAcc& acc, uint8_t* staging, float* scale, int stride,
                                                  int num_rows, bool half, float* xch) {
  constexpr int kUp = Config::kBlockN / 4;  // accumulator offset of the up half
  const int ct = static_cast<int>(threadIdx.x) - Config::kProducerThreads, cw = ct / 128;
  float h[kUp];
  float amax[2] = {0.f, 0.f};
#pragma unroll
  for (int r = 0; r < kUp; ++r) {  // accumulator r: row + 8 ((r & 3) >> 1)
    h[r] = silu(acc.d[r]) * acc.d[r + kUp];
    if (!half || r < kUp / 2) amax[(r & 3) >> 1] = fmaxf(amax[(r & 3) >> 1], fabsf(h[r]));
  }
  const int row = acc_row(0) - (half ? 64 * cw : 0);
#pragma unroll
  for (int i = 0; i < 2; ++i) {
    amax[i] = fmaxf(amax[i], __shfl_xor_sync(0xffffffffu, amax[i], 1));
    amax[i] = fmaxf(amax[i], __shfl_xor_sync(0xffffffffu, amax[i], 2));
  }
  if (half) {
    if ((threadIdx.x & 3) == 0) {
      xch[cw * 64 + row] = amax[0];
      xch[cw * 64 + row + 8] = amax[1];
    }
    named_sync(kBarConsumers, Config::kConsumerThreads);
#pragma unroll
    for (int i = 0; i < 2; ++i) amax[i] = fmaxf(amax[i], xch[(1 - cw) * 64 + row + 8 * i]);
  }
  float inv[2];
#pragma unroll
  for (int i = 0; i < 2; ++i) {
    const float s = fmaxf(amax[i] * (1.f / Config::kFp8Max), Config::kFp8ScaleFloor);
    inv[i] = __fdividef(1.f, s);  // (IEEE division or reciprocal: a slow-path call, and spills around it)
    const int m = row + 8 * i;
    if ((threadIdx.x & 3) == 0 && m < num_rows && (!half || cw == 0)) scale[static_cast<int64_t>(m) * stride] = s;
  }
  uint8_t* base = staging + row * Config::kStagingRow + (half ? 64 * cw : 0) + ((threadIdx.x & 3) << 1);
#pragma unroll
  for (int j = 0; j < kUp / 2; ++j) {  // pair j: accumulators 2j, 2j + 1: row + 8 (j & 1), columns 8 (j / 2) + 0, 1
    if (half && j >= kUp / 4) break;
    const float2 v = make_float2(h[2 * j] * inv[j & 1], h[2 * j + 1] * inv[j & 1]);
    const __nv_fp8x2_storage_t q = __nv_cvt_float2_to_fp8x2(v, __NV_SATFINITE, __NV_E4M3);
    *reinterpret_cast<__nv_fp8x2_storage_t*>(base + (j & 1) * 8 * Config::kStagingRow + (j >> 1) * 8) = q;
  }
}

}  // namespace weave

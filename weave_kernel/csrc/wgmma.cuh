// Hopper tile mainloop: wgmma.mma_async m64n256k16 (sm_90a), bf16 in, fp32 accumulators in registers.
// Two warpgroups per CTA, each owning 64 rows of the 128 x 256 tile; A (cp.async) and B (TMA) land in
// 128-byte-swizzled smem stages (the SW128 K-major canonical layout, so the tile bases must be 1024-byte
// aligned). Framework-free.
#pragma once
#include <cstdint>

#include "config.cuh"
#include "gemm_common.cuh"

namespace weave {

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
      "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63, %64, %65, %66, %67, %68, %69, %70, %71, %72, %73, %74, %75, %76, %77, %78, %79, %80, %81, %82, %83, %84, %85, %86, %87, %88, %89, %90, %91, %92, %93, %94, %95, %96, %97, %98, %99, %100, %101, %102, %103, %104, %105, %106, %107, %108, %109, %110, %111, %112, %113, %114, %115, %116, %117, %118, %119, %120, %121, %122, %123, %124, %125, %126, %127}, %128, %129, p, 1, 1, 0, 0;\n}\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]), "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]), "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]), "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63]), "+f"(d[64]), "+f"(d[65]), "+f"(d[66]), "+f"(d[67]), "+f"(d[68]), "+f"(d[69]), "+f"(d[70]), "+f"(d[71]), "+f"(d[72]), "+f"(d[73]), "+f"(d[74]), "+f"(d[75]), "+f"(d[76]), "+f"(d[77]), "+f"(d[78]), "+f"(d[79]), "+f"(d[80]), "+f"(d[81]), "+f"(d[82]), "+f"(d[83]), "+f"(d[84]), "+f"(d[85]), "+f"(d[86]), "+f"(d[87]), "+f"(d[88]), "+f"(d[89]), "+f"(d[90]), "+f"(d[91]), "+f"(d[92]), "+f"(d[93]), "+f"(d[94]), "+f"(d[95]), "+f"(d[96]), "+f"(d[97]), "+f"(d[98]), "+f"(d[99]), "+f"(d[100]), "+f"(d[101]), "+f"(d[102]), "+f"(d[103]), "+f"(d[104]), "+f"(d[105]), "+f"(d[106]), "+f"(d[107]), "+f"(d[108]), "+f"(d[109]), "+f"(d[110]), "+f"(d[111]), "+f"(d[112]), "+f"(d[113]), "+f"(d[114]), "+f"(d[115]), "+f"(d[116]), "+f"(d[117]), "+f"(d[118]), "+f"(d[119]), "+f"(d[120]), "+f"(d[121]), "+f"(d[122]), "+f"(d[123]), "+f"(d[124]), "+f"(d[125]), "+f"(d[126]), "+f"(d[127])
      : "l"(desc_a), "l"(desc_b), "r"(scale_d));
}

// acc = A[BM, K] * B[BN, K]^T; A rows past the block's rows are zero-filled by the loader, so they compute
// zeros that no epilogue stores. K % kBlockK == 0; smem 1024-byte aligned, its barriers initialised
// (init_pipe_barriers). A stage holds A (cp.async by all threads) and B (two TMA boxes issued by thread 0,
// completing the stage's full barrier); one wgmma group stays in flight while the next stage is waited for and
// the one after is prefetched; a stage is refilled only after both warpgroups retired the MMAs that read it.
// Ends with a __syncthreads. The epilogue may then reuse the stages as generic staging memory: the next tile's
// first TMA writes are ordered after it by the proxy fence at the top.
//
// No wgmma instruction may sit under a branch that depends on the thread (e.g. "this warpgroup's 64 rows are
// all padding, skip"): ptxas cannot prove such a branch warpgroup-uniform, inserts a warpgroup dependency
// barrier (WG.DP) in the divergent path and then serialises every wgmma of the kernel (warning C7518: each
// HGMMA gets its own WARPGROUP.ARRIVE / DEPBAR.LE gsb0, 0x0, so no MMA overlaps anything). An earlier
// version skipped the MMAs of an all-padding warpgroup that way; both warpgroups now always issue them
// (tests/kernel/test_csrc.py asserts that ptxas reports no C7518).
__device__ __forceinline__ void tile_mainloop(const Params& p, const TileOperands& op, int K, uint8_t* smem,
                                              TileAcc& acc) {
  static_assert(Config::kBlockM == 128 && Config::kBlockN == 256 && Config::kThreads == 256,
                "wgmma path: two warpgroups x m64n256");
  static_assert(Config::kSmemA % 1024 == 0 && Config::kSmemB % 1024 == 0, "SW128 atoms need 1024-byte bases");
  static_assert(Config::kStages == 3, "refill-after-retire order assumes 3 stages");
  const int wg = threadIdx.x / 128;
  PipeBarriers* bars = pipe_barriers(smem);
  uint32_t phase = bars->phase;  // written back by thread 0 before the previous tile's closing __syncthreads
#pragma unroll
  for (int i = 0; i < Config::kBlockN / 2; ++i) acc.d[i] = 0.f;
  const int num_k = K / Config::kBlockK;
  fence_proxy_async_smem();  // this thread's generic smem accesses (last epilogue) before the TMA writes below
  __syncthreads();
#pragma unroll
  for (int s = 0; s < Config::kStages - 1; ++s) {
    if (s < num_k) {
      if (threadIdx.x == 0) issue_stage_b(op, smem, s, s * Config::kBlockK);
      load_stage_a(op, smem, s, s * Config::kBlockK);
    }
    cp_async_commit();
  }
  const uint32_t smem_base = smem_u32(smem);
  for (int kt = 0; kt < num_k; ++kt) {
    const int st = kt % Config::kStages;
    cp_async_wait<Config::kStages - 2>();  // stage kt's A landed (this thread's copies)
    fence_proxy_async_smem();              // cp.async wrote through the generic proxy; wgmma reads via async
    mbar_wait(p, &bars->full[st], (phase >> st) & 1u, st, kt);  // stage kt's B landed
    phase ^= 1u << st;
    __syncthreads();                       // ... and every thread's A copies landed
    const uint32_t sa = smem_base + st * Config::kSmemStage + wg * 64 * 128;
    const uint32_t sb = smem_base + st * Config::kSmemStage + Config::kSmemA;
    wgmma_fence();
#pragma unroll
    for (int kk = 0; kk < Config::kBlockK / 16; ++kk)
      wgmma_m64n256k16(acc.d, wgmma_desc_sw128(sa + kk * 32), wgmma_desc_sw128(sb + kk * 32), 1);
    wgmma_commit();
    wgmma_wait<1>();  // the MMAs of stage kt-1 retired; those of stage kt keep running
    __syncthreads();  // both warpgroups are done with stage kt-1: refill it
    const int next = kt + Config::kStages - 1;
    if (next < num_k) {
      if (threadIdx.x == 0) issue_stage_b(op, smem, next % Config::kStages, next * Config::kBlockK);
      load_stage_a(op, smem, next % Config::kStages, next * Config::kBlockK);
    }
    cp_async_commit();
  }
  wgmma_wait<0>();
  cp_async_wait<0>();
  if (threadIdx.x == 0) bars->phase = phase;
  __syncthreads();
}

// Accumulator element r of this thread: row and column inside the tile (m64nNk16 fragment layout).
__device__ __forceinline__ int acc_row(int r) {
  const int wg = threadIdx.x / 128, w4 = (threadIdx.x / 32) % 4, lane = threadIdx.x & 31;
  return wg * 64 + w4 * 16 + (lane >> 2) + (((r & 3) >> 1) << 3);
}
__device__ __forceinline__ int acc_col(int r) { return (r >> 2) * 8 + ((threadIdx.x & 3) << 1) + (r & 1); }

// GEMM0 B rows: [0, kHalfN) gate columns, [kHalfN, kBlockN) up columns of the same h columns (gemm0_tile
// fills them so), so every thread holds gate and up of the same h column in accumulators r and
// r + kBlockN / 4: SwiGLU stays in registers.
__device__ __forceinline__ float silu(float g) { return g / (1.f + __expf(-g)); }

// Stage SwiGLU(acc) as bf16 [BM][kHalfN] into smem (row stride kEpiStride).
__device__ __forceinline__ void stage_swiglu(const TileAcc& acc, bf16* s_out) {
  constexpr int kUp = Config::kBlockN / 4;  // accumulator offset of the up half
#pragma unroll
  for (int r = 0; r < kUp; r += 2) {
    const float g0 = acc.d[r], g1 = acc.d[r + 1], u0 = acc.d[r + kUp], u1 = acc.d[r + kUp + 1];
    *reinterpret_cast<__nv_bfloat162*>(s_out + acc_row(r) * Config::kEpiStride + acc_col(r)) =
        __floats2bfloat162_rn(silu(g0) * u0, silu(g1) * u1);
  }
}

// Stage acc as bf16 [BM][BN] into smem.
__device__ __forceinline__ void stage_plain(const TileAcc& acc, bf16* s_out) {
#pragma unroll
  for (int r = 0; r < Config::kBlockN / 2; r += 2)
    *reinterpret_cast<__nv_bfloat162*>(s_out + acc_row(r) * Config::kEpiStride + acc_col(r)) =
        __floats2bfloat162_rn(acc.d[r], acc.d[r + 1]);
}

}  // namespace weave

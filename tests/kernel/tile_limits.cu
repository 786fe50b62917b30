// Experiment: what limits the megakernel's GEMM tile rate? The wgmma mainloop of 128 x 256 x 64 steps on one GPU,
// tiles handed out round-robin (no ticket, no epilogue store), with its operands loaded in different ways:
//   mode 0  A + B by cp.async from all threads (the tile up to this experiment: 16 KB of A + 32 KB of B per step)
//   mode 1  A + half of B by cp.async (the L2 bytes a CTA would read if B were multicast over a 2-CTA cluster)
//   mode 2  A only by cp.async
//   mode 3  nothing loaded (MMAs, barriers and the pipeline's waits alone: the mainloop's own ceiling)
//   mode 4  main's 256-thread tile_mainloop (copied into the legacy namespace below on this branch): A by
//           cp.async, B by two TMA boxes per stage
//   mode 6  a 2-CTA cluster runs two row blocks of the same weight tile: each CTA loads one of the two B boxes
//           and multicasts it to both (half the L2 reads of B per CTA, the same bytes into each SM), a cross-CTA
//           "empty" mbarrier per stage; A by cp.async (what the megakernel could do with CTA-pair tickets)
//   mode 7  warp-specialised: 384 threads, warpgroup 0 = producer (one thread issues A and B by TMA, 4 stages of
//           48 KB, running ahead across tiles), warpgroups 1-2 = consumers (wgmma, release a stage per warpgroup
//           through an "empty" mbarrier); no CTA-wide barrier in the loop
//   mode 8  mode 7 + B multicast over a 2-CTA cluster (each producer loads A and one B box for both CTAs; a
//           stage is refilled once both CTAs' consumers released it)
//   mode 9  mode 7 with 3 stages (what fits beside the megakernel's shared-memory tables)
//   mode 10 mode 7 with A gathered by the 128 producer threads (cp.async per row pointer, completion counted on
//           the stage's full barrier with cp.async.mbarrier.arrive.noinc), as GEMM0's own token rows need
//   mode 11 mode 10 + an epilogue: the consumers keep the tile's last stage, stage the outputs there as bf16 in two
//           128-column halves (272-byte rows) and copy them to C in 16-byte stores (the branch ws-pipeline's)
//   mode 12 mode 11 with the copy-out done by the copy engine (one bulk copy per 256-byte row from one warp, the
//           consumers waiting until the stage has been read)
//   mode 13 mode 8 without the multicast: the same 2-CTA clusters, pairs of row blocks and cross-CTA "empty"
//           barriers (a stage is refilled once both CTAs released it), but each CTA loads all of its own B (tells
//           the cost of the pairs' lock-step from the cost of the multicast itself)
//   mode 14 mode 7 in FP8: A and B e4m3 (random values in [-1, 1]), wgmma m64n256k32 e4m3 x e4m3 -> fp32, 4 per
//           stage, so a 48 KB stage carries 128 of K instead of 64: the same GEMM (FLOPs) as the bf16 modes from half
//           the bytes. Scales would go in the epilogue (per row and per column) and are left out; 128 x 128 block
//           scales would need a second accumulator set (docs/kernel.md, "FP8 experts: what they would buy").
//           Checked against a host product on three tiles (K must be a multiple of 128).
//   mode 15 mode 14 with DeepSeek-style block scales: one fp32 scale per (A row, 128 of K) and per (128 B rows, 128
//           of K). Each consumer warpgroup computes a stage's 64 x 256 in two 64 x 128 halves into a partial
//           accumulator (4 x m64n128k32, starting from zero), waits, and adds it times its rows' and columns' scales
//           to the tile's accumulator (the promotion; the other warpgroup's MMAs run meanwhile). 256 threads, thread
//           0 issuing the TMA loads ahead, so a thread may hold the 128 + 64 accumulators (up to 255 registers;
//           with a producer warpgroup, 168). Checked against a host product with the scales on three tiles.
//   mode 16 mode 15 with a producer warpgroup (384 threads) and setmaxnreg: 40 registers for the producer, 232 for
//           the consumers, so the warpgroups do not wait on each other's releases before their MMAs. Same check.
//   mode 17 the same block scales with one accumulator set, rescaled before each stage by the ratio of the previous
//           stage's scale to this one's (168 registers, no setmaxnreg: what fits the megakernel). Same check.
// for 132, 66 and 16 CTAs (rows a multiple of 128; the 2-CTA modes 6, 8 and 13 need multiples of 256 and are skipped
// otherwise). TL_ZERO_ROWS=z zeros the last z rows of every 128-row block of A (padding rows). Prints TFLOP/s per SM. TL_SUSTAIN=S adds sustained runs (S seconds per mode on 132
// CTAs, modes from TL_SUSTAIN_MODES, default 7,10,11,13,8) with the SM clock and board power read through NVML.
// Modes 0-3 keep a private copy of the old cp.async loader.
// Every mode writes each tile's accumulator sums per thread, which must match mode 0 bit for bit; modes 11 and 12
// must store the same C, every element (poisoned before each run).
// Standalone, not part of the package:
//   nvcc -std=c++17 -gencode=arch=compute_90a,code=sm_90a -O3 -DNDEBUG --expt-relaxed-constexpr \
//        -I weave_kernel/csrc tests/kernel/tile_limits.cu -o tile_limits && ./tile_limits [K [E rows]]
#include <dlfcn.h>
#include <time.h>
#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <vector>

#include <cuda_fp8.h>

#include "tma_host.h"
#include "wgmma.cuh"

using namespace weave;

// (wgmma_m64n256k32_e4m3, mma_stage_e4m3: wgmma.cuh)
// wgmma m64n128k32, e4m3 x e4m3 -> fp32; scale_d 0 starts the accumulators at zero (mode 15's partial sums).
__device__ __forceinline__ void wgmma_m64n128k32_e4m3(float* d, uint64_t desc_a, uint64_t desc_b, int scale_d) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %66, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n128k32.f32.e4m3.e4m3 "
      "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63}, %64, %65, p, 1, 1;\n}\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]), "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]), "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]), "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63])
      : "l"(desc_a), "l"(desc_b), "r"(scale_d));
}

// ---- the 256-thread tile of main (before the warp-specialised pipeline), kept here for modes 0-6 -----------
// Its own constants: 8 warps, 3 stages, the stage barriers right after the stages. The rest of Config (tile and
// stage sizes) is the same in both kernels.
namespace legacy {
struct L {
  static constexpr int kThreads = 256;
  static constexpr int kStages = 3;
  static constexpr int kSmemPipe = kStages * Config::kSmemStage;
  static constexpr int kSmemBarOffset = kSmemPipe;
  static constexpr int kSmemBarBytes = 64;
  static constexpr int kSmemDynamic = kSmemPipe + kSmemBarBytes + 1024;
};
// Lives right after the pipeline stages in dynamic shared memory (L::kSmemBarOffset).
struct PipeBarriers {
  uint64_t full[L::kStages];  // completed once per use of the stage: 32 KB of B landed
  uint32_t phase;                  // bit s: parity of stage s's next completion (thread 0 writes it back)
};
static_assert(sizeof(PipeBarriers) <= L::kSmemBarBytes, "PipeBarriers must fit its smem slot");

__device__ __forceinline__ PipeBarriers* pipe_barriers(uint8_t* smem) {
  return reinterpret_cast<PipeBarriers*>(smem + L::kSmemBarOffset);
}

// Thread 0 once per launch, before any tile; the caller follows with __syncthreads.
__device__ __forceinline__ void init_pipe_barriers(uint8_t* smem) {
  if (threadIdx.x != 0) return;
  PipeBarriers* b = pipe_barriers(smem);
#pragma unroll
  for (int s = 0; s < L::kStages; ++s)
    asm volatile("mbarrier.init.shared::cta.b64 [%0], 1;" ::"r"(smem_u32(&b->full[s])) : "memory");
  b->phase = 0;
  // make the initialised barriers visible to the async proxy (the copy engine completes them)
  asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
  asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
}

// Operands of one tile, resolved once per tile. A: a pointer per A row this thread copies every stage (rows may
// be gathered from different tensors: a GEMM0 block mixes the owner's own token rows, read from x, with received
// rows) and a valid bit per row. B: a 3-D weight tensor map and the (row, z) coordinates of its two boxes; box i
// fills tile rows [kBoxRows i, kBoxRows (i + 1)) at k0 (rows past the tensor's end arrive as zeros).
struct TileOperands {
  static constexpr int kAChunks = C::kBlockM * C::kBlockK / 8 / L::kThreads;  // 4
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
    const int m = (threadIdx.x + i * L::kThreads) >> 3;
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
    const int c = threadIdx.x + i * L::kThreads;
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
  static_assert(Config::kBlockM == 128 && Config::kBlockN == 256 && L::kThreads == 256,
                "wgmma path: two warpgroups x m64n256");
  static_assert(Config::kSmemA % 1024 == 0 && Config::kSmemB % 1024 == 0, "SW128 atoms need 1024-byte bases");
  static_assert(L::kStages == 3, "refill-after-retire order assumes 3 stages");
  const int wg = threadIdx.x / 128;
  PipeBarriers* bars = pipe_barriers(smem);
  uint32_t phase = bars->phase;  // written back by thread 0 before the previous tile's closing __syncthreads
#pragma unroll
  for (int i = 0; i < Config::kBlockN / 2; ++i) acc.d[i] = 0.f;
  const int num_k = K / Config::kBlockK;
  fence_proxy_async_smem();  // this thread's generic smem accesses (last epilogue) before the TMA writes below
  __syncthreads();
#pragma unroll
  for (int s = 0; s < L::kStages - 1; ++s) {
    if (s < num_k) {
      if (threadIdx.x == 0) issue_stage_b(op, smem, s, s * Config::kBlockK);
      load_stage_a(op, smem, s, s * Config::kBlockK);
    }
    cp_async_commit();
  }
  const uint32_t smem_base = smem_u32(smem);
  for (int kt = 0; kt < num_k; ++kt) {
    const int st = kt % L::kStages;
    cp_async_wait<L::kStages - 2>();  // stage kt's A landed (this thread's copies)
    fence_proxy_async_smem();              // cp.async wrote through the generic proxy; wgmma reads via async
    mbar_wait(p, &bars->full[st], (phase >> st) & 1u, st, kt);  // stage kt's B landed
    phase ^= 1u << st;
    __syncthreads();                       // ... and every thread's A copies landed
    const uint32_t sa = smem_base + st * Config::kSmemStage + wg * 64 * 128;
    const uint32_t sb = smem_base + st * Config::kSmemStage + Config::kSmemA;
    mma_stage(acc, sa, sb);
    wgmma_wait<1>();  // the MMAs of stage kt-1 retired; those of stage kt keep running
    __syncthreads();  // both warpgroups are done with stage kt-1: refill it
    const int next = kt + L::kStages - 1;
    if (next < num_k) {
      if (threadIdx.x == 0) issue_stage_b(op, smem, next % L::kStages, next * Config::kBlockK);
      load_stage_a(op, smem, next % L::kStages, next * Config::kBlockK);
    }
    cp_async_commit();
  }
  wgmma_wait<0>();
  cp_async_wait<0>();
  if (threadIdx.x == 0) bars->phase = phase;
  __syncthreads();
}

}  // namespace legacy
using legacy::L;
using legacy::init_pipe_barriers;
using legacy::plain_tile_operands;
using legacy::tile_mainloop;
using legacy::TileOperands;
using legacy::load_stage_a;

// The cp.async-only operands of modes 0-3: B chunk i of this thread is weight row n0 + 32 i.
struct OldOperands {
  const bf16* a_row[4];
  const bf16* b_base;
  int32_t b_off0, b_step, b_hi;
  uint32_t valid;  // bit i: A chunk i; bit 4 + i: B chunk i
  __device__ __forceinline__ int32_t b_off(int i) const { return b_off0 + (i & 3) * b_step + (i >> 2) * b_hi; }
};

__device__ __forceinline__ OldOperands old_operands(const bf16* a_rows, const bf16* b, int K, int col) {
  OldOperands op;
  op.valid = 0;
  for (int i = 0; i < 4; ++i) {
    op.a_row[i] = a_rows + static_cast<int64_t>((threadIdx.x + i * L::kThreads) >> 3) * K;
    op.valid |= 1u << i;
  }
  op.b_base = b;
  const int n0 = col * C::kBlockN + (threadIdx.x >> 3);
  op.b_off0 = n0 * K;
  op.b_step = 32 * K;
  op.b_hi = 128 * K;
  op.valid |= 0xFFu << 4;
  return op;
}

template <int MODE>
__device__ __forceinline__ void load_stage_mode(const OldOperands& op, uint8_t* smem, int stage, int k0) {
  uint8_t* sa = smem + stage * C::kSmemStage;
  uint8_t* sb = sa + C::kSmemA;
  if (MODE <= 2) {
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const int c = threadIdx.x + i * L::kThreads;
      const int row = c >> 3, chunk = c & 7;
      const bool ok = (op.valid >> i) & 1u;
      cp_async_16(smem_u32(sa + swz(row, chunk)), op.a_row[i] + (ok ? k0 + chunk * 8 : 0), ok);
    }
  }
  if (MODE <= 1) {
    constexpr int kB = MODE == 0 ? 8 : 4;
#pragma unroll
    for (int i = 0; i < kB; ++i) {
      const int c = threadIdx.x + i * L::kThreads;
      const int row = c >> 3, chunk = c & 7;
      const bool ok = (op.valid >> (4 + i)) & 1u;
      cp_async_16(smem_u32(sb + swz(row, chunk)), op.b_base + (ok ? op.b_off(i) + k0 + chunk * 8 : 0), ok);
    }
  }
}

// tile_mainloop with load_stage_mode<MODE> (same order of waits, fences and barriers)
template <int MODE>
__device__ __forceinline__ void mainloop_mode(const OldOperands& op, int K, uint8_t* smem, TileAcc& acc) {
  const int wg = threadIdx.x / 128;
#pragma unroll
  for (int i = 0; i < C::kBlockN / 2; ++i) acc.d[i] = 0.f;
  const int num_k = K / C::kBlockK;
#pragma unroll
  for (int s = 0; s < L::kStages - 1; ++s) {
    if (s < num_k) load_stage_mode<MODE>(op, smem, s, s * C::kBlockK);
    cp_async_commit();
  }
  const uint32_t smem_base = smem_u32(smem);
  for (int kt = 0; kt < num_k; ++kt) {
    cp_async_wait<L::kStages - 2>();
    fence_proxy_async_smem();
    __syncthreads();
    const uint32_t sa = smem_base + (kt % L::kStages) * C::kSmemStage + wg * 64 * 128;
    const uint32_t sb = smem_base + (kt % L::kStages) * C::kSmemStage + C::kSmemA;
    mma_stage(acc, sa, sb);
    wgmma_wait<1>();
    __syncthreads();
    const int next = kt + L::kStages - 1;
    if (next < num_k) load_stage_mode<MODE>(op, smem, next % L::kStages, next * C::kBlockK);
    cp_async_commit();
  }
  wgmma_wait<0>();
  cp_async_wait<0>();
  __syncthreads();
}

template <int MODE>
__global__ void __launch_bounds__(256, 1)
    tiles_kernel(const bf16* a, const bf16* b, float* sink, int E, int rows, int N, int K, unsigned long long* t,
                 const __grid_constant__ Params p, const __grid_constant__ TensorMapBytes b_map) {
  extern __shared__ __align__(1024) uint8_t raw[];
  uint8_t* smem = raw + ((1024u - (smem_u32(raw) & 1023u)) & 1023u);
  init_pipe_barriers(smem);
  __syncthreads();
  const int nrb = rows / C::kBlockM, ncb = N / C::kBlockN, per_e = nrb * ncb, total = E * per_e;
  unsigned long long t0;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t0));
  for (int tile = blockIdx.x; tile < total; tile += gridDim.x) {
    const int e = tile / per_e, off = tile % per_e, rb = off % nrb, cb = off / nrb;
    const bf16* a_rows = a + (static_cast<int64_t>(e) * rows + rb * C::kBlockM) * K;
    TileAcc acc;
    if constexpr (MODE == 4) {
      tile_mainloop(p, plain_tile_operands(a_rows, &b_map, e, C::kBlockM, K, cb), K, smem, acc);
    } else {
      mainloop_mode<MODE>(old_operands(a_rows, b + static_cast<int64_t>(e) * N * K, K, cb), K, smem, acc);
    }
    float keep = 0.f;
#pragma unroll
    for (int i = 0; i < C::kBlockN / 2; ++i) keep += acc.d[i];
    sink[static_cast<int64_t>(tile) * blockDim.x + threadIdx.x] = keep;  // keeps the MMAs alive; compared
  }
  unsigned long long t1;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t1));
  if (threadIdx.x == 0) {
    t[2 * blockIdx.x] = t0;
    t[2 * blockIdx.x + 1] = t1;
  }
}

// ---- mode 6: weight-tile multicast over a 2-CTA cluster -------------------------------------------------
__device__ __forceinline__ uint32_t cluster_rank() {
  uint32_t r;
  asm volatile("mov.u32 %0, %%cluster_ctarank;" : "=r"(r));
  return r;
}
__device__ __forceinline__ void cluster_sync_all() {
  asm volatile("barrier.cluster.arrive.release.aligned;\nbarrier.cluster.wait.acquire.aligned;" ::: "memory");
}
// arrive on the barrier at the same smem offset in CTA `rank` of this cluster (this CTA or its peer)
// TL_CTA_SCOPE=1: the arrive (and the producer's wait on the "empty" barriers, modes 8 and 13) at the default CTA
// scope, as CUTLASS's ClusterBarrier does, instead of release / acquire at cluster scope
#ifndef TL_CLUSTER7
#define TL_CLUSTER7 0
#endif
#ifndef TL_CTA_SCOPE
#define TL_CTA_SCOPE 0
#endif
__device__ __forceinline__ void arrive_cluster(uint64_t* bar, uint32_t rank) {
  uint32_t remote;
  asm volatile("mapa.shared::cluster.u32 %0, %1, %2;" : "=r"(remote) : "r"(smem_u32(bar)), "r"(rank));
  if (TL_CTA_SCOPE)
    asm volatile("mbarrier.arrive.shared::cluster.b64 _, [%0];" ::"r"(remote) : "memory");
  else
    asm volatile("mbarrier.arrive.release.cluster.shared::cluster.b64 _, [%0];" ::"r"(remote) : "memory");
}
__device__ __forceinline__ void tma_load_3d_multicast(uint32_t dst, const void* map, uint64_t* bar, int x, int y, int z,
                                                      uint16_t mask) {
  asm volatile(
      "cp.async.bulk.tensor.3d.shared::cluster.global.tile.mbarrier::complete_tx::bytes.multicast::cluster "
      "[%0], [%1, {%3, %4, %5}], [%2], %6;" ::"r"(dst),
      "l"(reinterpret_cast<uint64_t>(map)), "r"(smem_u32(bar)), "r"(x), "r"(y), "r"(z), "h"(mask)
      : "memory");
}

struct McPipe {
  uint64_t* full;   // [kStages], 1 arrival (own expect_tx) + 32 KB from both CTAs' multicasts
  uint64_t* empty;  // [kStages], 2 arrivals: both CTAs retired the stage's MMAs
  uint32_t started;  // thread 0: bit s once stage s was filled (its later fills wait for both releases)
  uint32_t epar;     // thread 0: bit s = parity of stage s's next "empty" completion
  uint32_t fpar;     // every thread: bit s = parity of stage s's next "full" completion
};

// Thread 0 of CTA `rank`: fill stage s's B with box `rank` of the weight tile, multicast to both CTAs.
__device__ __forceinline__ void mc_issue_b(const Params& p, McPipe& mp, uint8_t* smem, const void* b_map, int s, int k0,
                                           int y0, int z, uint32_t rank) {
  if ((mp.started >> s) & 1u) {  // both CTAs released its previous use
    mbar_wait<true>(p, &mp.empty[s], (mp.epar >> s) & 1u, 100 + s, -1);
    mp.epar ^= 1u << s;
  }
  mp.started |= 1u << s;
  mbar_arrive_expect_tx(&mp.full[s], C::kSmemB);  // both boxes land here: one from each CTA
  const uint32_t sb = smem_u32(smem + s * C::kSmemStage + C::kSmemA) + rank * C::kBoxRows * 128;
  tma_load_3d_multicast(sb, b_map, &mp.full[s], k0, y0 + static_cast<int>(rank) * C::kBoxRows, z, 0x3);
}

__device__ __forceinline__ void mc_release(McPipe& mp, int s) {
  arrive_cluster(&mp.empty[s], 0);
  arrive_cluster(&mp.empty[s], 1);
}

__device__ __forceinline__ void mc_mainloop(const Params& p, McPipe& mp, const TileOperands& op, const void* b_map, int y0,
                                            int z, int K, uint8_t* smem, TileAcc& acc, uint32_t rank) {
  const int wg = threadIdx.x / 128;
#pragma unroll
  for (int i = 0; i < C::kBlockN / 2; ++i) acc.d[i] = 0.f;
  const int num_k = K / C::kBlockK;
#pragma unroll
  for (int s = 0; s < L::kStages - 1; ++s) {
    if (s < num_k) {
      if (threadIdx.x == 0) mc_issue_b(p, mp, smem, b_map, s, s * C::kBlockK, y0, z, rank);
      load_stage_a(op, smem, s, s * C::kBlockK);
    }
    cp_async_commit();
  }
  const uint32_t smem_base = smem_u32(smem);
  for (int kt = 0; kt < num_k; ++kt) {
    const int st = kt % L::kStages;
    cp_async_wait<L::kStages - 2>();
    fence_proxy_async_smem();
    mbar_wait(p, &mp.full[st], (mp.fpar >> st) & 1u, st, kt);
    mp.fpar ^= 1u << st;
    __syncthreads();
    const uint32_t sa = smem_base + st * C::kSmemStage + wg * 64 * 128;
    const uint32_t sb = smem_base + st * C::kSmemStage + C::kSmemA;
    mma_stage(acc, sa, sb);
    wgmma_wait<1>();
    __syncthreads();
    if (kt > 0 && threadIdx.x == 0) mc_release(mp, (kt - 1) % L::kStages);
    const int next = kt + L::kStages - 1;
    if (next < num_k) {
      if (threadIdx.x == 0) mc_issue_b(p, mp, smem, b_map, next % L::kStages, next * C::kBlockK, y0, z, rank);
      load_stage_a(op, smem, next % L::kStages, next * C::kBlockK);
    }
    cp_async_commit();
  }
  wgmma_wait<0>();
  cp_async_wait<0>();
  __syncthreads();
  if (threadIdx.x == 0) mc_release(mp, (num_k - 1) % L::kStages);
}

__global__ void __launch_bounds__(256, 1)
    tiles_kernel_mc(const bf16* a, float* sink, int E, int rows, int N, int K, unsigned long long* t,
                    const __grid_constant__ Params p, const __grid_constant__ TensorMapBytes b_map) {
  extern __shared__ __align__(1024) uint8_t raw[];
  uint8_t* smem = raw + ((1024u - (smem_u32(raw) & 1023u)) & 1023u);
  const uint32_t rank = cluster_rank();
  McPipe mp;
  mp.full = reinterpret_cast<uint64_t*>(smem + L::kSmemBarOffset);
  mp.empty = mp.full + L::kStages;
  static_assert(2 * L::kStages * 8 <= L::kSmemBarBytes, "barriers fit their slot");
  mp.started = mp.epar = mp.fpar = 0;
  if (threadIdx.x == 0) {
    for (int s = 0; s < L::kStages; ++s) {
      asm volatile("mbarrier.init.shared::cta.b64 [%0], 1;" ::"r"(smem_u32(&mp.full[s])) : "memory");
      asm volatile("mbarrier.init.shared::cta.b64 [%0], 2;" ::"r"(smem_u32(&mp.empty[s])) : "memory");
    }
    asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
  }
  cluster_sync_all();  // the peer's barriers exist before any multicast or remote arrive
  const int nrb = rows / C::kBlockM, ncb = N / C::kBlockN, per_e = nrb * ncb;
  const int pairs_per_e = (nrb / 2) * ncb, total_pairs = E * pairs_per_e;
  const int cluster = blockIdx.x / 2, num_clusters = gridDim.x / 2;
  unsigned long long t0;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t0));
  for (int pt = cluster; pt < total_pairs; pt += num_clusters) {
    const int e = pt / pairs_per_e, off = pt % pairs_per_e, q = off % (nrb / 2), cb = off / (nrb / 2);
    const int rb = 2 * q + static_cast<int>(rank);
    const TileOperands op = plain_tile_operands(a + (static_cast<int64_t>(e) * rows + rb * C::kBlockM) * K, &b_map, e,
                                                C::kBlockM, K, cb);
    TileAcc acc;
    mc_mainloop(p, mp, op, &b_map, cb * C::kBlockN, e, K, smem, acc, rank);
    float keep = 0.f;
#pragma unroll
    for (int i = 0; i < C::kBlockN / 2; ++i) keep += acc.d[i];
    const int tile = e * per_e + cb * nrb + rb;
    sink[static_cast<int64_t>(tile) * blockDim.x + threadIdx.x] = keep;
  }
  unsigned long long t1;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t1));
  if (threadIdx.x == 0) {
    t[2 * blockIdx.x] = t0;
    t[2 * blockIdx.x + 1] = t1;
  }
  cluster_sync_all();  // no CTA leaves while its peer may still arrive on its barriers
}


// ---- modes 7 / 8: warp-specialised producer / consumers ----------------------------------------------------
constexpr int kWsThreads = 384;
constexpr int ws_smem(int stages) { return stages * C::kSmemStage + 2 * stages * 8 + 1024; }

// (named_sync: gemm_common.cuh's, through wgmma.cuh)

// Mode 11's epilogue, in the shape the megakernel's warp-specialised branch used: the tile's last stage is held,
// the accumulators go into it as bf16 (128 x 128 halves, 272-byte rows) and are copied out in 16-byte stores.
template <int kHalf>
__device__ __forceinline__ void ws_stage_half(const TileAcc& acc, uint8_t* st, int ct) {
  const int row = (ct / 128) * 64 + ((ct / 32) % 4) * 16 + ((ct & 31) >> 2);
#pragma unroll
  for (int r = 64 * kHalf; r < 64 * kHalf + 64; r += 2) {
    const int rr = row + (((r & 3) >> 1) << 3), col = (r >> 2) * 8 + ((ct & 3) << 1) - 128 * kHalf;
    *reinterpret_cast<__nv_bfloat162*>(st + rr * 272 + col * 2) = __floats2bfloat162_rn(acc.d[r], acc.d[r + 1]);
  }
}
__device__ __forceinline__ void ws_copy_half(const uint8_t* st, bf16* out, int ld, int ct) {
  for (int c = ct; c < 128 * 16; c += 256) {
    const int m = c / 16, ch = c % 16;
    *reinterpret_cast<int4*>(out + static_cast<int64_t>(m) * ld + ch * 8) =
        *reinterpret_cast<const int4*>(st + m * 272 + ch * 16);
  }
}

// Mode 12: the same halves copied out by the copy engine (one bulk copy per 256-byte row, issued by one warp),
// the consumers waiting only until the engine has read the stage.
__device__ __forceinline__ void ws_bulk_half(uint8_t* st, bf16* out, int ld, int ct) {
  if (ct < 32) {
    for (int m = ct; m < 128; m += 32)
      asm volatile("cp.async.bulk.global.shared::cta.bulk_group [%0], [%1], 256;" ::"l"(out + static_cast<int64_t>(m) * ld),
                   "r"(smem_u32(st + m * 272))
                   : "memory");
    asm volatile("cp.async.bulk.commit_group;" ::: "memory");
    asm volatile("cp.async.bulk.wait_group.read 0;" ::: "memory");
  }
}

template <bool MC, int kWsStages, bool GATHER, int EPI = 0, bool LOCK = MC, bool F8 = false>
__global__ void __launch_bounds__(kWsThreads, 1)
    tiles_kernel_ws(const bf16* a_base, float* sink, int E, int rows, int N, int K, unsigned long long* t,
                    const __grid_constant__ Params p, const __grid_constant__ TensorMapBytes a_map,
                    const __grid_constant__ TensorMapBytes b_map, bf16* out = nullptr) {
  extern __shared__ __align__(1024) uint8_t raw[];
  uint8_t* smem = raw + ((1024u - (smem_u32(raw) & 1023u)) & 1023u);
  uint64_t* full = reinterpret_cast<uint64_t*>(smem + kWsStages * C::kSmemStage);
  uint64_t* empty = full + kWsStages;
  constexpr bool PAIRED = MC || LOCK;  // 2-CTA clusters in lock-step (mode 8 with multicast, mode 13 without)
  const uint32_t rank = PAIRED ? cluster_rank() : 0u;
  if (threadIdx.x == 0) {
    for (int s = 0; s < kWsStages; ++s) {
      // full: the TMA thread's expect_tx arrive, plus (GATHER) one cp.async completion arrive per producer thread
      asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" ::"r"(smem_u32(&full[s])), "r"(GATHER ? 129 : 1)
                   : "memory");
      asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" ::"r"(smem_u32(&empty[s])), "r"(PAIRED ? 4 : 2)
                   : "memory");
    }
    asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
  }
  if constexpr (PAIRED) cluster_sync_all(); else __syncthreads();
  const int nrb = rows / C::kBlockM, ncb = N / C::kBlockN, per_e = nrb * ncb, num_k = K / C::kBlockK;
  // work units: tiles (mode 7) or pairs of row blocks sharing a weight tile (mode 8)
  const int unit_rows = PAIRED ? 2 : 1;
  const int units_per_e = (nrb / unit_rows) * ncb, total_units = E * units_per_e;
  const int unit0 = PAIRED ? static_cast<int>(blockIdx.x) / 2 : static_cast<int>(blockIdx.x);
  const int unit_step = PAIRED ? static_cast<int>(gridDim.x) / 2 : static_cast<int>(gridDim.x);
  auto unit_tile = [&](int u, int* e, int* rb, int* cb) {
    *e = u / units_per_e;
    const int off = u % units_per_e, q = off % (nrb / unit_rows);
    *cb = off / (nrb / unit_rows);
    *rb = q * unit_rows + static_cast<int>(rank);
  };
  unsigned long long t0;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t0));
  const int wg = threadIdx.x / 128;
  if (wg == 0) {
    if (GATHER || threadIdx.x == 0) {  // producer: thread 0 (TMA), or all 128 threads (A gather + TMA of B)
      int it = 0;
      for (int u = unit0; u < total_units; u += unit_step) {
        int e, rb, cb;
        unit_tile(u, &e, &rb, &cb);
        // GATHER: chunk c = tid + 128 i (i < 8) of the 128 x 8 chunks of an A stage, i.e. row c / 8, 16-byte chunk
        // c % 8, through one pointer per row (8 neighbouring threads read one row's 128 bytes: coalesced)
        const bf16* a_row[8];
#pragma unroll
        for (int i = 0; i < 8; ++i)
          a_row[i] = a_base + (static_cast<int64_t>(e) * rows + rb * C::kBlockM + ((threadIdx.x + 128 * i) >> 3)) * K;
        for (int k = 0; k < num_k; ++k, ++it) {
          const int s = it % kWsStages;
          if (it >= kWsStages) {
            mbar_wait<PAIRED && !TL_CTA_SCOPE>(p, &empty[s], ((it / kWsStages) - 1) & 1, 200 + s, k);
          }
          const uint32_t sa = smem_u32(smem + s * C::kSmemStage), sb = sa + C::kSmemA;
          if constexpr (GATHER) {
#pragma unroll
            for (int i = 0; i < 8; ++i) {
              const int c = threadIdx.x + 128 * i;
              cp_async_16(sa + swz(c >> 3, c & 7), a_row[i] + k * C::kBlockK + (c & 7) * 8, true);
            }
            asm volatile("cp.async.mbarrier.arrive.noinc.shared::cta.b64 [%0];" ::"r"(smem_u32(&full[s]))
                         : "memory");
            if (threadIdx.x != 0) continue;
            mbar_arrive_expect_tx(&full[s], C::kSmemB);
          } else {
            mbar_arrive_expect_tx(&full[s], C::kSmemA + C::kSmemB);
            tma_load_3d(sa, &a_map, &full[s], k * C::kBlockK, e * rows + rb * C::kBlockM, 0);
          }
          if constexpr (MC) {
            tma_load_3d_multicast(sb + rank * C::kBoxRows * 128, &b_map, &full[s], k * C::kBlockK,
                                  cb * C::kBlockN + static_cast<int>(rank) * C::kBoxRows, e, 0x3);
          } else {
            tma_load_3d(sb, &b_map, &full[s], k * C::kBlockK, cb * C::kBlockN, e);
            tma_load_3d(sb + C::kBoxRows * 128, &b_map, &full[s], k * C::kBlockK, cb * C::kBlockN + C::kBoxRows, e);
          }
        }
      }
    }
  } else {  // consumers: warpgroup cw owns rows [64 cw, 64 cw + 64)
    const int cw = wg - 1;
    const int ct = threadIdx.x - 128;  // 0..255, the accumulator layout of mode 0's thread ct
    auto release = [&](int s) {
      named_sync(1 + cw, 128);  // every warp of this warpgroup retired the stage's MMAs
      if (threadIdx.x % 128 == 0) {
        if constexpr (PAIRED) {
          arrive_cluster(&empty[s], 0);
          arrive_cluster(&empty[s], 1);
        } else {
          asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];" ::"r"(smem_u32(&empty[s])) : "memory");
        }
      }
    };
    int it = 0;
    for (int u = unit0; u < total_units; u += unit_step) {
      int e, rb, cb;
      unit_tile(u, &e, &rb, &cb);
      TileAcc acc;
#pragma unroll
      for (int i = 0; i < C::kBlockN / 2; ++i) acc.d[i] = 0.f;
      for (int k = 0; k < num_k; ++k, ++it) {
        const int s = it % kWsStages;
        mbar_wait(p, &full[s], (it / kWsStages) & 1, s, k);
        if constexpr (GATHER) fence_proxy_async_smem();  // A was written by cp.async (generic proxy)
        const uint32_t sa = smem_u32(smem + s * C::kSmemStage) + cw * 64 * 128, sb = smem_u32(smem + s * C::kSmemStage) + C::kSmemA;
        if constexpr (F8) mma_stage_e4m3(acc, sa, sb); else mma_stage(acc, sa, sb);
        wgmma_wait<1>();
        if (k > 0) release((it - 1) % kWsStages);
      }
      wgmma_wait<0>();
      if constexpr (EPI) {
        uint8_t* st = smem + ((it - 1) % kWsStages) * C::kSmemStage;
        bf16* o = out + (static_cast<int64_t>(e) * rows + rb * C::kBlockM) * N + cb * C::kBlockN;
        fence_proxy_async_smem();
        named_sync(3, 256);  // both warpgroups' MMAs are done with the held stage
        ws_stage_half<0>(acc, st, ct);
        if (EPI == 2) fence_proxy_async_smem();  // generic writes before the copy engine reads them
        named_sync(3, 256);
        if (EPI == 1) ws_copy_half(st, o, N, ct); else ws_bulk_half(st, o, N, ct);
        named_sync(3, 256);
        ws_stage_half<1>(acc, st, ct);
        if (EPI == 2) fence_proxy_async_smem();
        named_sync(3, 256);
        if (EPI == 1) ws_copy_half(st, o + 128, N, ct); else ws_bulk_half(st, o + 128, N, ct);
        named_sync(3, 256);
        fence_proxy_async_smem();
      }
      release((it - 1) % kWsStages);
      float keep = 0.f;
#pragma unroll
      for (int i = 0; i < C::kBlockN / 2; ++i) keep += acc.d[i];
      sink[(static_cast<int64_t>(e) * per_e + cb * nrb + rb) * 256 + ct] = keep;
    }
  }
  if constexpr (PAIRED) cluster_sync_all(); else __syncthreads();  // the consumers are done
  unsigned long long t1;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t1));
  if (threadIdx.x == 0) {
    t[2 * blockIdx.x] = t0;
    t[2 * blockIdx.x + 1] = t1;
  }
}

// One 128-of-K stage of a block-scaled FP8 tile (modes 15 and 16), consumer warpgroup cw (thread ct of the 256
// consumers): wait for the stage, compute it in two 64 x 128 halves into a partial accumulator starting from zero,
// release the stage once both halves have read it, and add each half times its rows' (a0: row0, a1: row0 + 8) and
// columns' (b0: tile columns [0, 128), b1: [128, 256)) scales to the tile's accumulator.
__device__ __forceinline__ void f8_scaled_stage(TileAcc& acc, const Params& p, uint8_t* smem, uint64_t* full,
                                                uint64_t* empty, int s, uint32_t parity, int k, int cw, int ct, float a0,
                                                float a1, float b0, float b1) {
  mbar_wait(p, &full[s], parity, s, k);
  const uint32_t sa = smem_u32(smem + s * C::kSmemStage) + cw * 64 * 128;
  const uint32_t sb = smem_u32(smem + s * C::kSmemStage) + C::kSmemA;
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    float part[64];
    wgmma_fence();
#pragma unroll
    for (int kk = 0; kk < 4; ++kk)
      wgmma_m64n128k32_e4m3(part, wgmma_desc_sw128(sa + kk * 32), wgmma_desc_sw128(sb + h * 128 * 128 + kk * 32),
                            kk > 0);
    wgmma_commit();
    wgmma_wait<0>();
#pragma unroll
    for (int i = 0; i < 64; ++i) asm volatile("" : "+f"(part[i])::"memory");
    if (h == 1) {  // both halves have read the stage: release it
      asm volatile("bar.sync %0, 128;" ::"r"(1 + cw) : "memory");
      if (ct % 128 == 0) asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];" ::"r"(smem_u32(&empty[s])) : "memory");
    }
    const float bs = h ? b1 : b0;
    const float s0 = a0 * bs, s1 = a1 * bs;
#pragma unroll
    for (int i = 0; i < 64; ++i)  // n128 element i is the tile's accumulator 64 h + i (same row, column + 128 h)
      acc.d[64 * h + i] += part[i] * (((i & 3) >> 1) ? s1 : s0);
  }
}

// Modes 15-17: thread 0 initialises the stages' full (one arrival: the TMA thread's) and empty (one per consumer
// warpgroup) barriers; every thread then waits at the CTA barrier.
template <int kStages>
__device__ __forceinline__ void f8_init_barriers(uint64_t* full, uint64_t* empty) {
  if (threadIdx.x == 0) {
    for (int s = 0; s < kStages; ++s) {
      asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" ::"r"(smem_u32(&full[s])), "r"(1) : "memory");
      asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" ::"r"(smem_u32(&empty[s])), "r"(2) : "memory");
    }
    asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
  }
  __syncthreads();
}

// Modes 16-17: the producer warpgroup's thread 0 loads every k step of this CTA's tiles by TMA, kStages ahead.
template <int kStages>
__device__ __forceinline__ void f8_produce_all(const Params& p, uint8_t* smem, uint64_t* full, uint64_t* empty,
                                               const TensorMapBytes& a_map, const TensorMapBytes& b_map, int rows,
                                               int total, int per_e, int nrb, int num_k) {
  if (threadIdx.x != 0) return;
  int it = 0;
  for (int u = blockIdx.x; u < total; u += gridDim.x) {
    const int e = u / per_e, cb = (u % per_e) / nrb, rb = u % nrb;
    for (int k = 0; k < num_k; ++k, ++it) {
      const int s = it % kStages;
      if (it >= kStages) mbar_wait(p, &empty[s], ((it / kStages) - 1) & 1, 200 + s, k);
      const uint32_t sa = smem_u32(smem + s * C::kSmemStage), sb = sa + C::kSmemA;
      mbar_arrive_expect_tx(&full[s], C::kSmemA + C::kSmemB);
      tma_load_3d(sa, &a_map, &full[s], k * C::kBlockK, e * rows + rb * C::kBlockM, 0);
      tma_load_3d(sb, &b_map, &full[s], k * C::kBlockK, cb * C::kBlockN, e);
      tma_load_3d(sb + C::kBoxRows * 128, &b_map, &full[s], k * C::kBlockK, cb * C::kBlockN + C::kBoxRows, e);
    }
  }
}

// ---- mode 15: FP8 with 128 x 128 block scales (promotion per 128 of K) -------------------------------------
// 256 threads, no producer warpgroup: thread 0 keeps the TMA loads kStages - 1 iterations ahead of the one its
// warpgroup consumes (it waits on the oldest stage's "empty" barrier, i.e. for the other warpgroup too). With 8 warps
// a warp may hold up to 255 registers (a ninth warp would put three on one SM sub-partition: 168 at most).
constexpr int kF8sThreads = 256;

template <int kStages>
__global__ void __launch_bounds__(kF8sThreads, 1)
    tiles_kernel_f8_scaled(float* sink, int E, int rows, int N, int K8, const float* a_scale, const float* b_scale,
                           unsigned long long* t, const __grid_constant__ Params p,
                           const __grid_constant__ TensorMapBytes a_map, const __grid_constant__ TensorMapBytes b_map) {
  // K8: K in e4m3 elements (= bytes); the maps see rows of K8 / 2 bf16, a box of 64 "bf16" is 128 of K
  extern __shared__ __align__(1024) uint8_t raw[];
  uint8_t* smem = raw + ((1024u - (smem_u32(raw) & 1023u)) & 1023u);
  uint64_t* full = reinterpret_cast<uint64_t*>(smem + kStages * C::kSmemStage);
  uint64_t* empty = full + kStages;
  f8_init_barriers<kStages>(full, empty);
  const int nrb = rows / C::kBlockM, ncb = N / C::kBlockN, per_e = nrb * ncb, num_k = K8 / 128, kb_n = K8 / 128;
  const int total = E * per_e;
  const int my_units = total > static_cast<int>(blockIdx.x) ? (total - 1 - blockIdx.x) / gridDim.x + 1 : 0;
  const int total_it = my_units * num_k;
  unsigned long long t0;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t0));
  int pit = 0;  // thread 0: the next iteration whose operands it loads
  auto produce = [&](int upto) {
    for (; pit < upto && pit < total_it; ++pit) {
      const int s = pit % kStages, u = blockIdx.x + (pit / num_k) * gridDim.x, k = pit % num_k;
      const int e = u / per_e, cb = (u % per_e) / nrb, rb = u % nrb;
      if (pit >= kStages) mbar_wait(p, &empty[s], ((pit / kStages) - 1) & 1, 200 + s, k);
      const uint32_t sa = smem_u32(smem + s * C::kSmemStage), sb = sa + C::kSmemA;
      mbar_arrive_expect_tx(&full[s], C::kSmemA + C::kSmemB);
      tma_load_3d(sa, &a_map, &full[s], k * C::kBlockK, e * rows + rb * C::kBlockM, 0);
      tma_load_3d(sb, &b_map, &full[s], k * C::kBlockK, cb * C::kBlockN, e);
      tma_load_3d(sb + C::kBoxRows * 128, &b_map, &full[s], k * C::kBlockK, cb * C::kBlockN + C::kBoxRows, e);
    }
  };
  const int warp = threadIdx.x / 32, cw = warp / 4, ct = threadIdx.x;  // warpgroup cw: rows [64 cw, 64 cw + 64)
  const int row0 = cw * 64 + (warp % 4) * 16 + ((ct & 31) >> 2);     // the thread's rows: row0 and row0 + 8
  if (threadIdx.x == 0) produce(kStages - 1);
  int it = 0;
  for (int u = blockIdx.x; u < total; u += gridDim.x) {
    const int e = u / per_e, cb = (u % per_e) / nrb, rb = u % nrb;
    const float* sa_row = a_scale + (static_cast<int64_t>(e) * rows + rb * C::kBlockM + row0) * kb_n;
    const float* sb_col = b_scale + (static_cast<int64_t>(e) * (N / 128) + cb * 2) * kb_n;
    TileAcc acc;
#pragma unroll
    for (int i = 0; i < C::kBlockN / 2; ++i) acc.d[i] = 0.f;
    for (int k = 0; k < num_k; ++k, ++it) {
      if (threadIdx.x == 0) produce(it + kStages);  // waits for both warpgroups to have released iteration it - 1
      const int s = it % kStages;
      const float a0 = sa_row[k], a1 = sa_row[8 * kb_n + k];  // rows row0, row0 + 8
      const float b0 = sb_col[k], b1 = sb_col[kb_n + k];      // columns [0, 128), [128, 256) of the tile
      f8_scaled_stage(acc, p, smem, full, empty, s, (it / kStages) & 1, k, cw, ct, a0, a1, b0, b1);
    }
    float keep = 0.f;
#pragma unroll
    for (int i = 0; i < C::kBlockN / 2; ++i) keep += acc.d[i];
    sink[(static_cast<int64_t>(e) * per_e + cb * nrb + rb) * 256 + ct] = keep;
  }
  __syncthreads();
  unsigned long long t1;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t1));
  if (threadIdx.x == 0) {
    t[2 * blockIdx.x] = t0;
    t[2 * blockIdx.x + 1] = t1;
  }
}

// ---- mode 16: mode 15 with a producer warpgroup and setmaxnreg (40 registers for it, 232 for the consumers) ----
// The consumers no longer issue the loads, so neither waits for the other's release before its own MMAs.
constexpr int kF8pThreads = 384;

template <int kStages>
__global__ void __launch_bounds__(kF8pThreads, 1)
    tiles_kernel_f8_scaled_ws(float* sink, int E, int rows, int N, int K8, const float* a_scale, const float* b_scale,
                              unsigned long long* t, const __grid_constant__ Params p,
                              const __grid_constant__ TensorMapBytes a_map, const __grid_constant__ TensorMapBytes b_map) {
  extern __shared__ __align__(1024) uint8_t raw[];
  uint8_t* smem = raw + ((1024u - (smem_u32(raw) & 1023u)) & 1023u);
  uint64_t* full = reinterpret_cast<uint64_t*>(smem + kStages * C::kSmemStage);
  uint64_t* empty = full + kStages;
  f8_init_barriers<kStages>(full, empty);
  const int nrb = rows / C::kBlockM, ncb = N / C::kBlockN, per_e = nrb * ncb, num_k = K8 / 128, kb_n = K8 / 128;
  const int total = E * per_e;
  unsigned long long t0;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t0));
  const int wg = threadIdx.x / 128;
  if (wg == 0) {
    asm volatile("setmaxnreg.dec.sync.aligned.u32 40;" ::: "memory");
    f8_produce_all<kStages>(p, smem, full, empty, a_map, b_map, rows, total, per_e, nrb, num_k);
  } else {
    asm volatile("setmaxnreg.inc.sync.aligned.u32 232;" ::: "memory");
    const int cw = wg - 1, ct = threadIdx.x - 128;  // consumer warpgroup cw: rows [64 cw, 64 cw + 64)
    const int row0 = cw * 64 + ((ct / 32) % 4) * 16 + ((ct & 31) >> 2);  // the thread's rows: row0 and row0 + 8
    int it = 0;
    for (int u = blockIdx.x; u < total; u += gridDim.x) {
      const int e = u / per_e, cb = (u % per_e) / nrb, rb = u % nrb;
      const float* sa_row = a_scale + (static_cast<int64_t>(e) * rows + rb * C::kBlockM + row0) * kb_n;
      const float* sb_col = b_scale + (static_cast<int64_t>(e) * (N / 128) + cb * 2) * kb_n;
      TileAcc acc;
#pragma unroll
      for (int i = 0; i < C::kBlockN / 2; ++i) acc.d[i] = 0.f;
      for (int k = 0; k < num_k; ++k, ++it) {
        const int s = it % kStages;
        const float a0 = sa_row[k], a1 = sa_row[8 * kb_n + k];
        const float b0 = sb_col[k], b1 = sb_col[kb_n + k];
        f8_scaled_stage(acc, p, smem, full, empty, s, (it / kStages) & 1, k, cw, ct, a0, a1, b0, b1);
      }
      float keep = 0.f;
#pragma unroll
      for (int i = 0; i < C::kBlockN / 2; ++i) keep += acc.d[i];
      sink[(static_cast<int64_t>(e) * per_e + cb * nrb + rb) * 256 + ct] = keep;
    }
  }
  __syncthreads();
  unsigned long long t1;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t1));
  if (threadIdx.x == 0) {
    t[2 * blockIdx.x] = t0;
    t[2 * blockIdx.x + 1] = t1;
  }
}

// ---- mode 17: block scales without a second accumulator set (168 registers, no setmaxnreg) ------------------
// The tile's accumulator is kept in units of the current stage's scale s_k = a(row, k) * b(column block, k): before
// stage k's MMAs it is multiplied by s_{k-1} / s_k, the MMAs then add the plain e4m3 product of stage k into it, and
// the end multiplies by the last stage's scale (wgmma.cuh scale_acc, which the megakernel's FP8 tiles use). One
// set of 128 accumulators, so it fits the megakernel's 168 registers; a warpgroup's MMAs stop while it rescales
// (the other warpgroup's run). A mode 18 that issued each stage as two n128 halves, rescaling one while the other
// ran, was serialised by ptxas (C7520) and ran at 1.22-1.31x bf16 instead of 1.44-1.58x
// (docs/results/fp8/tile_limits_fp8_rescaled_1xh200.txt); it was removed. Same producer warpgroup as mode 16.
template <int kStages>
__global__ void __launch_bounds__(kF8pThreads, 1)
    tiles_kernel_f8_rescaled(float* sink, int E, int rows, int N, int K8, const float* a_scale, const float* b_scale,
                             unsigned long long* t, const __grid_constant__ Params p,
                             const __grid_constant__ TensorMapBytes a_map, const __grid_constant__ TensorMapBytes b_map) {
  extern __shared__ __align__(1024) uint8_t raw[];
  uint8_t* smem = raw + ((1024u - (smem_u32(raw) & 1023u)) & 1023u);
  uint64_t* full = reinterpret_cast<uint64_t*>(smem + kStages * C::kSmemStage);
  uint64_t* empty = full + kStages;
  f8_init_barriers<kStages>(full, empty);
  const int nrb = rows / C::kBlockM, ncb = N / C::kBlockN, per_e = nrb * ncb, num_k = K8 / 128, kb_n = K8 / 128;
  const int total = E * per_e;
  unsigned long long t0;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t0));
  const int wg = threadIdx.x / 128;
  if (wg == 0) {
    f8_produce_all<kStages>(p, smem, full, empty, a_map, b_map, rows, total, per_e, nrb, num_k);
  } else {
    const int cw = wg - 1, ct = threadIdx.x - 128;
    const int row0 = cw * 64 + ((ct / 32) % 4) * 16 + ((ct & 31) >> 2);  // the thread's rows: row0 and row0 + 8
    auto release = [&](int s) {
      asm volatile("bar.sync %0, 128;" ::"r"(1 + cw) : "memory");
      if (ct % 128 == 0) asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];" ::"r"(smem_u32(&empty[s])) : "memory");
    };
    int it = 0;
    for (int u = blockIdx.x; u < total; u += gridDim.x) {
      const int e = u / per_e, cb = (u % per_e) / nrb, rb = u % nrb;
      const float* sa_row = a_scale + (static_cast<int64_t>(e) * rows + rb * C::kBlockM + row0) * kb_n;
      const float* sb_col = b_scale + (static_cast<int64_t>(e) * (N / 128) + cb * 2) * kb_n;
      TileAcc acc;
#pragma unroll
      for (int i = 0; i < C::kBlockN / 2; ++i) acc.d[i] = 0.f;
      float q[4] = {1.f, 1.f, 1.f, 1.f};  // the accumulator's current units (f[2 * half + row], scale_acc)
      for (int k = 0; k < num_k; ++k, ++it) {
        const int s = it % kStages;
        float f[4];
        const float a0 = sa_row[k], a1 = sa_row[8 * kb_n + k], b0 = sb_col[k], b1 = sb_col[kb_n + k];
        const float nq[4] = {a0 * b0, a1 * b0, a0 * b1, a1 * b1};
#pragma unroll
        for (int j = 0; j < 4; ++j) {
          f[j] = __fdividef(q[j], nq[j]);  // no IEEE slow path: a branch there serialises the wgmmas
          q[j] = nq[j];
        }
        mbar_wait(p, &full[s], (it / kStages) & 1, s, k);
        scale_acc(acc, f);  // k = 0: an all-zero accumulator
        mma_stage_e4m3(acc, smem_u32(smem + s * C::kSmemStage) + cw * 64 * 128,
                       smem_u32(smem + s * C::kSmemStage) + C::kSmemA);
        wgmma_wait<0>();
        release(s);
      }
      scale_acc(acc, q);  // into the product's own units
      float keep = 0.f;
#pragma unroll
      for (int i = 0; i < C::kBlockN / 2; ++i) keep += acc.d[i];
      sink[(static_cast<int64_t>(e) * per_e + cb * nrb + rb) * 256 + ct] = keep;
    }
  }
  __syncthreads();
  unsigned long long t1;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t1));
  if (threadIdx.x == 0) {
    t[2 * blockIdx.x] = t0;
    t[2 * blockIdx.x + 1] = t1;
  }
}

// random values in [-1, 1) of type T (bf16, or e4m3 for modes 14 / 15); zeros would let the tensor cores run cooler
// than real data does
template <typename T>
__global__ void fill_random(T* x, size_t n, uint32_t seed) {
  for (size_t i = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x; i < n; i += gridDim.x * blockDim.x) {
    uint32_t h = static_cast<uint32_t>(i) * 2654435761u ^ seed;
    h ^= h >> 15;
    h *= 2246822519u;
    h ^= h >> 13;
    x[i] = T(static_cast<float>(h & 0xFFFF) / 32768.f - 1.f);
  }
}

// Zeros in the last z rows of every kBlockM-row block of the [rows][K] matrix x (TL_ZERO_ROWS).
template <typename T>
__global__ void zero_block_tails(T* x, size_t rows, int K, int z) {
  const size_t n = rows * K;
  for (size_t i = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x; i < n; i += gridDim.x * blockDim.x)
    if (static_cast<int>((i / K) % C::kBlockM) >= C::kBlockM - z) x[i] = T(0.f);
}

// e4m3 (bias 7, no infinities; 0x7F / 0xFF are NaN) to float, on the host
static float e4m3_to_float(uint8_t v) {
  const int sgn = v >> 7, e = (v >> 3) & 15, m = v & 7;
  const float mag = e == 0 ? m / 8.f * 0.015625f : (1.f + m / 8.f) * std::ldexp(1.f, e - 7);
  return sgn ? -mag : mag;
}

#define CK(x)                                                                  \
  do {                                                                         \
    cudaError_t e_ = (x);                                                      \
    if (e_ != cudaSuccess) {                                                   \
      std::printf("CUDA error %s at %s:%d\n", cudaGetErrorString(e_), __FILE__, __LINE__); \
      return 1;                                                                \
    }                                                                          \
  } while (0)

static TensorMapBytes g_a_map;  // A as [1][E * rows][K] (modes 7 and 8)
static TensorMapBytes g_a_map8;  // mode 14's e4m3 A, its bytes seen as bf16 [1][E * rows][K / 2]
static TensorMapBytes g_b_map8;  // mode 14's e4m3 B as bf16 [E][N][K / 2]
static const void* g_a8;         // mode 14's A (e4m3)
static float* g_as;              // mode 15's A scales [E * rows][K / 128]
static float* g_bs;              // mode 15's B scales [E][N / 128][K / 128]
static bf16* g_out;              // C [E * rows][N] (mode 11)

// One launch of MODE's kernel on `ctas` CTAs (asynchronous; errors of the launch itself are returned).
template <int MODE>
int launch(int ctas, const bf16* a, const bf16* b, float* sink, unsigned long long* t, int E, int rows, int N, int K,
           const Params& p, const TensorMapBytes& b_map, bool report_clusters) {
  if constexpr (MODE == 17) {
    constexpr int kSmem = ws_smem(4);
    auto fn = tiles_kernel_f8_rescaled<4>;
    CK(cudaFuncSetAttribute(fn, cudaFuncAttributeMaxDynamicSharedMemorySize, kSmem));
    fn<<<ctas, kF8pThreads, kSmem>>>(sink, E, rows, N, K, g_as, g_bs, t, p, g_a_map8, g_b_map8);
  } else if constexpr (MODE == 15 || MODE == 16) {
    constexpr int kSmem = ws_smem(4);
    auto fn = MODE == 15 ? tiles_kernel_f8_scaled<4> : tiles_kernel_f8_scaled_ws<4>;
    CK(cudaFuncSetAttribute(fn, cudaFuncAttributeMaxDynamicSharedMemorySize, kSmem));
    fn<<<ctas, MODE == 15 ? kF8sThreads : kF8pThreads, kSmem>>>(sink, E, rows, N, K, g_as, g_bs, t, p, g_a_map8,
                                                                 g_b_map8);
  } else if constexpr (MODE >= 7) {
    auto fn = tiles_kernel_ws<MODE == 8, MODE == 9 ? 3 : 4, MODE >= 10 && MODE <= 12,
                              MODE >= 11 && MODE <= 12 ? MODE - 10 : 0, MODE == 8 || MODE == 13, MODE == 14>;
    constexpr int kWsSmem = ws_smem(MODE == 9 ? 3 : 4);
    CK(cudaFuncSetAttribute(fn, cudaFuncAttributeMaxDynamicSharedMemorySize, kWsSmem));
    cudaLaunchConfig_t cfg{};
    cfg.gridDim = dim3(ctas);
    cfg.blockDim = dim3(kWsThreads);
    cfg.dynamicSmemBytes = kWsSmem;
    cudaLaunchAttribute attr[1];
    attr[0].id = cudaLaunchAttributeClusterDimension;
    // TL_CLUSTER7=1: mode 7 launched in 2-CTA clusters too (CTAs unpaired): the launch's own cost
    attr[0].val.clusterDim.x = MODE == 8 || MODE == 13 || (TL_CLUSTER7 && MODE == 7) ? 2 : 1;
    attr[0].val.clusterDim.y = 1;
    attr[0].val.clusterDim.z = 1;
    cfg.attrs = attr;
    cfg.numAttrs = 1;
    if constexpr (MODE == 14)  // e4m3 bytes through the bf16 maps: a 64-element box is 128 of K, K / 2 "bf16" per row
      CK(cudaLaunchKernelEx(&cfg, fn, static_cast<const bf16*>(g_a8), sink, E, rows, N, K / 2, t, p, g_a_map8, g_b_map8,
                            g_out));
    else
      CK(cudaLaunchKernelEx(&cfg, fn, a, sink, E, rows, N, K, t, p, g_a_map, b_map, g_out));
  } else if constexpr (MODE == 6) {
    CK(cudaFuncSetAttribute(tiles_kernel_mc, cudaFuncAttributeMaxDynamicSharedMemorySize, L::kSmemDynamic));
    cudaLaunchConfig_t cfg{};
    cfg.gridDim = dim3(ctas);
    cfg.blockDim = dim3(256);
    cfg.dynamicSmemBytes = L::kSmemDynamic;
    cudaLaunchAttribute attr[1];
    attr[0].id = cudaLaunchAttributeClusterDimension;
    attr[0].val.clusterDim.x = 2;
    attr[0].val.clusterDim.y = 1;
    attr[0].val.clusterDim.z = 1;
    cfg.attrs = attr;
    cfg.numAttrs = 1;
    if (report_clusters) {
      int clusters = 0;
      CK(cudaOccupancyMaxActiveClusters(&clusters, tiles_kernel_mc, &cfg));
      std::printf("mode 6: %d 2-CTA clusters can be co-resident\n", clusters);
    }
    CK(cudaLaunchKernelEx(&cfg, tiles_kernel_mc, a, sink, E, rows, N, K, t, p, b_map));
  } else {
    auto fn = tiles_kernel<MODE>;
    CK(cudaFuncSetAttribute(fn, cudaFuncAttributeMaxDynamicSharedMemorySize, L::kSmemDynamic));
    fn<<<ctas, 256, L::kSmemDynamic>>>(a, b, sink, E, rows, N, K, t, p, b_map);
  }
  CK(cudaGetLastError());
  return 0;
}

template <int MODE>
int run(int ctas, const bf16* a, const bf16* b, float* sink, unsigned long long* t, int E, int rows, int N, int K,
        const Params& p, const TensorMapBytes& b_map, double* tflops_per_sm) {
  double best = 1e30;
  for (int rep = 0; rep < 6; ++rep) {
    if (launch<MODE>(ctas, a, b, sink, t, E, rows, N, K, p, b_map, rep == 0)) return 1;
    CK(cudaDeviceSynchronize());
    int err[4];
    CK(cudaMemcpy(err, p.err, sizeof(err), cudaMemcpyDeviceToHost));
    if (err[0] != 0) {
      std::printf("mode %d: kernel error %d (%d %d %d)\n", MODE, err[0], err[1], err[2], err[3]);
      return 1;
    }
    std::vector<unsigned long long> h(2 * ctas);
    CK(cudaMemcpy(h.data(), t, h.size() * 8, cudaMemcpyDeviceToHost));
    unsigned long long lo = ~0ull, hi = 0;
    for (int i = 0; i < ctas; ++i) {
      lo = h[2 * i] < lo ? h[2 * i] : lo;
      hi = h[2 * i + 1] > hi ? h[2 * i + 1] : hi;
    }
    if (rep > 0 && hi - lo < best) best = static_cast<double>(hi - lo);
  }
  const double flop = 2.0 * E * rows * static_cast<double>(N) * K;
  *tflops_per_sm = flop / (best * 1e-9) / 1e12 / ctas;
  return 0;
}

// ---- sustained runs (TL_SUSTAIN=S seconds): the tile's rate at the board's power limit ----------------------
// NVML through dlopen (no header, no link-time dependency): SM clock and board power while the mode runs.
struct Nvml {
  void* dev = nullptr;
  int (*clock)(void*, int, unsigned*) = nullptr;  // nvmlDeviceGetClockInfo(dev, NVML_CLOCK_SM = 1, &mhz)
  int (*power)(void*, unsigned*) = nullptr;       // nvmlDeviceGetPowerUsage(dev, &milliwatts)
  bool ok() const { return dev && clock && power; }
  void sample(double* mhz, double* watts) const {
    unsigned c = 0, w = 0;
    *mhz = ok() && clock(dev, 1, &c) == 0 ? c : -1.0;
    *watts = ok() && power(dev, &w) == 0 ? w / 1000.0 : -1.0;
  }
};

static Nvml open_nvml() {
  Nvml n;
  void* lib = dlopen("libnvidia-ml.so.1", RTLD_NOW);
  if (!lib) return n;
  auto init = reinterpret_cast<int (*)()>(dlsym(lib, "nvmlInit_v2"));
  auto by_index = reinterpret_cast<int (*)(unsigned, void**)>(dlsym(lib, "nvmlDeviceGetHandleByIndex_v2"));
  n.clock = reinterpret_cast<int (*)(void*, int, unsigned*)>(dlsym(lib, "nvmlDeviceGetClockInfo"));
  n.power = reinterpret_cast<int (*)(void*, unsigned*)>(dlsym(lib, "nvmlDeviceGetPowerUsage"));
  int dev = 0;
  cudaGetDevice(&dev);  // NVML's index order can differ from CUDA's; one visible GPU is assumed
  if (!init || !by_index || init() != 0 || by_index(static_cast<unsigned>(dev), &n.dev) != 0) n.dev = nullptr;
  return n;
}

struct Sustained {
  double tflops = 0, mhz = 0, watts = 0;
};

// 1.5 s idle, then back-to-back launches for `seconds`, in batches of 8 with a sync (and an NVML sample) after
// each; the second half is timed. The pause before each mode gives every mode the same thermal start.
template <int MODE>
int sustain(double seconds, int ctas, const bf16* a, const bf16* b, float* sink, unsigned long long* t, int E,
            int rows, int N, int K, const Params& p, const TensorMapBytes& b_map, const Nvml& nvml, Sustained* out) {
  CK(cudaDeviceSynchronize());
  usleep(1500000);
  const double flop = 2.0 * E * rows * static_cast<double>(N) * K;
  auto now = [] {
    timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
  };
  const double t_start = now();
  double t_half = -1, mhz_sum = 0, w_sum = 0;
  long calls_half = 0, samples = 0;
  for (;;) {
    for (int i = 0; i < 8; ++i)
      if (launch<MODE>(ctas, a, b, sink, t, E, rows, N, K, p, b_map, false)) return 1;
    CK(cudaDeviceSynchronize());
    const double tn = now();
    if (t_half < 0 && tn - t_start >= seconds / 2) t_half = tn;  // the timed half starts after this batch
    else if (t_half >= 0) {
      calls_half += 8;
      double m, w;
      nvml.sample(&m, &w);
      mhz_sum += m;
      w_sum += w;
      ++samples;
    }
    if (tn - t_start >= seconds) {
      int err[4];
      CK(cudaMemcpy(err, p.err, sizeof(err), cudaMemcpyDeviceToHost));
      if (err[0] != 0) {
        std::printf("mode %d (sustained): kernel error %d\n", MODE, err[0]);
        return 1;
      }
      out->tflops = calls_half * flop / (tn - t_half) / 1e12;
      out->mhz = samples ? mhz_sum / samples : -1;
      out->watts = samples ? w_sum / samples : -1;
      return 0;
    }
  }
}

int main(int argc, char** argv) {
  // E experts x rows x N=4096 outputs, tiles of 128 x 256 x K: `./tile_limits [K [E rows]]`, default 4096 4 2048
  // (1024 tiles, 16 row blocks per weight tile); E 64 rows 256 gives MoE-like weight reuse (2 row blocks per
  // weight tile, most weight stages from HBM)
  const int N = 4096, K = argc > 1 ? std::atoi(argv[1]) : 4096;
  const int E = argc > 3 ? std::atoi(argv[2]) : 4, rows = argc > 3 ? std::atoi(argv[3]) : 2048;
  if (K < 64 || K % 64 != 0 || E < 1 || rows < 128 || rows % 128 != 0) {
    std::printf("K must be a positive multiple of 64, E >= 1, rows a positive multiple of 128\n");
    return 1;
  }
  // the 2-CTA modes (6, 8, 13) pair row blocks of one weight tile: they need rows in multiples of 256 and are
  // skipped otherwise (rows 128: every weight tile read by one row block, as at decode sizes)
  const bool pairs = rows % 256 == 0;
  // TL_ZERO_ROWS=z: the last z rows of every 128-row block of A are zeros (both dtypes), as a partial block's
  // padding rows are in the megakernel: what an MMA on padding rows costs in time and power
  const int zero_rows = std::getenv("TL_ZERO_ROWS") ? std::atoi(std::getenv("TL_ZERO_ROWS")) : 0;
  if (zero_rows < 0 || zero_rows > C::kBlockM) {
    std::printf("TL_ZERO_ROWS must lie in [0, %d]\n", C::kBlockM);
    return 1;
  }
  if (zero_rows) std::printf("A: the last %d rows of every %d-row block are zeros\n", zero_rows, C::kBlockM);
  bf16 *a, *b;
  float* sink;
  unsigned long long* t;
  CK(cudaMalloc(&a, static_cast<size_t>(E) * rows * K * 2));
  CK(cudaMalloc(&b, static_cast<size_t>(E) * N * K * 2));
  fill_random<<<1024, 256>>>(a, static_cast<size_t>(E) * rows * K, 1u);
  fill_random<<<1024, 256>>>(b, static_cast<size_t>(E) * N * K, 2u);
  if (zero_rows) zero_block_tails<<<1024, 256>>>(a, static_cast<size_t>(E) * rows, K, zero_rows);
  CK(cudaDeviceSynchronize());
  const size_t sink_len = static_cast<size_t>(E) * (rows / C::kBlockM) * (N / C::kBlockN) * 256;  // per tile, thread
  CK(cudaMalloc(&sink, sink_len * 4));
  CK(cudaMalloc(&g_out, static_cast<size_t>(E) * rows * N * 2));
  CK(cudaMalloc(&t, 2 * 1024 * 8));
  Params p{};
  CK(cudaMalloc(&p.err, 4 * sizeof(int32_t)));
  CK(cudaMemset(p.err, 0, 4 * sizeof(int32_t)));
  p.timeout_ns = 2000000000ull;
  TensorMapBytes b_map;
  if (encode_weight_map(&b_map, b, K, N, E) != 0 || encode_weight_map(&g_a_map, a, K, static_cast<uint64_t>(E) * rows, 1) != 0) {
    std::printf("tensor map encode failed\n");
    return 1;
  }
  // mode 14: the same shapes in e4m3 (K bytes per row), mapped as bf16 rows of K / 2
  const bool f8 = K % 128 == 0;
  __nv_fp8_e4m3 *a8 = nullptr, *b8 = nullptr;
  if (f8) {
    CK(cudaMalloc(&a8, static_cast<size_t>(E) * rows * K));
    CK(cudaMalloc(&b8, static_cast<size_t>(E) * N * K));
    fill_random<<<1024, 256>>>(a8, static_cast<size_t>(E) * rows * K, 3u);
    fill_random<<<1024, 256>>>(b8, static_cast<size_t>(E) * N * K, 4u);
    if (zero_rows) zero_block_tails<<<1024, 256>>>(a8, static_cast<size_t>(E) * rows, K, zero_rows);
    CK(cudaDeviceSynchronize());
    g_a8 = a8;
    if (encode_weight_map(&g_b_map8, b8, K / 2, N, E) != 0 ||
        encode_weight_map(&g_a_map8, a8, K / 2, static_cast<uint64_t>(E) * rows, 1) != 0) {
      std::printf("tensor map encode failed (e4m3)\n");
      return 1;
    }
    // mode 15's block scales: seeded values in [0.5, 2)
    std::vector<float> as(static_cast<size_t>(E) * rows * (K / 128)), bs(static_cast<size_t>(E) * (N / 128) * (K / 128));
    uint32_t x = 12345u;
    auto next = [&x] { x = x * 1664525u + 1013904223u; return 0.5f + 1.5f * static_cast<float>(x >> 8) / 16777216.f; };
    for (float& v : as) v = next();
    for (float& v : bs) v = next();
    CK(cudaMalloc(&g_as, as.size() * 4));
    CK(cudaMalloc(&g_bs, bs.size() * 4));
    CK(cudaMemcpy(g_as, as.data(), as.size() * 4, cudaMemcpyHostToDevice));
    CK(cudaMemcpy(g_bs, bs.data(), bs.size() * 4, cudaMemcpyHostToDevice));
  }

  const int grid[3] = {132, 66, 16};
  const char* names[18] = {"cp.async A+B (old)", "cp.async A+B/2", "cp.async A only", "no loads",
                           "cp.async A + TMA B (shipped)", "", "A + B multicast, 2-CTA cluster",
                           "warp-specialised, TMA A+B, 4 st.", "warp-spec. + B multicast", "warp-spec., 3 stages",
                           "warp-spec., A gathered (cp.async)", "mode 10 + staged epilogue", "mode 11, bulk-copy stores",
                           "mode 8 lock-step, no multicast", "warp-spec., FP8 e4m3 (mode 7)",
                           "FP8 + 128x128 block scales", "mode 15 + producer wg, setmaxnreg",
                           "block scales, rescaled acc"};
  double r[18][3] = {};
  // modes 4 (TMA B) and 6 (multicast B) must compute exactly what mode 0 (cp.async B) computes: same data, same
  // MMA order, per tile and thread
  std::vector<float> s0(sink_len), sx(sink_len);
  if (run<0>(132, a, b, sink, t, E, rows, N, K, p, b_map, &r[0][0])) return 1;
  CK(cudaMemcpy(s0.data(), sink, sink_len * 4, cudaMemcpyDeviceToHost));
  double mag = 0.0;
  for (size_t i = 0; i < sink_len; ++i) mag += s0[i] < 0 ? -s0[i] : s0[i];
  const size_t out_len = static_cast<size_t>(E) * rows * N;
  std::vector<uint16_t> o11(out_len), o12(out_len);
  for (int m : {4, 6, 7, 8, 9, 10, 11, 12, 13}) {
    if (!pairs && (m == 6 || m == 8 || m == 13)) continue;
    CK(cudaMemset(sink, 0xFF, sink_len * 4));  // poisoned: a tile that is not computed shows up as NaN
    CK(cudaMemset(g_out, 0xFF, out_len * 2));
    const int rc = m == 4   ? run<4>(132, a, b, sink, t, E, rows, N, K, p, b_map, &r[4][0])
                   : m == 6 ? run<6>(132, a, b, sink, t, E, rows, N, K, p, b_map, &r[6][0])
                   : m == 7 ? run<7>(132, a, b, sink, t, E, rows, N, K, p, b_map, &r[7][0])
                   : m == 8 ? run<8>(132, a, b, sink, t, E, rows, N, K, p, b_map, &r[8][0])
                   : m == 9 ? run<9>(132, a, b, sink, t, E, rows, N, K, p, b_map, &r[9][0])
                   : m == 10 ? run<10>(132, a, b, sink, t, E, rows, N, K, p, b_map, &r[10][0])
                   : m == 11 ? run<11>(132, a, b, sink, t, E, rows, N, K, p, b_map, &r[11][0])
                   : m == 12 ? run<12>(132, a, b, sink, t, E, rows, N, K, p, b_map, &r[12][0])
                             : run<13>(132, a, b, sink, t, E, rows, N, K, p, b_map, &r[13][0]);
    if (rc) return 1;
    CK(cudaMemcpy(sx.data(), sink, sink_len * 4, cudaMemcpyDeviceToHost));
    size_t diff = 0;
    for (size_t i = 0; i < sink_len; ++i) diff += !(s0[i] == sx[i]);
    std::printf("mode %d vs mode 0 accumulator sums: %zu of %zu differ (mean |sum| %.3g)\n", m, diff, sink_len,
                mag / sink_len);
    if (diff != 0) return 1;
    if (m == 11 || m == 12) CK(cudaMemcpy(m == 11 ? o11.data() : o12.data(), g_out, out_len * 2, cudaMemcpyDeviceToHost));
  }
  // modes 11 and 12 store the same bf16 outputs, every element written (0xFFFF, a NaN, is the poison)
  size_t odiff = 0, poisoned = 0;
  for (size_t i = 0; i < out_len; ++i) {
    odiff += o11[i] != o12[i];
    poisoned += o11[i] == 0xFFFFu;
  }
  std::printf("modes 11/12 outputs: %zu of %zu differ, %zu unwritten\n", odiff, out_len, poisoned);
  if (odiff != 0 || poisoned != 0) return 1;
  if (f8) {  // modes 14 and 15 against a host product of the e4m3 values (15: with its scales) on three tiles
    std::vector<uint8_t> ha(static_cast<size_t>(E) * rows * K), hb(static_cast<size_t>(E) * N * K);
    CK(cudaMemcpy(ha.data(), a8, ha.size(), cudaMemcpyDeviceToHost));
    CK(cudaMemcpy(hb.data(), b8, hb.size(), cudaMemcpyDeviceToHost));
    std::vector<float> has(static_cast<size_t>(E) * rows * (K / 128)), hbs(static_cast<size_t>(E) * (N / 128) * (K / 128));
    CK(cudaMemcpy(has.data(), g_as, has.size() * 4, cudaMemcpyDeviceToHost));
    CK(cudaMemcpy(hbs.data(), g_bs, hbs.size() * 4, cudaMemcpyDeviceToHost));
    std::vector<float> lut(256);
    for (int v = 0; v < 256; ++v) lut[v] = e4m3_to_float(static_cast<uint8_t>(v));
    const int nrb = rows / C::kBlockM, ncb = N / C::kBlockN, per_e = nrb * ncb, tiles = E * per_e, kbn = K / 128;
    for (int mode : {14, 15, 16, 17}) {
      CK(cudaMemset(sink, 0xFF, sink_len * 4));
      if ((mode == 14   ? run<14>(132, a, b, sink, t, E, rows, N, K, p, b_map, &r[14][0])
           : mode == 15 ? run<15>(132, a, b, sink, t, E, rows, N, K, p, b_map, &r[15][0])
           : mode == 16 ? run<16>(132, a, b, sink, t, E, rows, N, K, p, b_map, &r[16][0])
                        : run<17>(132, a, b, sink, t, E, rows, N, K, p, b_map, &r[17][0])) != 0)
        return 1;
      CK(cudaMemcpy(sx.data(), sink, sink_len * 4, cudaMemcpyDeviceToHost));
      size_t bad = 0, checked = 0;
      double worst = 0.0;
      for (int tile : {0, tiles / 2 + 1, tiles - 1}) {  // sink index: (e * per_e + cb * nrb + rb) * 256 + ct
        const int e = tile / per_e, cb = (tile % per_e) / nrb, rb = tile % nrb;
        for (int ct = 0; ct < 256; ++ct) {
          double sum = 0.0, mag = 0.0;
          for (int i = 0; i < C::kBlockN / 2; ++i) {  // the thread's accumulators (wgmma.cuh acc_row / acc_col)
            const int row = (ct / 128) * 64 + ((ct / 32) % 4) * 16 + ((ct & 31) >> 2) + (((i & 3) >> 1) << 3);
            const int col = (i >> 2) * 8 + ((ct & 3) << 1) + (i & 1);
            const size_t grow = static_cast<size_t>(e) * rows + rb * C::kBlockM + row;
            const size_t gcol = static_cast<size_t>(e) * N + cb * C::kBlockN + col;
            const uint8_t* ar = &ha[grow * K];
            const uint8_t* br = &hb[gcol * K];
            for (int kb = 0; kb < kbn; ++kb) {
              double blk = 0.0, bmag = 0.0;
              for (int k = kb * 128; k < kb * 128 + 128; ++k) {
                const double pr = static_cast<double>(lut[ar[k]]) * lut[br[k]];
                blk += pr;
                bmag += pr < 0 ? -pr : pr;
              }
              const double sc = mode != 14 ? static_cast<double>(has[grow * kbn + kb]) *
                                                 hbs[(static_cast<size_t>(e) * (N / 128) + (cb * C::kBlockN + col) / 128) * kbn + kb]
                                           : 1.0;
              sum += blk * sc;
              mag += bmag * sc;
            }
          }
          const double got = sx[static_cast<size_t>(tile) * 256 + ct], err = (got - sum) / (mag > 0 ? mag : 1.0);
          worst = std::fmax(worst, std::fabs(err));
          bad += !(std::fabs(err) <= 1e-3);  // NaN (an unwritten sink) counts as bad
          ++checked;
        }
      }
      std::printf("mode %d (e4m3%s) vs host product: %zu of %zu thread sums off by more than 1e-3 of their "
                  "|products| (worst %.2e)\n", mode, mode != 14 ? ", block scales" : "", bad, checked, worst);
      if (bad != 0) return 1;
    }
  } else {
    std::printf("mode 14 skipped: K %% 128 != 0\n");
  }
  for (int g = 0; g < 3; ++g) {
    if (g > 0 && run<0>(grid[g], a, b, sink, t, E, rows, N, K, p, b_map, &r[0][g])) return 1;
    if (run<1>(grid[g], a, b, sink, t, E, rows, N, K, p, b_map, &r[1][g])) return 1;
    if (run<2>(grid[g], a, b, sink, t, E, rows, N, K, p, b_map, &r[2][g])) return 1;
    if (run<3>(grid[g], a, b, sink, t, E, rows, N, K, p, b_map, &r[3][g])) return 1;
    if (g > 0 && run<4>(grid[g], a, b, sink, t, E, rows, N, K, p, b_map, &r[4][g])) return 1;
    if (g > 0 && pairs && run<6>(grid[g], a, b, sink, t, E, rows, N, K, p, b_map, &r[6][g])) return 1;
    if (g > 0 && run<7>(grid[g], a, b, sink, t, E, rows, N, K, p, b_map, &r[7][g])) return 1;
    if (g > 0 && pairs && run<8>(grid[g], a, b, sink, t, E, rows, N, K, p, b_map, &r[8][g])) return 1;
    if (g > 0 && run<9>(grid[g], a, b, sink, t, E, rows, N, K, p, b_map, &r[9][g])) return 1;
    if (g > 0 && run<10>(grid[g], a, b, sink, t, E, rows, N, K, p, b_map, &r[10][g])) return 1;
    if (g > 0 && run<11>(grid[g], a, b, sink, t, E, rows, N, K, p, b_map, &r[11][g])) return 1;
    if (g > 0 && run<12>(grid[g], a, b, sink, t, E, rows, N, K, p, b_map, &r[12][g])) return 1;
    if (g > 0 && pairs && run<13>(grid[g], a, b, sink, t, E, rows, N, K, p, b_map, &r[13][g])) return 1;
    if (f8 && g > 0 && run<14>(grid[g], a, b, sink, t, E, rows, N, K, p, b_map, &r[14][g])) return 1;
    if (f8 && g > 0 && run<15>(grid[g], a, b, sink, t, E, rows, N, K, p, b_map, &r[15][g])) return 1;
    if (f8 && g > 0 && run<16>(grid[g], a, b, sink, t, E, rows, N, K, p, b_map, &r[16][g])) return 1;
    if (f8 && g > 0 && run<17>(grid[g], a, b, sink, t, E, rows, N, K, p, b_map, &r[17][g])) return 1;
  }
  std::printf("TFLOP/s per SM (128x256x64 wgmma tiles, K=%d, %d experts x %d rows, %d tiles, best of 5%s)\n", K, E,
              rows, E * (rows / C::kBlockM) * (N / C::kBlockN), pairs ? "" : "; 2-CTA modes skipped");
  std::printf("%-30s %8s %8s %8s\n", "loads", "132 CTAs", "66", "16");
  for (int m : {0, 1, 2, 3, 4, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17}) std::printf("%-30s %8.2f %8.2f %8.2f\n", names[m], r[m][0], r[m][1], r[m][2]);

  // TL_SUSTAIN=S: each mode of TL_SUSTAIN_MODES (default 7,10,11,13,8) for S seconds back to back on 132 CTAs
  const char* sus = std::getenv("TL_SUSTAIN");
  const double seconds = sus ? std::atof(sus) : 0.0;
  if (seconds > 0) {
    const Nvml nvml = open_nvml();
    if (!nvml.ok()) std::printf("NVML not available: no clock or power readings\n");
    const char* ms = std::getenv("TL_SUSTAIN_MODES");
    std::vector<int> modes;
    for (const char* c = ms ? ms : "7,10,11,13,8"; *c;) {
      char* end;
      const long m = std::strtol(c, &end, 10);
      if (end == c) break;
      modes.push_back(static_cast<int>(m));
      c = *end == ',' ? end + 1 : end;
    }
    std::printf("sustained, 132 CTAs, %.1f s per mode (second half timed; 1.5 s idle before each)\n", seconds);
    std::printf("%-30s %9s %9s %7s %11s %14s %12s\n", "mode", "TFLOP/s", "per SM", "SM MHz", "board W", "TFLOP/s per W",
                "B GB/s/SM");
    for (int m : modes) {
      Sustained o;
      int rc;
      switch (m) {
        case 4: rc = sustain<4>(seconds, 132, a, b, sink, t, E, rows, N, K, p, b_map, nvml, &o); break;
        case 7: rc = sustain<7>(seconds, 132, a, b, sink, t, E, rows, N, K, p, b_map, nvml, &o); break;
        case 8:
        case 13:
          if (!pairs) { std::printf("modes 8 and 13 need rows %% 256 == 0\n"); return 1; }
          rc = m == 8 ? sustain<8>(seconds, 132, a, b, sink, t, E, rows, N, K, p, b_map, nvml, &o)
                      : sustain<13>(seconds, 132, a, b, sink, t, E, rows, N, K, p, b_map, nvml, &o);
          break;
        case 10: rc = sustain<10>(seconds, 132, a, b, sink, t, E, rows, N, K, p, b_map, nvml, &o); break;
        case 11: rc = sustain<11>(seconds, 132, a, b, sink, t, E, rows, N, K, p, b_map, nvml, &o); break;
        case 14:
        case 15:
        case 16:
        case 17:
          if (!f8) { std::printf("modes 14-17 need K %% 128 == 0\n"); return 1; }
          rc = m == 14   ? sustain<14>(seconds, 132, a, b, sink, t, E, rows, N, K, p, b_map, nvml, &o)
               : m == 15 ? sustain<15>(seconds, 132, a, b, sink, t, E, rows, N, K, p, b_map, nvml, &o)
               : m == 16 ? sustain<16>(seconds, 132, a, b, sink, t, E, rows, N, K, p, b_map, nvml, &o)
                         : sustain<17>(seconds, 132, a, b, sink, t, E, rows, N, K, p, b_map, nvml, &o);
          break;
        default: std::printf("mode %d: no sustained run for this mode (4, 7, 8, 10, 11, 13, 14-17)\n", m); return 1;
      }
      if (rc) return 1;
      // B GB/s per SM: the weight bytes the SM loads (2 or 1 per element, 1 / 256 of a FLOP's share per element;
      // from HBM once per row block, so at rows 128 this is the weight stream from HBM)
      std::printf("%d %-28s %9.1f %9.2f %7.0f %11.0f %14.3f %12.1f\n", m, names[m], o.tflops, o.tflops / 132, o.mhz,
                  o.watts, o.watts > 0 ? o.tflops / o.watts : -1.0, o.tflops / 132 * 1e3 * (m >= 14 ? 1 : 2) / 256);
    }
  }
  return 0;
}

// Experiment: what limits the megakernel's GEMM tile rate? The wgmma mainloop of 128 x 256 x 64 steps on one GPU,
// tiles handed out round-robin (no ticket, no epilogue store), with its operands loaded in different ways:
//   mode 0  A + B by cp.async from all threads (the tile up to this experiment: 16 KB of A + 32 KB of B per step)
//   mode 1  A + half of B by cp.async (the L2 bytes a CTA would read if B were multicast over a 2-CTA cluster)
//   mode 2  A only by cp.async
//   mode 3  nothing loaded (MMAs, barriers and the pipeline's waits alone: the mainloop's own ceiling)
//   mode 4  the shipped tile_mainloop (wgmma.cuh): A by cp.async, B by two TMA boxes per stage
// for 132, 66 and 16 CTAs. Prints TFLOP/s per SM. Modes 0-3 keep a private copy of the old cp.async loader.
// Standalone, not part of the package:
//   nvcc -std=c++17 -gencode=arch=compute_90a,code=sm_90a -O3 -DNDEBUG --expt-relaxed-constexpr \
//        -I weave_kernel/csrc tests/kernel/tile_limits.cu -o tile_limits && ./tile_limits
#include <cstdio>
#include <vector>

#include "tma_host.h"
#include "wgmma.cuh"

using namespace weave;

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
    op.a_row[i] = a_rows + static_cast<int64_t>((threadIdx.x + i * C::kThreads) >> 3) * K;
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
      const int c = threadIdx.x + i * C::kThreads;
      const int row = c >> 3, chunk = c & 7;
      const bool ok = (op.valid >> i) & 1u;
      cp_async_16(smem_u32(sa + swz(row, chunk)), op.a_row[i] + (ok ? k0 + chunk * 8 : 0), ok);
    }
  }
  if (MODE <= 1) {
    constexpr int kB = MODE == 0 ? 8 : 4;
#pragma unroll
    for (int i = 0; i < kB; ++i) {
      const int c = threadIdx.x + i * C::kThreads;
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
  for (int s = 0; s < C::kStages - 1; ++s) {
    if (s < num_k) load_stage_mode<MODE>(op, smem, s, s * C::kBlockK);
    cp_async_commit();
  }
  const uint32_t smem_base = smem_u32(smem);
  for (int kt = 0; kt < num_k; ++kt) {
    cp_async_wait<C::kStages - 2>();
    fence_proxy_async_smem();
    __syncthreads();
    const uint32_t sa = smem_base + (kt % C::kStages) * C::kSmemStage + wg * 64 * 128;
    const uint32_t sb = smem_base + (kt % C::kStages) * C::kSmemStage + C::kSmemA;
    wgmma_fence();
#pragma unroll
    for (int kk = 0; kk < C::kBlockK / 16; ++kk)
      wgmma_m64n256k16(acc.d, wgmma_desc_sw128(sa + kk * 32), wgmma_desc_sw128(sb + kk * 32), 1);
    wgmma_commit();
    wgmma_wait<1>();
    __syncthreads();
    const int next = kt + C::kStages - 1;
    if (next < num_k) load_stage_mode<MODE>(op, smem, next % C::kStages, next * C::kBlockK);
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
  float keep = 0.f;
  for (int tile = blockIdx.x; tile < total; tile += gridDim.x) {
    const int e = tile / per_e, off = tile % per_e, rb = off % nrb, cb = off / nrb;
    const bf16* a_rows = a + (static_cast<int64_t>(e) * rows + rb * C::kBlockM) * K;
    TileAcc acc;
    if constexpr (MODE == 4) {
      tile_mainloop(p, plain_tile_operands(a_rows, &b_map, e, C::kBlockM, K, cb), K, smem, acc);
    } else {
      mainloop_mode<MODE>(old_operands(a_rows, b + static_cast<int64_t>(e) * N * K, K, cb), K, smem, acc);
    }
#pragma unroll
    for (int i = 0; i < C::kBlockN / 2; ++i) keep += acc.d[i];
  }
  unsigned long long t1;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t1));
  if (threadIdx.x == 0) {
    t[2 * blockIdx.x] = t0;
    t[2 * blockIdx.x + 1] = t1;
  }
  sink[blockIdx.x * blockDim.x + threadIdx.x] = keep;  // keeps the MMAs alive; compared across modes 0 and 4
}

// random bf16 in [-1, 1) (zeros would let the tensor cores run cooler than real data does)
__global__ void fill_random(bf16* x, size_t n, uint32_t seed) {
  for (size_t i = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x; i < n; i += gridDim.x * blockDim.x) {
    uint32_t h = static_cast<uint32_t>(i) * 2654435761u ^ seed;
    h ^= h >> 15;
    h *= 2246822519u;
    h ^= h >> 13;
    x[i] = __float2bfloat16(static_cast<float>(h & 0xFFFF) / 32768.f - 1.f);
  }
}

#define CK(x)                                                                  \
  do {                                                                         \
    cudaError_t e_ = (x);                                                      \
    if (e_ != cudaSuccess) {                                                   \
      std::printf("CUDA error %s at %s:%d\n", cudaGetErrorString(e_), __FILE__, __LINE__); \
      return 1;                                                                \
    }                                                                          \
  } while (0)

template <int MODE>
int run(int ctas, const bf16* a, const bf16* b, float* sink, unsigned long long* t, int E, int rows, int N, int K,
        const Params& p, const TensorMapBytes& b_map, double* tflops_per_sm) {
  auto fn = tiles_kernel<MODE>;
  CK(cudaFuncSetAttribute(fn, cudaFuncAttributeMaxDynamicSharedMemorySize, C::kSmemDynamic));
  double best = 1e30;
  for (int rep = 0; rep < 6; ++rep) {
    fn<<<ctas, 256, C::kSmemDynamic>>>(a, b, sink, E, rows, N, K, t, p, b_map);
    CK(cudaGetLastError());
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

int main() {
  const int E = 4, rows = 2048, N = 4096, K = 4096;  // 1024 tiles of 128 x 256 x 4096
  bf16 *a, *b;
  float* sink;
  unsigned long long* t;
  CK(cudaMalloc(&a, static_cast<size_t>(E) * rows * K * 2));
  CK(cudaMalloc(&b, static_cast<size_t>(E) * N * K * 2));
  fill_random<<<1024, 256>>>(a, static_cast<size_t>(E) * rows * K, 1u);
  fill_random<<<1024, 256>>>(b, static_cast<size_t>(E) * N * K, 2u);
  CK(cudaDeviceSynchronize());
  CK(cudaMalloc(&sink, 132 * 256 * 4));
  CK(cudaMalloc(&t, 2 * 1024 * 8));
  Params p{};
  CK(cudaMalloc(&p.err, 4 * sizeof(int32_t)));
  CK(cudaMemset(p.err, 0, 4 * sizeof(int32_t)));
  p.timeout_ns = 2000000000ull;
  TensorMapBytes b_map;
  if (encode_weight_map(&b_map, b, K, N, E) != 0) {
    std::printf("tensor map encode failed\n");
    return 1;
  }

  const int grid[3] = {132, 66, 16};
  const char* names[5] = {"cp.async A+B (old)", "cp.async A+B/2", "cp.async A only", "no loads",
                          "cp.async A + TMA B (shipped)"};
  double r[5][3];
  // mode 4 (TMA B) must compute exactly what mode 0 (cp.async B) computes: same data, same MMA order
  std::vector<float> s0(132 * 256), s4(132 * 256);
  if (run<0>(132, a, b, sink, t, E, rows, N, K, p, b_map, &r[0][0])) return 1;
  CK(cudaMemcpy(s0.data(), sink, s0.size() * 4, cudaMemcpyDeviceToHost));
  if (run<4>(132, a, b, sink, t, E, rows, N, K, p, b_map, &r[4][0])) return 1;
  CK(cudaMemcpy(s4.data(), sink, s4.size() * 4, cudaMemcpyDeviceToHost));
  int diff = 0;
  double mag = 0.0;
  for (size_t i = 0; i < s0.size(); ++i) {
    diff += s0[i] != s4[i];
    mag += s0[i] < 0 ? -s0[i] : s0[i];
  }
  std::printf("TMA vs cp.async accumulator sums: %d of %zu differ (mean |sum| %.3g)\n", diff, s0.size(),
              mag / s0.size());
  if (diff != 0) return 1;
  for (int g = 0; g < 3; ++g) {
    if (g > 0 && run<0>(grid[g], a, b, sink, t, E, rows, N, K, p, b_map, &r[0][g])) return 1;
    if (run<1>(grid[g], a, b, sink, t, E, rows, N, K, p, b_map, &r[1][g])) return 1;
    if (run<2>(grid[g], a, b, sink, t, E, rows, N, K, p, b_map, &r[2][g])) return 1;
    if (run<3>(grid[g], a, b, sink, t, E, rows, N, K, p, b_map, &r[3][g])) return 1;
    if (g > 0 && run<4>(grid[g], a, b, sink, t, E, rows, N, K, p, b_map, &r[4][g])) return 1;
  }
  std::printf("TFLOP/s per SM (128x256x64 wgmma tiles, K=%d, 1024 tiles, best of 5)\n", K);
  std::printf("%-30s %8s %8s %8s\n", "loads", "132 CTAs", "66", "16");
  for (int m = 0; m < 5; ++m) std::printf("%-30s %8.2f %8.2f %8.2f\n", names[m], r[m][0], r[m][1], r[m][2]);
  return 0;
}

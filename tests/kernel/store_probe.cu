// How fast one SM writes a GEMM1 tile's outputs: 128 rows x 256 bytes (32 KB) from shared memory to global rows,
// with the megakernel's store loop (256 threads, 16 bytes each per step; pipeline.cuh store_staged), by where the
// rows lie. docs/kernel.md "A GEMM1 tile's stores" found about 1.5 us per 32 KB inside the layer at 4096 tokens,
// the same on 16 CTAs as on 132; this asks whether the row pattern (the combine slots are scattered: one row per
// (token, expert) pair) or the producer's concurrent loads set that.
//
// Framework-free: nvcc -std=c++17 -arch=sm_90a -O3 -o store_probe tests/kernel/store_probe.cu && ./store_probe
// Row patterns (a round's 128 rows; every round of every CTA gets fresh rows):
//   contig    - one 32 KB block (rows 256 bytes apart)
//   stride4k  - rows of a [*, 2048] bf16 matrix, 128 consecutive rows (4 KB apart; 512 KB per round)
//   stride32k - 128 consecutive tokens' slots of one (token, k = 8) combine buffer (32 KB apart; 4 MB per round)
//   rand128m  - 128 random rows (sorted) of a 128 MB combine buffer (4096 tokens x 8 x 4 KB): the layer's case
//   rand2m    - 128 random rows (sorted) inside one 2 MB page
// Loads: off; on = the 128 other threads stream cp.async 16-byte copies from a 1 GB source into 96 KB of shared
// memory meanwhile (as the producer warpgroup loads the next tile's stages during the epilogue); bulk = one of them
// keeps 96 KB of bulk copies in flight instead (as its TMA loads of the weights).
#include <cstdio>
#include <cstdint>
#include <cstdlib>
#include <vector>
#include <algorithm>
#include <random>

#define CK(x)                                                                                  \
  do {                                                                                         \
    cudaError_t e_ = (x);                                                                      \
    if (e_ != cudaSuccess) {                                                                   \
      fprintf(stderr, "%s:%d %s: %s\n", __FILE__, __LINE__, #x, cudaGetErrorString(e_));       \
      exit(1);                                                                                 \
    }                                                                                          \
  } while (0)

constexpr int kRows = 128, kRowBytes = 256, kConsumers = 256, kProducers = 128, kRounds = 48;
constexpr int kStagingRow = kRowBytes + 16;  // as the kernel's staging (rows padded by 16 bytes)
constexpr int kLoadBytes = 96 * 1024;

__device__ __forceinline__ uint64_t gtime() {
  uint64_t t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}

// offs[(cta * kRounds + r) * kRows + m]: byte offset of round r's row m; out[cta * kRounds + r]: ns of its stores
__global__ void __launch_bounds__(kConsumers + kProducers, 1)
probe(uint8_t* dst, const int64_t* offs, const uint8_t* src, int64_t src_bytes, int loads, uint32_t* out,
      volatile int* stop) {
  extern __shared__ __align__(128) uint8_t smem[];
  uint8_t* staging = smem;
  int64_t* rows = reinterpret_cast<int64_t*>(smem + kRows * kStagingRow);
  uint8_t* ring = smem + kRows * kStagingRow + kRows * 8;
  const int t = threadIdx.x;
  if (t >= kConsumers) {  // the "producer": loads until the consumers are done
    if (!loads) return;
    const int pt = t - kConsumers;
    if (loads == 2) {  // bulk copies (as the producer's TMA loads of B): thread 0 keeps 96 KB in flight
      __shared__ __align__(8) uint64_t mbar;
      const uint32_t bar = static_cast<uint32_t>(__cvta_generic_to_shared(&mbar));
      if (pt != 0) return;
      asm volatile("mbarrier.init.shared.b64 [%0], 1;" ::"r"(bar));
      asm volatile("fence.mbarrier_init.release.cluster;");
      int64_t pos = (static_cast<int64_t>(blockIdx.x) * 8 * 1024 * 1024) % src_bytes;
      const uint32_t sbase = static_cast<uint32_t>(__cvta_generic_to_shared(ring));
      for (uint32_t phase = 0; !*stop; phase ^= 1) {
        asm volatile("mbarrier.arrive.expect_tx.shared.b64 _, [%0], %1;" ::"r"(bar), "r"(kLoadBytes));
        for (int i = 0; i < kLoadBytes / 16384; ++i)
          asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], 16384, [%2];"
                       ::"r"(sbase + i * 16384), "l"(src + pos + i * 16384), "r"(bar) : "memory");
        asm volatile("{\n.reg .pred p;\nW: mbarrier.try_wait.parity.shared.b64 p, [%0], %1;\n@!p bra W;\n}"
                     ::"r"(bar), "r"(phase) : "memory");
        pos = (pos + kLoadBytes) % (src_bytes - kLoadBytes);
      }
      return;
    }
    int64_t pos = (static_cast<int64_t>(blockIdx.x) * 8 * 1024 * 1024) % src_bytes;
    uint32_t sbase = static_cast<uint32_t>(__cvta_generic_to_shared(ring));
    for (int it = 0; !*stop; ++it) {
      for (int i = 0; i < kLoadBytes / 16 / kProducers; ++i) {
        const int chunk = i * kProducers + pt;
        asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"(sbase + chunk * 16),
                     "l"(src + pos + chunk * 16));
      }
      asm volatile("cp.async.commit_group;");
      asm volatile("cp.async.wait_group 1;");
      pos = (pos + kLoadBytes) % (src_bytes - kLoadBytes);
    }
    asm volatile("cp.async.wait_all;");
    return;
  }
  for (int i = t; i < kRows * kStagingRow / 16; i += kConsumers)
    reinterpret_cast<int4*>(staging)[i] = make_int4(i, blockIdx.x, t, 7);
  for (int r = 0; r < kRounds; ++r) {
    if (t < kRows) rows[t] = offs[(static_cast<int64_t>(blockIdx.x) * kRounds + r) * kRows + t];
    asm volatile("bar.sync 1, %0;" ::"r"(kConsumers) : "memory");
    const uint64_t t0 = gtime();
    constexpr int kChunks = kRowBytes / 16;
#pragma unroll 1
    for (int c = t; c < kRows * kChunks; c += kConsumers) {
      const int m = c / kChunks, chunk = c % kChunks;
      *reinterpret_cast<int4*>(dst + rows[m] + chunk * 16) =
          *reinterpret_cast<const int4*>(staging + m * kStagingRow + chunk * 16);
    }
    asm volatile("bar.sync 1, %0;" ::"r"(kConsumers) : "memory");
    if (t == 0) out[blockIdx.x * kRounds + r] = static_cast<uint32_t>(gtime() - t0);
  }
  // the last CTA to finish stops the loaders of all (each CTA's loaders stop at their next check)
  __shared__ int done;
  if (t == 0) done = atomicAdd(reinterpret_cast<int*>(const_cast<int*>(stop)) + 1, 1) + 1 == gridDim.x;
  asm volatile("bar.sync 1, %0;" ::"r"(kConsumers) : "memory");
  if (t == 0 && done) *stop = 1;
}

int main() {
  const char* names[] = {"contig", "stride4k", "stride32k", "rand128m", "rand2m"};
  const int64_t dst_bytes = 512ll << 20, src_bytes = 1ll << 30;
  uint8_t *dst, *src;
  int* stop;
  CK(cudaMalloc(&dst, dst_bytes));
  CK(cudaMalloc(&src, src_bytes));
  CK(cudaMemset(src, 1, src_bytes));
  CK(cudaMalloc(&stop, 8));
  const int smem = kRows * kStagingRow + kRows * 8 + kLoadBytes;
  CK(cudaFuncSetAttribute(probe, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
  int sms;
  CK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
  std::mt19937_64 rng(1234);
  printf("%-10s %5s %5s %10s %10s %10s\n", "rows", "ctas", "loads", "us/32KB", "p90 us", "GB/s/SM");
  for (int pat = 0; pat < 5; ++pat) {
    for (int ctas : {1, 16, sms}) {
      std::vector<int64_t> offs(static_cast<size_t>(ctas) * kRounds * kRows);
      for (int b = 0; b < ctas; ++b)
        for (int r = 0; r < kRounds; ++r) {
          int64_t* o = &offs[(static_cast<size_t>(b) * kRounds + r) * kRows];
          const int64_t round = static_cast<int64_t>(b) * kRounds + r;
          for (int m = 0; m < kRows; ++m) {
            switch (pat) {
              case 0: o[m] = (round * 32768) % (dst_bytes - 32768) + m * 256; break;
              case 1: o[m] = (round * 512 * 1024) % (dst_bytes - 512 * 1024) + m * 4096 + (round % 16) * 256; break;
              case 2: o[m] = (round * 4096) % (dst_bytes - 4 * 1024 * 1024 - 4096) / 256 * 256 + m * 32768; break;
              case 3: o[m] = static_cast<int64_t>(rng() % 32768) * 4096 + (round % 16) * 256; break;
              case 4: o[m] = (round % 200) * (2 << 20) + static_cast<int64_t>(rng() % 512) * 4096 + (round % 16) * 256;
            }
          }
          if (pat >= 3) std::sort(o, o + kRows);
        }
      int64_t* d_offs;
      uint32_t* d_out;
      CK(cudaMalloc(&d_offs, offs.size() * 8));
      CK(cudaMemcpy(d_offs, offs.data(), offs.size() * 8, cudaMemcpyHostToDevice));
      CK(cudaMalloc(&d_out, static_cast<size_t>(ctas) * kRounds * 4));
      for (int loads = 0; loads < 3; ++loads) {
        std::vector<uint32_t> ns(static_cast<size_t>(ctas) * kRounds);
        for (int rep = 0; rep < 2; ++rep) {  // the first launch warms up
          CK(cudaMemset(stop, 0, 8));
          probe<<<ctas, kConsumers + kProducers, smem>>>(dst, d_offs, src, src_bytes, loads, d_out, stop);
          CK(cudaGetLastError());
          CK(cudaDeviceSynchronize());
        }
        CK(cudaMemcpy(ns.data(), d_out, ns.size() * 4, cudaMemcpyDeviceToHost));
        // drop each CTA's first 4 rounds (cold start)
        std::vector<uint32_t> v;
        for (int b = 0; b < ctas; ++b)
          for (int r = 4; r < kRounds; ++r) v.push_back(ns[static_cast<size_t>(b) * kRounds + r]);
        std::sort(v.begin(), v.end());
        const double med = v[v.size() / 2] / 1e3, p90 = v[v.size() * 9 / 10] / 1e3;
        printf("%-10s %5d %5s %10.2f %10.2f %10.1f\n", names[pat], ctas, loads == 2 ? "bulk" : loads ? "on" : "off", med, p90,
               32768.0 / (med * 1e3));
      }
      CK(cudaFree(d_offs));
      CK(cudaFree(d_out));
    }
  }
  return 0;
}

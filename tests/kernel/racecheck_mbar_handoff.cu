// Does compute-sanitizer racecheck follow the tile pipeline's stage handoff? A checked program with the same
// synchronisation as csrc/pipeline.cuh, without the MMAs (docs/kernel.md, "Dispatch by bulk copies", racecheck):
//   producer  warpgroup 0: wait for the stage's "empty" mbarrier (from the second round on), fill the stage with
//             cp.async (16 bytes per thread and chunk), cp.async.mbarrier.arrive.noinc on its "full" mbarrier;
//   consumers warpgroups 1-2: wait "full", read the stage (the MMAs' stand-in), write the stage (the epilogue's
//             staging), consumer barrier, read it back (the epilogue's stores), consumer barrier, the warpgroup's
//             named barrier, one thread per warpgroup arrives on "empty" (the pipeline's release()).
// One stage, `rounds` rounds; every round's sums and read-back values are checked on the host, so the program is
// correct or says so. all_arrive = 1: instead of the named barrier and one arrival per warpgroup, every consumer
// thread arrives on "empty" (count 256); 2: __syncwarp and one arrival per warp (count 8). Usage: racecheck_mbar_handoff [rounds] [all_arrive]   (prints PASS / FAIL)
//   nvcc -std=c++17 -arch=sm_90a -o /tmp/rmh tests/kernel/racecheck_mbar_handoff.cu
//   compute-sanitizer --tool racecheck /tmp/rmh 8
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <vector>

constexpr int kThreads = 384, kProducers = 128, kConsumers = 256;
constexpr int kRows = 128, kRowInts = 32;  // one 16 KB stage: 128 rows of 128 bytes

__device__ __forceinline__ uint32_t smem_u32(const void* p) { return static_cast<uint32_t>(__cvta_generic_to_shared(p)); }
__device__ __forceinline__ void bar_sync(int id, int n) { asm volatile("bar.sync %0, %1;" ::"r"(id), "r"(n) : "memory"); }
__device__ __forceinline__ void mbar_init(uint64_t* b, uint32_t n) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" ::"r"(smem_u32(b)), "r"(n) : "memory");
}
__device__ __forceinline__ void mbar_arrive(uint64_t* b) {
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];" ::"r"(smem_u32(b)) : "memory");
}
__device__ __forceinline__ void mbar_wait(uint64_t* b, uint32_t parity) {
  uint32_t done = 0;
  while (!done)
    asm volatile("{\n.reg .pred p;\nmbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\nselp.u32 %0, 1, 0, p;\n}\n"
                 : "=r"(done)
                 : "r"(smem_u32(b)), "r"(parity)
                 : "memory");
}

__global__ void __launch_bounds__(kThreads, 1) handoff(const int* src, int* sums, int* back, int rounds, int all_arrive) {
  __shared__ __align__(128) int stage[kRows * kRowInts];
  __shared__ uint64_t full, empty;
  if (threadIdx.x == 0) {
    mbar_init(&full, kProducers);
    mbar_init(&empty, all_arrive == 1 ? kConsumers : all_arrive == 2 ? kConsumers / 32 : kConsumers / 128);
    asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
  }
  __syncthreads();
  const int t = threadIdx.x;
  if (t < kProducers) {
    for (int r = 0; r < rounds; ++r) {
      if (r > 0) mbar_wait(&empty, (r - 1) & 1);
      for (int c = t; c < kRows * kRowInts / 4; c += kProducers) {  // 16-byte chunks
        const int* g = src + static_cast<int64_t>(r) * kRows * kRowInts + 4 * c;
        asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"(smem_u32(stage + 4 * c)), "l"(g) : "memory");
      }
      asm volatile("cp.async.mbarrier.arrive.noinc.shared::cta.b64 [%0];" ::"r"(smem_u32(&full)) : "memory");
    }
  } else {
    const int ct = t - kProducers, cw = ct / 128;
    for (int r = 0; r < rounds; ++r) {
      mbar_wait(&full, r & 1);
      int s = 0;  // the MMAs' stand-in: this consumer's row
      const int row = ct % kRows, half = ct / kRows;
      for (int i = 0; i < kRowInts / 2; ++i) s += stage[row * kRowInts + half * (kRowInts / 2) + i];
      bar_sync(2, kConsumers);  // every consumer has read the operands
      sums[r * kConsumers + ct] = s;
      for (int i = 0; i < kRowInts / 2; ++i) stage[row * kRowInts + half * (kRowInts / 2) + i] = s + i;  // staging
      bar_sync(2, kConsumers);
      const int other = (ct + 128) % kConsumers;  // read back what another warpgroup staged (the stores' pattern)
      const int orow = other % kRows, ohalf = other / kRows;
      back[r * kConsumers + ct] = stage[orow * kRowInts + ohalf * (kRowInts / 2) + 3];
      bar_sync(2, kConsumers);
      if (all_arrive == 1) {
        mbar_arrive(&empty);
      } else if (all_arrive == 2) {
        __syncwarp();
        if (ct % 32 == 0) mbar_arrive(&empty);
      } else {
        bar_sync(3 + cw, 128);  // release(): the warpgroup is done with the stage
        if (ct % 128 == 0) mbar_arrive(&empty);
      }
    }
  }
}

int main(int argc, char** argv) {
  const int rounds = argc > 1 ? std::atoi(argv[1]) : 8, all_arrive = argc > 2 ? std::atoi(argv[2]) : 0;
  const size_t n = static_cast<size_t>(rounds) * kRows * kRowInts;
  std::vector<int> h(n);
  for (size_t i = 0; i < n; ++i) h[i] = static_cast<int>((i * 2654435761u) % 1000);
  int *src, *sums, *back;
  cudaMalloc(&src, n * sizeof(int));
  cudaMalloc(&sums, rounds * kConsumers * sizeof(int));
  cudaMalloc(&back, rounds * kConsumers * sizeof(int));
  cudaMemcpy(src, h.data(), n * sizeof(int), cudaMemcpyHostToDevice);
  handoff<<<1, kThreads>>>(src, sums, back, rounds, all_arrive);
  if (cudaDeviceSynchronize() != cudaSuccess) {
    std::printf("FAIL: %s\n", cudaGetErrorString(cudaGetLastError()));
    return 1;
  }
  std::vector<int> s(rounds * kConsumers), b(rounds * kConsumers);
  cudaMemcpy(s.data(), sums, s.size() * sizeof(int), cudaMemcpyDeviceToHost);
  cudaMemcpy(b.data(), back, b.size() * sizeof(int), cudaMemcpyDeviceToHost);
  int bad = 0;
  for (int r = 0; r < rounds; ++r)
    for (int ct = 0; ct < kConsumers; ++ct) {
      const int row = ct % kRows, half = ct / kRows;
      int want = 0;
      for (int i = 0; i < kRowInts / 2; ++i) want += h[(static_cast<size_t>(r) * kRows + row) * kRowInts + half * (kRowInts / 2) + i];
      const int other = (ct + 128) % kConsumers;
      bad += s[r * kConsumers + ct] != want;
      bad += b[r * kConsumers + ct] != s[r * kConsumers + other] + 3;
    }
  std::printf("%s: %d rounds, all_arrive %d, %d mismatches\n", bad ? "FAIL" : "PASS", rounds, all_arrive, bad);
  return bad ? 1 : 0;
}

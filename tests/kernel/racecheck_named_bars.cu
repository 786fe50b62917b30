// Does compute-sanitizer racecheck order "one thread writes a shared flag; __syncthreads; every thread reads it"
// correctly after the warpgroups of a CTA passed *different numbers* of named barriers (bar.sync id, count)?
// That is the shape of the megakernel's warp-specialised GEMM phase (pipeline.cuh): the producer warpgroup syncs
// on barrier 1 (128 threads), the consumers on barrier 2 (256 threads), a different number of times, then the
// whole CTA meets at __syncthreads and read flags that one thread wrote (role_ok / s.ok, since replaced by
// cta_all = __syncthreads_and).
//
//   nvcc -std=c++17 -arch=sm_90a -o racecheck_named_bars racecheck_named_bars.cu
//   compute-sanitizer --tool racecheck ./racecheck_named_bars P Q
// P / Q: named-barrier rounds of the producer (bar 1, 128 threads) / consumers (bar 2, 256 threads). The program
// checks its own result (every thread saw the flags) and prints PASS / FAIL; racecheck prints its hazards.
//
// Measured (H200, driver 580.159.04, compute-sanitizer of CUDA 13.0, 2026-11-30): P Q = 0 0, 3 3, 3 5, 1 2:
// 0 hazards; 5 3: "Race reported between Write access ... and Read access [4 hazards]" (1 error), while the
// program, ordered by __syncthreads alone, passes. The tool loses the ordering of __syncthreads once the
// producer passed more named barriers than the consumers: a false report of the same shape as the megakernel's
// (a flag written by one thread, read by all after __syncthreads; docs/kernel.md).
#include <cstdio>
#include <cstdlib>

__device__ __forceinline__ void named_sync(int id, int threads) {
  asm volatile("bar.sync %0, %1;" ::"r"(id), "r"(threads) : "memory");
}

__global__ void kernel(int p_rounds, int q_rounds, int* out) {
  __shared__ int flag[2];
  __shared__ int scratch[384];
  const int t = threadIdx.x;
  if (t == 0) flag[0] = flag[1] = 0;
  __syncthreads();
  if (t < 128) {
    for (int r = 0; r < p_rounds; ++r) {
      scratch[t] = r;  // producer-private data, ordered by its own barrier
      named_sync(1, 128);
      out[1024 + t] += scratch[(t + 1) % 128];
      named_sync(1, 128);
    }
    if (t == 0) flag[0] = 1;
  } else {
    for (int r = 0; r < q_rounds; ++r) {
      scratch[t] = r;
      named_sync(2, 256);
      out[1024 + t] += scratch[128 + (t - 127) % 256];
      named_sync(2, 256);
    }
    if (t == 128) flag[1] = 1;
  }
  __syncthreads();
  const int seen = flag[0] + flag[1];  // every thread: 2
  __syncthreads();
  if (t == 0) flag[0] = 5;  // written after everyone read it: no hazard
  __syncthreads();
  out[t] = seen * 10 + flag[0];  // 25 everywhere
}

int main(int argc, char** argv) {
  const int p = argc > 1 ? atoi(argv[1]) : 3, q = argc > 2 ? atoi(argv[2]) : 5;
  int* d;
  cudaMalloc(&d, 2048 * sizeof(int));
  cudaMemset(d, 0xff, 2048 * sizeof(int));  // poisoned
  kernel<<<1, 384>>>(p, q, d);
  int h[384];
  cudaMemcpy(h, d, sizeof(h), cudaMemcpyDeviceToHost);
  const cudaError_t e = cudaGetLastError();
  int bad = 0;
  for (int i = 0; i < 384; ++i) bad += h[i] != 25;
  printf("%s P %d Q %d: %d of 384 threads wrong, %s\n", bad || e ? "FAIL" : "PASS", p, q, bad, cudaGetErrorString(e));
  return bad || e ? 1 : 0;
}

// The kernel's silu (weave::silu in wgmma.cuh, whatever the tree has) against silu in double precision, on a dense
// grid of gate values, with the previous formula (__fdividef(g, 1 + __expf(-g))) beside it. Prints, per range of g,
// the largest absolute error, the largest error relative to |silu(g)|, and the largest absolute error measured in
// half-ulps of bf16 at the value (what rounding h to bf16 costs anyway). One GPU, a second or so:
//   nvcc -std=c++17 -arch=sm_90a -O3 -I weave_kernel/csrc tests/kernel/silu_probe.cu -o /tmp/silu_probe && /tmp/silu_probe
#include <cmath>
#include <cstdio>
#include <vector>

#include <cuda_runtime.h>

#include "wgmma.cuh"

__global__ void eval(const float* g, float* now, float* before, int n) {
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= n) return;
  now[i] = weave::silu(g[i]);
  before[i] = __fdividef(g[i], 1.f + __expf(-g[i]));
}

static double bf16_half_ulp(double v) {
  // bf16 keeps 8 significant bits: half an ulp at |v| is 2^(floor(log2 |v|) - 8); subnormal range ignored.
  const double a = std::fabs(v);
  if (a == 0.0) return std::ldexp(1.0, -133);
  return std::ldexp(1.0, static_cast<int>(std::floor(std::log2(a))) - 8);
}

int main() {
  const double lo = -64.0, hi = 64.0;
  const int n = 1 << 22;
  std::vector<float> g(n);
  for (int i = 0; i < n; ++i) g[i] = static_cast<float>(lo + (hi - lo) * i / (n - 1));
  float *dg, *dn, *db;
  if (cudaMalloc(&dg, n * 4) || cudaMalloc(&dn, n * 4) || cudaMalloc(&db, n * 4)) {
    std::fprintf(stderr, "cudaMalloc failed\n");
    return 1;
  }
  cudaMemcpy(dg, g.data(), n * 4, cudaMemcpyHostToDevice);
  eval<<<(n + 255) / 256, 256>>>(dg, dn, db, n);
  if (cudaError_t e = cudaDeviceSynchronize(); e != cudaSuccess) {
    std::fprintf(stderr, "kernel failed: %s\n", cudaGetErrorString(e));
    return 1;
  }
  std::vector<float> now(n), before(n);
  cudaMemcpy(now.data(), dn, n * 4, cudaMemcpyDeviceToHost);
  cudaMemcpy(before.data(), db, n * 4, cudaMemcpyDeviceToHost);
  const double edges[] = {-64, -16, -8, -4, 0, 4, 8, 16, 64};
  std::printf("%-16s %-7s %12s %12s %14s %12s %12s %14s\n", "g range", "points", "now abs", "now rel",
              "now /halfulp", "before abs", "before rel", "before /halfulp");
  for (int r = 0; r + 1 < static_cast<int>(sizeof(edges) / sizeof(edges[0])); ++r) {
    double worst[2][3] = {{0, 0, 0}, {0, 0, 0}};
    bool nan_seen[2] = {false, false};  // fmax drops NaN, so a NaN output is tracked on its own
    int count = 0;
    for (int i = 0; i < n; ++i) {
      if (g[i] < edges[r] || g[i] >= edges[r + 1]) continue;
      ++count;
      const double x = g[i], exact = x / (1.0 + std::exp(-x));
      const float got[2] = {now[i], before[i]};
      for (int k = 0; k < 2; ++k) {
        const double err = std::fabs(static_cast<double>(got[k]) - exact);
        if (std::isnan(got[k])) nan_seen[k] = true;
        worst[k][0] = std::fmax(worst[k][0], err);
        if (exact != 0.0) worst[k][1] = std::fmax(worst[k][1], err / std::fabs(exact));
        worst[k][2] = std::fmax(worst[k][2], err / bf16_half_ulp(exact));
      }
    }
    for (int k = 0; k < 2; ++k)
      if (nan_seen[k]) worst[k][0] = worst[k][1] = worst[k][2] = NAN;
    char name[32];
    std::snprintf(name, sizeof(name), "[%g, %g)", edges[r], edges[r + 1]);
    std::printf("%-16s %-7d %12.3e %12.3e %14.3f %12.3e %12.3e %14.3f\n", name, count, worst[0][0], worst[0][1],
                worst[0][2], worst[1][0], worst[1][1], worst[1][2]);
  }
  cudaFree(dg);
  cudaFree(dn);
  cudaFree(db);
  return 0;
}

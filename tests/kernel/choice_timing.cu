// How long the weave choice (choice.cuh) takes on the GPU, by pieces; driven by tests/kernel/choice_timing.py.
// stdin as tests/kernel/choice_host.cpp: the cost table, the number of cases, per case "G E hidden ffn", owner [E],
// pair counts [G*E]. Prints per case the median over 132 CTAs of: the whole choice, the argmin alone, one
// evaluation of layer_time_ns per thread (ns, %globaltimer).
#include <cstdio>
#include <vector>
#include <algorithm>
#include "choice.cuh"
#include "host_input.h"
using namespace weave;
constexpr int kThreads = 384;
__device__ __forceinline__ uint64_t gt() { uint64_t t; asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t)); return t; }
__global__ void __launch_bounds__(kThreads, 1) k(const double* table_g, const int* cnt_g, const int* owner, int rank, int G, int E,
                                                 int H, int I, uint64_t* out, int* choice) {
  __shared__ double table[cost_table::kLen];
  __shared__ int cnt[8 * 512];
  __shared__ VolumeSums rs[kThreads / 32];
  __shared__ GridBest rb[kThreads / 32];
  for (int i = threadIdx.x; i < cost_table::kLen; i += kThreads) table[i] = table_g[i];
  for (int i = threadIdx.x; i < G * E; i += kThreads) cnt[i] = cnt_g[i];
  __syncthreads();
  uint64_t t[8], cold = 0;
  CostChoice c{};
  for (int rep = 0; rep < 3; ++rep) {  // rep 0: cold (instructions, owner[]); the last one is reported as warm
    __syncthreads();
    t[0] = gt();
    c = choose_split_parallel<kThreads>(table, cnt, owner, rank, G, E, H, I, rs, rb);
    __syncthreads();
    t[1] = gt();
    if (rep == 0) cold = t[1] - t[0];
  }
  // grid only: volumes from the serial thread-0 path are not needed; reuse a fixed v computed by all threads
  VolumeSums a{0, 0, 0, 0, 0};
  for (int e = 0; e < E; ++e) {
    int64_t rows = 0;
    for (int s = 0; s < G; ++s) rows += cnt[s * E + e];
    accumulate_expert(a, rows, cnt[rank * E + e], owner[e] == rank, (int64_t)table[cost_table::kOffHeader + cost_table::kTileRows]);
  }
  const CostVolumes v = volumes_from_sums(table, a, H, I);
  __syncthreads();
  t[2] = gt();
  GridBest best = grid_slice_best(table, v, 1, (int)table[cost_table::kOffHeader + cost_table::kMaxCommSms], threadIdx.x, kThreads);
  __syncthreads();
  t[3] = gt();
  // one evaluation per thread
  double acc = 0;
  t[4] = gt();
  acc += layer_time_ns(table, v, 1 + threadIdx.x % 130, threadIdx.x & 3);
  __syncthreads();
  t[5] = gt();
  if (threadIdx.x == 0) {
    uint64_t* o = out + blockIdx.x * 5;
    o[0] = t[1] - t[0]; o[1] = t[3] - t[2]; o[2] = t[5] - t[4]; o[3] = (uint64_t)(acc > 0) + (best.idx >= 0);
    o[4] = cold;
    if (blockIdx.x == 0) { choice[0] = c.num_comm_sms; choice[1] = c.num_chunks; }
  }
}
int main() {
  std::vector<double> table;
  if (!host_input::read_table(table)) return 1;
  int n = 0; if (std::scanf("%d", &n) != 1) return 1;
  double* dt; cudaMalloc(&dt, table.size() * 8); cudaMemcpy(dt, table.data(), table.size() * 8, cudaMemcpyHostToDevice);
  const int blocks = 132;
  uint64_t* dout; cudaMalloc(&dout, blocks * 5 * 8);
  int* dch; cudaMalloc(&dch, 8);
  for (int i = 0; i < n; ++i) {
    host_input::CaseHeader h; if (!host_input::read_case_header(h)) return 1;
    if (h.g * h.e > 8 * 512) { std::printf("G x E > 4096: the test's shared counts are too small\n"); return 1; }
    std::vector<int> cnt((size_t)h.g * h.e);
    for (int& x : cnt)
      if (std::scanf("%d", &x) != 1) return 1;
    int *dc, *dow; cudaMalloc(&dc, cnt.size() * 4); cudaMalloc(&dow, h.e * 4);
    cudaMemcpy(dc, cnt.data(), cnt.size() * 4, cudaMemcpyHostToDevice); cudaMemcpy(dow, h.owner.data(), h.e * 4, cudaMemcpyHostToDevice);
    k<<<blocks, kThreads>>>(dt, dc, dow, 0, h.g, h.e, h.hidden, h.ffn, dout, dch);
    cudaError_t err = cudaDeviceSynchronize();
    if (err != cudaSuccess) { std::printf("error %s\n", cudaGetErrorString(err)); return 1; }
    std::vector<uint64_t> o(blocks * 5); cudaMemcpy(o.data(), dout, o.size() * 8, cudaMemcpyDeviceToHost);
    int ch[2]; cudaMemcpy(ch, dch, 8, cudaMemcpyDeviceToHost);
    std::vector<uint64_t> full, grid, one, first;
    for (int b = 0; b < blocks; ++b) {
      full.push_back(o[b * 5]); grid.push_back(o[b * 5 + 1]); one.push_back(o[b * 5 + 2]); first.push_back(o[b * 5 + 4]);
    }
    auto med = [](std::vector<uint64_t> v) { std::sort(v.begin(), v.end()); return v[v.size() / 2]; };
    std::printf("G=%d E=%d H=%d I=%d: c*=%d K*=%d; whole choice first call %llu ns, warm %llu ns; argmin alone %llu ns; "
                "one evaluation %llu ns (medians over %d CTAs)\n", h.g, h.e, h.hidden, h.ffn, ch[0], ch[1],
                (unsigned long long)med(first), (unsigned long long)med(full), (unsigned long long)med(grid),
                (unsigned long long)med(one), blocks);
    cudaFree(dc); cudaFree(dow);
  }
  return 0;
}

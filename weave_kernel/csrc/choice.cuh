// In-kernel spatial choice for the `weave` policy: (c*, K*) of this rank, from the gathered counts and the
// cost table that weave_sim exports (cost_model.cuh holds the model; this file only parallelises its inputs
// and its argmin). Framework-free and __host__ __device__ where possible, so that tests/kernel builds the
// pieces as host C++ and checks them against cost_model.cuh's serial volumes_for_gpu / choose_split.
//
// This kernel dispatches one row per (token, expert) pair (no de-duplication per destination GPU), so the
// dispatch rows it passes to the model are pair-based: dispatch_rows[s][d] = pairs of source s routed to
// experts owned by d. Then, for GPU r:
//   d_in  = sum_{s != r} dispatch_rows[s][r] = (pairs computed on r) - (local pairs of r)
//   d_out = sum_{d != r} dispatch_rows[r][d] = (pairs of r)          - (local pairs of r)
// which is what volumes_from_sums uses; everything else is a per-expert integer sum, exact in any order.
#pragma once
#include <stdint.h>

#include "cost_model.cuh"

namespace weave {

// Integer sums over experts that volumes_for_gpu accumulates (same names as there).
struct VolumeSums {
  int64_t computed;             // pairs computed on this GPU (all sources, its experts)
  int64_t local;                // pairs of this GPU on its own experts
  int64_t outgoing_plus_local;  // all pairs of this GPU
  int64_t active;               // own experts with >= 1 row
  int64_t row_blocks;           // sum over own experts of ceil(rows / tile_rows)
};

// Contribution of expert e: rows_e = pairs of every source on e, own = pairs of this GPU on e.
WEAVE_HD void accumulate_expert(VolumeSums& a, int64_t rows_e, int64_t own, bool owned, int64_t tile_rows) {
  a.outgoing_plus_local += own;
  if (!owned) return;
  a.computed += rows_e;
  a.local += own;
  a.active += rows_e > 0 ? 1 : 0;
  a.row_blocks += (rows_e + tile_rows - 1) / tile_rows;
}

WEAVE_HD void add_sums(VolumeSums& a, const VolumeSums& b) {
  a.computed += b.computed;
  a.local += b.local;
  a.outgoing_plus_local += b.outgoing_plus_local;
  a.active += b.active;
  a.row_blocks += b.row_blocks;
}

// The tail of volumes_for_gpu, operation for operation, with pair-based dispatch rows (see the top).
WEAVE_HD CostVolumes volumes_from_sums(const double* table, const VolumeSums& a, int hidden, int ffn) {
  using namespace cost_table;
  const int64_t row_bytes = 2 * (int64_t)hidden;
  const int64_t tile_cols = (int64_t)table[kOffHeader + kTileCols];
  const int64_t d_in = a.computed - a.local;
  const int64_t d_out = a.outgoing_plus_local - a.local;
  const int64_t cols = (ffn + tile_cols - 1) / tile_cols + (hidden + tile_cols - 1) / tile_cols;
  CostVolumes v;
  v.flops = (double)(a.computed * 6 * (int64_t)hidden * (int64_t)ffn);
  v.dispatch_bytes_in = (double)(d_in * row_bytes);
  v.dispatch_bytes_out = (double)(d_out * row_bytes);
  v.combine_bytes_out = (double)((a.computed - a.local) * row_bytes);
  v.combine_bytes_in = (double)((a.outgoing_plus_local - a.local) * row_bytes);
  v.weight_bytes = (double)(a.active * 6 * (int64_t)hidden * (int64_t)ffn);
  v.rows_per_expert = (double)(a.computed / (a.active > 0 ? a.active : 1));
  v.gemm_tiles = (double)(a.row_blocks * cols);
  return v;
}

// A candidate of the argmin: flat grid index idx = (c - c_min) * num_k + k_idx (c-major, as numpy's argmin
// over [c][K]), predicted time t.
struct GridBest {
  double t;
  int idx;
};

// b beats a: smaller time, then smaller flat index (= smaller c, then smaller K): choose_split's tie-break.
// NaN never wins (choose_split's `t < best` is false for NaN too).
WEAVE_HD bool grid_better(const GridBest& b, const GridBest& a) {
  return b.t < a.t || (b.t == a.t && b.idx < a.idx);
}

WEAVE_HD GridBest grid_none() { return GridBest{1e300, 0x7fffffff}; }

// Best point of the strided slice {first, first + stride, ...} of the grid c in [c_min, c_max] x K.
WEAVE_HD GridBest grid_slice_best(const double* table, const CostVolumes& v, int c_min, int c_max, int first,
                                  int stride) {
  using namespace cost_table;
  const int num_k = (int)table[kOffHeader + kNumChunkChoices];
  const int n = (c_max - c_min + 1) * num_k;
  GridBest best = grid_none();
  for (int i = first; i < n; i += stride) {
    const double t = layer_time_ns(table, v, c_min + i / num_k, i % num_k);
    if (t < best.t) best = GridBest{t, i};  // ascending i: the first minimum of the slice
  }
  return best;
}

// Decode a reduced GridBest into a CostChoice (nothing finite below 1e300: choose_split's default).
WEAVE_HD CostChoice grid_to_choice(const double* table, const GridBest& b, int c_min) {
  using namespace cost_table;
  const int num_k = (int)table[kOffHeader + kNumChunkChoices];
  if (b.idx == 0x7fffffff) return CostChoice{c_min, (int)table[kOffChunks], 1e300};
  return CostChoice{c_min + b.idx / num_k, (int)table[kOffChunks + b.idx % num_k], b.t};
}

#if defined(__CUDACC__)
// Every CTA (all threads): this rank's (c*, K*) from the gathered counts cnt[s * E + e] (shared memory).
// red_* are shared scratch of kWarps entries. Deterministic: the same counts give the same answer on every
// CTA (integer sums are exact; the argmin's tie-break is total).
template <int kThreads>
__device__ __forceinline__ CostChoice choose_split_parallel(const double* table, const int* cnt, const int* owner,
                                                            int rank, int world, int num_experts, int hidden,
                                                            int ffn, VolumeSums* red_sums, GridBest* red_best) {
  using namespace cost_table;
  constexpr int kWarps = kThreads / 32;
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int64_t tile_rows = (int64_t)table[kOffHeader + kTileRows];
  VolumeSums a{0, 0, 0, 0, 0};
  for (int e = tid; e < num_experts; e += kThreads) {
    int64_t rows = 0;
    for (int s = 0; s < world; ++s) rows += cnt[s * num_experts + e];
    accumulate_expert(a, rows, cnt[rank * num_experts + e], __ldg(owner + e) == rank, tile_rows);
  }
#pragma unroll
  for (int off = 16; off > 0; off >>= 1) {
    VolumeSums b;
    b.computed = __shfl_down_sync(0xffffffffu, a.computed, off);
    b.local = __shfl_down_sync(0xffffffffu, a.local, off);
    b.outgoing_plus_local = __shfl_down_sync(0xffffffffu, a.outgoing_plus_local, off);
    b.active = __shfl_down_sync(0xffffffffu, a.active, off);
    b.row_blocks = __shfl_down_sync(0xffffffffu, a.row_blocks, off);
    add_sums(a, b);
  }
  if (lane == 0) red_sums[warp] = a;
  __syncthreads();
  VolumeSums tot{0, 0, 0, 0, 0};
#pragma unroll
  for (int w = 0; w < kWarps; ++w) add_sums(tot, red_sums[w]);
  const CostVolumes v = volumes_from_sums(table, tot, hidden, ffn);

  const int c_min = 1, c_max = (int)table[kOffHeader + kMaxCommSms];
  GridBest best = grid_slice_best(table, v, c_min, c_max, tid, kThreads);
#pragma unroll
  for (int off = 16; off > 0; off >>= 1) {
    GridBest o;
    o.t = __shfl_down_sync(0xffffffffu, best.t, off);
    o.idx = __shfl_down_sync(0xffffffffu, best.idx, off);
    if (grid_better(o, best)) best = o;
  }
  if (lane == 0) red_best[warp] = best;
  __syncthreads();
  best = red_best[0];
#pragma unroll
  for (int w = 1; w < kWarps; ++w)
    if (grid_better(red_best[w], best)) best = red_best[w];
  __syncthreads();  // red_* may be reused by the caller
  return grid_to_choice(table, best, c_min);
}
#endif

}  // namespace weave

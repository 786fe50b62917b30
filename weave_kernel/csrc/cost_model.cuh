// Weave's spatial scheduler: the analytic cost model T(c, K), evaluated from the table that weave_sim
// exports (weave_sim/costtable.py), and the (c*, K*) choice for one GPU of one layer.
//
// Framework-free and usable from host and device: the megakernel runs it right after the in-kernel count
// exchange; tests build it as plain C++ and check it picks what the Python model picks for the same counts.
// The arithmetic mirrors weave_sim/costmodel.py::layer_time_ns operation for operation, in double.
#pragma once
#include <stdint.h>

#if defined(__CUDACC__)
#define WEAVE_HD __host__ __device__ __forceinline__
#else
#define WEAVE_HD inline
#endif

namespace weave {

// Mirror of the layout constants in weave_sim/costtable.py (tests compare them).
namespace cost_table {
constexpr int kVersion = 3;
constexpr int kHeaderLen = 16;
constexpr int kMaxSms = 256;
constexpr int kNumRowBuckets = 16;
constexpr int kMaxChunkChoices = 8;
constexpr int kOffHeader = 0;
constexpr int kOffBw = kOffHeader + kHeaderLen;
constexpr int kOffTflops = kOffBw + kMaxSms + 1;
constexpr int kOffChunks = kOffTflops + kNumRowBuckets;
constexpr int kOffEff = kOffChunks + kMaxChunkChoices;
constexpr int kLen = kOffEff + kMaxChunkChoices;
// header slots, in HEADER_FIELDS order
constexpr int kVersionSlot = 0, kNumSms = 1, kNvlinkPeakGbs = 2, kGemmPeakTflops = 3, kHbmGbs = 4, kRho = 5,
              kTileRows = 6, kTileCols = 7, kNumChunkChoices = 8, kMaxCommSms = 9;
static_assert(kLen == 305, "table length changed: update weave_sim/costtable.py too");
}  // namespace cost_table

// Inputs of the cost model for one GPU of one layer (bytes and FLOPs as double, like numpy's float64).
struct CostVolumes {
  double flops, dispatch_bytes_in, dispatch_bytes_out, combine_bytes_in, combine_bytes_out;
  double weight_bytes, rows_per_expert, gemm_tiles;
};

struct CostChoice {
  int num_comm_sms;
  int num_chunks;
  double time_ns;
};

WEAVE_HD int row_bucket(int64_t rows) {
  if (rows < 1) rows = 1;
  int b = 0;
  for (int shift = 1; shift < cost_table::kNumRowBuckets; ++shift) b += (rows >> shift) > 0 ? 1 : 0;
  return b;
}

WEAVE_HD double dmax(double a, double b) { return a > b ? a : b; }
// a * b rounded on its own (no fused multiply-add on the device, as numpy computes it)
WEAVE_HD double dmul(double a, double b) {
#if defined(__CUDA_ARCH__)
  return __dmul_rn(a, b);
#else
  return a * b;
#endif
}
WEAVE_HD double dmin(double a, double b) { return a < b ? a : b; }

// Volumes of GPU `gpu` from the exchanged counts, as weave_sim/workload.py defines them.
//   pair_counts  [num_gpus * num_experts]: pairs of source GPU s routed to expert e (row-major [s][e])
//   dispatch_rows [num_gpus * num_gpus]: distinct tokens of source s that need destination d ([s][d])
//   owner        [num_experts]: GPU owning each expert
WEAVE_HD CostVolumes volumes_for_gpu(const double* table, int gpu, int num_gpus, int num_experts,
                                     const int* owner, const int64_t* pair_counts,
                                     const int64_t* dispatch_rows, int hidden, int ffn) {
  using namespace cost_table;
  const int64_t row_bytes = 2 * (int64_t)hidden;
  const int64_t tile_rows = (int64_t)table[kOffHeader + kTileRows];
  const int64_t tile_cols = (int64_t)table[kOffHeader + kTileCols];
  int64_t computed = 0, local = 0, outgoing_plus_local = 0, active = 0, row_blocks = 0;
  for (int e = 0; e < num_experts; ++e) {
    int64_t rows_e = 0;
    for (int s = 0; s < num_gpus; ++s) rows_e += pair_counts[(int64_t)s * num_experts + e];
    outgoing_plus_local += pair_counts[(int64_t)gpu * num_experts + e];
    if (owner[e] != gpu) continue;
    computed += rows_e;
    local += pair_counts[(int64_t)gpu * num_experts + e];
    active += rows_e > 0 ? 1 : 0;
    row_blocks += (rows_e + tile_rows - 1) / tile_rows;
  }
  int64_t d_in = 0, d_out = 0;
  for (int s = 0; s < num_gpus; ++s) {
    if (s == gpu) continue;
    d_in += dispatch_rows[(int64_t)s * num_gpus + gpu];
    d_out += dispatch_rows[(int64_t)gpu * num_gpus + s];
  }
  const int64_t cols = (ffn + tile_cols - 1) / tile_cols + (hidden + tile_cols - 1) / tile_cols;
  CostVolumes v;
  v.flops = (double)(computed * 6 * (int64_t)hidden * (int64_t)ffn);
  v.dispatch_bytes_in = (double)(d_in * row_bytes);
  v.dispatch_bytes_out = (double)(d_out * row_bytes);
  v.combine_bytes_out = (double)((computed - local) * row_bytes);
  v.combine_bytes_in = (double)((outgoing_plus_local - local) * row_bytes);
  v.weight_bytes = (double)(active * 6 * (int64_t)hidden * (int64_t)ffn);
  v.rows_per_expert = (double)(computed / (active > 0 ? active : 1));
  v.gemm_tiles = (double)(row_blocks * cols);
  return v;
}

// Per-SM TFLOP/s at rows per expert r (integer-valued): linear in r between the table's rates at 2^b and
// 2^(b+1), b = row_bucket(r); the last bucket flat (weave_sim/costmodel.py::per_sm_tflops, the same operations).
WEAVE_HD double per_sm_tflops(const double* table, double rows_per_expert) {
  using namespace cost_table;
  const double r = dmax(rows_per_expert, 1.0);
  const int b = row_bucket((int64_t)r);
  const int nxt = b + 1 < kNumRowBuckets ? b + 1 : kNumRowBuckets - 1;
  const double lo = table[kOffTflops + b], hi = table[kOffTflops + nxt];
  const double base = (double)((int64_t)1 << b);
  const double frac = b + 1 < kNumRowBuckets ? (r - base) / base : 0.0;
  return lo + dmul(hi - lo, frac);
}

// T(c, K) in ns for c comm SMs and the k_idx-th candidate chunk count.
WEAVE_HD double layer_time_ns(const double* table, const CostVolumes& v, int c, int k_idx) {
  using namespace cost_table;
  const double num_sms = table[kOffHeader + kNumSms];
  const double bw = table[kOffBw + c];
  const double k = table[kOffChunks + k_idx];
  const double eff = table[kOffEff + k_idx];
  const double t_push = (v.dispatch_bytes_out + v.combine_bytes_out) / bw;
  const double t_ingress = (v.dispatch_bytes_in + v.combine_bytes_in) / table[kOffHeader + kNvlinkPeakGbs];
  const double t_comm = dmax(t_push, t_ingress);
  const double sms = dmin(num_sms - (double)c, dmax(v.gemm_tiles, 1.0));
  const double per_sm = per_sm_tflops(table, v.rows_per_expert);
  const double rate = dmin(sms * per_sm, table[kOffHeader + kGemmPeakTflops]) * 1e3;
  const double t_comp = dmax(v.flops / (rate * eff), v.weight_bytes / table[kOffHeader + kHbmGbs]);
  const double t_tail = (1.0 - table[kOffHeader + kRho]) * v.combine_bytes_out / (bw * k);
  return dmax(t_comp + t_tail, t_comm);
}

// argmin over c in [c_min, c_max] and every candidate K; ties go to the smaller c, then the smaller K
// (the same order as numpy's argmin over the [c][K] grid in weave_sim.costmodel.choose).
WEAVE_HD CostChoice choose_split(const double* table, const CostVolumes& v, int c_min, int c_max) {
  using namespace cost_table;
  const int num_k = (int)table[kOffHeader + kNumChunkChoices];
  CostChoice best{c_min, (int)table[kOffChunks], 1e300};
  for (int c = c_min; c <= c_max; ++c) {
    for (int ki = 0; ki < num_k; ++ki) {
      const double t = layer_time_ns(table, v, c, ki);
      if (t < best.time_ns) best = CostChoice{c, (int)table[kOffChunks + ki], t};
    }
  }
  return best;
}

}  // namespace weave

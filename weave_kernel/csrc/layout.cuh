// Per-call layout computed inside the kernel from the all-gathered counts: where every (expert, source)
// segment lives in its owner's receive buffer, which row blocks this rank computes, which it dispatches.
// Every rank computes the same numbers from the same counts, so no host round trip is needed.
#pragma once
#include <cstdint>

#include "bulk_copy.cuh"
#include "choice.cuh"
#include "config.cuh"
#include "sync.cuh"

namespace weave {

struct SharedLayout {
  int cnt[Config::kMaxRankExperts];         // cnt[s*E + e]: pairs source s sends to expert e
  int segoff[Config::kMaxRankExperts + 1];  // scan over (owner d, local le, step t) of the
                                                            // segment of source (d - t) mod G; the last
                                                            // step also carries the padding of the expert's
                                                            // rows to a multiple of kBlockM
  int ebase[Config::kMaxExperts + 1];  // scan of this rank's counts: base of expert e in sorted_pair
  int tq[Config::kMaxExperts + 1];     // scan of row blocks this rank computes, per local expert
  int tk[2 * Config::kMaxExperts + 4]; // GEMM phases: scan of tickets per segment (GEMM0 of expert slot i,
                                       // GEMM1 of slot i - L; slots: the local experts and the shared expert)
  int dq[Config::kMaxExperts + 1];     // scan of row pieces this rank sends to other ranks, (step i, le) order
  union {
    int hist[Config::kMaxExperts];         // routing histogram, then this CTA's per-expert base (until the
                                           // sorted pair list is written, before grid barrier 1)
    double cost_table[cost_table::kLen];   // weave: the cost table, loaded after grid barrier 1 while the
                                           // peers' counts are in flight
  };
  int scan_tmp[Config::kWarps + 1];
  VolumeSums red_sums[Config::kWarps];  // weave: block reductions of the spatial choice
  GridBest red_best[Config::kWarps];
  int num_comm;                         // CTAs that dispatch first (static / weave); 0 for sequential
  int choice_c, choice_k;               // weave: the cost model's (c*, K*) for this call
  int g1_tiles;                         // GEMM1 tiles this CTA ran (static / weave; the consumers' leader counts)
  int g1s_tiles;                        // the shared expert's GEMM1 tiles this CTA ran
  int tl_count;
  uint64_t epoch;                       // this call's epoch: *p.epoch_ctr + 1, read by thread 0 at the start
  BulkRing ring;                        // dispatch by bulk copies (p.dispatch_bulk): the slots' mbarriers
};

__device__ __forceinline__ int ceil_div(int a, int b) { return (a + b - 1) / b; }

// Exclusive scan of f(0..n-1) into out[0..n]; out[n] = total. n <= 16 * kThreads. Call from all threads.
template <typename F>
__device__ __forceinline__ void block_scan(int n, F f, int* out, int* tmp) {
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int per = ceil_div(n, Config::kThreads);
  const int begin = min(n, tid * per), end = min(n, begin + per);
  int sum = 0;
  for (int i = begin; i < end; ++i) sum += f(i);
  int incl = sum;
#pragma unroll
  for (int off = 1; off < 32; off <<= 1) {
    const int v = __shfl_up_sync(0xffffffffu, incl, off);
    if (lane >= off) incl += v;
  }
  if (lane == 31) tmp[warp] = incl;
  __syncthreads();
  if (tid == 0) {
    int run = 0;
    for (int w = 0; w < Config::kWarps; ++w) {
      const int t = tmp[w];
      tmp[w] = run;
      run += t;
    }
    tmp[Config::kWarps] = run;
  }
  __syncthreads();
  int run = tmp[warp] + incl - sum;
  for (int i = begin; i < end; ++i) {
    out[i] = run;
    run += f(i);
  }
  if (tid == 0) out[n] = tmp[Config::kWarps];
  __syncthreads();
}

// Largest q in [0, n] with prefix[q] <= x (prefix ascending, prefix[0] = 0 <= x).
__device__ __forceinline__ int find_segment(const int* prefix, int n, int x) {
  int lo = 0, hi = n;
  while (lo < hi) {
    const int mid = (lo + hi + 1) >> 1;
    if (prefix[mid] <= x) lo = mid; else hi = mid - 1;
  }
  return lo;
}

// Receive layout on an owner: per local expert, the rows of every source back to back (step t = source
// (owner - t) mod G, so the owner's own rows come first), the expert's rows padded once to a multiple of
// kBlockM. A compute row block (kBlockM rows of one expert) may therefore hold rows of several sources; each
// source publishes one flag per (row block, source) that it wrote into. The owner's own rows are never
// copied: GEMM0 gathers them from x.
struct RowBlock {
  int le;        // local expert on the owner
  int expert;    // global expert id
  int src;       // dispatch: the source rank (this rank); compute: -1 (per row, see load_block_pairs)
  int dst;       // owner rank
  int num_rows;  // valid rows (<= kBlockM)
  int row0;      // first row in the owner's receive buffer (compute blocks: a multiple of kBlockM)
  int slot0;     // first row inside the expert's rows on the owner (compute) / inside this rank's pairs of
                 // the expert (dispatch)
  int seg;       // index of the expert's step-0 entry in segoff: (owner * El + le) * G
};

struct LayoutView {
  const SharedLayout& s;
  const Params& p;

  // First receive row of the segment of step t of (owner, le), relative to the owner's receive buffer.
  __device__ int segment_row0(int owner, int le, int step) const {
    const int G = p.world, El = p.num_local_experts;
    return s.segoff[(owner * El + le) * G + step] - s.segoff[owner * El * G];
  }
  // Rows of step t of a compute block's expert, as offsets inside the expert's rows: [begin, end).
  __device__ int step_begin(const RowBlock& b, int step) const { return s.segoff[b.seg + step] - s.segoff[b.seg]; }
  __device__ int step_rows(const RowBlock& b, int step) const {
    const int src = (b.dst - step + p.world) % p.world;
    return s.cnt[src * p.num_experts + b.expert];
  }
  // idx-th row block this rank computes (order: local expert, then block).
  __device__ RowBlock compute_block(int idx) const {
    const int G = p.world, El = p.num_local_experts;
    RowBlock b;
    b.le = find_segment(s.tq, El, idx);
    b.dst = p.rank;
    b.src = -1;
    b.expert = p.owner_experts[p.rank * El + b.le];
    b.seg = (p.rank * El + b.le) * G;
    b.slot0 = (idx - s.tq[b.le]) * Config::kBlockM;
    int total = 0;
    for (int t = 0; t < G; ++t) total += step_rows(b, t);
    b.num_rows = min(Config::kBlockM, total - b.slot0);
    b.row0 = segment_row0(p.rank, b.le, 0) + b.slot0;
    return b;
  }
  // idx-th row piece this rank sends (destinations r+1, r+2, ..., then local expert, then piece): the part
  // of this rank's segment at the owner that falls into one of the owner's row blocks.
  __device__ RowBlock dispatch_block(int idx) const {
    const int G = p.world, El = p.num_local_experts, BM = Config::kBlockM;
    const int q = find_segment(s.dq, (G - 1) * El, idx);
    RowBlock b;
    b.le = q % El;
    b.src = p.rank;
    b.dst = (p.rank + 1 + q / El) % G;
    b.expert = p.owner_experts[b.dst * El + b.le];
    b.seg = (b.dst * El + b.le) * G;
    const int a = segment_row0(b.dst, b.le, (b.dst - p.rank + G) % G);
    const int n = s.cnt[p.rank * p.num_experts + b.expert];
    const int blk = a / BM + (idx - s.dq[q]);
    const int r0 = max(a, blk * BM), r1 = min(a + n, (blk + 1) * BM);
    b.row0 = r0;
    b.num_rows = r1 - r0;
    b.slot0 = r0 - a;
    return b;
  }
  __device__ int num_compute_blocks() const { return s.tq[p.num_local_experts]; }
  __device__ int expert_first_block(int le) const { return s.tq[le]; }
  __device__ int expert_num_blocks(int le) const { return s.tq[le + 1] - s.tq[le]; }
  __device__ int num_dispatch_blocks() const { return s.dq[(p.world - 1) * p.num_local_experts]; }
};

// Fill segoff, tq and dq from cnt (all threads). Returns false (error raised) if a receive buffer overflows.
__device__ __forceinline__ bool build_layout(SharedLayout& s, const Params& p) {
  const int G = p.world, El = p.num_local_experts, E = p.num_experts, BM = Config::kBlockM;
  const int* owner_experts = p.owner_experts;
  // rows of (owner dl / El, local expert dl % El) from the source of step t
  auto rows = [&](int dl, int t) { return s.cnt[((dl / El) - t + G) % G * E + owner_experts[dl]]; };
  auto padded = [&](int dl) {
    int total = 0;
    for (int t = 0; t < G; ++t) total += rows(dl, t);
    return ceil_div(total, BM) * BM - total;
  };
  block_scan(
      G * El * G, [&](int i) { return rows(i / G, i % G) + (i % G == G - 1 ? padded(i / G) : 0); }, s.segoff,
      s.scan_tmp);
  block_scan(
      El, [&](int le) { return (s.segoff[(p.rank * El + le + 1) * G] - s.segoff[(p.rank * El + le) * G]) / BM; },
      s.tq, s.scan_tmp);
  block_scan(
      (G - 1) * El,
      [&](int q) {
        const int dst = (p.rank + 1 + q / El) % G, dl = dst * El + q % El;
        const int n = s.cnt[p.rank * E + owner_experts[dl]];
        if (n == 0) return 0;
        const int a = s.segoff[dl * G + (dst - p.rank + G) % G] - s.segoff[dst * El * G];
        return (a + n - 1) / BM - a / BM + 1;
      },
      s.dq, s.scan_tmp);
  bool ok = true;
  if (threadIdx.x == 0) {
    for (int d = 0; d < G; ++d) {
      const int rows_d = s.segoff[(d + 1) * El * G] - s.segoff[d * El * G];
      if (rows_d > p.recv_cap_rows) {
        raise_error(p, kErrRecvOverflow, d, rows_d);
        ok = false;
      }
    }
  }
  return cta_all(ok);
}

}  // namespace weave

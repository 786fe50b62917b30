// Per-call layout computed inside the kernel from the all-gathered counts: where every (expert, source)
// segment lives in its owner's receive buffer, which row blocks this rank computes, which it dispatches.
// Every rank computes the same numbers from the same counts, so no host round trip is needed.
#pragma once
#include <cstdint>

#include "choice.cuh"
#include "config.cuh"
#include "sync.cuh"

namespace weave {

struct SharedLayout {
  int cnt[Config::kMaxRanks * Config::kMaxExperts];         // cnt[s*E + e]: pairs source s sends to expert e
  int rowoff[Config::kMaxRanks * Config::kMaxExperts + 1];  // scan over (owner d, local le, source s) of
                                                            // BM-padded segment sizes
  int ebase[Config::kMaxExperts + 1];  // scan of this rank's counts: base of expert e in sorted_pair
  int tq[Config::kMaxExperts + 1];     // scan of row blocks this rank computes, (le, step i) order
  int tk[2 * Config::kMaxExperts + 2]; // static policy: scan of tickets per segment (GEMM0 of expert i,
                                       // GEMM1 of expert i - L)
  int dq[Config::kMaxExperts + 1];     // scan of row blocks this rank sends to other ranks, (step i, le) order
  int hist[Config::kMaxExperts];       // routing histogram, then this CTA's per-expert base
  int pair[Config::kBlockM];           // pair ids of the rows of the current block
  int scan_tmp[Config::kWarps + 1];
  VolumeSums red_sums[Config::kWarps];  // weave: block reductions of the spatial choice
  GridBest red_best[Config::kWarps];
  int num_comm;                         // CTAs that dispatch first (static / weave); 0 for sequential
  int choice_c, choice_k;               // weave: the cost model's (c*, K*) for this call
  int ok;
  int ticket;
  int tl_count;
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

// A row block of one (local expert, source) segment on its owner.
struct RowBlock {
  int le;        // local expert on the owner
  int expert;    // global expert id
  int src;       // source rank of the rows
  int dst;       // owner rank
  int mb;        // block index inside the segment
  int num_rows;  // valid rows (<= kBlockM)
  int row0;      // first row in the owner's receive buffer (multiple of kBlockM)
  int slot0;     // first slot inside the source's per-expert order (mb * kBlockM)
};

struct LayoutView {
  const SharedLayout& s;
  const Params& p;

  __device__ int segment_row0(int owner, int le, int src) const {
    const int G = p.world, El = p.num_local_experts;
    return s.rowoff[(owner * El + le) * G + src] - s.rowoff[owner * El * G];
  }
  // idx-th row block this rank computes (order: local expert, then sources r, r-1, ..., then block).
  __device__ RowBlock compute_block(int idx) const {
    const int G = p.world, El = p.num_local_experts;
    const int q = find_segment(s.tq, G * El, idx);
    RowBlock b;
    const int step = q % G;
    b.le = q / G;
    b.dst = p.rank;
    b.src = (p.rank - step + G) % G;
    b.expert = p.owner_experts[p.rank * El + b.le];
    b.mb = idx - s.tq[q];
    b.slot0 = b.mb * Config::kBlockM;
    b.num_rows = min(Config::kBlockM, s.cnt[b.src * p.num_experts + b.expert] - b.slot0);
    b.row0 = segment_row0(p.rank, b.le, b.src) + b.slot0;
    return b;
  }
  // idx-th row block this rank sends (destinations r+1, r+2, ..., then local expert, then block). Rows for
  // this rank's own experts are never copied: GEMM0 gathers them straight from x.
  __device__ RowBlock dispatch_block(int idx) const {
    const int G = p.world, El = p.num_local_experts;
    const int q = find_segment(s.dq, (G - 1) * El, idx);
    RowBlock b;
    const int step = 1 + q / El;
    b.le = q % El;
    b.src = p.rank;
    b.dst = (p.rank + step) % G;
    b.expert = p.owner_experts[b.dst * El + b.le];
    b.mb = idx - s.dq[q];
    b.slot0 = b.mb * Config::kBlockM;
    b.num_rows = min(Config::kBlockM, s.cnt[p.rank * p.num_experts + b.expert] - b.slot0);
    b.row0 = segment_row0(b.dst, b.le, p.rank) + b.slot0;
    return b;
  }
  __device__ int num_compute_blocks() const { return s.tq[p.world * p.num_local_experts]; }
  __device__ int expert_first_block(int le) const { return s.tq[le * p.world]; }
  __device__ int expert_num_blocks(int le) const { return s.tq[(le + 1) * p.world] - s.tq[le * p.world]; }
  // t-th tile of a phase that has `ncols` column blocks per row block, expert-major, then column block, then
  // row block: consecutive tiles share one weight tile (read once from HBM, then from L2). Returns the row
  // block index; *col gets the column block.
  __device__ int expert_major_tile(int t, int ncols, int* col) const {
    const int G = p.world;
    const int le = find_segment(s.tq, G * p.num_local_experts, t / ncols) / G;
    const int nblk = expert_num_blocks(le);
    const int off = t - ncols * expert_first_block(le);
    *col = off / nblk;
    return expert_first_block(le) + off % nblk;
  }
  __device__ int num_dispatch_blocks() const { return s.dq[(p.world - 1) * p.num_local_experts]; }
};

// Fill rowoff, tq and dq from cnt (all threads). Returns false (error raised) if a receive buffer overflows.
__device__ __forceinline__ bool build_layout(SharedLayout& s, const Params& p) {
  const int G = p.world, El = p.num_local_experts, E = p.num_experts, BM = Config::kBlockM;
  const int* owner_experts = p.owner_experts;
  block_scan(
      G * El * G,
      [&](int i) {
        const int src = i % G, dl = i / G;  // dl = owner * El + le
        return ceil_div(s.cnt[src * E + owner_experts[dl]], BM) * BM;
      },
      s.rowoff, s.scan_tmp);
  block_scan(
      G * El,
      [&](int q) {
        const int src = (p.rank - q % G + G) % G;
        return ceil_div(s.cnt[src * E + owner_experts[p.rank * El + q / G]], BM);
      },
      s.tq, s.scan_tmp);
  block_scan(
      (G - 1) * El,
      [&](int q) {
        const int dst = (p.rank + 1 + q / El) % G;
        return ceil_div(s.cnt[p.rank * E + owner_experts[dst * El + q % El]], BM);
      },
      s.dq, s.scan_tmp);
  if (threadIdx.x == 0) {
    int ok = 1;
    for (int d = 0; d < G; ++d) {
      const int rows = s.rowoff[(d + 1) * El * G] - s.rowoff[d * El * G];
      if (rows > p.recv_cap_rows) {
        raise_error(p, kErrRecvOverflow, d, rows);
        ok = 0;
      }
    }
    s.ok = ok;
  }
  __syncthreads();
  return cta_read_ok(&s.ok);
}

}  // namespace weave

// The tasks a CTA runs: dispatch a row block, GEMM0 (+SwiGLU) and GEMM1 (+combine push) tiles, push a row
// block back (sequential policy), and the weighted reduction. Framework-free: raw pointers only.
#pragma once
#include <cstdint>

#include "bulk_copy.cuh"
#include "config.cuh"
#include "gemm.cuh"
#include "pipeline.cuh"
#include "layout.cuh"
#include "sync.cuh"

namespace weave {

// ---- symmetric-buffer addressing ----------------------------------------------------------------------
template <typename T>
__device__ __forceinline__ T* sym(const Params& p, int rank, int64_t offset) {
  return reinterpret_cast<T*>(static_cast<uintptr_t>(p.peer_base[rank]) + static_cast<uint64_t>(offset));
}

// ---- timeline -----------------------------------------------------------------------------------------
// One thread records: thread 0 outside the GEMM phases, the consumers' leader (thread kProducerThreads) inside.
__device__ __forceinline__ void tl_record_span(const Params& p, SharedLayout& s, uint64_t t0, uint64_t t1,
                                               uint16_t role, uint16_t kind, int a0, int a1, int who = 0) {
  if (p.timeline == nullptr || static_cast<int>(threadIdx.x) != who) return;
  const int n = s.tl_count;
  if (n >= p.timeline_per_cta) return;
  TimelineRecord r;
  r.start_ns = t0;
  r.end_ns = t1;
  r.sm = smid();
  r.role = role;
  r.kind = kind;
  r.arg0 = a0;
  r.arg1 = a1;
  p.timeline[static_cast<int64_t>(blockIdx.x) * p.timeline_per_cta + n] = r;
  s.tl_count = n + 1;
}
__device__ __forceinline__ void tl_record(const Params& p, SharedLayout& s, uint64_t t0, uint16_t role,
                                          uint16_t kind, int a0, int a1, int who = 0) {
  if (p.timeline != nullptr && static_cast<int>(threadIdx.x) == who)
    tl_record_span(p, s, t0, globaltimer_ns(), role, kind, a0, a1, who);
}
// Record a wait only when it cost something (keeps traces small).
__device__ __forceinline__ void tl_wait(const Params& p, SharedLayout& s, uint64_t t0, uint16_t role, int a0,
                                        int a1, int who = 0) {
  if (p.timeline != nullptr && static_cast<int>(threadIdx.x) == who && globaltimer_ns() - t0 > 1000)
    tl_record(p, s, t0, role, kTaskWait, a0, a1, who);
}
__device__ __forceinline__ uint64_t tl_now(const Params& p) { return p.timeline ? globaltimer_ns() : 0; }

// ---- row copies (16-byte accesses, kCopyUnroll loads in flight per thread) -------------------------------
// Copies num_rows rows of row_chunks 16-byte chunks from src_row(m) to dst_row(m). Thread t copies chunks t,
// t + kThreads, ... of the rows laid end to end; its (row, chunk) position is carried from one to the next (kThreads
// is dm rows and dc chunks: at most one wrap per step) rather than divided out of the flat index. Two divisions by
// the run-time row length per 16 bytes, one for the load and one for the store, were most of the loop's
// instructions (docs/kernel.md, "Dispatch without a division per chunk").
template <typename SrcRow, typename DstRow>
__device__ __forceinline__ void copy_rows(int num_rows, int row_chunks, SrcRow src_row, DstRow dst_row) {
  constexpr int U = Config::kCopyUnroll;
  const int dm = Config::kThreads / row_chunks, dc = Config::kThreads % row_chunks;
  int m = threadIdx.x / row_chunks, c = threadIdx.x % row_chunks;
  while (m < num_rows) {
    int4 v[U];
    int mu[U], cu[U];
#pragma unroll
    for (int u = 0; u < U; ++u) {
      mu[u] = m;
      cu[u] = c;
      if (m < num_rows) v[u] = __ldcg(src_row(m) + c);
      m += dm;
      c += dc;
      if (c >= row_chunks) {
        c -= row_chunks;
        ++m;
      }
    }
#pragma unroll
    for (int u = 0; u < U; ++u)
      if (mu[u] < num_rows) dst_row(mu[u])[cu[u]] = v[u];
  }
}

// ---- dispatch: push one row piece of this rank's tokens into the owner's receive buffer -----------------
// The piece lies inside one of the owner's row blocks; its flag is (row block, source) = (row0 / BM, rank).
// tok: kBlockM ints of shared scratch (a tile slot's; no GEMM runs meanwhile), the rows' source tokens (pair id / k,
// divided once per row, not per chunk). With p.dispatch_bulk the rows go
// by bulk copies through the operand stages at `smem` (bulk_copy.cuh); false if one never landed.
__device__ __forceinline__ bool dispatch_block(const Params& p, SharedLayout& s, uint8_t* smem, int* tok,
                                               const RowBlock& b) {
  const int H = p.hidden;
  int32_t* meta = sym<int32_t>(p, b.dst, p.off_recv_meta);
  if (threadIdx.x < b.num_rows) {
    const int id = __ldcg(p.sorted_pair + s.ebase[b.expert] + b.slot0 + threadIdx.x);
    tok[threadIdx.x] = id / p.top_k;
    meta[b.row0 + threadIdx.x] = id;
  }
  __syncthreads();
  const int4* x = reinterpret_cast<const int4*>(p.fp8 ? p.x_q : p.x);
  int4* recv = sym<int4>(p, b.dst, p.off_recv_x);
  const int row_chunks = p.fp8 ? H / 16 : H / 8;  // e4m3 rows: H bytes (and their scales, below)
  auto src_row = [&](int m) { return x + static_cast<int64_t>(tok[m]) * row_chunks; };
  auto dst_row = [&](int m) { return recv + static_cast<int64_t>(b.row0 + m) * row_chunks; };
  if (p.fp8) {  // the rows' scales, H / 128 floats each, by the threads (also before bulk copies of the rows)
    const int ns = H / 128, st = fp8_scale_stride(H);
    float* rs = sym<float>(p, b.dst, p.off_recv_xs) + static_cast<int64_t>(b.row0) * st;
    for (int i = threadIdx.x; i < b.num_rows * ns; i += Config::kThreads)
      rs[(i / ns) * st + i % ns] = __ldcg(p.x_scale + static_cast<int64_t>(tok[i / ns]) * st + i % ns);
  }
  if (p.dispatch_bulk) {
    // rows of 16 * row_chunks bytes (bf16: 2H, e4m3: H); ends with a CTA barrier, after which thread 0's fence
    // below orders the other threads' scale stores too, as the barrier after copy_rows does
    if (!bulk_copy_rows_cta(p, s.ring, smem, b.num_rows, row_chunks * 16, src_row, dst_row)) return false;
  } else {
    copy_rows(b.num_rows, row_chunks, src_row, dst_row);
    __syncthreads();
  }
  if (threadIdx.x == 0) {
    __threadfence_system();
    st_release_sys_u64(sym<uint64_t>(p, b.dst, p.off_blk_flag) + (b.row0 / Config::kBlockM) * p.world + p.rank,
                       s.epoch);
  }
  return true;
}

// Pair ids (token * top_k + j on the source) and source ranks of a computed block's rows into ts.pair and
// ts.psrc (threads [0, num_rows)). The owner's own rows (the expert's first rows) come from this rank's sorted
// pair list, received rows from the metadata their source pushed with them. No barrier.
__device__ __forceinline__ void load_block_pairs(const Params& p, const SharedLayout& s, const LayoutView& lv,
                                                 const RowBlock& b, TileSlot& ts) {
  if (threadIdx.x >= b.num_rows) return;
  const int er = b.slot0 + threadIdx.x;  // row inside the expert's rows
  if (er < lv.step_rows(b, 0)) {
    ts.pair[threadIdx.x] = __ldcg(p.sorted_pair + s.ebase[b.expert] + er);
    ts.psrc[threadIdx.x] = p.rank;
    return;
  }
  int step = 1;
  while (step + 1 < p.world && lv.step_begin(b, step + 1) <= er) ++step;
  ts.pair[threadIdx.x] = __ldcg(sym<const int32_t>(p, p.rank, p.off_recv_meta) + b.row0 + threadIdx.x);
  ts.psrc[threadIdx.x] = (p.rank - step + p.world) % p.world;
}

// One thread: wait until every source whose rows fall into compute block b has published them.
__device__ __forceinline__ bool block_rows_ready(const Params& p, const LayoutView& lv, const RowBlock& b) {
  const int rb = b.row0 / Config::kBlockM;
  for (int step = 1; step < p.world; ++step) {
    const int n = lv.step_rows(b, step), beg = lv.step_begin(b, step);
    if (n == 0 || beg >= b.slot0 + b.num_rows || beg + n <= b.slot0) continue;
    const int src = (p.rank - step + p.world) % p.world;
    const uint64_t* f = sym<const uint64_t>(p, p.rank, p.off_blk_flag) + rb * p.world + src;
    if (!spin_until(p, [&] { return ld_acquire_sys_u64(f) >= lv.s.epoch; }, kErrTimeoutRows, rb, src)) return false;
  }
  return true;
}

// ---- the shared expert: virtual expert slots ------------------------------------------------------------
// The GEMM phases walk Ev = El (+ 1 with a shared expert) expert slots; the shared expert takes slot 0 (shared_first)
// or slot El, the routed local experts the others in order. Its row blocks are this rank's tokens, kBlockM at a time
// (RowBlock::le = kSharedLe marks them: row0 = first token, no pair ids, no flags to wait for).
// `on`: this launch computes a shared expert. The kernel is built twice (weave_moe_kernel<kShared>), and the
// instantiation without one folds every shared branch away: layers without a shared expert run the code they ran
// before it existed (with the branches in, they measured 1.5-2.4% slower; docs/kernel.md).
constexpr int kSharedLe = -1;
template <bool kShared>
__device__ __forceinline__ bool shared_on(const Params& p) { return kShared && p.inter_shared > 0; }
__device__ __forceinline__ int num_expert_slots(const Params& p, bool on) { return p.num_local_experts + (on ? 1 : 0); }
__device__ __forceinline__ int shared_slot(const Params& p, bool on) {
  return !on ? -1 : (p.shared_first ? 0 : p.num_local_experts);
}
__device__ __forceinline__ int num_shared_blocks(const Params& p, bool on) {
  return on ? (p.num_tokens + Config::kBlockM - 1) / Config::kBlockM : 0;
}
// local expert of a routed slot
__device__ __forceinline__ int slot_local_expert(const Params& p, bool on, int v) {
  return on && p.shared_first ? v - 1 : v;
}
__device__ __forceinline__ int slot_num_blocks(const Params& p, bool on, const LayoutView& lv, int v) {
  return on && v == shared_slot(p, on) ? num_shared_blocks(p, on) : lv.expert_num_blocks(slot_local_expert(p, on, v));
}
// GEMM0 column tiles (kHalfN h columns each) of a slot
__device__ __forceinline__ int slot_gemm0_cols(const Params& p, bool on, int v) {
  return ((on && v == shared_slot(p, on) ? p.inter_shared : p.inter) + Config::kHalfN - 1) / Config::kHalfN;
}
__device__ __forceinline__ RowBlock shared_block(const Params& p, int i) {
  RowBlock b;
  b.le = kSharedLe;
  b.expert = -1;
  b.src = -1;
  b.dst = p.rank;
  b.row0 = i * Config::kBlockM;
  b.num_rows = min(Config::kBlockM, p.num_tokens - b.row0);
  b.slot0 = 0;
  b.seg = 0;
  return b;
}

// ---- the GEMM tiles of the megakernel, as a tile source for run_tiles (pipeline.cuh) ----------------------
//   GEMM0: h[rows, kHalfN cols] = SwiGLU(x_rows W1^T, x_rows W3^T); A rows gathered from x (this rank's own
//          tokens) and from the receive buffer; waits for the rows' dispatch flags.
//   GEMM1: out[rows, kBlockN cols] = h_rows W2^T; waits until all GEMM0 tiles of the block are done; pushed
//          straight into the source's combine slots (static / weave), or written in place over the receive rows
//          (sequential: the combine phase pushes them later).
//   The shared expert's tiles: the same with x's rows in order, hs for h, ys for the output (local, added in the
//          reduction); its GEMM0 waits for nothing.
// Tickets: one counter over the expert-slot segments of s.tk: segment i holds the GEMM0 tiles of slot i (if
// with_g0) and then the GEMM1 tiles of slot i - L (if i >= L); within a segment column block, then row block,
// so consecutive tiles share a weight tile. static / weave: both kinds in one pass (gemm_phases picks L);
// sequential: a GEMM0-only pass (L = Ev), then a GEMM1-only pass (with_g0 = false, L = 0).
template <bool kShared, bool F8 = false>
struct MoeTiles {
  static constexpr bool kF8 = F8;  // FP8 experts (pipeline.cuh's consumer loop, the epilogues below)
  // Blocks of <= 64 rows skip the MMAs of their padding rows. kHalf, the split form (wgmma.cuh mma_stage_half,
  // mma_stage_half_e4m3): bf16 and FP8 tiles of the kernel without the shared expert's code (with it, the split
  // form's second copy of the k loop made ptxas serialise every wgmma: C7511). kIdleHalf, the idle form
  // (pipeline.cuh with_mma_form): bf16 tiles of the kernel with it. FP8 keeps full tiles there: its k loop waits
  // for every step's MMAs, so one warpgroup alone leaves the tensor cores idle (docs/kernel.md "Half tiles with the
  // shared expert").
  static constexpr bool kHalf = !kShared;
  static constexpr bool kIdleHalf = kShared && !F8;
  const Params& p;
  SharedLayout& s;
  const LayoutView& lv;
  uint16_t role;       // timeline label
  uint32_t* ticket;
  int num_seg, L;
  bool with_g0;        // segments start with their expert's GEMM0 tiles
  bool push;           // GEMM1 epilogue: into the source's combine slot (else in place over the receive row)

  // k steps over K: 64 bf16 or 128 e4m3 (one 128-byte smem row either way)
  static __device__ __forceinline__ int k_steps(int K) { return K / (F8 ? 2 * Config::kBlockK : Config::kBlockK); }
  // producer thread 0: the next tile and its inputs ready; false on an error
  __device__ __forceinline__ bool next(TileDesc& d) {
    const bool on = shared_on<kShared>(p);
    const int t = static_cast<int>(atomicAdd(ticket, 1u));
    if (t >= s.tk[num_seg]) {
      d.kind = kTileEnd;
      return true;
    }
    const int seg = find_segment(s.tk, num_seg, t);
    int off = t - s.tk[seg];
    const int g0_tiles =
        with_g0 && seg < num_expert_slots(p, on) ? slot_gemm0_cols(p, on, seg) * slot_num_blocks(p, on, lv, seg) : 0;
    const bool g0 = off < g0_tiles;
    const int v = g0 ? seg : seg - L, nblk = slot_num_blocks(p, on, lv, v);
    if (!g0) off -= g0_tiles;
    d.kind = g0 ? kTileGemm0 : kTileGemm1;
    d.col = off / nblk;
    if (on && v == shared_slot(p, on)) {
      const int i = off % nblk;
      d.b = shared_block(p, i);
      if (g0) {
        d.num_k = k_steps(p.hidden);
        return true;
      }
      d.num_k = k_steps(p.inter_shared);
      const uint32_t* done0 = p.g0s_done + (s.epoch & 1) * p.max_shared_blocks + i;
      const uint32_t n0s = static_cast<uint32_t>(slot_gemm0_cols(p, on, v));
      return spin_until(p, [&] { return ld_acquire_gpu_u32(done0) >= n0s; }, kErrTimeoutSharedGemm0, i, d.col);
    }
    const int le = slot_local_expert(p, on, v);
    d.b = lv.compute_block(lv.expert_first_block(le) + off % nblk);
    const int rb = d.b.row0 / Config::kBlockM;
    if (g0) {
      d.num_k = k_steps(p.hidden);
      return block_rows_ready(p, lv, d.b);
    }
    d.num_k = k_steps(p.inter);
    const int n0 = ceil_div(p.inter, Config::kHalfN);
    const uint32_t* done0 = p.g0_done + (s.epoch & 1) * p.max_row_blocks + rb;
    return spin_until(p, [&] { return ld_acquire_gpu_u32(done0) >= static_cast<uint32_t>(n0); }, kErrTimeoutGemm0, rb,
                      d.col);
  }
  // producer warpgroup
  __device__ __forceinline__ void prepare(const TileDesc& d, TileSlot& ts) {
    if (!kShared || d.b.le != kSharedLe) load_block_pairs(p, s, lv, d.b, ts);
  }
  __device__ __forceinline__ const bf16* a_row(const TileDesc& d, const TileSlot& ts, int m) const {
    const int64_t r = d.b.row0 + m;
    // (FP8 rows are K bytes: K / 2 in the bf16 units the producer steps in)
    const int64_t H = F8 ? p.hidden / 2 : p.hidden, I = F8 ? p.inter / 2 : p.inter;
    if (kShared && d.b.le == kSharedLe)
      return d.kind == kTileGemm1 ? reinterpret_cast<const bf16*>(p.hs) + r * (F8 ? p.inter_shared / 2 : p.inter_shared)
                                  : reinterpret_cast<const bf16*>(F8 ? p.x_q : p.x) + r * H;
    if (d.kind == kTileGemm1) return reinterpret_cast<const bf16*>(p.h) + r * I;
    // own rows: gathered from x (FP8: the kernel's x_q); others: received rows
    return ts.psrc[m] == p.rank
               ? reinterpret_cast<const bf16*>(F8 ? p.x_q : p.x) + static_cast<int64_t>(ts.pair[m] / p.top_k) * H
               : sym<const bf16>(p, p.rank, p.off_recv_x) + r * H;
  }
  // FP8 (consumers): the scales of row m's 128-column blocks of A (one per k step), the same rows a_row reads
  __device__ __forceinline__ const float* a_scales(const TileDesc& d, const TileSlot& ts, int m) const {
    const int64_t r = d.b.row0 + m;
    const int ns = fp8_scale_stride(p.hidden);
    if (kShared && d.b.le == kSharedLe)  // this rank's tokens in order, and its own h rows
      return d.kind == kTileGemm1 ? p.hs_scale + r * fp8_scale_stride(p.inter_shared) : p.x_scale + r * ns;
    if (d.kind == kTileGemm1) return p.h_scale + r * fp8_scale_stride(p.inter);
    return ts.psrc[m] == p.rank ? p.x_scale + static_cast<int64_t>(ts.pair[m] / p.top_k) * ns
                                : sym<const float>(p, p.rank, p.off_recv_xs) + r * ns;
  }
  // FP8: the weight scales of the tile's 128-column half (one per k step): GEMM0 half 0 the gate rows of h columns
  // [col * kHalfN, +kHalfN), half 1 the same up rows; GEMM1 W2's rows [col * kBlockN + 128 half, +128) (past H, a
  // zero box: any scale, the last block's)
  // (the shared expert: w13s_scale [2 Is / 128, H / 128], w2s_scale [H / 128, Is / 128])
  __device__ __forceinline__ const float* b_scales(const TileDesc& d, int half) const {
    const bool sh = kShared && d.b.le == kSharedLe;
    const int le = sh ? 0 : d.b.le, nh = p.hidden / 128, ni = (sh ? p.inter_shared : p.inter) / 128;
    if (d.kind == kTileGemm0)
      return (sh ? p.w13s_scale : p.w13_scale) + (static_cast<int64_t>(le) * 2 * ni + half * ni + d.col) * nh;
    const int rb = min(2 * d.col + half, nh - 1);
    return (sh ? p.w2s_scale : p.w2_scale) + (static_cast<int64_t>(le) * nh + rb) * ni;
  }
  // GEMM0: box 0 = the gate rows of h columns [col * kHalfN, +kHalfN), box 1 = the same up rows (wgmma.cuh; rows
  // past I arrive as zeros and their h columns are not stored); GEMM1: two 128-row halves of W2's column block
  __device__ __forceinline__ void b_boxes(const TileDesc& d, const void** map, int* y, int* z) const {
    static_assert(Config::kHalfN == Config::kBoxRows, "GEMM0 B: one box of gate rows, one of up rows");
    const bool sh = kShared && d.b.le == kSharedLe;
    const int le = sh ? 0 : d.b.le;
    if (d.kind == kTileGemm0) {
      *map = sh ? &p.tmap_w13s : &p.tmap_w13;
      y[0] = y[1] = d.col * Config::kHalfN;
      z[0] = 2 * le;
      z[1] = 2 * le + 1;
    } else {
      *map = sh ? &p.tmap_w2s : &p.tmap_w2;
      y[0] = d.col * Config::kBlockN;
      y[1] = d.col * Config::kBlockN + Config::kBoxRows;
      z[0] = z[1] = le;
    }
  }
  // consumers; ends with a consumer barrier
  __device__ __forceinline__ void epilogue(const TileDesc& d, const TileSlot& ts, const TileAcc& acc, uint8_t* staging) const {
    const int H = p.hidden, row0 = d.b.row0;
    const bool sh = kShared && d.b.le == kSharedLe;
    if (d.kind == kTileGemm0) {
      const int I = sh ? p.inter_shared : p.inter;
      const int c0 = d.col * Config::kHalfN;
      if constexpr (F8) {  // h in e4m3, one scale per (row, tile); the tile's 128 columns are one scale block
        uint8_t* h8 = reinterpret_cast<uint8_t*>(sh ? p.hs : p.h) + c0;
        const int hs = fp8_scale_stride(I);
        static_assert(Config::kSmemStaging + 2 * 64 * sizeof(float) <= Config::kSmemStage,
                      "a half tile's amax exchange fits the staging stage past the staged block");
        stage_swiglu_e4m3(acc, staging, (sh ? p.hs_scale : p.h_scale) + static_cast<int64_t>(row0) * hs + d.col, hs,
                          d.b.num_rows, kHalf && is_half_tile(d.b.num_rows),
                          reinterpret_cast<float*>(staging + Config::kSmemStaging));
        named_sync(kBarConsumers, Config::kConsumerThreads);
        store_staged(staging, d.b.num_rows, Config::kHalfN / 2,  // 128 bytes = 64 "bf16" per row
                     [&](int m) { return reinterpret_cast<bf16*>(h8 + static_cast<int64_t>(row0 + m) * I); });
        named_sync(kBarConsumers, Config::kConsumerThreads);
        return;
      }
      bf16* h = reinterpret_cast<bf16*>(sh ? p.hs : p.h) + c0;
      TileOut out;
      pack_swiglu(acc, out);
      stage_pairs<0>(out, staging, kHalf && is_half_tile(d.b.num_rows));  // such tiles ran as half tiles
      named_sync(kBarConsumers, Config::kConsumerThreads);
      store_staged(staging, d.b.num_rows, min(Config::kHalfN, I - c0),
                   [&](int m) { return h + static_cast<int64_t>(row0 + m) * I; });
      named_sync(kBarConsumers, Config::kConsumerThreads);
      return;
    }
    // static / weave: into the source's combine slot; sequential: over the receive row; shared expert: into ys
    bf16* rows = sh ? reinterpret_cast<bf16*>(p.ys) : sym<bf16>(p, p.rank, p.off_recv_x);
    const bool scatter = push && !sh;
    store_tile_plain(acc, staging, d.b.num_rows, d.col * Config::kBlockN, H, kHalf && is_half_tile(d.b.num_rows),
                     [&](int m, int col) {
      return (scatter ? sym<bf16>(p, ts.psrc[m], p.off_comb) + static_cast<int64_t>(ts.pair[m]) * H
                      : rows + static_cast<int64_t>(row0 + m) * H) + col;
    });
  }
  // consumers' leader, after the epilogue
  __device__ __forceinline__ void tile_done(const TileDesc& d, uint64_t t_wait, uint64_t t_start) const {
    const int rb = d.b.row0 / Config::kBlockM, who = Config::kProducerThreads;
    const bool sh = kShared && d.b.le == kSharedLe;
    if (d.kind == kTileGemm0) {
      // No separate fence: the release add orders the consumers' h (and scale) stores before it, cumulatively
      // through the consumer barrier that ended the epilogue (bar.sync synchronizes the storing threads with this
      // one), for GEMM1's producers, which acquire the counter before they read h.
      red_release_gpu_add_u32(sh ? p.g0s_done + (s.epoch & 1) * p.max_shared_blocks + rb
                                 : p.g0_done + (s.epoch & 1) * p.max_row_blocks + rb,
                              1u);
    } else if (sh) {
      ++s.g1s_tiles;
    } else {
      ++s.g1_tiles;
    }
    if (t_start - t_wait > 1000) tl_record_span(p, s, t_wait, t_start, role, kTaskWait, rb, d.col, who);
    const uint16_t kind = d.kind == kTileGemm0 ? (sh ? kTaskSharedGemm0 : kTaskGemm0)
                                               : (sh ? kTaskSharedGemm1 : kTaskGemm1);
    tl_record(p, s, t_start, role, kind, rb, d.col, who);
  }
  __device__ __forceinline__ uint64_t now() const { return tl_now(p); }
};

// Tell every source that this owner's combine rows have all landed.
__device__ __forceinline__ void post_combine_flags(const Params& p, uint64_t epoch) {
  __threadfence_system();
  for (int g = 0; g < p.world; ++g) st_release_sys_u64(sym<uint64_t>(p, g, p.off_comb_flag) + p.rank, epoch);
}

// ---- combine (sequential policy): push a computed row block back to its source's combine slots ----------
__device__ __forceinline__ void combine_block(const Params& p, SharedLayout& s, const LayoutView& lv,
                                              const RowBlock& b, TileSlot& ts) {
  const int row_chunks = p.hidden / 8;
  load_block_pairs(p, s, lv, b, ts);
  __syncthreads();
  const int4* out = sym<const int4>(p, p.rank, p.off_recv_x);
  copy_rows(
      b.num_rows, row_chunks, [&](int m) { return out + static_cast<int64_t>(b.row0 + m) * row_chunks; },
      [&](int m) { return sym<int4>(p, ts.psrc[m], p.off_comb) + static_cast<int64_t>(ts.pair[m]) * row_chunks; });
  __syncthreads();
}

// ---- weighted reduction on the source: y[t] = sum_j w[t, j] * comb[t * k + j] ---------------------------
template <bool kShared>
__device__ __forceinline__ bool reduce_phase(const Params& p, SharedLayout& s, uint16_t role) {
  const bool on = shared_on<kShared>(p);
  const uint64_t t0 = tl_now(p);
  bool ok = true;
  if (threadIdx.x == 0) {
    for (int g = 0; g < p.world && ok; ++g) {
      const uint64_t* f = sym<const uint64_t>(p, p.rank, p.off_comb_flag) + g;
      ok = spin_until(p, [&] { return ld_acquire_sys_u64(f) >= s.epoch; }, kErrTimeoutCombine, g, 0);
    }
  }
  // the shared expert's outputs: every GEMM1 tile of it counted (gemm_phases: a fence, then the count)
  if (threadIdx.x == 0 && ok && on) {
    const uint32_t want = static_cast<uint32_t>(num_shared_blocks(p, on) * ceil_div(p.hidden, Config::kBlockN));
    const uint32_t* done = p.sched + (s.epoch & 1) * 4 + 3;
    ok = spin_until(p, [&] { return ld_acquire_gpu_u32(done) >= want; }, kErrTimeoutShared, 0,
                    static_cast<int>(want));
  }
  if (!cta_all(ok)) return false;
  tl_wait(p, s, t0, role, -1, -1);
  const uint64_t t1 = tl_now(p);
  const int row_chunks = p.hidden / 8, k = p.top_k;
  const int4* ys = on ? reinterpret_cast<const int4*>(p.ys) : nullptr;
  const int64_t total = static_cast<int64_t>(p.num_tokens) * row_chunks;
  const int4* comb = sym<const int4>(p, p.rank, p.off_comb);
  int4* y = reinterpret_cast<int4*>(p.y);
  // element idx = t * row_chunks + c, strided by the grid; (t, c) carried from one to the next as in copy_rows
  // (a 64-bit division per element otherwise)
  const int64_t stride = static_cast<int64_t>(p.num_ctas) * Config::kThreads;
  const int64_t dt = stride / row_chunks;
  const int dc = static_cast<int>(stride % row_chunks);
  const int64_t first = static_cast<int64_t>(blockIdx.x) * Config::kThreads + threadIdx.x;
  int64_t t = first / row_chunks;
  int c = static_cast<int>(first % row_chunks);
  for (int64_t idx = first; idx < total; idx += stride) {
    float acc[8] = {0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f};
    // up to 8 of the k rows in flight per thread (the loads are independent; one at a time left the
    // reduction at about half of HBM bandwidth)
    for (int j0 = 0; j0 < k; j0 += 8) {
      int4 v[8];
      float wj[8];
#pragma unroll
      for (int u = 0; u < 8; ++u) {
        const bool ok = j0 + u < k;
        wj[u] = ok ? __ldg(p.topk_weights + t * k + j0 + u) : 0.f;
        v[u] = ok ? __ldcg(comb + (t * k + j0 + u) * row_chunks + c) : make_int4(0, 0, 0, 0);
      }
#pragma unroll
      for (int u = 0; u < 8; ++u) {
        const __nv_bfloat162* v2 = reinterpret_cast<const __nv_bfloat162*>(&v[u]);
#pragma unroll
        for (int q = 0; q < 4; ++q) {
          const float2 f = __bfloat1622float2(v2[q]);
          acc[2 * q] += wj[u] * f.x;
          acc[2 * q + 1] += wj[u] * f.y;
        }
      }
    }
    if (ys != nullptr) {  // the shared expert's row, weight 1 or the token's shared_scale
      const int4 v = __ldcg(ys + idx);
      const float sc = p.shared_scale != nullptr ? __ldg(p.shared_scale + t) : 1.f;
      const __nv_bfloat162* v2 = reinterpret_cast<const __nv_bfloat162*>(&v);
#pragma unroll
      for (int q = 0; q < 4; ++q) {
        const float2 f = __bfloat1622float2(v2[q]);
        acc[2 * q] += sc * f.x;
        acc[2 * q + 1] += sc * f.y;
      }
    }
    int4 o;
    __nv_bfloat162* o2 = reinterpret_cast<__nv_bfloat162*>(&o);
#pragma unroll
    for (int q = 0; q < 4; ++q) o2[q] = __floats2bfloat162_rn(acc[2 * q], acc[2 * q + 1]);
    y[idx] = o;
    t += dt;
    c += dc;
    if (c >= row_chunks) {
      c -= row_chunks;
      ++t;
    }
  }
  tl_record(p, s, t1, role, kTaskReduce, -1, -1);
  return true;
}

}  // namespace weave

// The tasks a CTA runs: dispatch a row block, GEMM0 (+SwiGLU) and GEMM1 (+combine push) tiles, push a row
// block back (sequential policy), and the weighted reduction. Framework-free: raw pointers only.
#pragma once
#include <cstdint>

#include "config.cuh"
#include "gemm.cuh"
#include "layout.cuh"
#include "sync.cuh"

namespace weave {

// ---- symmetric-buffer addressing ----------------------------------------------------------------------
template <typename T>
__device__ __forceinline__ T* sym(const Params& p, int rank, int64_t offset) {
  return reinterpret_cast<T*>(static_cast<uintptr_t>(p.peer_base[rank]) + static_cast<uint64_t>(offset));
}

// ---- timeline -----------------------------------------------------------------------------------------
__device__ __forceinline__ void tl_record_span(const Params& p, SharedLayout& s, uint64_t t0, uint64_t t1,
                                               uint16_t role, uint16_t kind, int a0, int a1) {
  if (p.timeline == nullptr || threadIdx.x != 0) return;
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
                                          uint16_t kind, int a0, int a1) {
  if (p.timeline != nullptr && threadIdx.x == 0) tl_record_span(p, s, t0, globaltimer_ns(), role, kind, a0, a1);
}
// Record a wait only when it cost something (keeps traces small).
__device__ __forceinline__ void tl_wait(const Params& p, SharedLayout& s, uint64_t t0, uint16_t role, int a0,
                                        int a1) {
  if (p.timeline != nullptr && threadIdx.x == 0 && globaltimer_ns() - t0 > 1000)
    tl_record(p, s, t0, role, kTaskWait, a0, a1);
}
__device__ __forceinline__ uint64_t tl_now(const Params& p) { return p.timeline ? globaltimer_ns() : 0; }

// ---- row copies (16-byte accesses, kCopyUnroll loads in flight per thread) -------------------------------
// Copies num_rows rows of row_chunks 16-byte chunks from src_row(m) to dst_row(m).
template <typename SrcRow, typename DstRow>
__device__ __forceinline__ void copy_rows(int num_rows, int row_chunks, SrcRow src_row, DstRow dst_row) {
  const int total = num_rows * row_chunks;
  constexpr int U = Config::kCopyUnroll;
  for (int base = threadIdx.x; base < total; base += Config::kThreads * U) {
    int4 v[U];
#pragma unroll
    for (int u = 0; u < U; ++u) {
      const int idx = base + u * Config::kThreads;
      if (idx < total) v[u] = __ldcg(src_row(idx / row_chunks) + idx % row_chunks);
    }
#pragma unroll
    for (int u = 0; u < U; ++u) {
      const int idx = base + u * Config::kThreads;
      if (idx < total) dst_row(idx / row_chunks)[idx % row_chunks] = v[u];
    }
  }
}

// ---- dispatch: push one row piece of this rank's tokens into the owner's receive buffer -----------------
// The piece lies inside one of the owner's row blocks; its flag is (row block, source) = (row0 / BM, rank).
__device__ __forceinline__ void dispatch_block(const Params& p, SharedLayout& s, const RowBlock& b) {
  const int H = p.hidden;
  int32_t* meta = sym<int32_t>(p, b.dst, p.off_recv_meta);
  if (threadIdx.x < b.num_rows) {
    const int pair = __ldcg(p.sorted_pair + s.ebase[b.expert] + b.slot0 + threadIdx.x);
    s.pair[threadIdx.x] = pair;
    meta[b.row0 + threadIdx.x] = pair;
  }
  __syncthreads();
  const int4* x = reinterpret_cast<const int4*>(p.x);
  int4* recv = sym<int4>(p, b.dst, p.off_recv_x);
  const int row_chunks = H / 8;
  copy_rows(
      b.num_rows, row_chunks,
      [&](int m) { return x + static_cast<int64_t>(s.pair[m] / p.top_k) * row_chunks; },
      [&](int m) { return recv + static_cast<int64_t>(b.row0 + m) * row_chunks; });
  __syncthreads();
  if (threadIdx.x == 0) {
    __threadfence_system();
    st_release_sys_u64(sym<uint64_t>(p, b.dst, p.off_blk_flag) + (b.row0 / Config::kBlockM) * p.world + p.rank,
                       p.epoch);
  }
}

// Pair ids (token * top_k + j on the source) and source ranks of a computed block's rows into s.pair and
// s.psrc. The owner's own rows (the expert's first rows) come from this rank's sorted pair list, received
// rows from the metadata their source pushed with them. No __syncthreads.
__device__ __forceinline__ void load_block_pairs(const Params& p, SharedLayout& s, const LayoutView& lv,
                                                 const RowBlock& b) {
  if (threadIdx.x >= b.num_rows) return;
  const int er = b.slot0 + threadIdx.x;  // row inside the expert's rows
  if (er < lv.step_rows(b, 0)) {
    s.pair[threadIdx.x] = __ldcg(p.sorted_pair + s.ebase[b.expert] + er);
    s.psrc[threadIdx.x] = p.rank;
    return;
  }
  int step = 1;
  while (step + 1 < p.world && lv.step_begin(b, step + 1) <= er) ++step;
  s.pair[threadIdx.x] = __ldcg(sym<const int32_t>(p, p.rank, p.off_recv_meta) + b.row0 + threadIdx.x);
  s.psrc[threadIdx.x] = (p.rank - step + p.world) % p.world;
}

// Wait (thread 0) until every source whose rows fall into compute block b has published them.
__device__ __forceinline__ bool wait_block_rows(const Params& p, SharedLayout& s, const LayoutView& lv,
                                                const RowBlock& b) {
  const int rb = b.row0 / Config::kBlockM;
  if (threadIdx.x == 0) {
    bool ok = true;
    for (int step = 1; step < p.world && ok; ++step) {
      const int n = lv.step_rows(b, step), beg = lv.step_begin(b, step);
      if (n == 0 || beg >= b.slot0 + b.num_rows || beg + n <= b.slot0) continue;
      const int src = (p.rank - step + p.world) % p.world;
      const uint64_t* f = sym<const uint64_t>(p, p.rank, p.off_blk_flag) + rb * p.world + src;
      ok = spin_until(p, [&] { return ld_acquire_sys_u64(f) >= p.epoch; }, kErrTimeoutRows, rb, src);
    }
    s.ok = ok;
  }
  __syncthreads();
  return cta_read_ok(&s.ok);
}

// ---- GEMM0: h[rows, kHalfN cols] = SwiGLU(x_rows W1^T, x_rows W3^T) ------------------------------------------
__device__ __forceinline__ bool gemm0_tile(const Params& p, SharedLayout& s, uint8_t* smem, const LayoutView& lv,
                                           const RowBlock& b, int col_block, uint16_t role) {
  const int H = p.hidden, I = p.inter, rb = b.row0 / Config::kBlockM;
  const uint64_t t0 = tl_now(p);
  if (!wait_block_rows(p, s, lv, b)) return false;
  tl_wait(p, s, t0, role, rb, col_block);
  const uint64_t t1 = tl_now(p);
  load_block_pairs(p, s, lv, b);
  __syncthreads();

  TileOperands op;
  op.valid = 0;
  op.a_base = reinterpret_cast<const bf16*>(p.x);
  const bf16* recv = sym<const bf16>(p, p.rank, p.off_recv_x);
#pragma unroll
  for (int i = 0; i < TileOperands::kAChunks; ++i) {
    const int m = (threadIdx.x + i * Config::kThreads) >> 3;
    const bool ok = m < b.num_rows;
    const bool own = ok && s.psrc[m] == p.rank;  // own rows: gathered from x; others: received rows
    op.set_a_row(i, ok,
                 own ? op.a_base + static_cast<int64_t>(s.pair[m] / p.top_k) * H
                     : recv + static_cast<int64_t>(b.row0 + m) * H);
  }
  // B: box 0 = the gate rows of h columns [col_block * kHalfN, +kHalfN), box 1 = the same up rows (wgmma.cuh);
  // rows past I (I % 128 != 0) arrive as zeros and their h columns are not stored
  static_assert(Config::kHalfN == Config::kBoxRows, "GEMM0 B: one box of gate rows, one of up rows");
  op.b_map = &p.tmap_w13;
  op.b_y[0] = op.b_y[1] = col_block * Config::kHalfN;
  op.b_z[0] = 2 * b.le;
  op.b_z[1] = 2 * b.le + 1;
  TileAcc acc;
  tile_mainloop(p, op, H, smem, acc);
  bf16* st = reinterpret_cast<bf16*>(smem);
  stage_swiglu(acc, st);
  __syncthreads();
  // kBlockM rows x kHalfN columns, 16-byte chunks; columns past I are not stored
  constexpr int kChunks = Config::kHalfN / 8;
  bf16* h = reinterpret_cast<bf16*>(p.h);
  for (int c = threadIdx.x; c < Config::kBlockM * kChunks; c += Config::kThreads) {
    const int m = c / kChunks, chunk = c % kChunks, col = col_block * Config::kHalfN + chunk * 8;
    if (m < b.num_rows && col < I)
      *reinterpret_cast<int4*>(h + static_cast<int64_t>(b.row0 + m) * I + col) =
          *reinterpret_cast<const int4*>(st + m * Config::kEpiStride + chunk * 8);
  }
  __syncthreads();
  if (threadIdx.x == 0) {
    __threadfence();
    red_release_gpu_add_u32(p.g0_done + (p.epoch & 1) * p.max_row_blocks + rb, 1u);
  }
  tl_record(p, s, t1, role, kTaskGemm0, rb, col_block);
  return true;
}

// ---- GEMM1: out[rows, kBlockN cols] = h_rows W2^T; pushed to the source's combine slots (static policy) or
// written in place over the receive rows (sequential policy, pushed later by the combine phase) ----------
__device__ __forceinline__ bool gemm1_tile(const Params& p, SharedLayout& s, uint8_t* smem, const LayoutView& lv,
                                           const RowBlock& b, int col_block, uint16_t role, bool push_now) {
  const int H = p.hidden, I = p.inter, rb = b.row0 / Config::kBlockM;
  const uint32_t need = static_cast<uint32_t>(ceil_div(I, Config::kHalfN));
  const uint32_t* done0 = p.g0_done + (p.epoch & 1) * p.max_row_blocks + rb;
  const uint64_t t0 = tl_now(p);
  if (threadIdx.x == 0)
    s.ok = spin_until(p, [&] { return ld_acquire_gpu_u32(done0) >= need; }, kErrTimeoutGemm0, rb, col_block);
  __syncthreads();
  if (!cta_read_ok(&s.ok)) return false;
  tl_wait(p, s, t0, role, rb, col_block);
  const uint64_t t1 = tl_now(p);

  load_block_pairs(p, s, lv, b);  // read after the mainloop's closing __syncthreads

  const TileOperands op = plain_tile_operands(reinterpret_cast<const bf16*>(p.h) + static_cast<int64_t>(b.row0) * I,
                                             &p.tmap_w2, b.le, b.num_rows, I, col_block);
  TileAcc acc;
  tile_mainloop(p, op, I, smem, acc);  // ends with __syncthreads: s.pair is visible
  bf16* st = reinterpret_cast<bf16*>(smem);
  stage_plain(acc, st);
  __syncthreads();
  const int col0 = col_block * Config::kBlockN;
  constexpr int kChunks = Config::kBlockN / 8;
  for (int c = threadIdx.x; c < Config::kBlockM * kChunks; c += Config::kThreads) {
    const int m = c / kChunks, chunk = c % kChunks, col = col0 + chunk * 8;
    if (m < b.num_rows && col < H) {
      // static / weave: straight into the source's combine slot; sequential: in place over the receive row
      bf16* dst = push_now ? sym<bf16>(p, s.psrc[m], p.off_comb) + static_cast<int64_t>(s.pair[m]) * H
                           : sym<bf16>(p, p.rank, p.off_recv_x) + static_cast<int64_t>(b.row0 + m) * H;
      *reinterpret_cast<int4*>(dst + col) = *reinterpret_cast<const int4*>(st + m * Config::kEpiStride + chunk * 8);
    }
  }
  __syncthreads();
  tl_record(p, s, t1, role, kTaskGemm1, rb, col_block);
  return true;
}

// Tell every source that this owner's combine rows have all landed.
__device__ __forceinline__ void post_combine_flags(const Params& p) {
  __threadfence_system();
  for (int g = 0; g < p.world; ++g) st_release_sys_u64(sym<uint64_t>(p, g, p.off_comb_flag) + p.rank, p.epoch);
}

// ---- combine (sequential policy): push a computed row block back to its source's combine slots ----------
__device__ __forceinline__ void combine_block(const Params& p, SharedLayout& s, const LayoutView& lv,
                                              const RowBlock& b) {
  const int row_chunks = p.hidden / 8;
  load_block_pairs(p, s, lv, b);
  __syncthreads();
  const int4* out = sym<const int4>(p, p.rank, p.off_recv_x);
  copy_rows(
      b.num_rows, row_chunks, [&](int m) { return out + static_cast<int64_t>(b.row0 + m) * row_chunks; },
      [&](int m) { return sym<int4>(p, s.psrc[m], p.off_comb) + static_cast<int64_t>(s.pair[m]) * row_chunks; });
  __syncthreads();
}

// ---- weighted reduction on the source: y[t] = sum_j w[t, j] * comb[t * k + j] ---------------------------
__device__ __forceinline__ bool reduce_phase(const Params& p, SharedLayout& s, uint16_t role) {
  const uint64_t t0 = tl_now(p);
  if (threadIdx.x == 0) {
    bool ok = true;
    for (int g = 0; g < p.world && ok; ++g) {
      const uint64_t* f = sym<const uint64_t>(p, p.rank, p.off_comb_flag) + g;
      ok = spin_until(p, [&] { return ld_acquire_sys_u64(f) >= p.epoch; }, kErrTimeoutCombine, g, 0);
    }
    s.ok = ok;
  }
  __syncthreads();
  if (!cta_read_ok(&s.ok)) return false;
  tl_wait(p, s, t0, role, -1, -1);
  const uint64_t t1 = tl_now(p);
  const int row_chunks = p.hidden / 8, k = p.top_k;
  const int64_t total = static_cast<int64_t>(p.num_tokens) * row_chunks;
  const int4* comb = sym<const int4>(p, p.rank, p.off_comb);
  int4* y = reinterpret_cast<int4*>(p.y);
  for (int64_t idx = static_cast<int64_t>(blockIdx.x) * Config::kThreads + threadIdx.x; idx < total;
       idx += static_cast<int64_t>(p.num_ctas) * Config::kThreads) {
    const int64_t t = idx / row_chunks;
    const int c = static_cast<int>(idx % row_chunks);
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
    int4 o;
    __nv_bfloat162* o2 = reinterpret_cast<__nv_bfloat162*>(&o);
#pragma unroll
    for (int q = 0; q < 4; ++q) o2[q] = __floats2bfloat162_rn(acc[2 * q], acc[2 * q + 1]);
    y[idx] = o;
  }
  tl_record(p, s, t1, role, kTaskReduce, -1, -1);
  return true;
}

}  // namespace weave

// The persistent cross-GPU MoE megakernel: one cooperative launch per GPU per layer, one CTA per SM.
//
//   routing      all CTAs: histogram of this rank's (token, j) pairs, slot of every pair, sorted pair list
//   counts       CTA g writes this rank's per-expert counts into rank g and publishes an epoch flag
//   layout       every CTA: wait for all ranks' counts, compute every owner's receive layout (layout.cuh)
//   policy       sequential: dispatch | GEMM0 | GEMM1 | combine, grid barriers between phases
//                static:C  : CTAs [0, C) dispatch; the others claim GEMM tiles from one atomic ticket
//                            (GEMM0 of block i interleaved with GEMM1 of block i - L), waiting only on the
//                            rows they need; GEMM1 epilogues push straight into the source's combine slots
//                weave     : (c*, K*) from the cost table right after the count exchange (choice.cuh), identical
//                            on every CTA below the table's max_comm_sms (the others skip it: they compute);
//                            CTAs [0, c*) dispatch, then steal tiles from the same ticket
//   reduce       all CTAs: wait for every owner's combine flag, y = sum_j w * comb (+ the shared expert's row)
// A shared expert (p.inter_shared > 0, this rank's own tokens) is one more expert slot in the GEMM tickets; the kernel
// is instantiated with and without its code (kShared; tasks.cuh).
//
// Cross-GPU flags hold the call's epoch (never reset; counted on the device, so CUDA-graph replays advance it);
// on-chip counters are double-buffered by epoch parity and the idle parity is cleared at the start of the call.
// See docs/kernel.md.
#pragma once
#include <cstdint>

#include "config.cuh"
#include "gemm.cuh"
#include "layout.cuh"
#include "sync.cuh"
#include "tasks.cuh"

namespace weave {

// FP8 experts: this rank's rows into x_q / x_scale, as weave_kernel/fp8.py quantize_act does it, bit for bit: one
// warp per (row, 128 columns), s = max(amax / 448, 2^-40), q = x / s (IEEE divisions), saturated to +-448 (NaN stays
// NaN; the row's amax ignores it, where fp8.py's would be NaN). Before grid barrier 1, so every CTA's dispatch and
// GEMM0 see all of it.
__device__ __forceinline__ void quantize_x(const Params& p) {
  const int nb = p.hidden / 128, st = fp8_scale_stride(p.hidden), lane = threadIdx.x & 31;
  const int64_t units = static_cast<int64_t>(p.num_tokens) * nb;
  const int64_t nw = static_cast<int64_t>(p.num_ctas) * Config::kWarps;
  for (int64_t u = static_cast<int64_t>(blockIdx.x) * Config::kWarps + threadIdx.x / 32; u < units; u += nw) {
    const int64_t t = u / nb;
    const int b = static_cast<int>(u % nb);
    const int64_t off = t * p.hidden + b * 128 + lane * 4;
    const uint2 raw = __ldg(reinterpret_cast<const uint2*>(reinterpret_cast<const bf16*>(p.x) + off));
    const float2 v01 = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(&raw.x));
    const float2 v23 = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(&raw.y));
    float amax = fmaxf(fmaxf(fabsf(v01.x), fabsf(v01.y)), fmaxf(fabsf(v23.x), fabsf(v23.y)));
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, o));
    const float s = fmaxf(__fdiv_rn(amax, Config::kFp8Max), Config::kFp8ScaleFloor);
    const __nv_fp8x2_storage_t q01 = __nv_cvt_float2_to_fp8x2(
        make_float2(__fdiv_rn(v01.x, s), __fdiv_rn(v01.y, s)), __NV_SATFINITE, __NV_E4M3);
    const __nv_fp8x2_storage_t q23 = __nv_cvt_float2_to_fp8x2(
        make_float2(__fdiv_rn(v23.x, s), __fdiv_rn(v23.y, s)), __NV_SATFINITE, __NV_E4M3);
    *reinterpret_cast<uint32_t*>(reinterpret_cast<uint8_t*>(p.x_q) + off) =
        static_cast<uint32_t>(q01) | (static_cast<uint32_t>(q23) << 16);
    if (lane == 0) p.x_scale[t * st + b] = s;
  }
}

// Routing and count exchange. Leaves s.cnt, s.ebase and the layout filled in every CTA.
__device__ __forceinline__ bool routing_phase(const Params& p, SharedLayout& s) {
  const int E = p.num_experts, G = p.world, tid = threadIdx.x;
  const int par = static_cast<int>(s.epoch & 1), other = par ^ 1;
  const uint64_t t0 = tl_now(p);
  // clear the idle parity of the on-chip counters (last used by the previous call, which has ended)
  for (int i = blockIdx.x * Config::kThreads + tid; i < p.max_row_blocks; i += p.num_ctas * Config::kThreads)
    p.g0_done[other * p.max_row_blocks + i] = 0u;
  for (int i = blockIdx.x * Config::kThreads + tid; i < E; i += p.num_ctas * Config::kThreads)
    p.expert_ctr[other * E + i] = 0;
  // (also on calls without the shared expert: a later call with it must find its parity cleared)
  if (p.g0s_done != nullptr)
    for (int i = blockIdx.x * Config::kThreads + tid; i < p.max_shared_blocks; i += p.num_ctas * Config::kThreads)
      p.g0s_done[other * p.max_shared_blocks + i] = 0u;
  if (blockIdx.x == 0 && tid < 4) p.sched[other * 4 + tid] = 0u;

  // histogram of this CTA's chunk of pairs; rank of each pair inside its expert within the CTA
  const int num_pairs = p.num_tokens * p.top_k;
  const int chunk = ceil_div(num_pairs, p.num_ctas);
  const int p0 = min(num_pairs, static_cast<int>(blockIdx.x) * chunk), p1 = min(num_pairs, p0 + chunk);
  for (int e = tid; e < E; e += Config::kThreads) s.hist[e] = 0;
  __syncthreads();
  for (int i = p0 + tid; i < p1; i += Config::kThreads) {
    const int e = __ldg(p.topk_ids + i);
    if (e < 0 || e >= E) {
      raise_error(p, kErrBadExpertId, i, e);
      continue;
    }
    p.pair_slot[i] = atomicAdd(&s.hist[e], 1);
  }
  __syncthreads();
  // this CTA's base inside each expert: one atomic per (CTA, expert) on this call's counters. CTAs get their
  // ranges in arrival order, which only permutes rows inside an expert (as the shared atomics above do inside a
  // CTA; every row's result and its combine slot are unchanged). Reading all CTAs' histograms instead (a loop
  // over 132 CTAs per expert) took 25-28 us per layer (timeline split, 2x H200, qwen3-30b-a3b / deepseek-v2).
  int32_t* ctr = p.expert_ctr + par * E;
  for (int e = tid; e < E; e += Config::kThreads) {
    const int n = s.hist[e];
    s.hist[e] = n ? atomicAdd(ctr + e, n) : 0;
  }
  if (!grid_barrier(p, 0)) return false;
  // every CTA has read the epoch counter (kernel start, before the barrier): advance it for the next call
  if (blockIdx.x == 0 && tid == 0) *p.epoch_ctr = s.epoch;

  // this rank's totals, the sorted pair list
  int* my_cnt = s.cnt + p.rank * E;
  for (int e = tid; e < E; e += Config::kThreads) my_cnt[e] = __ldcg(ctr + e);
  __syncthreads();
  block_scan(E, [&](int e) { return my_cnt[e]; }, s.ebase, s.scan_tmp);
  for (int i = p0 + tid; i < p1; i += Config::kThreads) {
    const int e = __ldg(p.topk_ids + i);
    p.sorted_pair[s.ebase[e] + s.hist[e] + p.pair_slot[i]] = i;
  }
  // count exchange: CTA g pushes this rank's counts into rank g, then publishes the epoch
  if (static_cast<int>(blockIdx.x) < G) {
    const int g = blockIdx.x;
    int32_t* dst = sym<int32_t>(p, g, p.off_gcounts) + (par * G + p.rank) * E;
    for (int e = tid; e < E; e += Config::kThreads) dst[e] = my_cnt[e];
    __syncthreads();
    if (tid == 0) {
      __threadfence_system();
      st_release_sys_u64(sym<uint64_t>(p, g, p.off_count_flag) + p.rank, s.epoch);
    }
  }
  if (p.fp8) {
    quantize_x(p);
    if (p.dispatch_bulk) fence_proxy_async_global();  // x_q is read by bulk copies after the barrier (bulk_copy.cuh)
  }
  if (!grid_barrier(p, 1)) return false;  // sorted_pair (and FP8's x_q) complete before anyone dispatches

  // weave: the CTAs that evaluate the choice. Its grid ends at the table's max_comm_sms, so under `weave` the
  // CTAs from min(max_comm_sms, num_ctas) on never dispatch: they skip the choice (about 9 us) and start their
  // tiles at once. Under weave:C (C fixed) only CTA 0 evaluates it, for the record (last_choice()).
  int deciders = 0;
  if (p.policy == kPolicyWeave)
    deciders = p.num_comm_ctas > 0
                   ? 1
                   : min(static_cast<int>(__ldg(p.cost_table + cost_table::kOffHeader + cost_table::kMaxCommSms)),
                         p.num_ctas);
  const bool decide = static_cast<int>(blockIdx.x) < deciders;
  // stage the cost table in shared memory while the peers' counts are in flight (the choice reads it a few
  // thousand times; from L2 those dependent loads made the choice cost 8-9 us)
  if (decide)
    for (int i = tid; i < cost_table::kLen; i += Config::kThreads) s.cost_table[i] = __ldg(p.cost_table + i);
  // every CTA: wait for all ranks' counts, load them, build the layout
  const uint64_t tw0 = tl_now(p);  // the wait is recorded apart from the work (timeline busy shares)
  bool counts_ok = true;
  if (tid == 0) {
    for (int g = 0; g < G && counts_ok; ++g) {
      const uint64_t* f = sym<const uint64_t>(p, p.rank, p.off_count_flag) + g;
      counts_ok = spin_until(p, [&] { return ld_acquire_sys_u64(f) >= s.epoch; }, kErrTimeoutCounts, g, 0);
    }
  }
  if (!cta_all(counts_ok)) return false;
  const uint64_t tw1 = tl_now(p);
  const int32_t* gc = sym<const int32_t>(p, p.rank, p.off_gcounts) + par * G * E;
  for (int i = tid; i < G * E; i += Config::kThreads) s.cnt[i] = __ldcg(gc + i);
  __syncthreads();
  if (!build_layout(s, p)) return false;  // ends with __syncthreads
  // weave's CTAs that skip the choice are compute CTAs (num_comm 0: they neither dispatch nor need C)
  int num_comm = p.policy == kPolicySequential ? 0 : p.num_comm_ctas, choice_c = -1, choice_k = -1;
  uint64_t tc = 0;
  if (decide) {
    // Weave's spatial choice for this rank: every deciding CTA evaluates the cost model on the same gathered
    // counts with the same deterministic parallel argmin, so they agree on (c*, K*) without communicating.
    tc = tl_now(p);
    const CostChoice c = choose_split_parallel<Config::kThreads>(s.cost_table, s.cnt, p.expert_owner, p.rank, G, E,
                                                                 p.hidden, p.inter, s.red_sums, s.red_best);
    choice_c = c.num_comm_sms;
    choice_k = c.num_chunks;
    if (num_comm <= 0) num_comm = max(1, min(c.num_comm_sms, p.num_ctas - 1));  // weave (weave:C keeps C)
    if (blockIdx.x == 0 && tid == 0) {
      p.choice[kChoiceCommSms] = c.num_comm_sms;
      p.choice[kChoiceChunks] = c.num_chunks;
      p.choice[kChoiceTimeNs] = c.time_ns;
      p.choice[kChoiceUsedComm] = num_comm;
      p.choice[kChoiceEpoch] = static_cast<double>(s.epoch);
    }
  }
  if (tid == 0) {
    s.num_comm = num_comm;
    s.choice_c = choice_c;
    s.choice_k = choice_k;
  }
  __syncthreads();
  const uint16_t role = static_cast<int>(blockIdx.x) < max(num_comm, 1) ? kRoleComm : kRoleCompute;
  // routing + count push, the wait for the peers' counts (if it cost > 1 us), then layout .. end of choice
  tl_record_span(p, s, t0, tw0, role, kTaskCountExchange, choice_c, choice_k);
  if (tw1 - tw0 > 1000) tl_record_span(p, s, tw0, tw1, role, kTaskWait, -1, -1);
  tl_record(p, s, tw1, role, kTaskCountExchange, choice_c, choice_k);
  if (decide) tl_record(p, s, tc, role, kTaskChoose, choice_c, choice_k);
  return true;
}

// The GEMM phases of one CTA (the routed experts' tiles and the shared expert's), all through one run_tiles call
// site (one inlined copy of the tile code; a second copy made ptxas spill).
//   static:C / weave: one phase. Tickets go expert by expert (so a weight tile is read from HBM once and reused
//     from L2 by the expert's other row blocks); segment i holds the GEMM0 tiles of local expert i, then the GEMM1
//     tiles of expert i - L, L chosen so that about one wave of GEMM0 tiles separates a block's GEMM0 from its
//     GEMM1. Within a segment: column block, then row block (the expert's rows: this rank's own first, then each
//     source's). Under weave the comm CTAs enter after their dispatch blocks (bubble stealing) and claim from the
//     same ticket, so no tile runs twice; `role` only labels the timeline records.
//   sequential: GEMM0 of every block, grid barrier, GEMM1 of every block (expert-major tickets).
// lag_comm: the comm CTA count the GEMM1 lag L assumes; the same on every CTA (the tickets' order depends on it).
template <bool kShared, bool kF8>
__device__ __forceinline__ bool gemm_phases(const Params& p, SharedLayout& s, uint8_t* smem, const LayoutView& lv,
                                            int lag_comm, uint16_t role) {
  const bool seq = p.policy == kPolicySequential;
  const bool on = shared_on<kShared>(p);
  const int NB = lv.num_compute_blocks(), El = p.num_local_experts, Ev = num_expert_slots(p, on);
  const int n0 = ceil_div(p.inter, Config::kHalfN), n1 = ceil_div(p.hidden, Config::kBlockN);
  const int par = static_cast<int>(s.epoch & 1);
  if (threadIdx.x == 0) s.g1_tiles = s.g1s_tiles = 0;
#pragma unroll 1  // one inlined copy of the tile code (two made ptxas spill)
  for (int ph = 0; ph < (seq ? 2 : 1); ++ph) {
    const bool with_g0 = !seq || ph == 0;
    // GEMM1 of slot i shares segment i + L with GEMM0 of slot i + L; sequential: no sharing
    int L = Ev;
    if (!seq) L = min(Ev, max(1, ceil_div(p.num_ctas - lag_comm, n0 * max(1, NB / El))));
    if (seq && ph == 1) L = 0;
    const int num_seg = seq ? Ev : Ev + L;
    block_scan(
        num_seg,
        [&](int i) {
          return (with_g0 && i < Ev ? slot_gemm0_cols(p, on, i) * slot_num_blocks(p, on, lv, i) : 0) +
                 (i >= L ? n1 * slot_num_blocks(p, on, lv, i - L) : 0);
        },
        s.tk, s.scan_tmp);  // ends with __syncthreads
    MoeTiles<kShared, kF8> tiles{p, s, lv, role, p.sched + par * 4 + ph, num_seg, L, with_g0, !seq};
    if (!run_tiles(p, smem, tiles)) return false;  // starts and ends with __syncthreads
    if (seq && ph == 0 && !grid_barrier(p, 3)) return false;
  }
  // the shared expert's outputs: this CTA's ys rows visible on the GPU before it counts them (reduce_phase waits
  // for the count)
  const uint32_t my_g1s = static_cast<uint32_t>(s.g1s_tiles);
  if (on && threadIdx.x == 0 && my_g1s > 0) {
    __threadfence();
    atomicAdd(p.sched + par * 4 + 3, my_g1s);
  }
  if (seq) return true;
  // One system fence per CTA (not per GEMM1 tile) makes this CTA's combine rows visible before it counts
  // them; the CTA that completes the count tells every source (post_combine_flags fences again, then
  // releases the flags).
  const uint32_t my_g1 = static_cast<uint32_t>(s.g1_tiles);
  if (threadIdx.x == 0 && my_g1 > 0) {
    __threadfence_system();
    if (atomicAdd(p.sched + par * 4 + 2, my_g1) + my_g1 == static_cast<uint32_t>(NB * n1))
      post_combine_flags(p, s.epoch);
  }
  return true;
}

__device__ __forceinline__ bool dispatch_blocks(const Params& p, SharedLayout& s, uint8_t* smem, const LayoutView& lv,
                                                int first, int step) {
  const int ND = lv.num_dispatch_blocks();
  for (int i = first; i < ND; i += step) {
    const uint64_t t0 = tl_now(p);
    const RowBlock b = lv.dispatch_block(i);
    if (!dispatch_block(p, s, smem, tile_slot(smem, 0)->pair, b)) return false;
    tl_record(p, s, t0, kRoleComm, kTaskDispatch, b.row0 / Config::kBlockM, b.dst);
  }
  return true;
}

// sequential: the combine phase after GEMM1 wrote every block in place.
__device__ __forceinline__ bool sequential_combine(const Params& p, SharedLayout& s, uint8_t* smem,
                                                   const LayoutView& lv) {
  if (!grid_barrier(p, 4)) return false;
  const int NB = lv.num_compute_blocks();
  for (int i = blockIdx.x; i < NB; i += p.num_ctas) {
    const uint64_t t0 = tl_now(p);
    const RowBlock b = lv.compute_block(i);
    combine_block(p, s, lv, b, *tile_slot(smem, 0));
    tl_record(p, s, t0, kRoleComm, kTaskCombine, b.row0 / Config::kBlockM, -1);
  }
  if (threadIdx.x == 0) __threadfence_system();
  if (!grid_barrier(p, 5)) return false;
  if (blockIdx.x == 0 && threadIdx.x == 0) post_combine_flags(p, s.epoch);
  return true;
}

// Built four times: bf16 and FP8 experts (kF8: p.fp8 = 1; its tiles in pipeline.cuh / tasks.cuh), each with the
// shared expert's code (p.inter_shared > 0) and without it (tasks.cuh).
template <bool kShared, bool kF8 = false>
__global__ void __launch_bounds__(Config::kThreads, 1) weave_moe_kernel(const __grid_constant__ Params p) {
  extern __shared__ __align__(1024) uint8_t smem_raw[];
  // SW128 tiles need 1024-byte aligned bases whatever the static shared memory before them
  uint8_t* smem = smem_raw + ((1024u - (smem_u32(smem_raw) & 1023u)) & 1023u);
  __shared__ SharedLayout s;
  if (threadIdx.x == 0) {
    s.tl_count = 0;
    s.epoch = *reinterpret_cast<const volatile uint64_t*>(p.epoch_ctr) + 1;  // CTA 0 stores it back after barrier 0
    bulk_ring_init(s.ring);  // its barriers are fenced by init_pipeline's mbar_init_fence
  }
  init_pipeline(smem);
  __syncthreads();
  bool ok = routing_phase(p, s);
  if (ok) {
    const LayoutView lv{s, p};
    const bool seq = p.policy == kPolicySequential;
    const int C = s.num_comm;  // 0 for sequential
    const bool comm = static_cast<int>(blockIdx.x) < C;
    if (seq) {
      ok = dispatch_blocks(p, s, smem, lv, blockIdx.x, p.num_ctas) && grid_barrier(p, 2);
    } else if (comm) {
      ok = dispatch_blocks(p, s, smem, lv, blockIdx.x, C);
      if (ok && blockIdx.x == 0 && threadIdx.x == 0 && lv.num_compute_blocks() == 0)
        post_combine_flags(p, s.epoch);
    }
    // weave: bubble stealing, comm CTAs join the ticket after their dispatch blocks (not under weave-nosteal,
    // p.steal = 0). Dispatch never waits on a tile, so joining late cannot deadlock.
    // weave: the GEMM1 lag assumes one comm CTA (c* is not known to the CTAs that skipped the choice, and with
    // stealing every CTA computes after its dispatch); static:C / weave:C: C
    const int lag_comm = p.policy == kPolicyWeave && p.num_comm_ctas <= 0 ? 1 : C;
    if (ok && (!comm || (p.policy == kPolicyWeave && p.steal)))
      ok = gemm_phases<kShared, kF8>(p, s, smem, lv, lag_comm, comm ? kRoleComm : kRoleCompute);
    if (ok && seq) ok = sequential_combine(p, s, smem, lv);
    if (ok) ok = reduce_phase<kShared>(p, s, comm ? kRoleComm : kRoleCompute);
  }
  if (p.timeline != nullptr && threadIdx.x == 0) p.timeline_count[blockIdx.x] = s.tl_count;
}

}  // namespace weave

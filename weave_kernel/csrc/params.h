// Plain C++ (no CUDA, no torch): the structs that cross the host/device border.
// Included by the device code (.cuh), the C launcher (.cu) and the pybind11 binding (.cpp).
// Python mirrors TimelineRecord in weave_kernel/timeline.py; tests/kernel checks that both agree.
#pragma once
#include <cstddef>
#include <cstdint>

namespace weave {

// ---- policies -----------------------------------------------------------------------------------------
enum Policy : int32_t {
  kPolicySequential = 0,  // all CTAs: dispatch | GEMM0 | GEMM1 | combine | reduce, grid barriers between
  kPolicyStatic = 1,      // CTAs [0, num_comm_ctas) dispatch, the rest run GEMM tiles; all CTAs reduce
  kPolicyWeave = 2,       // (c*, K*) chosen in the kernel from cost_table (num_comm_ctas = 0) or C fixed
                          // (num_comm_ctas = C); comm CTAs dispatch, then steal GEMM tiles (unless
                          // Params::steal is 0); all CTAs reduce
};

// ---- choice output of the weave policy (double [kChoiceLen], written by CTA 0 every weave call) -----------
enum ChoiceSlot : int32_t {
  kChoiceCommSms = 0,   // c* of the cost model (grid c in [1, table max_comm_sms])
  kChoiceChunks = 1,    // K* of the cost model
  kChoiceTimeNs = 2,    // predicted T(c*, K*) in ns
  kChoiceUsedComm = 3,  // comm CTAs this call used: C of weave:C, else min(c*, num_ctas - 1)
  kChoiceEpoch = 4,     // epoch of the call that wrote the slots
  kChoiceLen = 8,
};

// ---- error word (err[0]); err[1] = CTA, err[2] = detail, err[3] = detail --------------------------------
enum ErrorCode : int32_t {
  kErrNone = 0,
  kErrBadExpertId = 1,        // err[2] = pair index, err[3] = expert id
  kErrRecvOverflow = 2,       // err[2] = owner rank, err[3] = rows needed
  kErrTimeoutGridBarrier = 3, // err[2] = barrier index
  kErrTimeoutCounts = 4,      // err[2] = source rank whose counts never arrived
  kErrTimeoutRows = 5,        // err[2] = row block, err[3] = source rank
  kErrTimeoutGemm0 = 6,       // err[2] = row block
  kErrTimeoutCombine = 7,     // err[2] = owner rank whose combine flag never arrived
  kErrTimeoutTma = 8,         // err[2] = pipeline stage, err[3] = k step (a weight tile load never landed)
  kErrTimeoutSharedGemm0 = 9, // err[2] = shared-expert row block, err[3] = column block (its GEMM0 never finished)
  kErrTimeoutShared = 10,     // err[2] = shared-expert GEMM1 tiles done, err[3] = tiles expected (before the reduce)
};

// A CUDA tensor map (CUtensorMap: 128 bytes, 128-byte aligned), opaque here; the launchers encode it
// (tma_host.h) and the device code hands its address to cp.async.bulk.tensor (tma.cuh).
struct alignas(128) TensorMapBytes {
  uint8_t bytes[128];
};

// ---- per-SM timeline ----------------------------------------------------------------------------------
enum TaskKind : uint16_t {
  kTaskCountExchange = 0,
  kTaskDispatch = 1,
  kTaskGemm0 = 2,
  kTaskGemm1 = 3,
  kTaskCombine = 4,
  kTaskReduce = 5,
  kTaskWait = 6,
  kTaskChoose = 7,  // weave: the in-kernel (c*, K*) choice; arg0 = c*, arg1 = K*
  kTaskSharedGemm0 = 8,  // a GEMM0 / GEMM1 tile of the shared expert (arg0 = its row block of this rank's tokens)
  kTaskSharedGemm1 = 9,
};
enum Role : uint16_t { kRoleComm = 0, kRoleCompute = 1 };

// One task of one CTA. 32 bytes; times from %globaltimer (ns).
struct TimelineRecord {
  uint64_t start_ns;
  uint64_t end_ns;
  uint32_t sm;     // %smid
  uint16_t role;   // Role
  uint16_t kind;   // TaskKind
  int32_t arg0;    // row block (GEMM, dispatch) or -1
  int32_t arg1;    // column block (GEMM), destination rank (dispatch) or -1
};
static_assert(sizeof(TimelineRecord) == 32, "TimelineRecord must stay 32 bytes (mirrored in timeline.py)");
static_assert(offsetof(TimelineRecord, sm) == 16, "TimelineRecord layout changed: update timeline.py");
static_assert(offsetof(TimelineRecord, arg0) == 24, "TimelineRecord layout changed: update timeline.py");

// dispatch by bulk copies: at most one issuing warp per warp of the CTA (bulk_copy.cuh checks it against config.cuh)
constexpr int32_t kMaxDispatchIssuers = 12;

// FP8 experts: floats per row of a scale array over K columns (K / 128 scales, padded to whole 128-byte lines)
constexpr int32_t fp8_scale_stride(int32_t k) { return (k / 128 + 31) / 32 * 32; }

// ---- everything one launch needs (passed by value as the kernel argument) ------------------------------
struct Params {
  // inputs and output on this rank
  const void* x;                 // [num_tokens, hidden] bf16 (fp8 too: the kernel quantizes it into x_q)
  const int32_t* topk_ids;       // [num_tokens, top_k] global expert ids
  const float* topk_weights;     // [num_tokens, top_k]
  const void* w13;               // [num_local_experts, 2*inter, hidden] bf16: rows [0,I) gate, [I,2I) up
  const void* w2;                // [num_local_experts, hidden, inter] bf16
  void* y;                       // [num_tokens, hidden] bf16
  // placement (device arrays)
  const int32_t* expert_owner;   // [num_experts] owning rank
  const int32_t* owner_experts;  // [world, num_local_experts] global id of each rank's local experts
  // symmetric buffer: peer_base[g] is rank g's base address; offsets in bytes (same on every rank)
  const uint64_t* peer_base;     // device array [world]
  int64_t off_count_flag;        // u64 [world]: epoch once rank s's counts landed here
  int64_t off_comb_flag;         // u64 [world]: epoch once owner g pushed all its combine rows here
  int64_t off_gcounts;           // i32 [2][world][num_experts], parity = epoch & 1
  int64_t off_blk_flag;          // u64 [max_row_blocks]: epoch once the row block's rows arrived
  int64_t off_recv_meta;         // i32 [recv_cap_rows]: pair id (token*top_k + j) on the source
  int64_t off_comb;              // bf16 [max_tokens*top_k, hidden]: expert outputs per pair
  int64_t off_recv_x;            // bf16 [recv_cap_rows, hidden]: token rows laid out per (expert, source)
  // local scratch (plain device memory, this rank only)
  int32_t* expert_ctr;           // [2][num_experts], parity = epoch & 1: pairs claimed per expert (zeroed at alloc;
                                 // each call clears the parity the next call uses)
  int32_t* pair_slot;            // [max_tokens*top_k]
  int32_t* sorted_pair;          // [max_tokens*top_k]
  void* h;                       // bf16 [recv_cap_rows, inter]
  uint32_t* g0_done;             // [2][max_row_blocks]
  uint32_t* sched;               // [2][4]: ticket GEMM0/all, ticket GEMM1, GEMM1 tiles done, shared GEMM1 tiles done
  uint32_t* grid_bar;            // [2]: arrival count, generation
  int32_t* err;                  // [4]
  TimelineRecord* timeline;      // [num_ctas, timeline_per_cta] or null
  int32_t* timeline_count;       // [num_ctas]
  // weave policy
  const double* cost_table;      // [cost_table::kLen] float64 (weave_sim.costtable), null unless policy weave
  double* choice;                // [kChoiceLen] (ChoiceSlot), null unless policy weave
  // sizes
  int32_t rank, world;
  int32_t num_tokens, top_k, hidden, inter;
  int32_t num_experts, num_local_experts;
  int32_t max_tokens, recv_cap_rows, max_row_blocks;
  int32_t num_ctas, num_comm_ctas, policy;
  int32_t timeline_per_cta;
  int32_t steal;                 // weave: 1 = comm CTAs claim GEMM tiles once their dispatch is pushed (bubble
                                 // stealing); 0 = they idle after it (policy weave-nosteal: the chosen split alone)
  int32_t dispatch_bulk;         // W > 0: dispatch rows by bulk copies through the operand stages, issued by W
                                 // warps (bulk_copy.cuh); 0: by copy_rows (all threads, 16-byte loads and stores)
  uint64_t* epoch_ctr;           // [1]: the last call's epoch. Each call runs as epoch *epoch_ctr + 1 and stores it
                                 // back (CTA 0, after grid barrier 0, when every CTA has read it): the count lives
                                 // on the device, so replays of a captured CUDA graph advance it like calls do
  uint64_t timeout_ns;
  // the shared expert (always on; this rank's own tokens, no dispatch or combine): inter_shared = 0 for none
  const void* w13s;              // [2*inter_shared, hidden] bf16: rows [0,Is) gate, [Is,2Is) up
  const void* w2s;               // [hidden, inter_shared] bf16
  void* hs;                      // bf16 [max_tokens, inter_shared]: SwiGLU output
  void* ys;                      // bf16 [max_tokens, hidden]: the shared expert's output, added in the reduction
  const float* shared_scale;     // [num_tokens] fp32: the shared row's weight per token (a gate, as Qwen's), or null: 1
  uint32_t* g0s_done;            // [2][max_shared_blocks]: GEMM0 tiles done per shared row block, parity epoch & 1
  int32_t inter_shared;          // Is (a multiple of 64), 0 = no shared expert
  int32_t shared_first;          // 1: its tiles take the tickets before the routed experts' (they fill the wait for
                                 // dispatched rows); 0: after them (they fill the wait for combine rows)
  int32_t max_shared_blocks;     // ceil(max_tokens / kBlockM)
  // FP8 experts (fp8 = 1; weave_kernel/fp8.py defines the formats): x, the received rows and h hold e4m3 with one
  // fp32 scale per (row, 128 columns), w13 / w2 e4m3 with one fp32 scale per 128 x 128 block (DeepSeek-V3's
  // weight_scale_inv); value = e4m3 x scale. Combine rows, y and everything else stay bf16. hidden and inter are
  // multiples of 128 (inter_shared too); no bulk dispatch (the launcher refuses it).
  // A row's scales are padded to a multiple of 32 floats (fp8_scale_stride: a 128-byte cache line holds one row's
  // only, so an SM's L1, which the producers' 4-byte cp.async fill, never keeps a line whose other rows were still
  // being written). The kernel quantizes x itself (routing phase) into x_q / x_scale.
  int32_t fp8;
  void* x_q;                     // e4m3 [max_tokens, hidden]: x quantized by the kernel
  float* x_scale;                // [max_tokens, fp8_scale_stride(hidden)]
  const float* w13_scale;        // [num_local_experts, 2 * inter / 128, hidden / 128]
  const float* w2_scale;         // [num_local_experts, hidden / 128, inter / 128]
  int64_t off_recv_xs;           // f32 [recv_cap_rows, fp8_scale_stride(hidden)]: the received rows' scales (symmetric)
  float* h_scale;                // [recv_cap_rows, fp8_scale_stride(inter)]
  const float* w13s_scale;       // the shared expert's (inter_shared > 0): [2 * inter_shared / 128, hidden / 128]
  const float* w2s_scale;        // [hidden / 128, inter_shared / 128]
  float* hs_scale;               // [max_tokens, fp8_scale_stride(inter_shared)]
  // TMA descriptors of the weights, encoded by the launcher from w13 / w2 and the sizes above
  TensorMapBytes tmap_w13;       // w13 as [2 * num_local_experts][inter][hidden]: z = 2 * le + (0 gate, 1 up)
  TensorMapBytes tmap_w2;        // w2 as [num_local_experts][hidden][inter]
  TensorMapBytes tmap_w13s;      // w13s as [2][inter_shared][hidden] (inter_shared > 0 only)
  TensorMapBytes tmap_w2s;       // w2s as [1][hidden][inter_shared]
};

}  // namespace weave

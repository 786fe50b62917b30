// Plain C++ (no CUDA, no torch): arguments of the calibration microbenchmark kernels (calib.cuh), filled by the
// binding from raw addresses and passed by value to the kernels. Every kernel reuses the megakernel's own code
// (copy_rows, tile_mainloop, claim order, grid barrier, release/acquire flags); `sync` carries the fields of
// weave::Params that sync.cuh's spins and grid barrier and tasks.cuh's sym() read (grid_bar, err, num_ctas,
// timeout_ns, peer_base); its other fields stay null.
#pragma once
#include <cstdint>

#include "params.h"

namespace weave {

constexpr int kCalibMaxBlocks = 1024;  // push: row blocks per launch (flag slots per source)

// Push: CTAs copy `num_blocks` blocks of `block_rows` rows (row_chunks 16-byte chunks each) from `src` into the
// peers' symmetric buffers; block b goes to peer (rank + 1 + b % num_peers) % world, row block b / num_peers of
// this rank's slot there, then releases that block's flag (as dispatch_block does). All ranks meet at a
// cross-GPU start flag (epoch) first; times[2 * cta] = {start, end} ns (%globaltimer) after that meeting.
struct CalibPushArgs {
  const void* src;             // local [num_blocks * block_rows, row_chunks * 16 bytes]
  int64_t off_start_flag;      // u64 [world]: epoch once rank s reached the start
  int64_t off_blk_flag;        // u64 [world][kCalibMaxBlocks]: epoch once source s's block landed
  int64_t off_dst;             // receive slots: [world][slot_bytes], slot s written by source s
  int64_t slot_bytes;
  uint64_t* times;             // local [num_ctas][2]
  int32_t rank, world, num_peers, num_blocks, block_rows, row_chunks;
  uint64_t epoch;              // >= 1, grows every launch (flags are never reset)
  Params sync;                 // peer_base (symmetric buffer base of every rank), err, timeout_ns
};

// Expert-grouped GEMM with the kernel's tile (128 x 256, K steps of 64): C_e = A_e B_e^T for every expert e,
// tiles in expert-major order (column block outer, row block inner) claimed from an atomic ticket. With
// num_chunks = K > 1 every expert's row blocks are split into K chunks, run one after another with a grid
// barrier between (cooperative launch, all CTAs co-resident).
struct CalibGemmArgs {
  const void* a;               // bf16 [num_experts * rows_per_expert, k]
  const void* b;               // bf16 [num_experts, n, k]
  void* c;                     // bf16 [num_experts * rows_per_expert, n]
  uint32_t* tickets;           // [num_chunks], zeroed by the launcher
  int32_t num_experts, rows_per_expert, n, k, num_chunks;
  Params sync;                 // grid_bar (chunk barrier), err, num_ctas, timeout_ns
  TensorMapBytes tmap_b;       // b as [num_experts][n][k], encoded by the launcher
};

// Ticket claims: every CTA claims tickets (the kernel's claim: __syncthreads, atomicAdd by thread 0,
// __syncthreads) until `total_tickets` are gone; times[2 * cta] = {start, end} ns, claims[cta] = tickets taken.
struct CalibClaimArgs {
  uint32_t* counter;           // zeroed by the launcher
  uint64_t* times;             // [num_ctas][2]
  int32_t* claims;             // [num_ctas]
  int32_t total_tickets;
  Params sync;
};

// Ping-pong of a release/acquire flag: CTA i plays role role0 + i (0: pinger, 1: ponger); it waits on wait[i]
// (>= base + round) and posts base + round into post[i], round = 1..rounds. The pinger writes {start, end} ns
// of the timed rounds (those after `warmup`) into times[0..1]. base grows by rounds every launch (no reset).
struct CalibSignalArgs {
  uint64_t* wait[2];
  uint64_t* post[2];
  uint64_t* times;             // [2]
  uint64_t base;
  int32_t role0, rounds, warmup;
  Params sync;                 // err, timeout_ns
};

}  // namespace weave

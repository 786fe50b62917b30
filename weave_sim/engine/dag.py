"""The task DAG of one expert-parallel MoE layer on G GPUs, built with numpy.

Tasks (ids are a topological order: every edge goes from a lower id to a higher id):
    count_exchange[g]  one per GPU: routing counts are exchanged (and, for Weave, (c, K) decided)
    counts_known[g]    barrier: all GPUs' counts are here (receive offsets known)
    dispatch           a chunk of token rows pushed from src to dst over NVLink (run by a src SM)
    seq_gate[g]        (sequential only) barrier: all dispatch traffic into and out of g is complete
    rows_arrived[rb]   barrier: every row of row block rb of a local expert is in g's buffer
    gemm0              a batch of GEMM0 tiles (gate+up, SwiGLU epilogue) of one row block
    gemm0_done[rb]     barrier: all GEMM0 column tiles of rb are done (GEMM1 reads their output)
    gemm1              a batch of GEMM1 tiles (down projection) of one row block
    chunk_done[g, k]   barrier: every GEMM1 task of the row blocks in combine chunk k is done
    combine            a chunk of result rows pushed back from the computing GPU to the tokens' GPU (under the
                       megakernel's sequential also a chunk of local rows copied in HBM: peer = gpu, no link bytes)
    shared gemm0/gemm1 (SimOptions.shared 'first' or 'last') the shared experts on g's own tokens: row blocks of
                       tile_rows tokens, GEMM0 after counts_known[g] (and seq_gate[g]), a per-block gemm0_done
                       barrier, GEMM1; no dispatch or combine (chunk -1). Under sequential they are GEMM-phase
                       work: built before chunk_done, whose barrier (the phase boundary) waits for them too
    reduce_gate[s]     barrier: every result row of GPU s's tokens is back (remote and local), and every shared
                       GEMM1 task of s is done
    reduce             a slice of s's tokens: weighted sum over k result rows (HBM bound)

Row layout: where an expert's rows lie on its owner and what each row block waits on, in rows.py.

Shared experts ('first' / 'last'). The fused shared expert (one SwiGLU FFN of width Is = num_shared_experts * I)
of GPU g computes g's T_g own tokens in row blocks of tile_rows (the last one partial), its tiles in g's GEMM queue:
'first' below every routed GEMM task's priority, 'last' above, and (the kernel's tile ticket hands them out only
after every routed tile) claimable only once every routed GEMM task of g is claimed (core.py). Weights, rate,
batching and padding as a routed expert with T_g rows. The reduction reads one more row per token.

GEMM time. A task takes max(FLOPs / per-SM rate at its expert's row count, its weight bytes / an SM's share
of HBM bandwidth), where an expert's weights are streamed once and shared by its row blocks (so a GPU's GEMM
work is never below weight bytes / HBM bandwidth, the small-batch bound). Activation traffic is in the
measured rate curve (L2), not modelled separately.

Granularity. GEMM tiles are tile_rows x tile_cols outputs. To keep large layers fast, consecutive column
tiles of one row block are batched into one task (run back to back by one SM, one claim cost per tile):
with `gemm_tasks_per_sm=n`, the batch size is chosen per GPU so that a task lasts about
(GEMM time per SM) / n; small layers keep one tile per task. `None` disables batching.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..profile import HardwareProfile
from ..workload import LayerWorkload, expert_bytes
from .plan import Plan
from .rows import batch_sizes, dispatch_pieces, gpu_rows, piece_chunks, ranges, receive_ring, split_pieces

KIND_NAMES = ("count_exchange", "dispatch", "gemm0", "gemm1", "combine", "reduce", "barrier")
K_CTRL, K_DISPATCH, K_GEMM0, K_GEMM1, K_COMBINE, K_REDUCE, K_BARRIER = range(7)
# Claim classes: which worker queue a task waits in.
C_CTRL, C_COMM, C_GEMM, C_REDUCE, C_VIRTUAL = range(5)
KIND_CLASS = np.array([C_CTRL, C_COMM, C_GEMM, C_GEMM, C_COMM, C_REDUCE, C_VIRTUAL], dtype=np.int8)
DISPATCH_ORDERS = ("token", "expert", "piece")  # see "Row layout" in rows.py
SHARED_ORDERS = ("off", "first", "last")  # shared experts' tiles in the GEMM queue (see "Shared experts" above)
SHARED_FIRST, SHARED_LAST = 1, 2  # TaskGraph.shared: 0 = not a shared-expert task
_COMBINE_PRIO = 1 << 50  # every dispatch chunk outranks every combine chunk on a comm worker
_FLOP_PER_NS_PER_TFLOPS = 1e3


@dataclass(frozen=True, eq=False)
class TaskGraph:
    """Tasks as parallel arrays [T] and dependents as CSR (dep_idx[dep_ptr[t]:dep_ptr[t+1]]).

    kind: int8 index into KIND_NAMES.  gpu: int32 GPU whose SM runs the task (the source for transfers).
    peer: int32 destination GPU of a transfer, else -1.  work_ns: int64 SM time of compute/control/reduce
    tasks, excluding claim costs.  nbytes: int64 bytes moved by a transfer.  tiles: int32 claims the task
    makes (GEMM tiles; 1 otherwise; 0 for barriers).  flops: float64.  prio: int64 queue priority (lower
    first; ties by id).  delay_ns: int64 extra wait of a barrier once its dependencies are met.
    chunk: int32 combine chunk of GEMM and combine tasks, else -1.  num_deps: int32 in-degree.
    """

    num_gpus: int
    kind: np.ndarray
    gpu: np.ndarray
    peer: np.ndarray
    work_ns: np.ndarray
    nbytes: np.ndarray
    tiles: np.ndarray
    flops: np.ndarray
    prio: np.ndarray
    delay_ns: np.ndarray
    chunk: np.ndarray
    num_deps: np.ndarray
    dep_ptr: np.ndarray
    dep_idx: np.ndarray
    edge_src: np.ndarray
    batch: dict
    # GEMM tasks' two time terms (float ns, 0 elsewhere): the MMAs at the profile's per-SM rate, and the weight
    # bytes at an SM's share of HBM when every SM streams (hbm_gbs / num_sms); work_ns is the larger. With a
    # profile's concurrency scale the core re-evaluates both when a task starts (core.py).
    flop_ns: np.ndarray | None = None
    hbm_ns: np.ndarray | None = None
    # GEMM tasks' FLOPs on padding rows (float64 [T], 0 elsewhere; included in `flops`): the power model may charge
    # them less energy (PowerModel.pad_energy: their A operands are zeros).
    pad_flops: np.ndarray | None = None
    # int8 [T]: SHARED_FIRST / SHARED_LAST for the shared experts' GEMM tasks, 0 elsewhere; None when the graph has
    # none (SimOptions.shared 'off', or a model without shared experts).
    shared: np.ndarray | None = None

    @property
    def num_tasks(self) -> int:
        return int(self.kind.size)

    @property
    def cls(self) -> np.ndarray:
        return KIND_CLASS[self.kind]

    def preds(self) -> tuple[np.ndarray, np.ndarray]:
        """Predecessors as CSR (ptr [T+1], idx): the reverse of the dependents."""
        order = np.argsort(self.dep_idx, kind="stable")
        ptr = np.zeros(self.num_tasks + 1, dtype=np.int64)
        np.cumsum(np.bincount(self.dep_idx, minlength=self.num_tasks), out=ptr[1:])
        return ptr, self.edge_src[order]


class _Builder:
    """Accumulates task groups and edges; ids are handed out in call order (so in topological order)."""

    def __init__(self) -> None:
        self.cols: dict[str, list[np.ndarray]] = {k: [] for k in
                                                  ("kind", "gpu", "peer", "work_ns", "nbytes", "tiles",
                                                   "flops", "prio", "delay_ns", "chunk", "flop_ns", "hbm_ns",
                                                   "pad_flops")}
        self.n = 0
        self.src: list[np.ndarray] = []
        self.dst: list[np.ndarray] = []

    def add(self, kind: int, gpu, *, peer=-1, work_ns=0, nbytes=0, tiles=1, flops=0.0, prio=0,
            delay_ns=0, chunk=-1, flop_ns=0.0, hbm_ns=0.0, pad_flops=0.0) -> np.ndarray:
        gpu = np.atleast_1d(np.asarray(gpu, dtype=np.int64))
        n = gpu.size
        vals = dict(kind=kind, gpu=gpu, peer=peer, work_ns=work_ns, nbytes=nbytes, tiles=tiles, flops=flops,
                    prio=prio, delay_ns=delay_ns, chunk=chunk, flop_ns=flop_ns, hbm_ns=hbm_ns, pad_flops=pad_flops)
        for key, v in vals.items():
            self.cols[key].append(np.broadcast_to(np.asarray(v), (n,)).copy())
        ids = np.arange(self.n, self.n + n, dtype=np.int64)
        self.n += n
        return ids

    def edges(self, src, dst) -> None:
        src, dst = np.broadcast_arrays(np.asarray(src, dtype=np.int64), np.asarray(dst, dtype=np.int64))
        self.src.append(src.ravel())
        self.dst.append(dst.ravel())

    def build(self, num_gpus: int, batch: dict, shared: np.ndarray | None = None) -> TaskGraph:
        dtypes = dict(kind=np.int8, gpu=np.int32, peer=np.int32, work_ns=np.int64, nbytes=np.int64,
                      tiles=np.int32, flops=np.float64, prio=np.int64, delay_ns=np.int64, chunk=np.int32,
                      flop_ns=np.float64, hbm_ns=np.float64, pad_flops=np.float64)
        arr = {k: np.concatenate(v).astype(dtypes[k]) if v else np.zeros(0, dtypes[k])
               for k, v in self.cols.items()}
        src = np.concatenate(self.src) if self.src else np.zeros(0, np.int64)
        dst = np.concatenate(self.dst) if self.dst else np.zeros(0, np.int64)
        if np.any(src >= dst):
            raise AssertionError("task graph: an edge does not follow id order")
        order = np.argsort(src, kind="stable")
        ptr = np.zeros(self.n + 1, dtype=np.int64)
        np.cumsum(np.bincount(src, minlength=self.n), out=ptr[1:])
        return TaskGraph(num_gpus=num_gpus, **arr, num_deps=np.bincount(dst, minlength=self.n).astype(np.int32),
                         dep_ptr=ptr, dep_idx=dst[order].astype(np.int64), edge_src=src[order], batch=batch,
                         shared=shared)


def build_graph(w: LayerWorkload, profile: HardwareProfile, plan: Plan, *, tile_rows: int = 128,
                tile_cols: int = 128, comm_chunk_rows: int | None = None,
                gemm_tasks_per_sm: int | None = 32, dispatch_order: str = "token",
                segment_pad_rows: int | None = None, expert_pad_rows: int | None = None,
                piece_deal: str = "round-robin", gemm_clock=None, shared: str = "off",
                expert_dtype: str = "bf16") -> TaskGraph:
    """The task DAG of layer `w` under `plan` (plan fixes K per GPU and the sequential barriers).

    gemm_clock: None, or per GPU the SM clock as a fraction of the one the profile's GEMM rates hold at
    (the power model's, engine/run.py): GEMM tiles compute that much slower; their weight streaming does not.
    segment_pad_rows / expert_pad_rows: see SimOptions (both None: row blocks cut over an expert's rows from
    all sources, each charged its rows).
    comm_chunk_rows: rows per dispatch/combine transfer (default tile_rows).
    dispatch_order: order of rows in each dispatch stream, one of DISPATCH_ORDERS.
    piece_deal: with 'piece' order, 'round-robin' (the kernel's) or 'queue' (SimOptions).
    shared: one of SHARED_ORDERS, the shared experts' position in the GEMM queue ('off': none; a no-op for a model
    without shared experts).
    expert_dtype: one of EXPERT_DTYPES (SimOptions): bytes per weight element streamed by the tiles and per element of
    a dispatched row ('fp8': 1, plus one fp32 scale per 128 x 128 weight block and per 128 row elements).
    """
    if shared not in SHARED_ORDERS:
        raise ValueError(f"shared must be one of {SHARED_ORDERS}, got {shared!r}")
    disp_row_bytes, weight_elem_bytes = expert_bytes(expert_dtype, w.model.hidden_size)
    G, N = w.num_gpus, profile.num_sms
    H, I = w.model.hidden_size, w.model.expert_ffn_size
    row_bytes = w.model.row_bytes  # combine rows and the reduction: bf16
    cr = int(comm_chunk_rows or tile_rows)
    fx = profile.fixed_ns
    seq = plan.sequential
    # phase boundaries of a sequential plan: kernel launches (and one host sync), or grid barriers when fused
    boundary_ns = fx["grid_barrier"] if plan.fused else fx["launch"]
    b = _Builder()
    ring = receive_ring(G, dispatch_order)

    # Weave's decision is charged inside the count-exchange task (strictly it follows the remote counts'
    # arrival; the delay before any dispatch is the same either way), unless the plan names the SMs that make
    # it (decision_sms: the core holds those after the count exchange, the others start at once).
    cx = b.add(K_CTRL, np.arange(G), work_ns=fx["count_exchange"] + (0 if plan.decision_sms else plan.decision_ns))
    first_ns = fx["grid_barrier"] if plan.fused else fx["host_sync"] + fx["launch"]
    known = b.add(K_BARRIER, np.arange(G), delay_ns=first_ns if seq else 0)
    b.edges(cx[:, None], known[None, :])

    # Dispatch streams s -> d (s != d), each cut into chunks of cr rows (in 'piece' order: the kernel's pieces).
    R = w.dispatch_rows.copy()
    np.fill_diagonal(R, 0)
    chunk_starts = None
    if dispatch_order == "piece":
        # streams in the kernel's sending order: source s to s+1, s+2, ... (ids follow it, so that the
        # round-robin chains below run forward in id order)
        sizes, piece_of = piece_chunks(w, ring, tile_rows, cr, segment_pad_rows)
        sd = [(a, (a + step) % G) for a in range(G) for step in range(1, G)]
        cnt = np.array([sizes[a][d].size for a, d in sd], dtype=np.int64)
        st_own = np.repeat(np.array([a * G + d for a, d in sd], dtype=np.int64), cnt)
        st_idx = np.arange(cnt.sum()) - np.repeat(np.cumsum(cnt) - cnt, cnt)
        st_rows = np.concatenate([sizes[a][d] for a, d in sd] + [np.zeros(0, np.int64)])
        chunk_starts = [[np.cumsum(sizes[a][d]) - sizes[a][d] for d in range(G)] for a in range(G)]
        nch = np.zeros(G * G, dtype=np.int64)
        base = np.zeros((G, G), dtype=np.int64)
        for (a, d), c, o in zip(sd, cnt, np.cumsum(cnt) - cnt):
            nch[a * G + d], base[a, d] = c, o
    else:
        st_own, st_idx, st_rows = split_pieces(R.ravel(), cr)
        nch = -(-R.ravel() // cr)
        base = (np.cumsum(nch) - nch).reshape(G, G)
    st_src, st_dst = st_own // G, st_own % G
    # The megakernel's dispatch pieces (kernel layouts only, i.e. pad rows given): a source's rows of one expert
    # cut at the owner's 128-row blocks, each piece ended by a fence and a release flag on the owner, about one
    # cross-GPU signal during which its CTA pushes nothing (the profile's fixed_ns "dispatch_piece" if it has one,
    # e.g. fitted: weave-sim calibrate --fit-params ...,piece_ns). Charged before the stream's transfers, spread
    # evenly over them.
    if segment_pad_rows is not None or expert_pad_rows is not None:
        pieces = dispatch_pieces(w, ring, tile_rows, segment_pad_rows)
        per_piece = fx.get("dispatch_piece", fx["signal"])
        if dispatch_order == "piece" and piece_deal == "queue":
            per_piece += fx["task_claim"]  # each piece claimed from a ticket
        piece_ns = np.round(per_piece * pieces.ravel() / np.maximum(nch, 1)).astype(np.int64)[st_own]
    else:
        piece_ns = 0
    disp = b.add(K_DISPATCH, st_src, peer=st_dst, nbytes=st_rows * disp_row_bytes, work_ns=piece_ns,
                 prio=st_idx * G + (st_dst - st_src) % G)
    b.edges(known[st_src], disp)
    stream_base = base + (disp[0] if disp.size else 0)
    if dispatch_order == "piece" and disp.size and piece_deal == "round-robin":
        # The kernel hands its pieces to its dispatching CTAs round-robin, not from a queue: piece i of source s
        # (destinations s+1, s+2, ..., then expert, then row block) is pushed by CTA i mod C after piece i - C.
        for a in range(G):
            C = N if seq else max(1, int(plan.num_comm_sms[a]))
            ids, idx, base = [], [], 0
            for step in range(1, G):
                d = (a + step) % G
                ids.append(stream_base[a, d] + np.arange(nch[a * G + d]))
                idx.append(base + piece_of[a][d])
                base += int(piece_of[a][d][-1]) + 1 if piece_of[a][d].size else 0
            ids, idx = np.concatenate(ids), np.concatenate(idx)
            order = np.lexsort((idx, idx % C))  # by CTA, then in the CTA's order
            same = (idx[order][1:] % C) == (idx[order][:-1] % C)
            b.edges(ids[order][:-1][same], ids[order][1:][same])
    if seq:
        gate = b.add(K_BARRIER, np.arange(G), delay_ns=boundary_ns)
        b.edges(known, gate)
        b.edges(disp, gate[st_src])
        b.edges(disp, gate[st_dst])

    # Row blocks of every local expert, per GPU.
    if dispatch_order not in DISPATCH_ORDERS:
        raise ValueError(f"dispatch_order must be one of {DISPATCH_ORDERS}, got {dispatch_order!r}")
    if segment_pad_rows is not None and expert_pad_rows is not None:
        raise ValueError("segment_pad_rows and expert_pad_rows exclude each other")
    pad_rows = segment_pad_rows if segment_pad_rows is not None else expert_pad_rows
    geo = [gpu_rows(w, g, ring[g], tile_rows, cr, dispatch_order, pad_rows, segment_pad_rows is not None,
                     None if chunk_starts is None else [chunk_starts[ring[g][j]][g] for j in range(G)])
           for g in range(G)]
    if expert_pad_rows is not None and 2 * expert_pad_rows == tile_rows and profile.gemm_half_tile_cost != 0.5:
        # half tiles (the layout "expert-packed-half"): a block of at most half a tile costs the profile's share of
        # a whole tile (gemm.half_tile_cost; 0.5, its MMAs only, is what the rounding above already charged)
        for x in geo:
            x["cost_rows"] = np.where(x["rows"] <= expert_pad_rows, profile.gemm_half_tile_cost * tile_rows,
                                      x["cost_rows"])
    rb_gpu = np.concatenate([np.full(x["rows"].size, g) for g, x in enumerate(geo)])
    arrived = b.add(K_BARRIER, rb_gpu)
    b.edges(known[rb_gpu], arrived)
    if seq:
        b.edges(gate[rb_gpu], arrived)
    off = 0
    for g, x in enumerate(geo):
        s, lo, hi, rb = x["dep_src"], x["dep_lo"], x["dep_hi"], x["dep_rb"]
        own, j = ranges(lo, hi)
        b.edges(stream_base[s[own], g] + j, arrived[off + rb[own]])
        off += x["rows"].size

    # Chunk assignment (per GPU, K chunks balanced by rows in expected-arrival order) and GEMM batching.
    K = np.asarray(plan.num_chunks)
    rb_chunk, rb_order, rb_rate, batch = [], [], [], {}
    for g, x in enumerate(geo):
        order = np.lexsort((np.arange(x["rows"].size), x["ready_frac"]))
        rank = np.empty_like(order)
        rank[order] = np.arange(order.size)
        before = np.cumsum(x["rows"][order]) - x["rows"][order]
        ch = np.empty_like(order)
        ch[order] = np.minimum(before * K[g] // max(x["rows"].sum(), 1), K[g] - 1)
        rb_chunk.append(ch)
        rb_order.append(rank)
        # FLOP/ns per SM. With padded blocks (the kernel layouts) the padding is charged as rows, and a small
        # expert's weights as HBM time below (work = max of both), so its tiles compute at the rate of at least
        # two full blocks per expert: the calibration's points of one block per expert stream every weight
        # stage from HBM, i.e. their rate already holds the HBM time the engine charges separately.
        eff_rows = x["expert_rows"] if pad_rows is None else np.maximum(x["expert_rows"], 2 * tile_rows)
        rate = profile.per_sm_tflops(eff_rows) * _FLOP_PER_NS_PER_TFLOPS
        if gemm_clock is not None:
            rate = rate * float(gemm_clock[g])
        rb_rate.append(rate)
        batch[g] = batch_sizes(x, rate, H, I, tile_rows, tile_cols, N, gemm_tasks_per_sm)
    rb_chunk, rb_order, rb_rate = map(np.concatenate, (rb_chunk, rb_order, rb_rate))
    rb_cost_rows = np.concatenate([x["cost_rows"] for x in geo])  # rows the MMAs compute (padding included)
    rb_rows = np.concatenate([x["rows"] for x in geo])  # routed rows of each block
    rb_blocks = np.concatenate([x["expert_blocks"] for x in geo])
    per_sm_hbm_gbs = profile.hbm_gbs / N  # an SM's share of HBM bandwidth (bytes/ns)
    b0 = np.array([batch[g][0] for g in range(G)])[rb_gpu]
    b1 = np.array([batch[g][1] for g in range(G)])[rb_gpu]
    rb_prio = (rb_chunk.astype(np.int64) << 32) + (rb_order.astype(np.int64) << 8)

    def gemm_tasks(kind, width, k_dim, bsz, out_mult, blk_gpu=rb_gpu, cost_rows=rb_cost_rows, blocks=rb_blocks,
                   rate=rb_rate, prio=rb_prio, chunk=rb_chunk, rows=rb_rows):
        """GEMM tasks of the row blocks described by the per-block arrays (default: the routed experts')."""
        n_tasks = -(-(-(-width // tile_cols)) // bsz)  # ceil(column tiles / batch) per row block
        own = np.repeat(np.arange(n_tasks.size), n_tasks)
        t = np.arange(n_tasks.sum()) - np.repeat(np.cumsum(n_tasks) - n_tasks, n_tasks)
        col_lo = t * bsz[own] * tile_cols
        cols = np.minimum(width, col_lo + bsz[own] * tile_cols) - col_lo
        flops = 2.0 * cost_rows[own] * k_dim * out_mult * cols
        pad_flops = 2.0 * np.maximum(cost_rows[own] - rows[own], 0) * k_dim * out_mult * cols
        # Weight slice (bf16, or fp8 with its block scales) streamed from HBM once per expert, shared by its row
        # blocks (L2 reuse).
        weight_bytes = weight_elem_bytes * k_dim * out_mult * cols / blocks[own]
        # A tile's fixed cost (profile gemm.k_fixed) makes short-K tiles slower per FLOP than the calibrated
        # K, long-K tiles faster; the factor is 1 without it.
        flop_ns = flops / rate[own] * profile.k_factor(k_dim)
        hbm_ns = weight_bytes / per_sm_hbm_gbs
        ids = b.add(kind, blk_gpu[own], work_ns=np.ceil(np.maximum(flop_ns, hbm_ns)).astype(np.int64),
                    tiles=-(-cols // tile_cols), flops=flops, prio=prio[own] + (kind == K_GEMM0),
                    chunk=chunk[own], flop_ns=flop_ns, hbm_ns=hbm_ns, pad_flops=pad_flops)
        return own, ids

    own0, g0 = gemm_tasks(K_GEMM0, I, H, b0, 2)  # gate and up: 2 x tile_cols outputs per SwiGLU column
    b.edges(arrived[own0], g0)
    g0done = b.add(K_BARRIER, rb_gpu)
    b.edges(g0, g0done[own0])
    own1, g1 = gemm_tasks(K_GEMM1, H, I, b1, 1)
    b.edges(g0done[own1], g1)
    # Shared experts: one FFN of width Is per GPU over its own tokens (module docstring, "Shared experts").
    tokens = np.asarray(w.tokens_per_gpu, dtype=np.int64)
    Is = w.model.shared_ffn_size
    on = shared != "off" and Is > 0 and tokens.sum() > 0

    def shared_tasks():
        """The shared experts' GEMM tasks: (GEMM0 ids, GEMM1 ids, GPU of each GEMM1 task)."""
        nb = -(-tokens // tile_rows)  # row blocks per GPU, the last one partial
        sb_gpu = np.repeat(np.arange(G), nb)
        sb_idx = np.arange(nb.sum()) - np.repeat(np.cumsum(nb) - nb, nb)
        sb_rows = np.minimum(tile_rows, tokens[sb_gpu] - sb_idx * tile_rows)
        sb_cost = sb_rows if pad_rows is None else -(-sb_rows // pad_rows) * pad_rows
        eff = tokens if pad_rows is None else np.maximum(tokens, 2 * tile_rows)  # as eff_rows of a routed expert
        g_rate = profile.per_sm_tflops(eff) * _FLOP_PER_NS_PER_TFLOPS
        if gemm_clock is not None:
            g_rate = g_rate * np.asarray(gemm_clock, dtype=np.float64)
        if shared == "first":  # below every routed GEMM task (those have priorities >= 0)
            sb_prio = (sb_idx - nb[sb_gpu]) << 8
        else:  # above every routed GEMM task
            sb_prio = int(rb_prio.max(initial=-1)) + 2 + (sb_idx << 8)
        sb = dict(blk_gpu=sb_gpu, cost_rows=sb_cost, blocks=nb[sb_gpu], rate=g_rate[sb_gpu], prio=sb_prio,
                  chunk=np.full(sb_gpu.size, -1), rows=sb_rows)
        bsz0 = np.array([batch[g][0] for g in range(G)])[sb_gpu]
        bsz1 = np.array([batch[g][1] for g in range(G)])[sb_gpu]
        sown0, s0 = gemm_tasks(K_GEMM0, Is, H, bsz0, 2, **sb)
        b.edges(known[sb_gpu[sown0]], s0)
        if seq:
            b.edges(gate[sb_gpu[sown0]], s0)
        s0done = b.add(K_BARRIER, sb_gpu)
        b.edges(s0, s0done[sown0])
        sown1, s1 = gemm_tasks(K_GEMM1, H, Is, bsz1, 1, **sb)
        b.edges(s0done[sown1], s1)
        return s0, s1, sb_gpu[sown1]

    # Under `sequential` the shared tiles belong to the GEMM phases, which end at the phase boundary after them
    # (the kernel: the grid barrier after its GEMM1 pass, whose tickets end with the shared GEMM1 tiles): they are
    # built before the chunk barriers, which wait for them. Otherwise after the combine (ids as before).
    if on and seq:
        s0, s1, s1_gpu = shared_tasks()

    chunk_base = np.concatenate([[0], np.cumsum(K)[:-1]])
    cdone = b.add(K_BARRIER, np.repeat(np.arange(G), K), delay_ns=boundary_ns if seq else 0,
                  chunk=np.arange(K.sum()) - np.repeat(chunk_base, K))
    b.edges(known[np.repeat(np.arange(G), K)], cdone)
    b.edges(g1, cdone[chunk_base[rb_gpu[own1]] + rb_chunk[own1]])
    if on and seq:  # every chunk barrier of the GPU (one chunk: K = 1 under sequential)
        own, k = ranges(chunk_base[s1_gpu], chunk_base[s1_gpu] + K[s1_gpu] - 1)
        b.edges(s1[own], cdone[k])

    # Combine: rows of chunk k on g that belong to source s go back to s in transfers of cr rows. Local rows do
    # not move, except under the megakernel's sequential (plan.fused): its GEMM1 writes every result in place over
    # the receive rows and its combine phase copies all of them, local ones included, to their combine slots
    # (csrc megakernel.cuh sequential_combine). A local piece is a copy in g's HBM: no link bytes, its rows read
    # and written at an SM's share of HBM bandwidth, as the reduction is charged.
    copy_local = seq and plan.fused
    comb_own, comb_rows = [], []
    for g, x in enumerate(geo):
        per = np.zeros((K[g], G), dtype=np.int64)  # [chunk, ring position]
        np.add.at(per, rb_chunk[rb_gpu == g], x["overlap"])
        if not copy_local:
            per[:, 0] = 0  # local rows do not move
        comb_rows.append(per.ravel())
        comb_own.append(np.stack(np.meshgrid(np.arange(K[g]), ring[g], indexing="ij"), -1).reshape(-1, 2))
    comb_rows, comb_own = np.concatenate(comb_rows), np.concatenate(comb_own)
    comb_src = np.repeat(np.arange(G), K * G)
    own, idx, rows = split_pieces(comb_rows, cr)
    src, dst, k = comb_src[own], comb_own[own, 1], comb_own[own, 0]
    prio = _COMBINE_PRIO + (k.astype(np.int64) << 32) + idx * G + (dst - src) % G
    if copy_local:
        local = dst == src
        copy_ns = np.ceil(2 * rows * row_bytes / per_sm_hbm_gbs).astype(np.int64)
        comb = b.add(K_COMBINE, src, peer=dst, nbytes=np.where(local, 0, rows * row_bytes),
                     work_ns=np.where(local, copy_ns, 0), chunk=k, prio=prio)
    else:
        comb = b.add(K_COMBINE, src, peer=dst, nbytes=rows * row_bytes, chunk=k, prio=prio)
    b.edges(cdone[chunk_base[src] + k], comb)

    if on and not seq:
        s0, s1, s1_gpu = shared_tasks()

    # Weighted reduction at each token's GPU, spread over up to N SM-sized slices.
    rgate = b.add(K_BARRIER, np.arange(G))
    b.edges(known, rgate)
    b.edges(comb, rgate[dst])
    b.edges(cdone, rgate[np.repeat(np.arange(G), K)])
    red_bytes = (w.pair_counts.sum(axis=(1, 2)) + tokens) * row_bytes  # read k rows, write one
    if on:
        b.edges(s1, rgate[s1_gpu])
        red_bytes = red_bytes + tokens * row_bytes  # and the shared expert's row
    pieces = np.minimum(N, tokens)
    red_gpu = np.repeat(np.arange(G), pieces)
    red_ns = np.ceil(red_bytes[red_gpu] / np.maximum(pieces[red_gpu], 1) / per_sm_hbm_gbs).astype(np.int64)
    red = b.add(K_REDUCE, red_gpu, work_ns=red_ns, nbytes=0, prio=np.arange(red_gpu.size))
    b.edges(rgate[red_gpu], red)
    mark = None
    if on:
        mark = np.zeros(b.n, dtype=np.int8)
        mark[np.r_[s0, s1]] = SHARED_FIRST if shared == "first" else SHARED_LAST
    return b.build(G, {g: {"gemm0_tiles_per_task": int(batch[g][0]), "gemm1_tiles_per_task": int(batch[g][1])}
                       for g in range(G)}, shared=mark)

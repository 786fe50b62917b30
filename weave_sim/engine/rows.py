"""Where a layer's rows lie on their owner GPU and which dispatch transfers each row block waits on (numpy).

Row layout. Expert e's rows on its owner g are grouped by source GPU in ring order g, g+1, ... (local rows
first, as receive offsets are prefix sums of the exchanged counts; 'piece' order: g, g-1, ..., the megakernel's
layout). A stream s->g sends each token once,
in one of two orders: 'token' (as the tokens sit on s: expert e's rows are spread evenly over the whole
stream, so most row blocks complete late) or 'expert' (grouped by g's local expert, as a sender that sorts
its rows by expert would; a token picking several experts on g is approximated as a fraction of a row in
each). Either way a row block waits on a contiguous range of each source stream's chunks, cut every
comm_chunk_rows rows. 'piece' is 'expert' with the megakernel's transfers: one per (source, expert, owner row
block), split at comm_chunk_rows (pair-based dispatch rows only), so a block's rows arrive with its own pieces.
"""
from __future__ import annotations

import numpy as np

from ..workload import LayerWorkload


def ranges(lo: np.ndarray, hi: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Expand integer ranges [lo_i, hi_i] (inclusive) into (owner index i, value) pairs."""
    n = np.maximum(hi - lo + 1, 0)
    owner = np.repeat(np.arange(lo.size), n)
    start = np.repeat(lo - np.concatenate([[0], np.cumsum(n)[:-1]]), n)
    return owner, start + np.arange(n.sum())


def split_pieces(total: np.ndarray, piece: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Split each total_i into ceil(total_i / piece) pieces: (owner i, piece index, piece size)."""
    count = -(-total // piece)
    owner = np.repeat(np.arange(total.size), count)
    idx = np.arange(count.sum()) - np.repeat(np.cumsum(count) - count, count)
    size = np.minimum(piece, total[owner] - idx * piece)
    return owner, idx, size


def receive_ring(G: int, dispatch_order: str) -> np.ndarray:
    """ring[g, j]: the j-th source in owner g's receive layout (j = 0: g itself). The megakernel's layout ('piece'
    order) steps backwards, g, g-1, g-2, ... (csrc/layout.cuh: step t holds source (g - t) mod G), so the source
    that sends to g first (g-1, whose first destination is g) fills the row blocks right after g's own rows; the
    other orders keep g, g+1, ...  Both are the same for G <= 2."""
    step = -1 if dispatch_order == "piece" else 1
    return (np.arange(G)[:, None] + step * np.arange(G)[None, :]) % G


def piece_layout(w: LayerWorkload, ring: np.ndarray, tile_rows: int,
                 segment_pad_rows: int | None) -> list[list[tuple[np.ndarray, np.ndarray, np.ndarray]]]:
    """The megakernel's dispatch pieces per stream s -> d in stream order (layout[s][d]; empty for s == d), as
    (rows, local expert, row block counted from the expert's first block): on owner d each local expert's rows lie
    back to back (d's own first, then ring order; each source's segment padded to segment_pad_rows in the
    per-segment layout), and a source sends one piece per tile_rows-row block its segment touches, expert by
    expert (weave_kernel.piece_cost matches measured dispatch records to these)."""
    G = w.num_gpus
    empty = np.zeros(0, np.int64)
    out = [[(empty, empty, empty) for _ in range(G)] for _ in range(G)]
    for d in range(G):
        seg = w.pair_counts[:, d, w.placement.local_experts(d)][ring[d]].T  # [experts, ring position]
        span = seg if segment_pad_rows is None else -(-seg // segment_pad_rows) * segment_pad_rows
        start = np.cumsum(span, axis=1) - span
        for j in range(1, G):
            n, st = seg[:, j], start[:, j]
            e = np.flatnonzero(n > 0)
            first, last = st[e] // tile_rows, (st[e] + n[e] - 1) // tile_rows
            cnt = last - first + 1
            ee = np.repeat(e, cnt)
            blk = np.repeat(first, cnt) + np.arange(cnt.sum()) - np.repeat(np.cumsum(cnt) - cnt, cnt)
            rows = np.minimum((blk + 1) * tile_rows, st[ee] + n[ee]) - np.maximum(blk * tile_rows, st[ee])
            out[int(ring[d, j])][d] = (rows, ee, blk)
    return out


def piece_rows(w: LayerWorkload, ring: np.ndarray, tile_rows: int,
                segment_pad_rows: int | None) -> list[list[np.ndarray]]:
    """Rows of each megakernel dispatch piece, per stream s -> d in stream order (rows[s][d]; piece_layout)."""
    return [[rows for rows, _, _ in row] for row in piece_layout(w, ring, tile_rows, segment_pad_rows)]


def dispatch_pieces(w: LayerWorkload, ring: np.ndarray, tile_rows: int, segment_pad_rows: int | None) -> np.ndarray:
    """[G_src, G_dst] number of dispatch pieces of the megakernel (piece_rows). Own rows are not sent (diagonal 0)."""
    rows = piece_rows(w, ring, tile_rows, segment_pad_rows)
    return np.array([[r.size for r in row] for row in rows], dtype=np.int64)


def piece_chunks(w: LayerWorkload, ring: np.ndarray, tile_rows: int, cr: int,
                  segment_pad_rows: int | None) -> tuple[list[list[np.ndarray]], list[list[np.ndarray]]]:
    """Transfer sizes of each dispatch stream s -> d (sizes[s][d], in stream order) in 'piece' order: the
    megakernel's pieces (piece_rows), each split further into transfers of at most cr rows; and per transfer the
    index of its piece in the stream. Needs pair-based dispatch rows (one row per (token, expert) pair, as the
    kernel sends)."""
    sizes = piece_rows(w, ring, tile_rows, segment_pad_rows)
    piece = [[np.zeros(0, np.int64) for _ in row] for row in sizes]
    for s, row in enumerate(sizes):
        for d, z in enumerate(row):
            if s != d and int(z.sum()) != int(w.dispatch_rows[s, d]):
                raise ValueError("dispatch_order 'piece' needs pair-based dispatch rows (one row per (token, "
                                 f"expert) pair, as the megakernel sends): {s} -> {d} sends "
                                 f"{int(w.dispatch_rows[s, d])} rows for {int(z.sum())} pairs")
            piece[s][d], _, row[d] = split_pieces(z, cr)
    return sizes, piece


def gpu_rows(w: LayerWorkload, g: int, ring: np.ndarray, tile_rows: int, cr: int, order: str,
              pad_rows: int | None = None, per_segment: bool = False, chunk_starts=None) -> dict:
    """Row blocks of GPU g's experts and the dispatch chunk ranges each one waits on (see DISPATCH_ORDERS).
    With `per_segment`, blocks never straddle two sources' segments; with `pad_rows`, a block costs its rows
    rounded up to pad_rows. chunk_starts ('piece' order): per ring position j the stream offsets at which the
    transfers of source ring[j]'s stream to g start."""
    le = w.placement.local_experts(g)
    seg_n = w.pair_counts[:, g, le][ring].T  # [experts, ring position]
    seg_end = np.cumsum(seg_n, axis=1)
    seg_start = seg_end - seg_n
    e_rows = seg_end[:, -1] if le.size else np.zeros(0, np.int64)
    if not per_segment:
        nb = -(-e_rows // tile_rows)
        rb_e = np.repeat(np.arange(le.size), nb)
        lo = (np.arange(nb.sum()) - np.repeat(np.cumsum(nb) - nb, nb)) * tile_rows
        hi = np.minimum(lo + tile_rows, e_rows[rb_e])
    else:  # blocks per (expert, source) segment, expert-major like the kernel's receive layout
        per_seg = (-(-seg_n // tile_rows)).ravel()
        seg = np.repeat(np.arange(per_seg.size), per_seg)
        m = np.arange(per_seg.sum()) - np.repeat(np.cumsum(per_seg) - per_seg, per_seg)
        rb_e, seg_j = seg // max(ring.size, 1), seg % max(ring.size, 1)
        nb = per_seg.reshape(seg_n.shape).sum(axis=1) if le.size else np.zeros(0, np.int64)
        lo = seg_start[rb_e, seg_j] + m * tile_rows
        hi = np.minimum(lo + tile_rows, seg_end[rb_e, seg_j])
    ss, se = seg_start[rb_e], seg_end[rb_e]  # [RB, G]
    a = np.maximum(lo[:, None], ss)
    z = np.minimum(hi[:, None], se)
    overlap = np.maximum(z - a, 0)
    r, j = np.nonzero(overlap[:, 1:] > 0)
    j = j + 1
    n = seg_n[rb_e[r], j]
    stream_rows = w.dispatch_rows[ring[j], g]
    i_lo, i_hi = a[r, j] - ss[r, j], z[r, j] - ss[r, j]

    if order == "token":  # e's rows from s are spread evenly over the whole stream
        off, span = np.zeros_like(n), n
    else:  # "expert" and "piece": the stream carries expert 0's rows from s, then expert 1's, ...
        off = (np.cumsum(seg_n, axis=0) - seg_n)[rb_e[r], j]
        span = seg_n[:, j].sum(axis=0)

    def chunk_of(i):  # the dispatch chunk carrying the i-th row of expert e from this source
        if order == "piece":  # expert order, transfers of uneven sizes
            out = np.empty_like(i)
            for jj in np.unique(j):
                m = j == jj
                out[m] = np.searchsorted(chunk_starts[jj], off[m] + i[m], side="right") - 1
            return out
        return ((2 * (off + i) + 1) * stream_rows // (2 * span)) // cr

    ready = np.zeros(lo.size)
    np.maximum.at(ready, r, (off + i_hi) / span)
    cost = hi - lo if pad_rows is None else -(-(hi - lo) // pad_rows) * pad_rows
    return {"rows": hi - lo, "cost_rows": cost, "expert_rows": e_rows[rb_e], "expert_blocks": nb[rb_e],
            "overlap": overlap,
            "ready_frac": ready,
            "dep_rb": r, "dep_src": ring[j], "dep_lo": chunk_of(i_lo), "dep_hi": chunk_of(i_hi - 1)}


def batch_sizes(x: dict, rate: np.ndarray, H: int, I: int, tile_rows: int, tile_cols: int, num_sms: int,
                 tasks_per_sm: int | None) -> tuple[int, int]:
    """Column tiles per GEMM0 and GEMM1 task on one GPU (1 when unbatched or the layer is small)."""
    if tasks_per_sm is None or x["rows"].size == 0:
        return 1, 1
    total_ns = float(np.sum(x["rows"] * 6.0 * H * I / rate))
    quantum_ns = total_ns / num_sms / tasks_per_sm
    full = x["rows"] == tile_rows
    r = float(np.median(rate[full])) if full.any() else float(np.median(rate))
    t0 = 2.0 * tile_rows * H * 2 * tile_cols / r
    t1 = 2.0 * tile_rows * I * tile_cols / r
    return max(1, int(quantum_ns // t0)), max(1, int(quantum_ns // t1))

"""The 'piece' dispatch order: the megakernel's transfers, one per (source, expert, owner row block)."""
import numpy as np
import pytest

from weave_sim.engine import simulate_layer
from weave_sim.engine.dag import K_DISPATCH
from weave_sim.engine.rows import dispatch_pieces, gpu_rows, piece_chunks
from weave_sim.placement import contiguous
from weave_sim.presets import ModelPreset
from weave_sim.profile import load_profile
from weave_sim.validate import KERNEL_OPTIONS
from weave_sim.workload import layer_workload, workload_from_counts

PROFILE = load_profile("h200")
MODEL = ModelPreset("m", 2048, 768, 48, 4, 0, 1)


def pair_workload(G: int, tokens: int, seed: int, skew: float = 1.0):
    """A pair-based workload as the kernel's counts give it: dispatch rows = pairs sent to each owner."""
    rng = np.random.default_rng(seed)
    p = rng.random(MODEL.num_experts) ** skew
    pairs = np.stack([rng.multinomial(tokens * MODEL.top_k, p / p.sum()) for _ in range(G)])
    pl = contiguous(MODEL.num_experts, G)
    rows = np.stack([np.bincount(pl.owner, weights=pairs[s], minlength=G).astype(np.int64) for s in range(G)])
    return workload_from_counts(pairs, rows, MODEL, pl, [tokens] * G)


@pytest.mark.parametrize("G,tokens,seed", [(2, 1024, 0), (2, 96, 1), (3, 512, 2), (4, 700, 3), (8, 300, 4)])
@pytest.mark.parametrize("cr", [128, 48])
def test_transfers_are_the_kernels_pieces(G, tokens, seed, cr):
    w = pair_workload(G, tokens, seed)
    ring = (np.arange(G)[:, None] + np.arange(G)[None, :]) % G
    sizes, piece_of = piece_chunks(w, ring, 128, cr, None)
    pieces = dispatch_pieces(w, ring, 128, None)
    for s in range(G):
        for d in range(G):
            z = sizes[s][d]
            assert int(z.sum()) == (0 if s == d else int(w.dispatch_rows[s, d]))
            assert (z > 0).all() and (z <= min(cr, 128)).all()
            if cr >= 128:
                assert z.size == pieces[s, d]  # one transfer per kernel piece
            else:
                assert z.size >= pieces[s, d]


@pytest.mark.parametrize("G,tokens,seed", [(2, 1024, 0), (3, 512, 2), (4, 700, 3)])
def test_a_block_waits_only_on_its_own_pieces(G, tokens, seed):
    """In 'piece' order no transfer carries rows of two owner blocks, so the chunk ranges the blocks of one expert
    wait on never overlap (in 'expert' order, 128-row transfers cut across blocks and experts)."""
    w = pair_workload(G, tokens, seed)
    ring = (np.arange(G)[:, None] + np.arange(G)[None, :]) % G
    sizes, _ = piece_chunks(w, ring, 128, 128, None)
    for g in range(G):
        starts = [np.cumsum(sizes[ring[g][j]][g]) - sizes[ring[g][j]][g] for j in range(G)]
        x = gpu_rows(w, g, ring[g], 128, 128, "piece", 128, False, starts)
        for src in range(G):
            m = x["dep_src"] == src
            if not m.any():
                continue
            lo, hi = x["dep_lo"][m], x["dep_hi"][m]
            order = np.argsort(lo)
            assert (hi >= lo).all() and (lo[order][1:] > hi[order][:-1]).all()
            # together they cover every transfer of the stream once
            assert int((hi - lo + 1).sum()) == sizes[src][g].size


def test_kernel_layout_simulates_with_pieces():
    """validate's model of the current kernel sends one transfer per kernel piece, all the dispatched bytes."""
    w = pair_workload(2, 2048, 5)
    assert KERNEL_OPTIONS["dispatch_order"] == "piece"
    r = simulate_layer(w, PROFILE, "kernel:static:8", record_timeline=True, **KERNEL_OPTIONS)
    ring = (np.arange(2)[:, None] + np.arange(2)[None, :]) % 2
    disp = r.graph.kind == K_DISPATCH
    assert int(disp.sum()) == int(dispatch_pieces(w, ring, 128, None).sum())
    sent = int(w.dispatch_rows.sum() - np.trace(w.dispatch_rows))
    assert int(r.graph.nbytes[disp].sum()) == sent * MODEL.row_bytes and r.latency_ns > 0


def test_piece_order_needs_pair_based_rows():
    ids = np.argsort(np.random.default_rng(1).random((2 * 256, 48)), axis=1)[:, :4]
    w = layer_workload(ids, MODEL, contiguous(48, 2))  # distinct tokens per owner, fewer than pairs
    with pytest.raises(ValueError, match="pair-based"):
        simulate_layer(w, PROFILE, "kernel:static:8", dispatch_order="piece", expert_pad_rows=128)


@pytest.mark.parametrize("policy,C", [("kernel:static:3", 3), ("kernel:weave:5", 5), ("kernel:sequential", None)])
def test_pieces_go_to_the_dispatching_ctas_round_robin(policy, C):
    """The kernel's dispatching CTA i pushes pieces i, i + C, i + 2C, ... (destinations s+1, s+2, ..., then expert,
    then block; csrc layout.cuh dispatch_block): in the engine piece i starts only after piece i - C ended."""
    w = pair_workload(3, 700, 7, skew=3.0)
    r = simulate_layer(w, PROFILE, policy, record_timeline=True, **KERNEL_OPTIONS)
    g = r.graph
    C = C or PROFILE.num_sms
    for s in range(3):
        ids = []
        for step in (1, 2):  # kernel order: destination s+1 first, then s+2; each stream in piece order
            m = np.flatnonzero((g.kind == K_DISPATCH) & (g.gpu == s) & (g.peer == (s + step) % 3))
            ids.append(m)  # the builder adds a stream's transfers in stream order
        ids = np.concatenate(ids)
        assert (np.diff(ids) > 0).all()  # built in the kernel's sending order
        if C < ids.size:
            assert (r.start_ns[ids[C:]] >= r.end_ns[ids[:-C]]).all()
        else:  # every SM dispatches (sequential): no piece waits for another
            assert r.start_ns[ids].min() == r.start_ns[ids].max()


def test_pieces_from_a_queue_go_to_whichever_comm_sm_is_free():
    """piece_deal='queue' drops the round-robin chains: no comm SM idles while a piece waits, so on uneven pieces
    and few comm CTAs the dispatch ends no later than dealt round-robin (beyond its claim costs), and each piece
    pays one task claim more."""
    from weave_sim.engine.dag import build_graph
    from weave_sim.engine.plan import Plan

    w = pair_workload(2, 900, 11, skew=4.0)
    plan = Plan("kernel:static:3", (3, 3), (1, 1), combine_in_epilogue=True)
    kw = dict(dispatch_order="piece", expert_pad_rows=128)
    rr, q = (build_graph(w, PROFILE, plan, piece_deal=d, **kw) for d in ("round-robin", "queue"))
    disp = rr.kind == K_DISPATCH
    claim = PROFILE.fixed_ns["task_claim"]
    assert (q.work_ns[disp] >= rr.work_ns[disp]).all() and q.work_ns[disp].sum() > rr.work_ns[disp].sum()
    assert q.work_ns[disp].sum() - rr.work_ns[disp].sum() <= claim * disp.sum() + disp.sum()  # rounding
    res = {d: simulate_layer(w, PROFILE, "kernel:static:3", record_timeline=True, piece_deal=d, **kw)
           for d in ("round-robin", "queue")}
    end = {d: r.end_ns[r.graph.kind == K_DISPATCH].max() for d, r in res.items()}
    assert end["queue"] <= end["round-robin"] + claim * disp.sum()
    with pytest.raises(ValueError, match="piece_deal"):
        simulate_layer(w, PROFILE, "kernel:static:3", piece_deal="lifo", **kw)


def test_round_robin_graphs_are_not_shared_between_comm_counts():
    """A context that simulates several C (oracle) must not reuse the round-robin chains built for another C."""
    from weave_sim.engine.policies import kernel as kernel_policy
    from weave_sim.engine.run import SimContext, SimOptions

    w = pair_workload(2, 900, 11, skew=4.0)
    ctx = SimContext(w, PROFILE, SimOptions(**KERNEL_OPTIONS))
    first = ctx.simulate(kernel_policy.plan(ctx, "static:3")).latency_ns
    again = ctx.simulate(kernel_policy.plan(ctx, "static:9")).latency_ns
    assert again == simulate_layer(w, PROFILE, "kernel:static:9", **KERNEL_OPTIONS).latency_ns
    assert first == simulate_layer(w, PROFILE, "kernel:static:3", **KERNEL_OPTIONS).latency_ns

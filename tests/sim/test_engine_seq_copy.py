"""The megakernel's `sequential` copies every result row in its combine phase, local rows included (its GEMM1 writes
in place over the receive rows); the engine charges a local row's copy as HBM traffic (dag.py, "Combine")."""
import numpy as np
import pytest

from weave_sim.engine import simulate_layer
from weave_sim.engine.dag import K_COMBINE, K_REDUCE
from weave_sim.engine.testing import ZERO_FIXED, random_layer, tiny_model, tiny_profile

MODEL = tiny_model(hidden=256, ffn=128, experts=8, top_k=2)


def _local_copies(r):
    g = r.graph
    return np.flatnonzero((g.kind == K_COMBINE) & (g.peer == g.gpu))


@pytest.mark.parametrize("tokens", [256, 1024])
def test_fused_sequential_copies_all_rows_at_ep1(tokens):
    prof = tiny_profile(16, fixed_ns=ZERO_FIXED, hbm_gbs=1000.0)
    w = random_layer(1, tokens, MODEL, seed=1)
    r = simulate_layer(w, prof, "kernel:sequential")
    g, loc = r.graph, _local_copies(r)
    rows = tokens * MODEL.top_k
    per_sm = prof.hbm_gbs / prof.num_sms  # bytes per ns
    # every pair's result row is read and written once, in pieces of at most tile_rows rows, at an SM's HBM share
    assert g.nbytes[loc].sum() == 0
    assert g.work_ns[loc].sum() == pytest.approx(2 * rows * MODEL.row_bytes / per_sm, abs=loc.size)
    assert r.busy_by_kind_ns["combine"].sum() == g.work_ns[loc].sum()  # no claim cost in ZERO_FIXED
    # the reduction waits for the copies: they are on the path, so the layer grows with the copied bytes
    assert r.start_ns[g.kind == K_REDUCE].min() >= r.end_ns[loc].max()
    fast = simulate_layer(w, tiny_profile(16, fixed_ns=ZERO_FIXED, hbm_gbs=2000.0), "kernel:sequential")
    assert fast.busy_by_kind_ns["combine"].sum() == pytest.approx(r.busy_by_kind_ns["combine"].sum() / 2,
                                                                  abs=loc.size)


def test_copy_time_scales_with_rows_and_width():
    prof = tiny_profile(16, fixed_ns=ZERO_FIXED)
    busy = {}
    for hidden in (128, 256):
        for tokens in (512, 1024):
            w = random_layer(1, tokens, tiny_model(hidden=hidden, ffn=128, experts=8, top_k=2), seed=2)
            busy[hidden, tokens] = simulate_layer(w, prof, "kernel:sequential").busy_by_kind_ns["combine"].sum()
    base = busy[128, 512]
    assert base > 0
    assert busy[128, 1024] == pytest.approx(2 * base, rel=0.01)
    assert busy[256, 512] == pytest.approx(2 * base, rel=0.01)
    assert busy[256, 1024] == pytest.approx(4 * base, rel=0.01)


def test_local_copies_at_ep2_and_link_bytes_unchanged():
    prof = tiny_profile(16, fixed_ns=ZERO_FIXED)
    w = random_layer(2, 1024, MODEL, seed=3)
    r = simulate_layer(w, prof, "kernel:sequential")
    g, loc = r.graph, _local_copies(r)
    comb = g.kind == K_COMBINE
    local_rows = np.array([w.pair_counts[s, s, w.placement.local_experts(s)].sum() for s in range(2)])
    per_sm = prof.hbm_gbs / prof.num_sms
    for s in range(2):
        mine = loc[g.gpu[loc] == s]
        assert g.work_ns[mine].sum() == pytest.approx(2 * local_rows[s] * MODEL.row_bytes / per_sm, abs=mine.size)
    # remote rows still cross the link, and only they
    assert np.array_equal(np.bincount(g.peer[comb], g.nbytes[comb], 2), w.combine_bytes_in)


@pytest.mark.parametrize("policy", ["sequential", "kernel:static:4", "kernel:weave", "static:4", "weave"])
def test_other_policies_copy_no_local_rows(policy):
    prof = tiny_profile(16, fixed_ns=ZERO_FIXED)
    for G in (1, 2):
        r = simulate_layer(random_layer(G, 512, MODEL, seed=4), prof, policy)
        assert _local_copies(r).size == 0
        if G == 1:
            assert r.busy_by_kind_ns["combine"].sum() == 0

"""`kernel:P` models the megakernel's own scheduling; check what distinguishes it from the ideal policies."""
import numpy as np
import pytest

from weave_sim.engine import simulate_layer
from weave_sim.engine.dag import C_COMM, K_GEMM1
from weave_sim.engine.hardware import ROLE_COMPUTE
from weave_sim.placement import contiguous
from weave_sim.presets import ModelPreset
from weave_sim.profile import load_profile
from weave_sim.workload import layer_workload

PROFILE = load_profile()


@pytest.fixture(scope="module")
def layer():
    model = ModelPreset("m", 2048, 768, 16, 4, 0, 1)
    rng = np.random.default_rng(0)
    ids = np.argsort(rng.random((2 * 1024, 16)), axis=1)[:, :4]
    return layer_workload(ids, model, contiguous(16, 2))


def test_fused_sequential_skips_host_sync(layer):
    """kernel:sequential saves the host sync and launches, pays grid barriers, and copies its local result rows in
    the combine phase (at most one wave of copy tasks here: fewer tasks than SMs)."""
    from weave_sim.engine.dag import K_COMBINE

    host = simulate_layer(layer, PROFILE, "sequential").latency_ns
    r = simulate_layer(layer, PROFILE, "kernel:sequential")
    g = r.graph
    local = (g.kind == K_COMBINE) & (g.peer == g.gpu)
    assert 0 < np.bincount(g.gpu[local], minlength=2).max() <= PROFILE.num_sms
    fx = PROFILE.fixed_ns
    saved = fx["host_sync"] + 3 * fx["launch"] - 3 * fx["grid_barrier"]
    tol = 2 * fx["signal"] + 1000
    assert saved - g.work_ns[local].max() - fx["task_claim"] - tol <= host - r.latency_ns <= saved + tol


def test_epilogue_combine_runs_on_compute_sms_during_gemms(layer):
    r = simulate_layer(layer, PROFILE, "kernel:static:8")
    g = r.graph
    comm = np.flatnonzero(g.cls == C_COMM)
    by_compute = comm[r.roles[g.gpu[comm], r.sm[comm]] == ROLE_COMPUTE]
    assert by_compute.size > 0
    gemm_end = r.end_ns[g.kind == K_GEMM1].max()
    assert r.start_ns[by_compute].min() < gemm_end  # pushed while other GEMMs still run
    assert r.plan.combine_in_epilogue and not r.plan.steal


def test_kernel_weave_uses_the_cost_model_choice(layer):
    from weave_sim import costmodel as cm

    r = simulate_layer(layer, PROFILE, "kernel:weave")
    choice = cm.choose(cm.Volumes.from_workloads([layer], PROFILE), PROFILE)
    assert r.plan.num_comm_sms == tuple(choice.num_comm_sms[0]) and r.plan.steal
    assert simulate_layer(layer, PROFILE, "kernel:weave:12").plan.num_comm_sms == (12, 12)


def test_kernel_weave_without_stealing(layer):
    """The same split as kernel:weave, no comm SM runs a GEMM task; with a fixed split the comm SMs of
    kernel:static:C do the same, so the two coincide."""
    from weave_sim.engine.dag import C_GEMM

    w, ns = simulate_layer(layer, PROFILE, "kernel:weave"), simulate_layer(layer, PROFILE, "kernel:weave-nosteal")
    assert ns.plan.num_comm_sms == w.plan.num_comm_sms and not ns.plan.steal and w.plan.steal
    g = ns.graph
    gemm = np.flatnonzero(g.cls == C_GEMM)
    assert (ns.roles[g.gpu[gemm], ns.sm[gemm]] == ROLE_COMPUTE).all()
    st = simulate_layer(layer, PROFILE, "kernel:static:12")
    assert simulate_layer(layer, PROFILE, "kernel:weave-nosteal:12").latency_ns == pytest.approx(
        st.latency_ns, rel=0.02)


def test_only_the_deciders_wait_for_the_weave_choice(layer):
    """kernel:weave: the SMs below the table's max_comm_sms decide after the count exchange, the others start
    their GEMM tasks at once; a fixed C (kernel:weave:C) leaves the decision to SM 0; the recorded split
    (kernel:weave@c0,c1) decides like kernel:weave."""
    from weave_sim.costtable import table_for
    from weave_sim.engine.dag import C_GEMM, K_CTRL
    from weave_sim.engine.timeline import chrome_trace_events
    from weave_sim.profile import profile_from_dict

    data = PROFILE.to_dict()
    data["fixed_ns"]["decision"] = d = 20_000  # about what the megakernel's choice takes (the profiles say 600)
    prof = profile_from_dict(data)
    r = simulate_layer(layer, prof, "kernel:weave", record_timeline=True)
    deciders = min(table_for(prof).max_comm_sms, prof.num_sms)
    assert r.plan.decision_sms == (deciders, deciders) and deciders < PROFILE.num_sms
    g = r.graph
    cx_end = {int(g.gpu[t]): int(r.end_ns[t]) for t in np.flatnonzero(g.kind == K_CTRL)}
    gemm = np.flatnonzero(g.cls == C_GEMM)
    sm, gpu, start = r.sm[gemm], g.gpu[gemm], r.start_ns[gemm]
    ends = np.array([cx_end[int(x)] for x in gpu])
    assert (start[sm < deciders] >= ends[sm < deciders] + d).all()
    assert (start[sm >= deciders] < ends[sm >= deciders] + d).any()  # some start before the decision is made
    chooses = [e for e in chrome_trace_events(r) if e.get("name") == "choose"]
    assert sorted((e["pid"], e["tid"]) for e in chooses) == [(x, s) for x in range(2) for s in range(deciders)]
    assert all(e["dur"] == pytest.approx(d / 1e3) for e in chooses)
    waits = [e for e in chrome_trace_events(r) if e.get("name") == "wait" and e["tid"] < deciders]
    assert not any(e["ts"] < c["ts"] + c["dur"] and c["ts"] < e["ts"] + e["dur"]  # the decision is not a wait
                   for c in chooses for e in waits if (e["pid"], e["tid"]) == (c["pid"], c["tid"]))
    assert simulate_layer(layer, PROFILE, "kernel:weave:12").plan.decision_sms == (1, 1)  # fixed C: SM 0 alone
    rec = simulate_layer(layer, PROFILE, "kernel:weave@13,9")
    assert rec.plan.num_comm_sms == (13, 9) and rec.plan.decision_sms == (deciders, deciders)
    with pytest.raises(ValueError, match="kernel"):
        simulate_layer(layer, PROFILE, "kernel:weave@13,9:4")


@pytest.mark.parametrize("spec", ["kernel", "kernel:static", "kernel:bogus:3", "kernel:sequential:2"])
def test_bad_kernel_specs(layer, spec):
    with pytest.raises(ValueError, match="kernel"):
        simulate_layer(layer, PROFILE, spec)


def test_segment_padding_geometry(layer):
    """Blocks never straddle two sources; each segment is cut into ceil(rows / tile) blocks; cost is padded."""
    from weave_sim.engine.rows import gpu_rows

    G, tile = layer.num_gpus, 128
    for g in range(G):
        ring = (g + np.arange(G)) % G
        x = gpu_rows(layer, g, ring, tile, 128, "expert", pad_rows=64, per_segment=True)
        assert ((x["overlap"] > 0).sum(axis=1) == 1).all()
        seg = layer.pair_counts[:, g, layer.placement.local_experts(g)]
        assert x["rows"].size == int((-(-seg // tile)).sum()) and x["rows"].sum() == seg.sum()
        assert (x["cost_rows"] % 64 == 0).all() and (x["cost_rows"] >= x["rows"]).all()
        plain = gpu_rows(layer, g, ring, tile, 128, "expert")
        assert (plain["cost_rows"] == plain["rows"]).all() and plain["rows"].size <= x["rows"].size
        # expert-packed (the kernel now): ceil(expert rows / tile) blocks, each costing a whole tile
        packed = gpu_rows(layer, g, ring, tile, 128, "expert", pad_rows=128)
        assert packed["rows"].size == int((-(-seg.sum(axis=0) // tile)).sum()) == plain["rows"].size
        assert (packed["cost_rows"] == tile).all() and packed["rows"].sum() == seg.sum()


def test_expert_packing_computes_fewer_padded_rows(layer):
    a = simulate_layer(layer, PROFILE, "kernel:static:8", dispatch_order="expert", segment_pad_rows=128)
    b = simulate_layer(layer, PROFILE, "kernel:static:8", dispatch_order="expert", expert_pad_rows=128)
    gemm = lambda r: sum(r.busy_by_kind_ns[k].sum() for k in r.busy_by_kind_ns if "gemm" in str(k))  # noqa: E731
    assert 0 < gemm(b) <= gemm(a)
    with pytest.raises(ValueError, match="exclude"):
        simulate_layer(layer, PROFILE, "kernel:static:8", segment_pad_rows=64, expert_pad_rows=128)


def test_padding_option_is_validated(layer):
    with pytest.raises(ValueError, match="segment_pad_rows"):
        simulate_layer(layer, PROFILE, "kernel:static:8", segment_pad_rows=0)


@pytest.mark.parametrize("gpus,pad", [(2, None), (4, None), (4, 64)])
def test_dispatch_pieces_count_the_blocks_each_segment_touches(gpus, pad):
    """rows.dispatch_pieces against the receive layout built row by row as the kernel builds it (csrc/layout.cuh):
    on owner d, each local expert's rows from every source in step order t = 0, 1, ..., source (d - t) mod G (d's
    own first), a source's segment padded to `pad` rows in the per-segment layout; a source sends one piece per
    128-row block holding any of its rows (its own rows none)."""
    from weave_sim.engine.rows import dispatch_pieces, receive_ring

    rng = np.random.default_rng(gpus * 7 + (pad or 0))
    E = 8 * gpus
    model = ModelPreset("m", 256, 128, E, 3, 0, 1)
    ids = np.stack([rng.choice(E, size=3, replace=False, p=np.linspace(1, 5, E) / np.linspace(1, 5, E).sum())
                    for _ in range(700 * gpus)])
    w = layer_workload(ids, model, contiguous(E, gpus))
    ring = receive_ring(gpus, "piece")
    want = np.zeros((gpus, gpus), dtype=np.int64)
    for d in range(gpus):
        for e in w.placement.local_experts(d):
            row = 0
            for s in ((d - t) % gpus for t in range(gpus)):
                n = int(w.pair_counts[s, d, e])
                if s != d:
                    want[s, d] += len({r // 128 for r in range(row, row + n)})
                row += n if pad is None else -(-n // pad) * pad
    got = dispatch_pieces(w, ring, 128, pad)
    assert np.array_equal(got, want)
    assert got.sum() >= -(-w.dispatch_rows[~np.eye(gpus, dtype=bool)] // 128).sum()  # at least one per 128 rows
    if gpus > 2:  # the other order cuts the blocks elsewhere
        assert not np.array_equal(dispatch_pieces(w, receive_ring(gpus, "expert"), 128, pad), want)

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from weave_sim import costmodel as cm
from weave_sim.placement import contiguous, round_robin
from weave_sim.presets import ModelPreset, get_model
from weave_sim.profile import ProfileError, load_profile, profile_from_dict
from weave_sim.workload import layer_workload, model_workloads, split_tokens

PROFILE = load_profile("h200")


def random_routing(rng, num_tokens, num_experts, top_k, num_layers=1, skew=1.0):
    """Distinct top-k experts per token via Gumbel-top-k on Zipf-like logits."""
    logits = -skew * np.log1p(rng.permutation(num_experts))
    g = rng.gumbel(size=(num_tokens, num_layers, num_experts)) + logits
    return np.argsort(-g, axis=2)[:, :, :top_k]


@st.composite
def scenarios(draw):
    num_gpus = draw(st.sampled_from([1, 2, 4, 8]))
    per_gpu = draw(st.integers(1, 6))
    num_experts = num_gpus * per_gpu
    top_k = draw(st.integers(1, min(num_experts, 6)))
    model = ModelPreset("t", 64 * draw(st.integers(1, 8)), 64 * draw(st.integers(1, 8)), num_experts, top_k, 0, 1)
    num_tokens = draw(st.integers(0, 300))
    seed = draw(st.integers(0, 2**31))
    kind = draw(st.sampled_from([contiguous, round_robin]))
    ids = random_routing(np.random.default_rng(seed), num_tokens, num_experts, top_k, skew=draw(st.floats(0, 3)))
    return model, kind(num_experts, num_gpus), ids[:, 0, :]


@given(scenarios())
def test_conservation_and_identities(sc):
    model, placement, ids = sc
    w = layer_workload(ids, model, placement)
    n = ids.shape[0]
    assert w.tokens_per_gpu.sum() == n
    assert w.computed_pairs.sum() == n * model.top_k  # every pair computed exactly once
    assert w.incoming_pairs.sum() == w.outgoing_pairs.sum()
    assert w.dispatch_rows_in.sum() == w.dispatch_rows_out.sum()  # bytes sent = bytes received
    assert w.combine_rows_in.sum() == w.combine_rows_out.sum()
    assert (w.dispatch_rows_in <= w.incoming_pairs).all()  # dedup never exceeds pairs
    assert (w.dispatch_rows_out <= w.outgoing_pairs).all()
    assert (w.flops == w.computed_pairs * 6 * model.hidden_size * model.expert_ffn_size).all()
    assert (w.dispatch_bytes_in == w.dispatch_rows_in * 2 * model.hidden_size).all()
    assert (w.combine_bytes_out == w.incoming_pairs * 2 * model.hidden_size).all()
    # pairs only land on the owner of their expert
    for g in range(placement.num_gpus):
        foreign = placement.owner != g
        assert w.pair_counts[:, g, foreign].sum() == 0
    assert (w.active_local_experts <= placement.experts_per_gpu()).all()
    # dispatch rows: each token counted once per distinct GPU that owns one of its experts
    src = split_tokens(n, placement.num_gpus)
    want = np.zeros((placement.num_gpus, placement.num_gpus), dtype=np.int64)
    for t in range(n):
        for d in {int(placement.owner[e]) for e in ids[t]}:
            want[src[t], d] += 1
    np.testing.assert_array_equal(w.dispatch_rows, want)


def test_workload_by_hand():
    # 2 GPUs, experts 0,1 on GPU0 and 2,3 on GPU1; tokens 0-1 on GPU0, 2-3 on GPU1
    model = ModelPreset("t", 64, 64, 4, 2, 0, 1)
    ids = np.array([[0, 1], [0, 2], [3, 2], [1, 3]])
    w = layer_workload(ids, model, contiguous(4, 2))
    assert w.local_pairs.tolist() == [3, 3]
    assert w.incoming_pairs.tolist() == [1, 1]
    assert w.dispatch_rows_out.tolist() == [1, 1]  # token 1 -> GPU1 once; token 3 -> GPU0 once
    assert w.expert_rows.tolist() == [2, 2, 2, 2]
    assert w.local_expert_rows(1).tolist() == [2, 2]


def test_split_tokens_even():
    src = split_tokens(10, 4)
    assert np.bincount(src).tolist() in ([3, 2, 3, 2], [2, 3, 2, 3], [3, 3, 2, 2], [2, 2, 3, 3], [3, 2, 2, 3])
    assert (np.diff(src) >= 0).all()


@pytest.mark.parametrize(
    "ids, msg",
    [(np.zeros((4, 3), int), r"\[num_tokens, 2\]"), (np.full((4, 2), 9), "lie in"), (np.zeros((4, 2)), "integer")],
)
def test_workload_rejects_bad_ids(ids, msg):
    with pytest.raises(ValueError, match=msg):
        layer_workload(ids, ModelPreset("t", 64, 64, 4, 2, 0, 1), contiguous(4, 2))


@given(scenarios(), st.sampled_from([(1, 2, 4, 8), (1,), (2, 8)]))
def test_cost_never_below_lower_bound_and_choice_is_grid_minimum(sc, chunks):
    model, placement, ids = sc
    vol = cm.Volumes.from_workloads([layer_workload(ids, model, placement)], PROFILE)
    comm = np.arange(1, PROFILE.num_sms)
    grid = cm.layer_time_ns(vol, PROFILE, comm, chunks)
    lb = cm.lower_bound_ns(vol, PROFILE)
    assert (grid >= lb[:, :, None, None] * (1 - 1e-12)).all()
    choice = cm.choose(vol, PROFILE, comm, chunks)
    assert np.allclose(choice.time_ns, grid.min(axis=(2, 3)))
    for g in range(placement.num_gpus):
        c_idx = int(np.flatnonzero(comm == choice.num_comm_sms[0, g])[0])
        k_idx = list(chunks).index(choice.num_chunks[0, g])
        assert grid[0, g, c_idx, k_idx] == choice.time_ns[0, g]
    assert (cm.sequential_time_ns(vol, PROFILE) >= lb).all()


def test_more_comm_bytes_want_more_comm_sms():
    # a comm-heavy geometry (small FFN) must choose more comm SMs than a compute-heavy one
    rng = np.random.default_rng(1)
    ids = random_routing(rng, 4 * 4096, 64, 8)[:, 0, :]
    light = ModelPreset("light", 4096, 256, 64, 8, 0, 1)
    heavy = ModelPreset("heavy", 4096, 8192, 64, 8, 0, 1)
    c_light = cm.choose(cm.Volumes.from_workloads([layer_workload(ids, light, contiguous(64, 4))], PROFILE), PROFILE)
    c_heavy = cm.choose(cm.Volumes.from_workloads([layer_workload(ids, heavy, contiguous(64, 4))], PROFILE), PROFILE)
    assert c_light.num_comm_sms.min() > c_heavy.num_comm_sms.max()


def test_model_workloads_per_layer():
    m = get_model("mixtral-8x7b")
    routing = random_routing(np.random.default_rng(0), 64, 8, 2, num_layers=3)
    ws = model_workloads(routing, m, contiguous(8, 2))
    assert len(ws) == 3 and all(w.computed_pairs.sum() == 128 for w in ws)


def test_profiles_load_and_curves_are_sane():
    for name in ("h200", "h100-sxm"):
        p = load_profile(name)
        assert p.num_sms == 132 and p.source
        assert p.bandwidth_gbs(0) == 0 and p.bandwidth_gbs(1) == pytest.approx(20)
        assert (np.diff(p.bandwidth_gbs(np.arange(1, 132))) >= 0).all()
        assert p.tflops(132, 4096) <= p.gemm_peak_tflops
        assert p.efficiency(1) == 1.0


def test_profile_errors_are_clear():
    with pytest.raises(ProfileError, match="shipped profiles"):
        load_profile("tpu-v9")
    raw = dict(PROFILE.raw)
    with pytest.raises(ProfileError, match="unknown keys"):
        profile_from_dict({**raw, "bogus": 1})
    with pytest.raises(ProfileError, match="rho"):
        profile_from_dict({**raw, "rho": 2})
    with pytest.raises(ProfileError, match="chunk efficiency"):
        PROFILE.efficiency(3)
    with pytest.raises(ValueError, match="comm SM"):
        cm.layer_time_ns(_tiny_vol(), PROFILE, [0])


def _tiny_vol():
    m = ModelPreset("t", 64, 64, 4, 2, 0, 1)
    return cm.Volumes.from_workloads([layer_workload(np.array([[0, 3]]), m, contiguous(4, 2))], PROFILE)


@given(scenarios())
def test_workload_round_trips_through_counts(sc):
    from weave_sim.workload import workload_from_counts

    model, placement, ids = sc
    w = layer_workload(ids, model, placement)
    w2 = workload_from_counts(w.pair_counts.sum(axis=1), w.dispatch_rows, model, placement, w.tokens_per_gpu)
    assert (w2.pair_counts == w.pair_counts).all() and (w2.flops == w.flops).all()
    assert (w2.dispatch_bytes_in == w.dispatch_bytes_in).all()


def test_inconsistent_counts_rejected():
    from weave_sim.workload import workload_from_counts

    m = ModelPreset("t", 64, 64, 4, 2, 0, 1)
    with pytest.raises(ValueError, match="inconsistent"):
        workload_from_counts([[1, 0, 0, 0], [0, 0, 0, 2]], [[1, 0], [0, 1]], m, contiguous(4, 2), [1, 1])
    with pytest.raises(ValueError, match="must be"):
        workload_from_counts([[1, 1]], [[1]], m, contiguous(4, 2), [1])

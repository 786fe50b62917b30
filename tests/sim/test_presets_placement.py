import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from weave_sim.placement import contiguous, explicit, make_placement, round_robin
from weave_sim.presets import PRESETS, WEAVE_EVAL_MODELS, ModelPreset, get_model


def test_all_required_presets_exist_with_paper_geometry():
    expected = {  # name: (E, k, H, I, shared, layers) from weave-system.md
        "deepseek-v3": (256, 8, 7168, 2048, 1, 58),
        "phi-3.5-moe": (16, 2, 4096, 6400, 0, 32),
        "qwen3-30b-a3b": (128, 8, 2048, 768, 0, 48),
        "qwen3.5-35b-a3b": (256, 8, 2048, 512, 1, 40),
        "deepseek-v2-lite": (64, 6, 2048, 1408, 2, 26),
        "deepseek-v2": (160, 6, 5120, 1536, 2, 59),
        "gpt-oss-20b": (32, 4, 2880, 2880, 0, 24),
        "olmoe-1b-7b": (64, 8, 2048, 1024, 0, 16),
        "mixtral-8x7b": (8, 2, 4096, 14336, 0, 32),
    }
    assert set(PRESETS) == set(expected)
    assert set(WEAVE_EVAL_MODELS) <= set(PRESETS)
    for name, (e, k, h, i, shared, layers) in expected.items():
        m = get_model(name)
        assert (m.num_experts, m.top_k, m.hidden_size, m.expert_ffn_size) == (e, k, h, i)
        assert (m.num_shared_experts, m.num_moe_layers) == (shared, layers)
        assert m.flops_per_pair == 6 * h * i and m.row_bytes == 2 * h


def test_unknown_model_names_known_ones():
    with pytest.raises(KeyError, match="deepseek-v3"):
        get_model("gpt-5")


def test_bad_preset_rejected():
    with pytest.raises(ValueError, match="top_k"):
        ModelPreset("x", 64, 64, 4, 8, 0, 1)


@given(st.integers(1, 8), st.integers(1, 32), st.sampled_from(["contiguous", "round-robin"]))
def test_placement_covers_each_expert_once(num_gpus, per_gpu, kind):
    num_experts = num_gpus * per_gpu
    p = make_placement(kind, num_experts, num_gpus)
    seen = np.concatenate([p.local_experts(g) for g in range(num_gpus)])
    assert sorted(seen.tolist()) == list(range(num_experts))
    assert (p.experts_per_gpu() == per_gpu).all()
    local = p.local_index()
    for g in range(num_gpus):
        assert (local[p.local_experts(g)] == np.arange(per_gpu)).all()


def test_contiguous_and_round_robin_layouts():
    assert contiguous(8, 2).owner.tolist() == [0, 0, 0, 0, 1, 1, 1, 1]
    assert round_robin(8, 2).owner.tolist() == [0, 1, 0, 1, 0, 1, 0, 1]


@pytest.mark.parametrize(
    "owner, gpus, msg",
    [([0, 2], 2, "owners"), ([-1, 0], 2, "owners"), ([], 2, "non-empty"), ([0.5, 1], 2, "integer")],
)
def test_bad_explicit_placement(owner, gpus, msg):
    with pytest.raises(ValueError, match=msg):
        explicit(np.asarray(owner), gpus)


def test_uneven_split_rejected():
    with pytest.raises(ValueError, match="evenly"):
        contiguous(10, 4)
    with pytest.raises(ValueError, match="experts"):
        make_placement("explicit", 4, 2, owner=[0, 1, 0])

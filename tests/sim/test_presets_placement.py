import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from weave_sim.placement import (balanced, balanced_per_layer, contiguous, explicit, make_placement, placement_for,
                                 round_robin)
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
    with pytest.raises(KeyError, match="deepseek-v3") as err:
        get_model("gpt-5")
    assert str(err.value).startswith("unknown model 'gpt-5'")  # no KeyError quotes around the message


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


def test_custom_spec_geometry_and_defaults():
    m = get_model("custom:I=1024:E=64:k=4:H=2048")
    assert (m.num_experts, m.top_k, m.hidden_size, m.expert_ffn_size) == (64, 4, 2048, 1024)
    assert (m.num_moe_layers, m.num_shared_experts) == (1, 0)
    assert m.name == "custom:E=64:k=4:H=2048:I=1024"  # canonical order, whatever order it was given in
    assert get_model(m.name) == m


def test_preset_spec_changes_only_the_given_keys():
    base, m = get_model("qwen3-30b-a3b"), get_model("qwen3-30b-a3b:layers=2:E=256")
    assert m.name == "qwen3-30b-a3b:E=256:layers=2"
    assert (m.num_experts, m.num_moe_layers) == (256, 2)
    assert (m.top_k, m.hidden_size, m.expert_ffn_size, m.num_shared_experts) == (
        base.top_k, base.hidden_size, base.expert_ffn_size, base.num_shared_experts)
    assert get_model("qwen3-30b-a3b") is base  # a plain preset name is still the preset itself


@pytest.mark.parametrize("spec, error, match", [
    ("custom:E=64:k=4", ValueError, "needs H, I"),
    ("custom:E=64:k=4:H=2048:I=1024:Q=1", ValueError, "KEY=VALUE with KEY one of"),
    ("custom:E=64:k=4:H=2048:I", ValueError, "KEY=VALUE"),
    ("custom:E=64:E=32:k=4:H=2048:I=64", ValueError, "E given twice"),
    ("custom:E=6.5:k=4:H=2048:I=64", ValueError, "not a plain decimal integer"),
    ("custom:E=+64:k=4:H=2048:I=64", ValueError, "not a plain decimal integer"),
    ("custom:E=64:k=4:H=2048:I=64:layers=100000", ValueError, "above its limit 1024"),
    ("custom:E=4:k=8:H=2048:I=64", ValueError, "top_k 8 > num_experts 4"),
    ("custom:E=4:k=2:H=0:I=64", ValueError, "hidden_size must be positive"),
    ("custom:E=4:k=2:H=64:I=64:shared=-1", ValueError, "not a plain decimal integer"),
    ("qwen3-30b-a3b:", ValueError, "KEY=VALUE"),
    ("gpt-9:E=4", KeyError, "unknown base 'gpt-9'"),
    ("gpt-9", KeyError, "or a spec such as"),
])
def test_bad_specs_are_clear_errors(spec, error, match):
    with pytest.raises(error, match=match):
        get_model(spec)


@given(st.sampled_from(["custom", *sorted(PRESETS)]), st.integers(1, 512), st.integers(1, 8),
       st.integers(1, 16384), st.integers(1, 32768), st.integers(1, 100), st.integers(0, 4),
       st.lists(st.sampled_from(["E", "k", "H", "I", "layers", "shared"]), unique=True), st.randoms())
def test_spec_round_trips_through_its_name(base, e, k, h, i, layers, shared, keys, rnd):
    values = {"E": e, "k": min(k, e), "H": h, "I": i, "layers": layers, "shared": shared}
    if base == "custom":
        keys = sorted(set(keys) | {"E", "k", "H", "I"})
    elif not keys:
        keys = ["H"]
    elif "k" in keys and "E" not in keys:
        values["k"] = min(values["k"], PRESETS[base].num_experts)
    elif "E" in keys and "k" not in keys:
        values["E"] = max(e, PRESETS[base].top_k)
    rnd.shuffle(keys)
    m = get_model(":".join([base] + [f"{key}={values[key]}" for key in keys]))
    assert get_model(m.name) == m
    expect = {**(PRESETS[base].to_dict() if base != "custom" else {"num_moe_layers": 1, "num_shared_experts": 0})}
    fields = {"E": "num_experts", "k": "top_k", "H": "hidden_size", "I": "expert_ffn_size",
              "layers": "num_moe_layers", "shared": "num_shared_experts"}
    expect.update({fields[key]: values[key] for key in keys})
    for field, value in expect.items():
        if field not in ("name", "hf_id"):
            assert getattr(m, field) == value, field


def test_balanced_placement_exact_case():
    # heaviest first to the lightest GPU with room: e0 -> 0, e7 -> 1, then the 1s fill GPU 1 to its 4 experts
    p = balanced([10, 1, 1, 1, 1, 1, 1, 4], 2)
    assert p.owner.tolist() == [0, 1, 1, 1, 0, 0, 0, 1] and p.kind == "balanced"
    assert np.bincount(p.owner, weights=[10, 1, 1, 1, 1, 1, 1, 4]).tolist() == [13.0, 7.0]  # e0 + 3 others: optimal


@given(st.integers(1, 8), st.integers(1, 16), st.integers(0, 2**31 - 1))
def test_balanced_placement_is_an_equal_split(num_gpus, per_gpu, seed):
    loads = np.random.default_rng(seed).zipf(1.5, num_gpus * per_gpu).astype(float)
    p = balanced(loads, num_gpus)
    assert np.bincount(p.owner, minlength=num_gpus).tolist() == [per_gpu] * num_gpus
    assert balanced(loads, num_gpus).owner.tolist() == p.owner.tolist()  # deterministic


def test_balanced_placement_evens_real_routing():
    """The shipped GPT-OSS-20B trace at EP=4: its GPUs' pair loads under contiguous placement, per layer, against
    balanced placement from the same loads."""
    from weave_sim.traces import DEFAULT_TRACE, routing_for

    routing = routing_for("gpt-oss-20b", 4 * 2048, trace=DEFAULT_TRACE)
    worst = lambda p, ids: (lambda g: g.max() / g.mean())(np.bincount(p.owner[ids.ravel()], minlength=4))  # noqa: E731
    per = balanced_per_layer(routing, 32, 4)
    cont = [worst(contiguous(32, 4), routing[:, layer]) for layer in range(routing.shape[1])]
    bal = [worst(per[layer], routing[:, layer]) for layer in range(routing.shape[1])]
    assert np.mean(cont) > 1.1 and np.mean(bal) < 1.02 and all(b <= c + 1e-12 for b, c in zip(bal, cont))


def test_balanced_per_layer_and_placement_for():
    routing = np.array([[[0, 1], [2, 3]], [[0, 2], [3, 1]], [[0, 3], [1, 2]]])  # 3 tokens, 2 layers, top-2
    per = balanced_per_layer(routing, 4, 2)
    assert len(per) == 2 and all(np.bincount(p.owner).tolist() == [2, 2] for p in per)
    assert per[0].owner[0] != per[0].owner[1]  # layer 0: experts 0 (3 pairs) and 1 (2) on different GPUs
    assert placement_for(per, 1) is per[1] and placement_for(per[0], 7) is per[0]
    with pytest.raises(ValueError, match="no placement for layer 2"):
        placement_for(per, 2)
    with pytest.raises(ValueError, match="do not split evenly"):
        balanced([1.0, 2.0, 3.0], 2)
    with pytest.raises(ValueError, match="finite"):
        balanced([1.0, float("nan")], 2)

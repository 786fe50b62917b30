"""tests/kernel/fuzz_worker.py's CPU parts: every drawn case is a layer the kernel accepts, and its routing is valid."""
from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("torch")  # weave_kernel.validate imports torch

from weave_kernel.policies import parse_policy  # noqa: E402
from weave_kernel.geometry import check_geometry  # noqa: E402
from weave_kernel.virtual import default_ctas_per_rank  # noqa: E402
from weave_sim.placement import contiguous, round_robin  # noqa: E402

CASES = 400


@pytest.fixture(scope="module")
def fz(kernel_script):
    return kernel_script("fuzz_worker")


@pytest.fixture(scope="module")
def cases(fz):
    return [fz.draw_case(3, i) for i in range(CASES)]


def test_cases_are_deterministic(fz):
    assert fz.draw_case(5, 7) == fz.draw_case(5, 7)
    assert fz.draw_case(5, 7) != fz.draw_case(5, 8)


@pytest.mark.parametrize("big", [False, True])
def test_every_case_is_a_layer_the_kernel_accepts(fz, cases, big):
    for c in cases if not big else [fz.draw_case(3, i, big=True) for i in range(100)]:
        check_geometry(c["hidden"], c["inter"], c["experts"], c["top_k"], c["world"], c["world"], c["shared_inter"])
        assert (c["shared_inter"] > 0) == (c["shared_order"] in ("first", "last"))
        assert max(2, c["world"]) <= c["ctas_per_rank"] <= default_ctas_per_rank(fz.SMS, c["world"])
        assert c["max_tokens"] >= max(max(c["tokens"]), 1)
        assert c["experts"] * 3 * c["hidden"] * c["inter"] <= (fz.BIG_WEIGHT_ELEMS if big else fz.MAX_WEIGHT_ELEMS)
        assert max(c["tokens"]) < fz.MAX_TOKENS * (2 if big else 1)
        assert 1 <= len(c["policies"]) <= 4
        for pol in c["policies"]:
            parse_policy(pol, c["ctas_per_rank"])  # raises on a C outside the grid
        if c["routing"] == "hot_rank":
            assert c["top_k"] <= c["experts"] // c["world"]


def test_cases_cover_the_corners(fz, cases):
    seen = lambda key: {c[key] for c in cases}  # noqa: E731
    assert set(range(1, 9)) <= seen("world")  # every world size the kernel takes (7 was never drawn before)
    assert set(fz.ROUTINGS) <= seen("routing")
    assert {64} <= seen("hidden") and {64} <= seen("inter")
    assert 1 in seen("top_k") and 1 in {c["experts"] // c["world"] for c in cases}
    assert any(all(t == 0 for t in c["tokens"]) for c in cases)
    assert any(0 in c["tokens"] and max(c["tokens"]) > 0 for c in cases)
    assert {"threads", "bulk"} <= seen("dispatch") and {"contiguous", "round-robin", "shuffled"} <= seen("placement")
    assert any(c["ctas_per_rank"] < fz.SMS // c["world"] for c in cases)
    assert any(c["max_tokens"] > max(c["tokens"]) + 1 for c in cases)
    assert any(max(c["tokens"]) >= 1000 for c in cases) and max(max(c["tokens"]) for c in cases) < fz.MAX_TOKENS
    assert {None, "first", "last"} <= seen("shared_order") and 64 in seen("shared_inter")


def test_shared_draw_leaves_the_other_fields_alone(fz):
    """The fields other than the shared expert's are those drawn before it existed (commit 7e9490b's draw_case), so
    the replay lines of earlier runs (docs/results/fuzz/) still name the same layers."""
    before = {
        (4, 11, False): {"world": 7, "ctas_per_rank": 18, "experts": 14, "top_k": 4, "hidden": 64, "inter": 256,
                         "tokens": [25, 39, 0, 528, 11, 43, 69], "max_tokens": 528, "routing": "uniform",
                         "zipf_s": 0.62, "hot_rank": 0, "placement": "contiguous", "dispatch": "threads", "repeats": 1,
                         "policies": ["weave:17", "weave", "weave-nosteal", "sequential"]},
        (6, 3, True): {"world": 2, "ctas_per_rank": 66, "experts": 256, "top_k": 7, "hidden": 2560, "inter": 1408,
                       "tokens": [3, 466], "max_tokens": 466, "routing": "uniform", "zipf_s": 1.23, "hot_rank": 0,
                       "placement": "contiguous", "dispatch": "threads", "repeats": 1,
                       "policies": ["static:1", "weave-nosteal", "weave", "weave:17"]},
    }
    for (seed, index, big), fields in before.items():
        c = fz.draw_case(seed, index, big=big)
        assert {k: c[k] for k in fields} == fields


@pytest.mark.parametrize("kind", ["zipf", "uniform", "duplicates", "hot_rank", "one_expert"])
def test_routing_is_valid(fz, kind):
    experts, top_k, world = 12, 3, 3
    for placement in (contiguous(experts, world), round_robin(experts, world)):
        owned = list(placement.local_experts(1))
        ids, w = fz._routing(kind, experts, top_k, owned, 1.1)(257, 9)
        assert ids.shape == w.shape == (257, top_k) and ids.dtype == np.int32 and w.dtype == np.float32
        assert ids.min() >= 0 and ids.max() < experts
        np.testing.assert_allclose(w.sum(1), 1.0, rtol=1e-5)
        assert (w > 0).all()
        distinct = np.array([len(set(r)) for r in ids.tolist()])
        if kind == "duplicates":
            assert (distinct < top_k).any()  # 257 tokens, 3 of 12: some token picks an expert twice
        else:
            assert (distinct == top_k).all()
        if kind == "hot_rank":
            assert set(ids.ravel().tolist()) <= set(owned)
    assert fz._routing(kind, experts, top_k, owned, 1.1)(0, 9)[0].shape == (0, top_k)


def test_shuffled_placements_split_evenly_and_differ(fz, cases):
    shuffled = [c for c in cases if c["placement"] == "shuffled"]
    owners = set()
    for c in shuffled:
        pl = fz.case_placement(c)
        assert np.bincount(pl.owner, minlength=c["world"]).tolist() == [c["experts"] // c["world"]] * c["world"]
        assert pl.owner.tolist() == fz.case_placement(c).owner.tolist()  # replayable
        owners.add(tuple(pl.owner.tolist()))
    assert len(owners) > len(shuffled) // 2


@pytest.mark.parametrize("big", [False, True])
def test_fp8_cases_are_the_bf16_draws_with_widths_in_128s(fz, big):
    """--fp8: the same layer draws (world, grid, experts, routing, tokens, policies, ...) with H, I and the shared
    width rounded up to the scale blocks, inside the same weight budget; bf16 draws are what they were."""
    from weave_kernel.fp8 import BLOCK

    budget = fz.BIG_WEIGHT_ELEMS if big else fz.MAX_WEIGHT_ELEMS
    widths = ("hidden", "inter", "shared_inter")
    for i in range(150 if not big else 60):
        b, f = fz.draw_case(3, i, big=big), fz.draw_case(3, i, big=big, fp8=True)
        assert b["expert_dtype"] == "bf16" and f["expert_dtype"] == "fp8"
        assert {k: v for k, v in b.items() if k not in widths + ("expert_dtype",)} == \
            {k: v for k, v in f.items() if k not in widths + ("expert_dtype",)}
        assert f["hidden"] % BLOCK == 0 and f["inter"] % BLOCK == 0 and f["shared_inter"] % BLOCK == 0
        assert f["experts"] * 3 * f["hidden"] * f["inter"] <= budget
        assert (f["shared_inter"] > 0) == (b["shared_inter"] > 0)
        check_geometry(f["hidden"], f["inter"], f["experts"], f["top_k"], f["world"], f["world"], f["shared_inter"])
        if b["hidden"] % BLOCK == 0 and b["inter"] % BLOCK == 0 and b["experts"] * 3 * b["hidden"] * b["inter"] <= budget:
            assert (f["hidden"], f["inter"]) == (b["hidden"], b["inter"])  # already FP8's shape: unchanged

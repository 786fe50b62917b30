"""SimOptions.expert_dtype: what FP8 experts change in the task graph (bytes only; the FLOP rate is the profile's)."""
from __future__ import annotations

import numpy as np
import pytest

from weave_sim.engine import simulate_layer
from weave_sim.engine.dag import K_COMBINE, K_DISPATCH, K_GEMM0, K_GEMM1
from weave_sim.engine.run import SimOptions
from weave_sim.engine.testing import random_layer
from weave_sim.presets import get_model
from weave_sim.profile import load_profile

KW = dict(expert_pad_rows=128)  # the kernel's row blocks (its piece order needs pair-based rows)


def test_fp8_moves_half_the_dispatch_bytes_and_streams_half_the_weights():
    w = random_layer(2, 2 * 1024, get_model("qwen3-30b-a3b"), seed=1, skew=0.5)
    prof = load_profile("h200-megakernel-ep2")
    bf, f8 = (simulate_layer(w, prof, "kernel:static:20", expert_dtype=d, **KW).graph for d in ("bf16", "fp8"))
    H = w.model.hidden_size
    disp = lambda g: int(g.nbytes[g.kind == K_DISPATCH].sum())  # noqa: E731
    assert disp(bf) == int(w.dispatch_bytes_out.sum()) > 0
    assert disp(f8) * (2 * H) == disp(bf) * (H + 4 * H // 128)  # e4m3 rows and an fp32 scale per 128
    comb = lambda g: int(g.nbytes[g.kind == K_COMBINE].sum())  # noqa: E731
    assert comb(f8) == comb(bf) > 0  # combine rows stay bf16
    for kind in (K_GEMM0, K_GEMM1):
        a, b = bf.kind == kind, f8.kind == kind
        assert a.sum() == b.sum() > 0
        assert np.allclose(f8.hbm_ns[b], bf.hbm_ns[a] * (1 + 4 / 128**2) / 2)
        assert np.array_equal(f8.flop_ns[b], bf.flop_ns[a])  # the rate is the profile's (whatif fp8:S scales it)


def test_fp8_is_never_slower_and_bad_dtype_is_named():
    w = random_layer(2, 2 * 2048, get_model("deepseek-v2-lite"), seed=2, skew=0.5)
    prof = load_profile("h200-megakernel-ep2")
    for pol in ("kernel:static:20", "kernel:weave", "kernel:sequential"):
        t = {d: simulate_layer(w, prof, pol, expert_dtype=d, **KW).latency_ns for d in ("bf16", "fp8")}
        assert t["fp8"] <= t["bf16"], pol
    with pytest.raises(ValueError, match="expert_dtype must be one of"):
        SimOptions(expert_dtype="int4")


def test_expert_bytes_one_definition_for_the_engine_and_the_bound():
    from weave_sim.workload import expert_bytes

    assert expert_bytes("bf16", 2048) == (4096, 2.0)
    assert expert_bytes("fp8", 2048) == (2048 + 4 * 16, 1 + 4 / 128**2)
    assert expert_bytes("fp8", 2880)[0] == 2880 + 4 * 23  # a partial last block has its scale too
    with pytest.raises(ValueError, match="expert_dtype must be one of"):
        expert_bytes("fp16", 2048)


def test_the_fp8_lower_bound_counts_e4m3_bytes_and_fp8_flops():
    """bound_volumes(expert_dtype='fp8'): dispatch rows and weights in e4m3 with their scales, combine rows bf16, FLOPs
    unchanged; with fp8_profile's doubled peak the bound falls by at most 2x, and by about 2x where weights bind."""
    from weave_sim.costmodel import bound_volumes, lower_bound_ns
    from weave_sim.profile import fp8_profile

    prof = load_profile("h200")
    p8 = fp8_profile(prof)
    H = get_model("deepseek-v3").hidden_size
    for tokens, shared in ((2 * 64, False), (2 * 4096, True)):
        w = random_layer(2, tokens, get_model("deepseek-v3"), seed=2, skew=0.5)
        bf, f8 = bound_volumes([w], prof, shared), bound_volumes([w], p8, shared, "fp8")
        assert np.array_equal(f8.flops, bf.flops) and np.array_equal(f8.combine_bytes_in, bf.combine_bytes_in)
        assert np.allclose(f8.dispatch_bytes_out * 2 * H, bf.dispatch_bytes_out * (H + 4 * H // 128))
        assert np.allclose(f8.weight_bytes * 2, bf.weight_bytes * (1 + 4 / 128**2))
        lb, lb8 = lower_bound_ns(bf, prof).max(), lower_bound_ns(f8, p8).max()
        assert lb / 2 <= lb8 < lb
        if tokens == 128:  # decode: the weights bind
            assert lb8 == pytest.approx(lb * (1 + 4 / 128**2) / 2, rel=1e-9)
    mixed = [random_layer(1, 64, get_model(m), seed=0) for m in ("deepseek-v3", "qwen3-30b-a3b")]
    with pytest.raises(ValueError, match="one hidden size"):
        bound_volumes(mixed, p8, expert_dtype="fp8")

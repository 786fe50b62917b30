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

"""weave_kernel.gap: the distance to the lower bound taken apart by the simulator (CPU only)."""
from __future__ import annotations

import pytest

from weave_kernel.gap import STEPS, gap_result, ideal_tiles, main, no_fixed_costs, push_at_peak
from weave_kernel.recount import counts_for
from weave_sim.profile import load_profile

CFG = {"seed": 5, "zipf": 1.0}


def _result(tokens=512, experts=8, top_k=2, gpus=2, layout="expert-packed"):
    r = {"model": "tiny", "hidden": 512, "inter": 256, "experts": experts, "top_k": top_k, "gpus": gpus,
         "tokens_per_gpu": tokens, "kernel_layout": layout, "latency_ms": {"static:20": 0.2, "weave": 0.15}}
    r["counts"] = counts_for(r, CFG)
    return r


@pytest.mark.parametrize("gpus,tokens", [(2, 512), (2, 2048), (4, 1024)])
def test_every_idealisation_stays_above_the_bound(gpus, tokens):
    """Each step removes a cost the bound does not charge, so with all of them the simulated layer comes near
    the bound but never under it; the bound is the same as the benchmark's (distinct token rows, h200)."""
    out = gap_result(_result(tokens=tokens, gpus=gpus), load_profile("h200-megakernel-ep2"), CFG)
    sim = out["simulated_ms"]
    assert list(sim) == ["as built", *STEPS]
    assert out["bound_ms"] > 0 and out["steps"] == "cumulative"
    for step, t in sim.items():
        assert t >= out["bound_ms"] * (1 - 1e-9), step
    assert sim["tiles"] < sim["as built"]  # the fitted tiles are slower than the chip's peak
    assert out["measured_ms"] == 0.15


def test_alone_applies_one_step_to_the_kernel_as_built():
    r, prof = _result(tokens=1024), load_profile("h200-megakernel-ep2")
    both, alone = gap_result(r, prof, CFG), gap_result(r, prof, CFG, alone=True)
    assert alone["steps"] == "alone"
    assert alone["simulated_ms"]["as built"] == both["simulated_ms"]["as built"]
    assert alone["simulated_ms"]["tiles"] == both["simulated_ms"]["tiles"]  # the first step is the same
    assert alone["simulated_ms"]["fixed"] > both["simulated_ms"]["fixed"]  # alone, the tiles are not ideal


def test_profile_edits_touch_only_their_part():
    raw, bound = load_profile("h200-megakernel-power-ep2").to_dict(), load_profile("h200").to_dict()
    t = ideal_tiles(raw, bound)
    assert "power" not in t and "k_fixed" not in t["gemm"]
    assert set(t["gemm"]["per_sm_tflops_by_rows"].values()) == {bound["gemm"]["peak_tflops"] / raw["num_sms"]}
    assert t["nvlink"] == raw["nvlink"] and t["fixed_ns"] == raw["fixed_ns"]
    f = no_fixed_costs(raw)
    assert set(f["fixed_ns"].values()) == {0} and f["gemm"] == raw["gemm"]
    p = push_at_peak(raw, bound)
    assert set(p["nvlink"]["push_gbs_by_ctas"].values()) == {bound["nvlink"]["peak_gbs"]}
    assert raw["power"] and raw["fixed_ns"]["count_exchange"] > 0  # the originals are untouched


def test_other_layouts_and_missing_counts_get_clear_errors(tmp_path, capsys):
    with pytest.raises(ValueError, match="padding step"):
        gap_result(_result(layout="segment-padded"), load_profile("h200-megakernel-ep2"), CFG)
    bench = tmp_path / "b.json"
    bench.write_text('{"results": [{"model": "x", "tokens_per_gpu": 8}]}')
    with pytest.raises(SystemExit):
        main([str(bench)])
    assert "without the exchanged counts" in capsys.readouterr().err


def test_a_results_fused_shared_expert_is_simulated_at_every_step():
    """A bench --shared result: the shared FFN (its "inter_shared") is computed as built and after every step, so
    each step's layer is slower than without it, and the bound (computed here) counts its FLOPs and stays below."""
    prof = load_profile("h200-megakernel-ep2")
    r = _result(tokens=1024)
    off = gap_result(r, prof, CFG)
    on = gap_result({**r, "shared": "first", "inter_shared": 4096}, prof, CFG)  # wide enough to move the bound
    assert on["bound_ms"] > off["bound_ms"]
    for step, t in on["simulated_ms"].items():
        assert t > off["simulated_ms"][step], step
        assert t >= on["bound_ms"] * (1 - 1e-9), step

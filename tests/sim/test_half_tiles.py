"""Half tiles (kernel layout "expert-packed-half"): a block of at most half a tile skips the MMAs of its padding rows,
and the profile's gemm.half_tile_cost says what such a tile costs as a fraction of a whole one (fitted by weave-sim
calibrate --amend P --half-tiles BENCH)."""
import json

import pytest

from weave_sim.calibrate import CalibrationError, amend_half_tile
from weave_sim.engine.run import simulate_layer
from weave_sim.engine.testing import random_layer, simulated_bench_file
from weave_sim.presets import ModelPreset
from weave_sim.workload import pairs_dispatched
from weave_sim.profile import ProfileError, load_profile, profile_from_dict
from weave_sim.validate import KERNEL_LAYOUTS, kernel_layout_for


def _with_half(cost: float):
    raw = json.loads(json.dumps(load_profile().raw))
    raw["gemm"]["half_tile_cost"] = cost
    return profile_from_dict(raw)


# 64 experts of 2048 x 2048, top-2, 2048 tokens per GPU on 2 GPUs: 256 rows per expert on average, and about half
# of the experts end in a block of at most 64 rows (small experts alone are bound by their weight bytes, not MMAs)
_LAYER = pairs_dispatched(random_layer(2, 4096, ModelPreset("m", 2048, 2048, 64, 2, 0, 1), seed=3))


@pytest.mark.parametrize("policy", ["kernel:static:8", "kernel:weave"])
def test_half_tiles_at_a_whole_tiles_cost_are_the_full_layout(policy):
    half, full = KERNEL_LAYOUTS["expert-packed-half"], KERNEL_LAYOUTS["expert-packed"]
    at_1 = simulate_layer(_LAYER, _with_half(1.0), policy, **half).latency_ns
    assert at_1 == simulate_layer(_LAYER, load_profile(), policy, **full).latency_ns
    at_half = simulate_layer(_LAYER, load_profile(), policy, **half).latency_ns
    assert at_half == simulate_layer(_LAYER, _with_half(0.5), policy, **half).latency_ns
    at_075 = simulate_layer(_LAYER, _with_half(0.75), policy, **half).latency_ns
    assert at_half < at_075 < at_1  # small blocks' MMAs are on this layer's critical path


def test_half_tile_cost_does_not_touch_the_full_layout():
    full = KERNEL_LAYOUTS["expert-packed"]
    assert simulate_layer(_LAYER, _with_half(0.7), "kernel:static:8", **full).latency_ns == \
        simulate_layer(_LAYER, load_profile(), "kernel:static:8", **full).latency_ns


@pytest.mark.parametrize("bad", [0.0, -0.1, 1.5, "0.7", None])
def test_a_half_tile_cost_outside_0_1_is_refused(bad):
    raw = json.loads(json.dumps(load_profile().raw))
    raw["gemm"]["half_tile_cost"] = bad
    with pytest.raises(ProfileError, match="half_tile_cost"):
        profile_from_dict(raw)


def test_kernel_layout_for_names_the_instances_with_half_tiles():
    assert kernel_layout_for() == kernel_layout_for("fp8") == kernel_layout_for("bf16", shared=True) \
        == "expert-packed-half"
    assert kernel_layout_for("fp8", shared=True) == "expert-packed"
    with pytest.raises(ValueError, match="expert_dtype"):
        kernel_layout_for("fp16")


def test_amend_half_tile_fits_and_records(tmp_path):
    """The fit keeps everything but gemm.half_tile_cost, ends no worse than MMAs only (0.5) or the profile before,
    and records what it fitted to; a benchmark without half-tile results is refused."""
    truth = _with_half(0.8)
    bench = simulated_bench_file(tmp_path / "b.json", truth, 2048, 1024, tokens=1024,
                                 policies=("static:4", "static:24", "weave"))
    base = tmp_path / "base.json"
    base.write_text(json.dumps(load_profile().raw))
    prof = amend_half_tile(base, bench, tmp_path / "out.json", name="x", iters=6, log=lambda m: None)
    fit = prof["calibration"]["half_tile_from"]
    assert 0.5 <= prof["gemm"]["half_tile_cost"] <= 1.0 and prof["name"] == "x" and prof["version"].endswith("+half")
    assert fit["mean_abs_log_error"] <= min(fit["mean_abs_log_error_at_0.5"], fit["mean_abs_log_error_before"])
    assert json.loads((tmp_path / "out.json").read_text()) == prof
    rest = {k: v for k, v in prof["gemm"].items() if k != "half_tile_cost"}
    assert rest == load_profile().raw["gemm"]
    data = json.loads(bench.read_text())
    for r in data["results"]:
        r["kernel_layout"] = "expert-packed"
    full = tmp_path / "full.json"
    full.write_text(json.dumps(data))
    with pytest.raises(CalibrationError, match="half tiles"):
        amend_half_tile(base, full, tmp_path / "no.json", log=lambda m: None)


def test_cli_half_tiles_needs_amend(tmp_path, capsys):
    from weave_sim.cli import main

    assert main(["calibrate", "--half-tiles", str(tmp_path / "b.json"), "-o", str(tmp_path / "o.json")]) == 2
    assert "--amend PROFILE" in capsys.readouterr().err


@pytest.mark.parametrize("name", ["h200-megakernel-ep1", "h200-megakernel-power-ep1",
                                  "h200-megakernel-power-ep1-sustained"])
def test_shipped_ep1_profiles_carry_their_half_tile_fit(name):
    """The EP=1 profiles' half-tile cost was fitted (docs/results.md "Half tiles"): the value is the one recorded, the
    benchmark it was fitted to is in the repository and ran half tiles, and the fit beat MMAs only (0.5)."""
    from pathlib import Path

    raw = load_profile(name).raw
    fit = raw["calibration"]["half_tile_from"]
    assert raw["gemm"]["half_tile_cost"] == fit["half_tile_cost"] and 0.5 < fit["half_tile_cost"] <= 1.0
    assert fit["mean_abs_log_error"] < fit["mean_abs_log_error_at_0.5"]
    bench = json.loads((Path(__file__).resolve().parents[2] / fit["bench"]).read_text())
    assert {r["kernel_layout"] for r in bench["results"]} == {"expert-packed-half"}
    assert {r["tokens_per_gpu"] for r in bench["results"]} == {2048, 8192}  # 4096 held out


def _fp8_cost(raw: dict | None = None, **gemm) -> float:
    from weave_sim.profile import fp8_profile, table_profile

    raw = json.loads(json.dumps(raw or load_profile().raw))
    raw["gemm"].update(gemm)
    f8 = fp8_profile(profile_from_dict(raw))
    assert table_profile(f8).gemm_half_tile_cost == profile_from_dict(raw).gemm_half_tile_cost  # bf16's back
    return f8.gemm_half_tile_cost


def test_fp8_tiles_take_their_own_half_tile_cost():
    """gemm.fp8_half_tile_cost is what fp8_profile charges an FP8 half tile; without it FP8 takes the bf16 value;
    the bf16 profile (and the cost table, table_profile) keeps its own."""
    assert _fp8_cost() == 0.5
    assert _fp8_cost(half_tile_cost=0.9) == 0.9
    assert _fp8_cost(half_tile_cost=0.9, fp8_half_tile_cost=0.7) == 0.7
    assert profile_from_dict({**load_profile().raw, "gemm": {**load_profile().raw["gemm"], "half_tile_cost": 0.9,
                                                             "fp8_half_tile_cost": 0.7}}).gemm_half_tile_cost == 0.9


@pytest.mark.parametrize("bad", [0.0, 1.5, "0.7", True])
def test_a_bad_fp8_half_tile_cost_is_refused(bad):
    raw = json.loads(json.dumps(load_profile().raw))
    raw["gemm"]["fp8_half_tile_cost"] = bad
    with pytest.raises(ProfileError, match="fp8_half_tile_cost"):
        profile_from_dict(raw)


def test_amend_half_tile_on_fp8_results_fits_the_fp8_cost(tmp_path):
    """FP8 results (bench --expert-dtype fp8, which records the half-tile layout since 0f660e73) fit
    gemm.fp8_half_tile_cost and leave the bf16 one alone; a file with both kinds is refused."""
    raw = json.loads(json.dumps(load_profile().raw))
    raw["gemm"]["fp8_half_tile_cost"] = 0.8
    bench = simulated_bench_file(tmp_path / "b8.json", profile_from_dict(raw), 2048, 1024, tokens=1024,
                                 policies=("static:4", "static:24", "weave"), expert_dtype="fp8")
    assert {r["kernel_layout"] for r in json.loads(bench.read_text())["results"]} == {"expert-packed-half"}
    base = tmp_path / "base.json"
    base.write_text(json.dumps(load_profile().raw))
    prof = amend_half_tile(base, bench, tmp_path / "out.json", iters=6, log=lambda m: None)
    fit = prof["calibration"]["fp8_half_tile_from"]
    assert prof["gemm"]["fp8_half_tile_cost"] == fit["fp8_half_tile_cost"] and prof["version"].endswith("+half8")
    assert fit["mean_abs_log_error"] <= min(fit["mean_abs_log_error_at_0.5"], fit["mean_abs_log_error_before"])
    assert {k: v for k, v in prof["gemm"].items() if k != "fp8_half_tile_cost"} == load_profile().raw["gemm"]
    b16 = simulated_bench_file(tmp_path / "b16.json", load_profile(), 2048, 1024, tokens=1024, policies=("weave",))
    both = json.loads(bench.read_text())
    both["results"] += json.loads(b16.read_text())["results"]
    (tmp_path / "both.json").write_text(json.dumps(both))
    with pytest.raises(CalibrationError, match="both bf16 and FP8"):
        amend_half_tile(base, tmp_path / "both.json", tmp_path / "no.json", log=lambda m: None)


@pytest.mark.parametrize("name", ["h200-megakernel-ep1", "h200-megakernel-power-ep1",
                                  "h200-megakernel-power-ep1-sustained"])
def test_shipped_ep1_profiles_carry_their_fp8_half_tile_fit(name):
    """The EP=1 profiles' FP8 half-tile cost was fitted to FP8 runs of the kernel with FP8 half tiles (docs/results.md
    "Half tiles in FP8"), 4096 tokens held out; the fit beat both MMAs only and the bf16 value it started from."""
    from pathlib import Path

    raw = load_profile(name).raw
    fit = raw["calibration"]["fp8_half_tile_from"]
    assert raw["gemm"]["fp8_half_tile_cost"] == fit["fp8_half_tile_cost"] and 0.5 < fit["fp8_half_tile_cost"] <= 1.0
    assert fit["previous"] == raw["gemm"]["half_tile_cost"]
    assert fit["mean_abs_log_error"] < min(fit["mean_abs_log_error_at_0.5"], fit["mean_abs_log_error_before"])
    bench = json.loads((Path(__file__).resolve().parents[2] / fit["bench"]).read_text())
    assert {(r["kernel_layout"], r["expert_dtype"]) for r in bench["results"]} == {("expert-packed-half", "fp8")}
    assert {r["tokens_per_gpu"] for r in bench["results"]} == {2048, 8192}  # 4096 held out

"""FP8 tiles in a profile: the fixed cost's own factor (profile.fp8_profile) and its fit to bf16 / FP8 benchmark
pairs (weave_sim.calibrate.fp8, weave-sim calibrate --amend P --fp8 ...)."""
from __future__ import annotations

import json

import pytest

from weave_sim.cli import main
from weave_sim.engine.testing import simulated_bench_file
from weave_sim.calibrate.fp8 import fit_fp8_scale, parse_pairs
from weave_sim.profile import fp8_profile, load_profile, profile_from_dict, table_profile

BASE = "h200-megakernel-power-ep1"  # has gemm.k_fixed (a tile's fixed cost) and a power model


def _bare():
    """BASE without the FP8 factors it ships with (what the fit starts from in these tests)."""
    return _with(load_profile(BASE), fp8_scale=None, fp8_fixed_scale=None)


def _with(profile, **gemm):
    raw = json.loads(json.dumps(profile.raw))
    raw["gemm"].update(gemm)
    for key in ("fp8_scale", "fp8_fixed_scale"):
        if key in gemm and gemm[key] is None:
            raw["gemm"].pop(key)
    return profile_from_dict(raw, origin="test")


def test_the_fixed_cost_of_an_fp8_tile_gets_its_own_factor():
    """Tile time at reduction length K is FLOPs / rate x k_factor(K). With the rate x s and the fixed part x sf, the
    part that grows with K runs s times faster and the fixed part sf times: t8 = t16 (share k / K / sf + (1 - share) /
    s) / (share k / K + 1 - share)."""
    base = _bare()
    share, k_cal = base.gemm_k_fixed_share, base.gemm_k_cal
    assert 0 < share < 1
    for s, sf in ((2.0, 1.0), (1.4, 0.8), (1.3, 1.3)):
        p8 = fp8_profile(base, s, sf)
        for k in (512, 2048, 7168):
            rows = 1024
            t16 = base.k_factor(k) / base.per_sm_tflops(rows)
            t8 = p8.k_factor(k) / p8.per_sm_tflops(rows)
            want = t16 * (share * k_cal / k / sf + (1 - share) / s) / (share * k_cal / k + 1 - share)
            assert t8 == pytest.approx(want, rel=1e-9)
    # the default fixed factor is the tile's (the model before fp8_fixed_scale), or the profile's own
    assert fp8_profile(base, 1.5).k_factor(768) == pytest.approx(base.k_factor(768))
    own = _with(base, fp8_scale=1.5, fp8_fixed_scale=1.0)
    assert fp8_profile(own).k_factor(768) == pytest.approx(fp8_profile(base, 1.5, 1.0).k_factor(768))
    # table_profile undoes all of it, k_fixed included
    assert json.dumps(table_profile(fp8_profile(base, 1.7, 0.9)).raw, sort_keys=True) == \
        json.dumps(base.raw, sort_keys=True)
    with pytest.raises(ValueError, match="must be > 0"):
        fp8_profile(base, 1.5, 0.0)


def test_the_fit_finds_the_factor_a_simulated_pair_was_made_with(tmp_path):
    """bf16 and FP8 benchmark files simulated with FP8 tiles x1.6 (their fixed cost x1): fitted on the profile
    without those factors, the fit recovers 1.6 and its gains match (the previous default, x1.25, does not)."""
    base = _bare()
    truth = _with(base, fp8_scale=1.6, fp8_fixed_scale=1.0)
    pairs = []
    for tokens, (h, i) in ((1024, (2048, 768)), (2048, (4096, 1536))):
        kw = dict(tokens=tokens, policies=("static:8", "static:24"))
        bf = simulated_bench_file(tmp_path / f"bf16_{tokens}.json", truth, h, i, **kw)
        f8 = simulated_bench_file(tmp_path / f"fp8_{tokens}.json", truth, h, i, expert_dtype="fp8", **kw)
        pairs.append((bf, f8))
    fit = fit_fp8_scale(pairs, base, fixed_scale=1.0)
    assert fit["scale"] == pytest.approx(1.6, abs=0.01)
    assert fit["points"] == 4 and fit["worst_abs_gain_error"] < 0.005 and fit["fixed_scale"] == 1.0
    assert fit["previous"]["scale"] == 1.25 and fit["previous"]["median_gain_error"] < -0.05
    # through the CLI, into a profile that then predicts the FP8 files as they were made
    out, bare = tmp_path / "fitted.json", tmp_path / "bare.json"
    bare.write_text(json.dumps(base.raw))
    spec = [f"{b}:{f}" for b, f in pairs]
    assert main(["calibrate", "--amend", str(bare), "--fp8", *spec, "-o", str(out)]) == 0
    prof = json.loads(out.read_text())
    assert prof["gemm"]["fp8_scale"] == pytest.approx(1.6, abs=0.01) and prof["gemm"]["fp8_fixed_scale"] == 1.0
    assert prof["version"].endswith("+fp8") and prof["calibration"]["fp8_from"]["pairs"][0][1].endswith("fp8_1024.json")


def test_fp8_fit_refuses_what_it_cannot_fit(tmp_path, capsys):
    base = _bare()
    bf = simulated_bench_file(tmp_path / "bf16.json", base, 2048, 768, policies=("static:8",))
    f8 = simulated_bench_file(tmp_path / "fp8.json", base, 2048, 768, policies=("static:8",), expert_dtype="fp8")
    other = simulated_bench_file(tmp_path / "other.json", base, 2048, 768, tokens=512, policies=("static:8",),
                                 expert_dtype="fp8")
    with pytest.raises(ValueError, match="BF16_BENCH.json:FP8_BENCH.json"):
        parse_pairs(["only_one.json"])
    with pytest.raises(ValueError, match="expected FP8 experts"):
        fit_fp8_scale([(bf, bf)], base)
    with pytest.raises(ValueError, match="expected bf16 experts"):
        fit_fp8_scale([(f8, f8)], base)
    with pytest.raises(ValueError, match="share no"):
        fit_fp8_scale([(bf, other)], base)
    with pytest.raises(ValueError, match="fixed-cost factor must be > 0"):
        fit_fp8_scale([(bf, f8)], base, fixed_scale=0.0)
    out = str(tmp_path / "p.json")
    assert main(["calibrate", "--fp8", f"{bf}:{f8}", "-o", out]) == 2
    assert "--amend PROFILE" in capsys.readouterr().err
    assert main(["calibrate", "--amend", BASE, "--fp8", f"{bf}:{f8}", "--decision", str(bf), "-o", out]) == 2
    assert "either --decision" in capsys.readouterr().err


def test_a_profile_without_a_fixed_cost_gets_one_factor(tmp_path):
    """h200-megakernel-ep2 has no gemm.k_fixed: the fit writes gemm.fp8_scale only."""
    base = load_profile("h200-megakernel-ep2")
    assert not base.raw["gemm"].get("k_fixed")
    truth = _with(base, fp8_scale=1.45)
    kw = dict(policies=("static:8", "weave"))
    bf = simulated_bench_file(tmp_path / "bf16.json", truth, 2048, 768, **kw)
    f8 = simulated_bench_file(tmp_path / "fp8.json", truth, 2048, 768, expert_dtype="fp8", **kw)
    out = tmp_path / "fitted.json"
    assert main(["calibrate", "--amend", "h200-megakernel-ep2", "--fp8", f"{bf}:{f8}", "-o", str(out)]) == 0
    gemm = json.loads(out.read_text())["gemm"]
    assert gemm["fp8_scale"] == pytest.approx(1.45, abs=0.01) and "fp8_fixed_scale" not in gemm


def test_the_shipped_ep1_profiles_carry_fitted_fp8_factors():
    """The EP=1 profiles of this kernel were amended with calibrate --fp8 on the measured bf16 / FP8 pairs
    (docs/results/fp8_harness/fit_*.txt); their record names the pairs, which exist."""
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    for name in ("h200-megakernel-power-ep1", "h200-megakernel-power-ep1-pad", "h200-megakernel-ep1",
                 "h200-megakernel-power-ep1-sustained"):
        p = load_profile(name)
        fit = p.raw["calibration"]["fp8_from"]
        assert p.raw["gemm"]["fp8_scale"] == fit["scale"] and 1.0 < fit["scale"] < 2.0
        assert all((root / f).is_file() for pair in fit["pairs"] for f in pair)
        assert fit["worst_abs_gain_error"] <= 0.2
    # the sustained profile: its GEMM rate fitted to sustained bf16 timings, its FP8 factor to sustained pairs
    sus = load_profile("h200-megakernel-power-ep1-sustained").raw["calibration"]
    assert sus["timing"] == "sustained" and sus["fp8_from"]["timing"] == "sustained"
    assert (root / sus["fitted_to"]).is_file()


def _with_sustained(path, factor: float):
    """A simulated bench file given sustained_ms = latency_ms x factor and one sustained clock record per policy."""
    d = json.loads(path.read_text())
    for r in d["results"]:
        r["sustained_ms"] = {p: t * factor for p, t in r["latency_ms"].items()}
        r["sustained_gpu_state"] = {p: [[{"sm_mhz_median": 1500.0}], [{"sm_mhz_median": 1600.0}]]
                                    for p in r["latency_ms"]}
    path.write_text(json.dumps(d))
    return path


def test_sustained_timings_stand_in_for_the_bench_ones(tmp_path, capsys):
    """benchfile.timed_as('sustained'): each result's sustained_ms becomes its latency, the passes' median clock its
    gpu_state; weave-sim validate --timing sustained compares with those, and a file without them is refused.
    The FP8 fit on sustained timings sees the gain those give (here 4% more than the bench timings')."""
    from weave_sim.benchfile import read_bench, timed_as

    base = _bare()
    truth = _with(base, fp8_scale=1.6, fp8_fixed_scale=1.0)
    kw = dict(policies=("static:8", "static:24"))
    bf = _with_sustained(simulated_bench_file(tmp_path / "bf16.json", truth, 2048, 768, **kw), 1.04)
    f8 = _with_sustained(simulated_bench_file(tmp_path / "fp8.json", truth, 2048, 768, expert_dtype="fp8", **kw), 1.0)
    plain = json.loads(bf.read_text())
    sus = read_bench(bf, "sustained")["results"][0]
    assert sus["latency_ms"] == plain["results"][0]["sustained_ms"] and sus["gpu_state"] == [{"sm_mhz_median": 1550.0}]
    assert timed_as(plain, "bench") is plain
    with pytest.raises(ValueError, match="timing must be one of"):
        timed_as(plain, "burst")
    bare = simulated_bench_file(tmp_path / "bare.json", truth, 2048, 768, **kw)
    with pytest.raises(ValueError, match="no sustained_ms"):
        read_bench(bare, "sustained")
    out = tmp_path / "v"
    assert main(["validate", str(bf), "--profile", BASE, "--timing", "sustained", "--out", str(out)]) == 0
    rows = json.loads((out / "validate.json").read_text())["configs"]
    assert rows[0]["measured_ms"]["static:8"] == pytest.approx(1.04 * plain["results"][0]["latency_ms"]["static:8"])
    bench_fit = fit_fp8_scale([(bf, f8)], base)
    sus_fit = fit_fp8_scale([(bf, f8)], base, timing="sustained")
    assert bench_fit["scale"] == pytest.approx(1.6, abs=0.01) and bench_fit["timing"] == "bench"
    assert sus_fit["scale"] > bench_fit["scale"] + 0.05 and sus_fit["timing"] == "sustained"
    capsys.readouterr()
    assert main(["calibrate", str(bf), "--timing", "sustained", "-o", str(tmp_path / "p.json")]) == 2
    assert "--timing applies to fits" in capsys.readouterr().err

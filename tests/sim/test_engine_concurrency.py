"""The GEMM rate's dependence on how many SMs compute at once (profile gemm.scale_by_ctas)."""
import copy

import numpy as np
import pytest

from weave_sim.calibrate import build_profile, gemm_concurrency_curve
from weave_sim.engine import simulate_layer
from weave_sim.engine.dag import C_GEMM
from weave_sim.placement import contiguous
from weave_sim.presets import ModelPreset
from weave_sim.profile import ProfileError, load_profile, profile_from_dict
from weave_sim.workload import layer_workload

BASE = load_profile("h200")


def with_scale(scale: dict | None, **top) -> "HardwareProfile":  # noqa: F821
    raw = copy.deepcopy(BASE.raw)
    raw.update(top)
    if scale is not None:
        raw["gemm"]["scale_by_ctas"] = scale
    return profile_from_dict(raw)


@pytest.fixture(scope="module")
def layer():
    model = ModelPreset("m", 2048, 768, 16, 4, 0, 1)
    ids = np.argsort(np.random.default_rng(1).random((2 * 1024, 16)), axis=1)[:, :4]
    return layer_workload(ids, model, contiguous(16, 2))


def test_profile_reads_and_interpolates_the_scale():
    p = with_scale({"16": 1.1, "132": 0.9})
    assert p.concurrency_scale(16) == pytest.approx(1.1) and p.concurrency_scale(132) == pytest.approx(0.9)
    assert p.concurrency_scale(74) == pytest.approx(1.0)
    assert p.concurrency_scale(1) == pytest.approx(1.1)  # clamped at the ends
    assert BASE.concurrency_scale(50) == 1.0 and BASE.gemm_scale is None
    assert p.tflops(132, 2048) == pytest.approx(min(132 * 0.9 * p.per_sm_tflops(2048), p.gemm_peak_tflops))
    with pytest.raises(ProfileError, match="scale_by_ctas"):
        with_scale({"16": 1.0, "132": 0.0})
    with pytest.raises(ProfileError, match="scale_by_ctas"):
        with_scale({"16": 1.0})


def _running_at(r, t, gemm):
    """Bounds on how many GEMM tasks of t's GPU ran when t started (itself included; same-instant order aside)."""
    same = gemm[r.graph.gpu[gemm] == r.graph.gpu[t]]
    s, e = r.start_ns[same], r.end_ns[same]
    lo = int(np.sum((s < r.start_ns[t]) & (e > r.start_ns[t]))) + 1
    hi = int(np.sum((s <= r.start_ns[t]) & (e >= r.start_ns[t])))
    return lo, hi


@pytest.mark.parametrize("policy", ["kernel:static:8", "kernel:weave:4", "kernel:sequential"])
def test_each_tile_takes_its_time_at_the_concurrency_it_started_with(layer, policy):
    p = with_scale({"1": 1.25, "64": 1.0, "132": 0.8})
    r = simulate_layer(layer, p, policy)
    g = r.graph
    gemm = np.flatnonzero(g.cls == C_GEMM)
    claims = p.fixed_ns["task_claim"] * g.tiles
    ns = np.arange(p.num_sms + 2)
    checked = 0
    for t in gemm:
        lo, hi = _running_at(r, t, gemm)
        cand = claims[t] + np.round(np.maximum(g.flop_ns[t] / p.concurrency_scale(np.maximum(ns, 1)),
                                               g.hbm_ns[t] * np.maximum(ns, 1) / p.num_sms))
        assert r.end_ns[t] - r.start_ns[t] in cand[lo:hi + 1], (t, lo, hi)
        checked += 1
    assert checked == gemm.size > 100


def test_scale_moves_the_latency_the_right_way(layer):
    base = simulate_layer(layer, with_scale(None), "kernel:static:8").latency_ns
    fast = simulate_layer(layer, with_scale({"1": 1.3, "132": 1.3}, hbm_gbs=1e9), "kernel:static:8").latency_ns
    slow = simulate_layer(layer, with_scale({"1": 0.7, "132": 0.7}, hbm_gbs=1e9), "kernel:static:8").latency_ns
    assert slow > base > fast
    # without a scale the engine is unchanged: GEMM tasks take their precomputed time
    r = simulate_layer(layer, with_scale(None), "kernel:static:8")
    gemm = np.flatnonzero(r.graph.cls == C_GEMM)
    dur = r.end_ns[gemm] - r.start_ns[gemm]
    assert np.array_equal(dur, r.graph.work_ns[gemm] + BASE.fixed_ns["task_claim"] * r.graph.tiles[gemm])


def test_calibration_curve_from_points():
    pts = []
    for rows in (256, 1024, 2048):
        for n, per_sm in ((16, 6.0), (64, 5.7), (132, 4.8)):
            pts.append({"ctas": n, "rows_per_expert": rows, "tflops": n * per_sm * (0.5 if rows == 256 else 1.0)})
    pts.append({"ctas": 96, "rows_per_expert": 2048, "tflops": 96 * 5.9})  # not monotone: made non-increasing
    c = gemm_concurrency_curve(pts)
    assert list(c) == ["16", "64", "96", "132"]
    vals = np.array(list(c.values()))
    assert np.all(np.diff(vals) <= 0)
    assert c["16"] == pytest.approx(np.mean([6.0 / 5.7, 6.0 / 5.8]), rel=1e-5)
    assert gemm_concurrency_curve([p for p in pts if p["ctas"] == 16]) is None


def test_build_profile_adds_the_curve_only_when_asked():
    import json
    from pathlib import Path

    m = json.loads((Path(__file__).resolve().parents[2] / "docs/results/ep2/calib_2xh200_ep2.json").read_text())
    plain = build_profile(m, base="h200")
    assert "scale_by_ctas" not in plain["gemm"]
    conc = profile_from_dict(build_profile(m, base="h200", concurrency=True))
    assert conc.gemm_scale is not None and np.all(np.diff(conc.gemm_scale) <= 0)
    assert conc.concurrency_scale(16) > 1.0 > conc.concurrency_scale(132)


def test_conc_exp_scales_the_curve_and_is_fitted(tmp_path):
    """scaled_profile raises gemm.scale_by_ctas to conc_exp; the fit finds the exponent a simulated benchmark was
    made with; without the curve the parameter is an error."""
    from weave_sim.calibrate import CalibrationError, fit_profile, scaled_profile
    from weave_sim.engine.testing import simulated_bench_file

    raw = with_scale({"16": 1.4, "132": 0.6}).raw
    half = scaled_profile(raw, 1.0, 1.0, raw["fixed_ns"]["count_exchange"] / 1e3, conc_exp=0.5)
    assert half["gemm"]["scale_by_ctas"]["16"] == pytest.approx(1.4 ** 0.5)
    with pytest.raises(CalibrationError, match="scale_by_ctas"):
        scaled_profile(BASE.raw, 1.0, 1.0, 10.0, conc_exp=0.5)
    simulated_bench_file(tmp_path / "b.json", profile_from_dict(half), 2048, 1024, tokens=2048,
                         policies=("static:4", "static:48", "sequential"))
    (tmp_path / "base.json").write_text(__import__("json").dumps(raw))
    prof = fit_profile(tmp_path / "b.json", base=str(tmp_path / "base.json"), rounds=1, iters=7,
                       log=lambda m: None, params=("conc_exp",))
    assert prof["calibration"]["params"]["conc_exp"] == pytest.approx(0.5, abs=0.1)
    assert prof["calibration"]["mean_abs_log_error"] < 0.01


def test_cli_adds_the_curve_when_calibrating_and_fitting(tmp_path, capsys):
    import json
    from pathlib import Path

    from weave_sim.cli import main
    from weave_sim.engine.testing import simulated_bench_file

    meas = Path(__file__).resolve().parents[2] / "docs/results/ep2/calib_2xh200_ep2.json"
    assert main(["calibrate", str(meas), "--gemm-concurrency", "-o", str(tmp_path / "c.json")]) == 0
    assert "scale_by_ctas" in json.loads((tmp_path / "c.json").read_text())["gemm"]
    assert main(["calibrate", str(meas), "--gemm-concurrency", str(meas), "-o", str(tmp_path / "x.json")]) == 2
    assert "only with --fit" in capsys.readouterr().err
    bench = simulated_bench_file(tmp_path / "b.json", BASE, 1024, 512)
    assert main(["calibrate", "--fit", str(bench), "--gemm-concurrency", "-o", str(tmp_path / "y.json")]) == 2
    assert "needs the measurements file" in capsys.readouterr().err
    from weave_sim.calibrate import fit_profile

    prof = fit_profile(bench, rounds=1, iters=1, log=lambda m: None, params=("gemm_scale", "conc_exp"),
                       concurrency_path=meas)
    assert prof["calibration"]["concurrency_from"] == str(meas) and "conc_exp" in prof["calibration"]["params"]
    assert set(prof["gemm"]["scale_by_ctas"]) == {"16", "32", "64", "96", "128", "132"}


def test_concurrency_and_power_model_together(layer):
    """With a power section the engine's clock loop runs over tiles timed by concurrency: it settles, and a board
    that cannot hold its clock is slower than one that can."""
    pw = {"cap_w": 700.0, "base_w": 100.0, "w_per_tflops": 1.0, "exponent": 2.0}
    scale = {"1": 1.1, "132": 0.9}
    cool = simulate_layer(layer, with_scale(scale, power=dict(pw)), "kernel:static:8")
    hot = simulate_layer(layer, with_scale(scale, power={**pw, "cap_w": 150.0}), "kernel:static:8")
    assert cool.gemm_clock is not None and hot.gemm_clock is not None
    assert float(min(hot.gemm_clock)) < float(min(cool.gemm_clock)) <= 1.0
    assert hot.latency_ns > cool.latency_ns

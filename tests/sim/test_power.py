"""The power model: the clock a power cap allows, its fit from sustained GEMM points, its place in profiles and in
the engine (a layer whose GEMM load exceeds the cap runs at a lower clock and takes longer; one below it does not
change)."""
import copy
import json

import numpy as np
import pytest

from weave_sim.calibrate import CalibrationError, build_profile, calibrate_file, fit_profile, power_model
from weave_sim.engine import simulate_layer
from weave_sim.engine.run import gemm_power_tflops, gemm_tflops
from weave_sim.engine.testing import ZERO_FIXED, random_layer, tiny_model, tiny_profile
from weave_sim.profile import PowerModel, ProfileError, profile_from_dict

TRUE = {"cap_w": 700.0, "base_w": 120.0, "w_per_tflops": 1.4, "exponent": 1.7}


def synthetic_points(model: PowerModel, rates_full=(100.0, 200.0, 380.0), rates_capped=(550.0, 800.0)):
    """Sustained points as the GPU would report them under `model`: rates at full clock (R1), the clock the cap
    allows, the rate achieved at that clock and the power drawn."""
    pts = []
    for r1 in rates_full + rates_capped:
        f = float(model.clock(r1, 1.0))
        pts.append({"ctas": int(r1 // 5), "tflops": r1 * f, "sm_mhz": 1980.0 * f,
                    "power_w": float(model.watts(r1 * f, f))})
    return pts


def test_clock_is_full_below_the_cap_and_holds_the_cap_above():
    m = PowerModel(**TRUE)
    assert m.clock(300.0, 1.0) == 1.0  # 120 + 1.4 * 300 = 540 W
    for r1 in (450.0, 700.0, 1000.0):
        f = float(m.clock(r1, 1.0))
        assert f < 1.0
        assert float(m.watts(r1 * f, f)) == pytest.approx(700.0, rel=1e-9)
        # the same answer from a run that was already at a lower clock (the engine's iteration)
        assert float(m.clock(r1 * 0.8, 0.8)) == pytest.approx(f)
    assert float(m.clock(1e9, 1.0)) == m.min_clock


def test_power_fit_recovers_the_model():
    pts = synthetic_points(PowerModel(**TRUE))
    got = power_model({"limit_w": 700.0, "points": pts})
    for k, v in TRUE.items():
        assert got[k] == pytest.approx(v, rel=2e-3), k
    assert got["clock_mhz"] == 1980.0 and "w_per_tbs" not in got
    # a sustained HBM copy at full clock gives the power per TB/s
    hbm = {"tbs": 4.0, "power_w": TRUE["base_w"] + 4.0 * 80.0, "sm_mhz": 1980.0}
    got = power_model({"limit_w": 700.0, "points": pts, "hbm": hbm})
    assert got["w_per_tbs"] == pytest.approx(80.0, rel=2e-3)
    with pytest.raises(CalibrationError, match="throttled"):
        power_model({"limit_w": 700.0, "points": pts, "hbm": {**hbm, "sm_mhz": 1500.0}})
    with pytest.raises(CalibrationError, match="bad hbm point"):
        power_model({"limit_w": 700.0, "points": pts, "hbm": {"tbs": 0.0, "power_w": 300.0}})


def pad_point(model: PowerModel, r1: float, z: float, energy: float, ctas: int = 132) -> dict:
    """A sustained run at full-clock rate r1 whose rows are a fraction z padding of relative energy `energy`:
    the cap then holds a higher clock (the model's R weighs padding FLOPs by `energy`)."""
    share = 1.0 - z + z * energy
    f = float(model.clock(r1 * share, 1.0))
    return {"ctas": ctas, "pad_fraction": z, "tflops": r1 * f, "sm_mhz": 1980.0 * f,
            "power_w": float(model.watts(r1 * f * share, f))}


def test_padding_energy_is_read_off_zero_row_runs():
    m = PowerModel(**TRUE)
    pts = synthetic_points(m)
    top = pts[-1]  # 800 TFLOP/s at full clock, capped
    r1 = 800.0
    for energy in (0.0, 0.35, 0.8):
        pads = [pad_point(m, r1, z, energy, ctas=top["ctas"]) for z in (0.5, 1.0)]
        got = power_model({"limit_w": 700.0, "points": pts, "pad_points": pads})
        assert got["pad_energy"] == pytest.approx(energy, abs=5e-3)
        assert len(got["pad_energy_points"]) == 2
        # and the profile takes it
        prof = profile_from_dict({**_raw_with_power(None), "power": got})
        assert prof.power.pad_energy == pytest.approx(got["pad_energy"])
    # no padding points: no pad_energy (the profile's default 1 then holds)
    assert "pad_energy" not in power_model({"limit_w": 700.0, "points": pts})
    # a zero-row run drawing more per FLOP than random rows is clipped to 1 (the raw value kept)
    hot = pad_point(m, r1, 1.0, 1.3, ctas=top["ctas"])
    got = power_model({"limit_w": 700.0, "points": pts, "pad_points": [hot]})
    assert got["pad_energy"] == 1.0 and got["pad_energy_points"][0] == pytest.approx(1.3, abs=5e-3)


def test_padding_energy_refuses_what_it_cannot_read():
    m = PowerModel(**TRUE)
    pts = synthetic_points(m)
    good = pad_point(m, 800.0, 1.0, 0.5, ctas=pts[-1]["ctas"])
    with pytest.raises(CalibrationError, match="no point without padding at 7 CTAs"):
        power_model({"limit_w": 700.0, "points": pts, "pad_points": [{**good, "ctas": 7}]})
    with pytest.raises(CalibrationError, match="outside"):
        power_model({"limit_w": 700.0, "points": pts, "pad_points": [{**good, "pad_fraction": 1.5}]})
    with pytest.raises(CalibrationError, match="pad point without"):
        power_model({"limit_w": 700.0, "points": pts, "pad_points": [{**good, "power_w": None}]})
    with pytest.raises(CalibrationError, match="no more than base_w"):
        power_model({"limit_w": 700.0, "points": pts, "pad_points": [{**good, "power_w": 100.0}]})


def test_clock_with_hbm_traffic_holds_the_cap():
    m = PowerModel(**TRUE, w_per_tbs=80.0)
    assert m.clock(200.0, 1.0, 1.0) == 1.0  # 120 + 280 + 80 = 480 W
    f = float(m.clock(450.0, 1.0, 3.0))  # 120 + 630 + 240 at full clock
    assert f < float(PowerModel(**TRUE).clock(450.0, 1.0))  # HBM power leaves less for the SMs
    assert float(m.watts(450.0 * f, f, 3.0 * f)) == pytest.approx(700.0, rel=1e-6)
    # vectorised over GPUs
    both = m.clock(np.array([200.0, 450.0]), np.ones(2), np.array([1.0, 3.0]))
    assert both[0] == 1.0 and both[1] == pytest.approx(f)


def test_power_fit_refuses_what_it_cannot_fit():
    pts = synthetic_points(PowerModel(**TRUE))
    with pytest.raises(CalibrationError, match="clock fell"):
        power_model({"limit_w": 700.0, "points": pts[:3]})  # the cap never held
    with pytest.raises(CalibrationError, match="two different rates"):
        power_model({"limit_w": 700.0, "points": pts[2:]})
    with pytest.raises(CalibrationError, match="no points"):
        power_model({"limit_w": 700.0, "points": [{"ctas": 1}]})


def _raw_with_power(power: dict | None, num_sms: int = 16, per_sm_tflops: float = 4.0) -> dict:
    raw = copy.deepcopy(tiny_profile(num_sms, fixed_ns=ZERO_FIXED, per_sm_tflops=per_sm_tflops).raw)
    if power is not None:
        raw["power"] = power
    return raw


def test_profile_checks_the_power_section():
    assert profile_from_dict(_raw_with_power(None)).power is None
    assert profile_from_dict(_raw_with_power(TRUE)).power == PowerModel(**TRUE)
    with pytest.raises(ProfileError, match="power needs"):
        profile_from_dict(_raw_with_power({"cap_w": 700.0}))
    with pytest.raises(ProfileError, match="cap_w must exceed"):
        profile_from_dict(_raw_with_power({**TRUE, "base_w": 800.0}))
    with pytest.raises(ProfileError, match="w_per_tbs"):
        profile_from_dict(_raw_with_power({**TRUE, "w_per_tbs": -1.0}))
    assert profile_from_dict(_raw_with_power({**TRUE, "w_per_tbs": 80.0})).power.w_per_tbs == 80.0


def test_engine_lowers_the_clock_only_above_the_cap():
    w = random_layer(2, 256, tiny_model(hidden=512, ffn=512, experts=8, top_k=2), seed=3)
    plain = profile_from_dict(_raw_with_power(None))
    r0 = simulate_layer(w, plain, "static:4")
    assert r0.gemm_clock is None
    tf = float(gemm_tflops(r0).max())
    light = profile_from_dict(_raw_with_power({"cap_w": 700.0, "base_w": 100.0, "w_per_tflops": 0.5 * 600.0 / tf,
                                               "exponent": 1.5}))
    r1 = simulate_layer(w, light, "static:4")
    assert np.all(r1.gemm_clock == 1.0) and r1.latency_ns == r0.latency_ns
    heavy_pw = {"cap_w": 700.0, "base_w": 100.0, "w_per_tflops": 3.0 * 600.0 / tf, "exponent": 1.5}
    r2 = simulate_layer(w, profile_from_dict(_raw_with_power(heavy_pw)), "static:4")
    assert np.all(r2.gemm_clock < 0.95) and r2.latency_ns > r0.latency_ns
    # the clock it settled at is (nearly) the one its own load allows
    again = PowerModel(**heavy_pw).clock(gemm_tflops(r2), r2.gemm_clock)
    assert np.allclose(again, r2.gemm_clock, atol=0.01)
    assert r2.to_dict()["gemm_clock"] == [round(float(c), 4) for c in r2.gemm_clock]


def test_padding_energy_is_parsed_and_weights_only_padding_flops():
    """power.pad_energy (default 1: the shipped profiles) weights the MMAs on padding rows in the power the engine
    charges; 0 frees them, so a padded decode-sized layer above the cap runs at a clock >= and in a time <= the
    default's, and exactly as the default's where nothing is padded."""
    assert profile_from_dict(_raw_with_power(TRUE)).power.pad_energy == 1.0
    assert profile_from_dict(_raw_with_power({**TRUE, "pad_energy": 0.25})).power.pad_energy == 0.25
    for bad in (-0.1, 1.5):
        with pytest.raises(ProfileError, match="pad_energy"):
            profile_from_dict(_raw_with_power({**TRUE, "pad_energy": bad}))
    w = random_layer(1, 64, tiny_model(hidden=512, ffn=512, experts=16, top_k=2), seed=5)  # ~8 rows per expert
    plain = simulate_layer(w, profile_from_dict(_raw_with_power(None)), "kernel:static:4", expert_pad_rows=128)
    pad = np.bincount(plain.graph.gpu, weights=plain.graph.pad_flops, minlength=1)
    assert 0 < pad[0] < plain.graph.flops.sum()  # most of these MMAs are padding
    assert np.allclose(gemm_power_tflops(plain, 1.0), gemm_tflops(plain))
    assert np.allclose(gemm_power_tflops(plain, 0.0), gemm_tflops(plain) - pad / plain.latency_ns / 1e3)
    tf = float(gemm_tflops(plain).max())
    heavy = {"cap_w": 700.0, "base_w": 100.0, "w_per_tflops": 3.0 * 600.0 / tf, "exponent": 1.5}
    full = simulate_layer(w, profile_from_dict(_raw_with_power(heavy)), "kernel:static:4", expert_pad_rows=128)
    free = simulate_layer(w, profile_from_dict(_raw_with_power({**heavy, "pad_energy": 0.0})), "kernel:static:4",
                          expert_pad_rows=128)
    assert np.all(free.gemm_clock > full.gemm_clock) and free.latency_ns < full.latency_ns
    unpadded = [simulate_layer(w, profile_from_dict(_raw_with_power({**heavy, "pad_energy": e})), "static:4")
                for e in (1.0, 0.0)]
    assert unpadded[0].latency_ns == unpadded[1].latency_ns


def test_calibrate_takes_the_power_block_from_another_file(tmp_path):
    meas = json.loads(json.dumps({
        "gpu_name": "NVIDIA H200", "date": "2026-12-01", "num_sms": 132,
        "nvlink_push": [{"ctas": 1, "peers": 1, "gbs": 20.0}, {"ctas": 16, "peers": 1, "gbs": 300.0}],
        "gemm": [{"ctas": 132, "rows_per_expert": 128, "tflops": 400.0},
                 {"ctas": 132, "rows_per_expert": 2048, "tflops": 700.0}]}))
    main = tmp_path / "m.json"
    main.write_text(json.dumps(meas))
    assert "power" not in build_profile(meas)
    side = tmp_path / "p.json"
    side.write_text(json.dumps({"gpu_name": "NVIDIA H200", "date": "2026-12-01",
                                "power": {"limit_w": 700.0, "points": synthetic_points(PowerModel(**TRUE))}}))
    prof = calibrate_file(main, tmp_path / "out.json", power_path=side)
    assert prof["power"]["cap_w"] == 700.0 and "power (from" in prof["source"]
    assert profile_from_dict(prof).power is not None
    with pytest.raises(CalibrationError, match="no power block"):
        calibrate_file(main, tmp_path / "out2.json", power_path=main)


def test_fit_rejects_unknown_parameters(tmp_path):
    with pytest.raises(CalibrationError, match="fit parameters"):
        fit_profile(tmp_path / "none.json", params=("gemm_scale", "colour"))


def test_fit_adds_the_power_block_to_its_base(tmp_path):
    from weave_sim.engine.testing import simulated_bench_file

    bench = simulated_bench_file(tmp_path / "bench.json", profile_from_dict(_raw_with_power(None, num_sms=132)),
                                 1024, 512)
    side = tmp_path / "p.json"
    side.write_text(json.dumps({"power": {"limit_w": 700.0, "points": synthetic_points(PowerModel(**TRUE))}}))
    prof = fit_profile(bench, rounds=1, iters=2, log=lambda m: None, power_path=side)
    assert prof["power"]["cap_w"] == 700.0 and prof["calibration"]["power_from"] == str(side)
    assert "power model" in prof["source"] and profile_from_dict(prof).power is not None
    with pytest.raises(CalibrationError, match="no power block"):
        fit_profile(bench, rounds=1, iters=2, log=lambda m: None, power_path=bench)


def _with_sustained_clocks(path, profile):
    """A simulated benchmark file made a sustained one: each result's latencies also as sustained_ms, and each
    policy's SM clock as `profile` predicts it as its sustained_gpu_state (one pass, one rank per GPU)."""
    from weave_sim.validate import validate_result

    data = json.loads(path.read_text())
    for r in data["results"]:
        v = validate_result(r, profile)
        r["sustained_ms"] = dict(r["latency_ms"])
        r["sustained_gpu_state"] = {p: [[{"sm_mhz_median": m} for m in mhz]] for p, mhz in v.predicted_mhz.items()}
    path.write_text(json.dumps(data))
    return path


def test_power_scale_scales_the_energy_per_flop_and_is_fitted_to_the_clocks(tmp_path):
    """scaled_profile's power_scale multiplies the power model's W per TFLOP/s (nothing else); without a power model
    it is an error; the fit finds the factor a simulated power-capped benchmark was made with from the policies'
    measured SM clocks (sustained runs), then the other parameters from the latencies."""
    from weave_sim.calibrate import scaled_profile
    from weave_sim.engine.testing import simulated_bench_file
    from weave_sim.benchfile import policy_clocks

    # the layer's GEMMs run at a few hundred TFLOP/s: 3 W per TFLOP/s puts it at the cap, twice that far above
    raw = _raw_with_power({"cap_w": 700.0, "base_w": 100.0, "w_per_tflops": 3.0, "exponent": 1.5}, num_sms=132)
    fixed_us = raw["fixed_ns"]["count_exchange"] / 1e3
    double = scaled_profile(raw, 1.0, 1.0, fixed_us, power_scale=2.0)
    assert double["power"]["w_per_tflops"] == pytest.approx(2.0 * raw["power"]["w_per_tflops"])
    assert {k: v for k, v in double["power"].items() if k != "w_per_tflops"} == \
        {k: v for k, v in raw["power"].items() if k != "w_per_tflops"}
    assert scaled_profile(raw, 1.0, 1.0, fixed_us)["power"] == raw["power"]
    with pytest.raises(CalibrationError, match="power model"):
        scaled_profile(_raw_with_power(None), 1.0, 1.0, 10.0, power_scale=2.0)
    truth = profile_from_dict(scaled_profile(double, 0.8, 1.0, fixed_us))  # a slower GEMM as well
    bench = simulated_bench_file(tmp_path / "b.json", truth, 1024, 512, tokens=2048,
                                 policies=("static:4", "static:48", "sequential"))
    # without measured clocks there is nothing to fit power_scale to
    (tmp_path / "base.json").write_text(json.dumps(raw))
    with pytest.raises(CalibrationError, match="no measured SM clocks"):
        fit_profile(bench, base=str(tmp_path / "base.json"), rounds=1, iters=1, log=lambda m: None,
                    params=("power_scale",))
    _with_sustained_clocks(bench, truth)
    r0 = json.loads(bench.read_text())["results"][0]
    assert set(policy_clocks(r0)) == {"static:4", "static:48", "sequential"}
    assert all(m < 1980.0 for per in policy_clocks(r0).values() for m in per)  # at the cap
    prof = fit_profile(bench, base=str(tmp_path / "base.json"), rounds=3, iters=10, log=lambda m: None,
                       params=("power_scale", "gemm_scale"), timing="sustained")
    cal = prof["calibration"]
    assert cal["params"]["power_scale"] == pytest.approx(2.0, rel=0.05)
    assert cal["params"]["gemm_scale"] == pytest.approx(0.8, rel=0.05)
    assert cal["power_scale_from_clocks"]["mean_abs_log_error"] < 0.01 < cal["power_scale_from_clocks"][
        "mean_abs_log_error_before"]
    assert cal["mean_abs_log_error"] < 0.01 and "fitted to 6 measured SM clocks" in prof["source"]  # 3 policies x 2 GPUs
    (tmp_path / "nopower.json").write_text(json.dumps(_raw_with_power(None, num_sms=132)))
    with pytest.raises(CalibrationError, match="power_scale needs a power model"):
        fit_profile(bench, base=str(tmp_path / "nopower.json"), rounds=1, iters=1, log=lambda m: None,
                    params=("power_scale",), timing="sustained")


def test_shipped_sustained_profile_is_its_base_with_its_recorded_fit():
    """h200-megakernel-power-ep1-sustained is its base profile, plus the concurrency curve of the calibration it names,
    with the fit's recorded parameters applied (scaled_profile): the GEMM rates, the concurrency factor and the power
    model's W per TFLOP/s, whose factor was fitted to measured clocks (docs/calibration.md "A layer's energy per
    FLOP" has the commands). A refit of the base needs a refit of this profile."""
    from pathlib import Path

    from weave_sim.calibrate import gemm_concurrency_curve, read_measurements, scaled_profile
    from weave_sim.profile import load_profile

    root = Path(__file__).resolve().parents[2]
    prof = load_profile("h200-megakernel-power-ep1-sustained").raw
    cal = prof["calibration"]
    assert cal["timing"] == "sustained" and set(cal["fitted"]) == {"power_scale", "gemm_scale", "conc_exp"}
    assert cal["power_scale_from_clocks"]["mean_abs_log_error"] < cal["power_scale_from_clocks"][
        "mean_abs_log_error_before"]
    assert (root / cal["fitted_to"]).is_file() and (root / cal["concurrency_from"]).is_file()
    base = json.loads(json.dumps(load_profile(cal["base"]).raw))
    base["gemm"]["scale_by_ctas"] = gemm_concurrency_curve(read_measurements(root / cal["concurrency_from"])["gemm"])
    expect = scaled_profile(base, **cal["params"])
    assert prof["power"]["w_per_tflops"] == pytest.approx(expect["power"]["w_per_tflops"], rel=1e-9)
    assert prof["power"]["w_per_tflops"] == pytest.approx(
        base["power"]["w_per_tflops"] * cal["params"]["power_scale"], rel=1e-9)
    assert prof["gemm"]["scale_by_ctas"] == pytest.approx(expect["gemm"]["scale_by_ctas"], rel=1e-9)
    assert prof["gemm"]["per_sm_tflops_by_rows"] == pytest.approx(expect["gemm"]["per_sm_tflops_by_rows"], rel=1e-9)


def test_shipped_power_profile_matches_its_measurements():
    """h200-megakernel-power's power section is what weave-sim calibrate makes of the committed measurements it
    names; the rest is the fit recorded in it (docs/results.md gives the command)."""
    from pathlib import Path

    from weave_sim.profile import load_profile

    root = Path(__file__).resolve().parents[2]
    prof = load_profile("h200-megakernel-power")
    raw = prof.raw
    src = root / raw["calibration"]["power_from"]
    expect = power_model(json.loads(src.read_text())["power"])
    assert {k: raw["power"][k] for k in expect} == expect
    assert prof.power == PowerModel(cap_w=expect["cap_w"], base_w=expect["base_w"],
                                    w_per_tflops=expect["w_per_tflops"], exponent=expect["exponent"])
    assert raw["calibration"]["base"] == "h200-calibrated"
    assert set(raw["calibration"]["params"]) == {"gemm_scale", "push_scale", "fixed_us", "barrier_us"}


def test_power_can_be_left_out_whole_or_its_hbm_term(tmp_path):
    """calibrate --no-power makes a fixed-clock profile (the kernel's cost table has no power term), --no-hbm-power
    keeps the model without its board-dependent W per TB/s; both for measurements and for fits."""
    from weave_sim.engine.testing import simulated_bench_file

    meas = {"gpu_name": "NVIDIA H200", "date": "2026-12-01", "num_sms": 132,
            "nvlink_push": [{"ctas": 1, "peers": 1, "gbs": 20.0}, {"ctas": 16, "peers": 1, "gbs": 300.0}],
            "gemm": [{"ctas": 132, "rows_per_expert": 128, "tflops": 400.0},
                     {"ctas": 132, "rows_per_expert": 2048, "tflops": 700.0}],
            "power": {"limit_w": 700.0, "points": synthetic_points(PowerModel(**TRUE)),
                      "hbm": {"tbs": 4.0, "power_w": TRUE["base_w"] + 4.0 * 80.0, "sm_mhz": 1980.0}}}
    path = tmp_path / "m.json"
    path.write_text(json.dumps(meas))
    full = calibrate_file(path, tmp_path / "a.json")
    assert full["power"]["w_per_tbs"] == pytest.approx(80.0, rel=2e-3)
    no_hbm = calibrate_file(path, tmp_path / "b.json", hbm_power=False)
    assert "w_per_tbs" not in no_hbm["power"] and no_hbm["power"]["cap_w"] == 700.0
    fixed = calibrate_file(path, tmp_path / "c.json", power=False)
    assert "power" not in fixed and profile_from_dict(fixed).power is None
    with pytest.raises(CalibrationError, match="contradict"):
        calibrate_file(path, tmp_path / "d.json", power=False, power_path=path)
    base = tmp_path / "a.json"
    bench = simulated_bench_file(tmp_path / "bench.json", profile_from_dict(_raw_with_power(None, num_sms=132)),
                                 1024, 512)
    fit = fit_profile(bench, base=str(base), rounds=1, iters=2, log=lambda m: None, power=False)
    assert "power" not in fit
    assert "power model" not in fit["source"]
    fit = fit_profile(bench, base=str(base), rounds=1, iters=2, log=lambda m: None, hbm_power=False)
    assert "w_per_tbs" not in fit["power"] and fit["power"]["cap_w"] == 700.0


def test_shipped_pad_profile_takes_the_measured_padding_energy():
    """h200-megakernel-power-ep1-pad charges padding rows the energy the calibration's zero-row runs measured
    (the file it names), rounded to two decimals; its other power parameters are h200-megakernel-power's."""
    from pathlib import Path

    from weave_sim.profile import load_profile

    root = Path(__file__).resolve().parents[2]
    prof = load_profile("h200-megakernel-power-ep1-pad")
    src = root / prof.raw["calibration"]["pad_energy_from"]
    measured = power_model(json.loads(src.read_text())["power"])
    assert len(measured["pad_energy_points"]) == 2 and 0.0 < measured["pad_energy"] < 1.0
    assert prof.power.pad_energy == round(measured["pad_energy"], 2)
    base = load_profile("h200-megakernel-power").power
    assert (prof.power.base_w, prof.power.w_per_tflops, prof.power.exponent) == (base.base_w, base.w_per_tflops,
                                                                                  base.exponent)

import json

import numpy as np
import pytest

from weave_sim.cli import main
from weave_sim.engine import simulate_layer
from weave_sim.placement import contiguous
from weave_sim.presets import ModelPreset
from weave_sim.profile import load_profile
from weave_sim.validate import KERNEL_DECIDERS, KERNEL_LAYOUT, KERNEL_OPTIONS, sim_policy, validate_file
from weave_sim.workload import layer_workload, pairs_dispatched

PROFILE = load_profile()


def bench_file(tmp_path, factors):
    """A kernel-benchmark-shaped file whose 'measured' times are the simulator's times scaled by factors."""
    model = ModelPreset("m", 1024, 512, 8, 2, 0, 1)
    rng = np.random.default_rng(3)
    ids = np.argsort(rng.random((2 * 512, 8)), axis=1)[:, :2]
    w = pairs_dispatched(layer_workload(ids, model, contiguous(8, 2)))  # the kernel's counts are pair-based
    lat = {"reference": 9.0}
    for pol, f in factors.items():
        lat[pol] = simulate_layer(w, PROFILE, sim_policy(pol), **KERNEL_OPTIONS).latency_ns / 1e6 * f
    res = {"kernel_layout": KERNEL_LAYOUT, "kernel_deciders": KERNEL_DECIDERS, "model": "m", "tokens_per_gpu": 512, "gpus": 2, "experts": 8, "top_k": 2, "hidden": 1024, "inter": 512,
           "latency_ms": lat, "counts": {"source_expert_pairs": w.pair_counts.sum(axis=1).tolist(),
                                         "dispatch_rows": w.dispatch_rows.tolist(),
                                         "tokens_per_gpu": w.tokens_per_gpu.tolist()}}
    path = tmp_path / "bench.json"
    path.write_text(json.dumps({"results": [res]}))
    return path


def test_errors_regret_and_gain(tmp_path):
    # measured static:8 is 10% slower than predicted, static:32 exact, weave 25% slower
    path = bench_file(tmp_path, {"static:8": 1.1, "static:32": 1.0, "weave": 1.25})
    (row,) = validate_file(path, PROFILE)
    err = row.errors()
    assert err["static:8"] == pytest.approx(1 / 1.1 - 1) and err["static:32"] == pytest.approx(0, abs=1e-12)
    pred = row.predicted_ms
    sim_pick = min(("static:8", "static:32"), key=pred.get)
    best = min(row.measured_ms["static:8"], row.measured_ms["static:32"])
    assert row.regret_static == pytest.approx(row.measured_ms[sim_pick] / best - 1)
    assert row.gain_measured == pytest.approx(best / row.measured_ms["weave"])


def test_cli_validate(tmp_path, capsys):
    path = bench_file(tmp_path, {"static:16": 1.0, "weave": 1.0})
    assert main(["validate", str(path), "--out", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "median_abs_error 0.000" in out and "points_over_15pct 0" in out and "error by policy" in out
    assert json.loads((tmp_path / "validate.json").read_text())["summary"]["configs"] == 1


def test_errors_by_policy_and_points_over_the_limit(tmp_path, capsys):
    """Two configurations whose 'measured' times are the simulator's scaled: per policy the median / worst / signed
    error and the points over 15% follow from the factors (predicted / measured = 1 / factor)."""
    from weave_sim.validate import errors_by_policy, summarize

    a = json.loads(bench_file(tmp_path, {"static:8": 1.25, "weave": 0.9}).read_text())["results"][0]
    b = json.loads(bench_file(tmp_path, {"static:8": 1.1, "weave": 1.0}).read_text())["results"][0]
    path = tmp_path / "two.json"
    path.write_text(json.dumps({"results": [a, {**b, "tokens_per_gpu": 256}]}))
    rows = validate_file(path, PROFILE)
    by = errors_by_policy(rows)
    assert list(by) == ["static:8", "weave"] and by["static:8"]["points"] == 2
    assert by["static:8"]["worst_abs_error"] == pytest.approx(1 - 1 / 1.25)
    assert by["static:8"]["median_error"] == pytest.approx(np.median([1 / 1.25 - 1, 1 / 1.1 - 1]))
    assert by["static:8"]["points_over_15pct"] == 1 and by["weave"]["points_over_15pct"] == 0
    assert by["weave"]["median_error"] > 0  # measured faster than predicted: predicted slower
    s = summarize(rows)
    assert s["points"] == 4 and s["points_over_15pct"] == 1
    assert main(["validate", str(path), "--out", str(tmp_path)]) == 0
    saved = json.loads((tmp_path / "validate.json").read_text())
    assert saved["by_policy"]["static:8"]["points_over_15pct"] == 1


def test_missing_counts_is_clear(tmp_path, capsys):
    p = tmp_path / "b.json"
    p.write_text(json.dumps({"results": [{"model": "m", "tokens_per_gpu": 1, "gpus": 1, "experts": 1, "top_k": 1,
                                          "hidden": 64, "inter": 64, "latency_ms": {}}]}))
    assert main(["validate", str(p), "--out", str(tmp_path)]) == 2
    assert "counts" in capsys.readouterr().err


def test_recorded_kernel_split_is_simulated():
    r = {"weave_choice": {"kernel": [{"comm_ctas_used": 13}, {"comm_ctas_used": 9}]}}
    assert sim_policy("weave", r) == "kernel:weave@13,9"
    assert sim_policy("weave") == "kernel:weave" and sim_policy("static:8", r) == "kernel:static:8"
    assert sim_policy("weave-nosteal", r) == "kernel:weave-nosteal@13,9"
    assert sim_policy("weave", {"weave_choice": {"kernel": [{"comm_ctas_used": 13}, None]}}) == "kernel:weave"


def test_fitted_profile_ships_with_provenance():
    p = load_profile("h200-megakernel")
    assert "fitted" in p.source and p.raw["calibration"]["points"] > 0
    assert p.per_sm_tflops(1024) < load_profile("h200").per_sm_tflops(1024)


def test_timeline_stats_of_a_simulated_trace(tmp_path, capsys):
    from weave_sim.timeline_stats import busy_stats

    path = bench_file(tmp_path, {"static:16": 1.0, "weave": 1.0})
    assert main(["validate", str(path), "--traces", "--out", str(tmp_path)]) == 0
    (trace,) = (tmp_path / "traces").glob("sim_m_512_weave.json")
    stats = busy_stats(trace, num_sms=PROFILE.num_sms)
    assert set(stats) == {0, 1}
    for st in stats.values():
        assert 0 < st["busy_fraction"] <= 1 and st["work_us_by_kind"]["gemm0"] > 0
        assert st["work_us_by_role"]["compute"] > 0
    assert main(["timeline-stats", str(trace)]) == 0
    assert "gemm1" in capsys.readouterr().out


def test_timeline_stats_window_from_a_kind(tmp_path, capsys):
    from weave_sim.timeline_stats import busy_stats

    def ev(pid, tid, name, ts, dur):
        return {"ph": "X", "pid": pid, "tid": tid, "name": name, "cat": "compute", "ts": ts, "dur": dur}

    # GPU 0 waits 100 us for its peer's counts, then both SMs work 50 us; GPU 1 has no count_exchange
    trace = {"traceEvents": [ev(0, 0, "count_exchange", 0, 10), ev(0, 0, "wait", 10, 100),
                             ev(0, 0, "count_exchange", 110, 10), ev(0, 0, "gemm0", 120, 40),
                             ev(0, 1, "count_exchange", 0, 10), ev(0, 1, "wait", 10, 105),
                             ev(0, 1, "count_exchange", 115, 5), ev(0, 1, "gemm0", 120, 40),
                             ev(1, 0, "gemm0", 0, 30)]}
    full, win = busy_stats(trace), busy_stats(trace, start_kind="count_exchange")
    assert full[0]["span_us"] == 160 and win[0]["span_us"] == 50
    assert win[0]["busy_fraction"] == pytest.approx((10 + 40 + 5 + 40) / (50 * 2))
    assert win[0]["work_us_by_kind"]["wait"] == pytest.approx(5)  # SM 1's wait past t0 = 110 is clipped, not dropped
    assert full[0]["busy_fraction"] < win[0]["busy_fraction"]
    assert win[1] == full[1]  # no such event: the full span
    path = tmp_path / "t.json"
    path.write_text(json.dumps(trace))
    assert main(["timeline-stats", str(path), "--from", "count_exchange"]) == 0
    assert "window from each GPU's last count_exchange" in capsys.readouterr().out


def test_timeline_stats_rejects_non_traces(tmp_path):
    from weave_sim.timeline_stats import busy_stats

    bad = tmp_path / "x.json"
    bad.write_text("[1, 2]")
    with pytest.raises(ValueError, match="Chrome trace"):
        busy_stats(bad)


def test_clocks_measured_and_predicted(tmp_path, capsys):
    """With a power model in the profile, validate reports the clock it predicts next to the bench's reading."""
    import copy

    from weave_sim.profile import profile_from_dict

    path = bench_file(tmp_path, {"static:8": 1.0, "static:32": 1.0})
    data = json.loads(path.read_text())
    data["results"][0]["gpu_state"] = [{"sm_mhz_median": 1800.0}, {"sm_mhz_median": 1750.0}]
    path.write_text(json.dumps(data))
    (row,) = validate_file(path, PROFILE)
    assert row.measured_mhz == [1800.0, 1750.0] and row.predicted_mhz == {}  # the seed has no power model
    raw = copy.deepcopy(PROFILE.raw)
    raw["power"] = {"cap_w": 700.0, "base_w": 100.0, "w_per_tflops": 50.0, "exponent": 1.5, "clock_mhz": 1980.0}
    prof_path = tmp_path / "power.json"
    prof_path.write_text(json.dumps(raw))
    (row,) = validate_file(path, profile_from_dict(raw))
    assert set(row.predicted_mhz) == {"static:8", "static:32"}
    assert all(0.3 * 1980 <= m < 1980 for v in row.predicted_mhz.values() for m in v)  # this load is capped
    assert main(["validate", str(path), "--profile", str(prof_path), "--out", str(tmp_path / "o")]) == 0
    assert "SM clock" in capsys.readouterr().out


def test_validate_warns_when_the_profile_was_fitted_to_other_kernel_sources(tmp_path, capsys):
    """A profile fitted to one kernel's latencies, checked against another kernel's results, says so."""
    import copy

    from weave_sim.profile import profile_from_dict
    from weave_sim.validate import kernel_sources_warning

    path = bench_file(tmp_path, {"static:8": 1.0, "static:32": 1.0})
    data = json.loads(path.read_text())
    raw = copy.deepcopy(PROFILE.raw)
    raw["name"] = "fitted-elsewhere"
    raw.setdefault("calibration", {})["kernel_sources"] = "sha256:aaaa"
    prof = profile_from_dict(raw)
    assert kernel_sources_warning(data, prof) is None  # the results do not say which kernel: nothing to compare
    data["kernel_sources"] = {"main": "sha256:aaaa"}
    assert kernel_sources_warning(data, prof) is None
    data["kernel_sources"] = {"main": "sha256:bbbb", "ab": "sha256:aaaa"}
    msg = kernel_sources_warning(data, prof)
    assert "fitted-elsewhere" in msg and "sha256:aaaa" in msg and "sha256:bbbb" in msg
    assert kernel_sources_warning(data, PROFILE) is None  # the seed profile was not fitted to a kernel
    path.write_text(json.dumps(data))
    prof_path = tmp_path / "fitted.json"
    prof_path.write_text(json.dumps(raw))
    assert main(["validate", str(path), "--profile", str(prof_path), "--out", str(tmp_path / "o")]) == 0
    assert "warning: profile fitted-elsewhere was fitted to kernel sources sha256:aaaa" in capsys.readouterr().out
    assert json.loads((tmp_path / "o" / "validate.json").read_text())["warnings"] == [msg]


def test_fit_records_the_kernel_sources_of_its_benchmark(tmp_path):
    from weave_sim.calibrate import fit_profile
    from weave_sim.engine.testing import simulated_bench_file

    bench = simulated_bench_file(tmp_path / "bench.json", PROFILE, 1024, 512)
    prof = fit_profile(bench, rounds=1, iters=1, log=lambda m: None)
    assert prof["calibration"]["kernel_sources"] is None
    data = json.loads(bench.read_text())
    data["kernel_sources"] = {"main": "sha256:0123456789abcdef"}
    bench.write_text(json.dumps(data))
    prof = fit_profile(bench, rounds=1, iters=1, log=lambda m: None)
    assert prof["calibration"]["kernel_sources"] == "sha256:0123456789abcdef"


def test_shipped_fitted_profiles_name_the_kernel_they_were_fitted_to():
    """Both fits used run A of docs/results/kernel_bench_A_at.json, measured on the kernel of commit 4952f58."""
    for name in ("h200-megakernel", "h200-megakernel-power"):
        cal = load_profile(name).raw["calibration"]
        assert cal["fitted_to"].endswith("kernel_bench_A_at.json")
        assert cal["kernel_sources"] == "sha256:15b22c0338baf433"


def test_a_smaller_grid_is_simulated_on_that_many_sms(tmp_path):
    """bench --num-ctas records the grid; validation simulates the layer on that many SMs (fewer SMs: slower),
    and a grid the profile cannot hold is an error, not a silent 132-SM prediction."""
    from weave_sim.validate import profile_for_result, validate_result

    r = json.loads(bench_file(tmp_path, {"static:8": 1.0}).read_text())["results"][0]
    full = validate_result(r, PROFILE).predicted_ms["static:8"]
    assert profile_for_result(r, PROFILE) is PROFILE and profile_for_result({**r, "num_ctas": PROFILE.num_sms}, PROFILE) is PROFILE
    small = profile_for_result({**r, "num_ctas": 32}, PROFILE)
    assert small.num_sms == 32 and small.name == PROFILE.name
    assert validate_result({**r, "num_ctas": 32}, PROFILE).predicted_ms["static:8"] > 1.05 * full  # 1.09x with half tiles (1.1x before)
    with pytest.raises(ValueError, match="num_ctas"):
        validate_result({**r, "num_ctas": PROFILE.num_sms + 1}, PROFILE)


def test_shipped_ep1_refits_keep_their_bases_links():
    """The EP=1 refits of the current kernel (docs/results.md): GEMM rate and fixed costs fitted on one GPU, the
    NVLink push curve left as the two-GPU fit made it, and the kernel they were fitted to named. The fixed-clock one
    also times tiles by the SMs computing at once (gemm.scale_by_ctas from the EP=2 calibration, weighed by conc_exp)."""
    from pathlib import Path

    from weave_sim.calibrate import gemm_concurrency_curve, scaled_profile

    root = Path(__file__).resolve().parents[2]
    for name, base, extra in (("h200-megakernel-ep1", "h200-megakernel-ep2", ["conc_exp"]),
                              ("h200-megakernel-power-ep1", "h200-megakernel-power", [])):
        prof, b = load_profile(name), load_profile(base)
        cal = prof.raw["calibration"]
        assert cal["base"] == base and cal["fitted"] == ["gemm_scale", "fixed_us", "barrier_us", *extra]
        if extra:
            meas = json.loads((root / cal["concurrency_from"]).read_text())
            curve = gemm_concurrency_curve(meas["gemm"])
            want = scaled_profile({**b.raw, "gemm": {**b.raw["gemm"], "scale_by_ctas": curve}},
                                  **cal["params"])["gemm"]["scale_by_ctas"]
            assert prof.raw["gemm"]["scale_by_ctas"] == pytest.approx(want)
            assert 0.0 < cal["params"]["conc_exp"] < 1.5
        assert cal["params"]["push_scale"] == 1.0
        assert prof.raw["nvlink"] == b.raw["nvlink"] and ("power" in prof.raw) == ("power" in b.raw)
        bench = json.loads((root / cal["fitted_to"]).read_text())
        assert cal["fitted_to"].startswith("docs/results/ep1/") and {r["gpus"] for r in bench["results"]} == {1}
        assert cal["kernel_sources"] == bench["kernel_sources"]["main"]


def test_per_layer_results_are_labelled_by_their_layer(tmp_path, capsys):
    """Results of bench --synthetic / --routing-trace name their MoE layer; validation keeps it apart (label,
    trace file names), so two layers of one model and size are two configurations, not one overwritten."""
    path = bench_file(tmp_path, {"static:16": 1.0, "weave": 1.0})
    doc = json.loads(path.read_text())
    doc["results"] = [{**doc["results"][0], "layer": 3}, {**doc["results"][0], "layer": 11}]
    path.write_text(json.dumps(doc))
    rows = validate_file(path, PROFILE, trace_dir=tmp_path / "traces")
    assert [(r.layer, r.label) for r in rows] == [(3, "m@L3"), (11, "m@L11")]
    assert len({t for r in rows for t in r.traces}) == 2 and all("_L3_" in t or "_L11_" in t for r in rows for t in r.traces)
    assert main(["validate", str(path), "--out", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "m@L3" in out and "m@L11" in out
    assert [c["layer"] for c in json.loads((tmp_path / "validate.json").read_text())["configs"]] == [3, 11]


def test_shipped_ep2_refits_of_the_current_kernel(monkeypatch):
    """h200-calibrated-ep2 is what weave-sim calibrate makes of the committed 2x H200 measurements, and the two
    fits on it (fixed clock; power model without its HBM term) name run A of the same kernel and EP=2."""
    from pathlib import Path

    from weave_sim.calibrate import build_profile, with_decision

    root = Path(__file__).resolve().parents[2]
    monkeypatch.chdir(root)  # the decision traces are named relative to the repository
    meas = json.loads((root / "docs/results/ep2/calib_2xh200_ep2.json").read_text())
    calibrated = load_profile("h200-calibrated-ep2").raw
    meas = with_decision(meas, calibrated["calibration"]["decision_from"]["traces"])
    assert build_profile(meas, base="h200", name="h200-calibrated-ep2") == calibrated
    for name, power in (("h200-megakernel-ep2", False), ("h200-megakernel-power-ep2", True)):
        prof = load_profile(name).raw
        cal = prof["calibration"]
        assert cal["base"] == "h200-calibrated-ep2" and cal["fitted_to"] == "docs/results/ep2/kernel_bench_A_ep2.json"
        bench = json.loads((root / cal["fitted_to"]).read_text())
        assert {r["gpus"] for r in bench["results"]} == {2}
        assert cal["kernel_sources"] == bench["kernel_sources"]["main"]
        assert ("power" in prof) == power and prof["nvlink"]["push_gbs_by_ctas"] != calibrated["nvlink"]["push_gbs_by_ctas"]
        if power:
            assert "w_per_tbs" not in prof["power"] and "w_per_tbs" in calibrated["power"]


def test_fit_in_worker_processes_is_the_serial_fit(tmp_path):
    """fit_profile(workers=2) simulates the points in a FitPool: the same error, bit for bit, so the same profile."""
    from weave_sim.calibrate import CalibrationError, FitPool, fit_error, fit_profile
    from weave_sim.engine.testing import simulated_bench_file

    bench = simulated_bench_file(tmp_path / "bench.json", PROFILE, 1024, 512)
    data = json.loads(bench.read_text())
    raw = PROFILE.raw
    with FitPool(data, 2) as pool:
        assert fit_error(data, raw, pool=pool) == fit_error(data, raw)
    serial = fit_profile(bench, rounds=1, iters=1, log=lambda m: None, workers=1)
    parallel = fit_profile(bench, rounds=1, iters=1, log=lambda m: None, workers=2)
    assert parallel == serial
    with pytest.raises(CalibrationError, match="workers"):
        fit_profile(bench, rounds=1, iters=1, log=lambda m: None, workers=-1)


def test_calibrate_fit_cli_passes_workers(tmp_path, capsys):
    from weave_sim.engine.testing import simulated_bench_file

    bench = simulated_bench_file(tmp_path / "bench.json", PROFILE, 1024, 512)
    assert main(["calibrate", "--fit", str(bench), "-o", str(tmp_path / "p.json"), "--workers", "-1"]) == 2
    assert "workers must be >= 0" in capsys.readouterr().err


def test_dispatch_piece_cost_is_optional_charged_and_fittable(tmp_path):
    """fixed_ns may carry "dispatch_piece" (else the engine charges `signal` per kernel dispatch piece); it slows
    the kernel's dispatch-bound policies, and `piece_ns` fits it."""
    from weave_sim.calibrate import fit_profile
    from weave_sim.engine.testing import simulated_bench_file
    from weave_sim.profile import ProfileError, profile_from_dict

    raw = PROFILE.raw
    with pytest.raises(ProfileError, match="fixed_ns"):
        profile_from_dict({**raw, "fixed_ns": {**raw["fixed_ns"], "colour": 1}})
    bench = json.loads(simulated_bench_file(tmp_path / "b.json", PROFILE, 1024, 512, tokens=2048).read_text())
    r = bench["results"][0]
    times = {}
    for piece in (0, 50_000):
        prof = profile_from_dict({**raw, "fixed_ns": {**raw["fixed_ns"], "dispatch_piece": piece}})
        times[piece] = validate_result_ms(r, prof)
    assert times[50_000]["static:4"] > times[0]["static:4"] * 1.05
    prof = fit_profile(tmp_path / "b.json", rounds=1, iters=1, log=lambda m: None,
                       params=("gemm_scale", "piece_ns"))
    assert prof["fixed_ns"]["dispatch_piece"] >= 0 and "piece_ns" in prof["calibration"]["params"]
    profile_from_dict(prof)


def validate_result_ms(result, prof):
    from weave_sim.validate import validate_result

    return validate_result(result, prof).predicted_ms


def test_dispatch_mode_mismatch_is_warned(tmp_path, capsys):
    """A benchmark that dispatched by bulk copies, validated with a profile whose push curve came from the
    all-thread copy, gets a warning (printed and in validate.json); calibrate records the mode it measured."""
    from pathlib import Path

    from weave_sim.calibrate import build_profile
    from weave_sim.engine.testing import simulated_bench_file
    from weave_sim.profile import profile_from_dict
    from weave_sim.validate import dispatch_warning

    path = simulated_bench_file(tmp_path / "b.json", PROFILE, 1024, 512)
    doc = json.loads(path.read_text())
    assert dispatch_warning(doc, PROFILE) is None
    doc["config"] = {"dispatch": "bulk"}
    path.write_text(json.dumps(doc))
    assert "bulk" in dispatch_warning(doc, PROFILE)
    assert main(["validate", str(path), "--out", str(tmp_path)]) == 0
    assert "warning: these results dispatched rows by 'bulk'" in capsys.readouterr().out
    assert any("bulk" in w for w in json.loads((tmp_path / "validate.json").read_text())["warnings"])
    meas = json.loads((Path(__file__).resolve().parents[2] / "docs/results/ep2/calib_2xh200_ep2.json").read_text())
    assert "dispatch" not in build_profile(meas, base="h200")["nvlink"]
    bulk = profile_from_dict(build_profile({**meas, "dispatch": "bulk:8"}, base="h200"))
    assert bulk.raw["nvlink"]["dispatch"] == "bulk:8" and dispatch_warning(doc, bulk) is None


def test_workers_give_the_rows_of_one_process(tmp_path):
    a = json.loads(bench_file(tmp_path, {"static:8": 1.2, "weave": 0.95}).read_text())["results"][0]
    path = tmp_path / "three.json"
    path.write_text(json.dumps({"results": [a, {**a, "tokens_per_gpu": 256}, {**a, "tokens_per_gpu": 128}]}))
    one, two = validate_file(path, PROFILE), validate_file(path, PROFILE, workers=2)
    assert [r.to_dict() for r in one] == [r.to_dict() for r in two]
    with pytest.raises(ValueError, match="workers"):
        validate_file(path, PROFILE, workers=0)



def test_result_placement_reads_the_recorded_owners():
    from weave_sim.validate import result_placement

    r = {"experts": 8, "gpus": 2}
    assert result_placement(r).owner.tolist() == [0, 0, 0, 0, 1, 1, 1, 1]  # the benchmark's contiguous map
    owner = [1, 0, 0, 1, 1, 0, 1, 0]
    assert result_placement({**r, "placement": "balanced", "placement_owner": owner}).owner.tolist() == owner


def test_fp8_results_are_simulated_with_fp8_tiles_and_bytes(tmp_path):
    """A result of bench --expert-dtype fp8 is simulated as FP8 experts: e4m3 bytes (engine expert_dtype) and tiles
    at the profile's FP8 factor (gemm.fp8_scale, else FP8_TILE_SCALE, fitted to the EP=1 FP8 layers), so faster than
    the same result in bf16; an unknown dtype is an error, and whatif's fp8:S refuses a result that already ran FP8."""
    from weave_sim.profile import FP8_TILE_SCALE, fp8_profile, profile_from_dict
    from weave_sim.validate import kernel_options, profile_for_result, result_fp8, validate_result

    r = json.loads(bench_file(tmp_path, {"static:8": 1.0, "weave": 1.0}).read_text())["results"][0]
    r8 = {**r, "expert_dtype": "fp8"}
    assert not result_fp8(r) and result_fp8(r8) and "expert_dtype" not in kernel_options(r)
    assert kernel_options(r8)["expert_dtype"] == "fp8"
    key = next(iter(PROFILE.raw["gemm"]["per_sm_tflops_by_rows"]))
    rate = PROFILE.raw["gemm"]["per_sm_tflops_by_rows"][key]
    assert profile_for_result(r8, PROFILE).raw["gemm"]["per_sm_tflops_by_rows"][key] == pytest.approx(rate * FP8_TILE_SCALE)
    own = profile_from_dict({**PROFILE.raw, "gemm": {**PROFILE.raw["gemm"], "fp8_scale": 1.5}})
    assert fp8_profile(own).raw["gemm"]["per_sm_tflops_by_rows"][key] == pytest.approx(rate * 1.5)
    b16, f8 = validate_result(r, PROFILE).predicted_ms, validate_result(r8, PROFILE).predicted_ms
    assert all(f8[p] < b16[p] for p in ("static:8", "weave"))
    with pytest.raises(ValueError, match="unknown expert_dtype"):
        validate_result({**r, "expert_dtype": "int4"}, PROFILE)
    with pytest.raises(ValueError, match="must be > 0"):
        fp8_profile(PROFILE, 0.0)


def test_an_fp8_layers_simulated_weave_split_is_chosen_from_the_bf16_table():
    """The kernel's FP8 layers read the bf16 cost table, so the engine's kernel:weave chooses an FP8 layer's split
    with the profile's bf16 rates (weave_sim.profile.table_profile undoes fp8_profile exactly) and simulates it with
    the FP8 tiles."""
    from weave_sim import costmodel
    from weave_sim.profile import fp8_profile, table_profile

    base = load_profile("h200-megakernel-ep2")
    f8 = fp8_profile(base, 1.9)
    assert json.dumps(table_profile(f8).raw, sort_keys=True) == json.dumps(base.raw, sort_keys=True)
    assert table_profile(base) is base
    with pytest.raises(ValueError, match="already has FP8 tiles"):
        fp8_profile(f8)
    model = ModelPreset("m", 2048, 768, 32, 8, 0, 1)
    rng = np.random.default_rng(5)
    ids = np.argsort(rng.random((2 * 1024, 32)) ** 3, axis=1)[:, :8]
    w = pairs_dispatched(layer_workload(ids, model, contiguous(32, 2)))
    want = costmodel.choose(costmodel.Volumes.from_workloads([w], base), base).num_comm_sms[0]
    fast = costmodel.choose(costmodel.Volumes.from_workloads([w], f8), f8).num_comm_sms[0]
    got = simulate_layer(w, f8, "kernel:weave", expert_dtype="fp8", **KERNEL_OPTIONS).plan.num_comm_sms
    assert tuple(got) == tuple(int(c) for c in want)
    assert simulate_layer(w, f8, "kernel:weave", expert_dtype="fp8", **KERNEL_OPTIONS).latency_ns < \
        simulate_layer(w, base, "kernel:weave", **KERNEL_OPTIONS).latency_ns
    assert tuple(want) != tuple(fast)  # (18 against 47 comm CTAs here: the test tells the two apart)

import json

import pytest

from weave_sim.calibrate import CalibrationError, build_profile, calibrate_file
from weave_sim.profile import load_profile

MEAS = {
    "gpu_name": "NVIDIA H200", "driver": "580", "date": "2026-11-30", "commit": "abc123", "num_sms": 132,
    "nvlink_push": [{"ctas": 1, "peers": 1, "gbs": 19.0}, {"ctas": 8, "peers": 1, "gbs": 150.0},
                    {"ctas": 8, "peers": 3, "gbs": 140.0}, {"ctas": 32, "peers": 1, "gbs": 300.0},
                    {"ctas": 64, "peers": 1, "gbs": 290.0}],
    "gemm": [{"ctas": 16, "rows_per_expert": 32, "tflops": 20.0}, {"ctas": 64, "rows_per_expert": 32, "tflops": 90.0},
             {"ctas": 64, "rows_per_expert": 512, "tflops": 320.0}],
    "chunks": [{"chunks": 1, "time_ns": 1000.0}, {"chunks": 4, "time_ns": 1100.0}, {"chunks": 8, "time_ns": 990.0}],
    "task_claim_ns": 250.0,
}


def test_profile_from_measurements(tmp_path):
    out = tmp_path / "p.json"
    calibrate_file_path = tmp_path / "m.json"
    calibrate_file_path.write_text(json.dumps(MEAS))
    prof = calibrate_file(calibrate_file_path, out, base="h200", name="h200-test")
    p = load_profile(out)
    assert p.name == "h200-test" and p.version.startswith("2026-11-30-abc123")
    # slowest peer count per CTA count; running max makes 64 CTAs no slower than 32
    assert prof["nvlink"]["push_gbs_by_ctas"] == {"1": 19.0, "8": 140.0, "32": 300.0, "64": 300.0}
    assert p.per_sm_tflops(32) == pytest.approx((20 / 16 + 90 / 64) / 2)
    assert p.efficiency(4) == pytest.approx(1000 / 1100) and p.efficiency(8) == 1.0
    assert p.fixed_ns["task_claim"] == 250
    assert "abc123" in p.source and "task_claim" in p.source


@pytest.mark.parametrize("broken, msg", [
    ({"gemm": None}, "lack"), ({"nvlink_push": [{"ctas": 4, "peers": 1, "gbs": 5.0}]}, "two CTA"),
    ({"chunks": [{"chunks": 2, "time_ns": 5.0}]}, "K=1"), ({"gemm": [{"ctas": 0, "rows_per_expert": 4, "tflops": 1}]}, "bad gemm"),
])
def test_bad_measurements_rejected(broken, msg):
    m = {**MEAS, **broken}
    m = {k: v for k, v in m.items() if v is not None}
    with pytest.raises(CalibrationError, match=msg):
        build_profile(m)


def test_unreadable_file(tmp_path):
    bad = tmp_path / "m.json"
    bad.write_text("{")
    with pytest.raises(CalibrationError, match="cannot read"):
        calibrate_file(bad, tmp_path / "o.json")


def test_fit_recovers_a_known_profile(tmp_path):
    """Latencies simulated with a profile scaled by known factors are fitted back to about those factors."""
    import numpy as np

    from weave_sim.calibrate import fit_profile, scaled_profile
    from weave_sim.engine import simulate_layer
    from weave_sim.placement import contiguous
    from weave_sim.presets import ModelPreset
    from weave_sim.profile import profile_from_dict
    from weave_sim.validate import KERNEL_DECIDERS, KERNEL_LAYOUT, KERNEL_OPTIONS, sim_policy
    from weave_sim.workload import layer_workload, pairs_dispatched

    truth = profile_from_dict(scaled_profile(load_profile().raw, 0.6, 0.5, 30.0))
    results = []
    for seed, (h, i, n) in enumerate([(2048, 2048, 2048), (4096, 256, 1024), (1024, 4096, 2048)]):
        model = ModelPreset("m", h, i, 8, 2, 0, 1)  # GEMM-heavy and comm-heavy layers: both scales matter
        ids = np.argsort(np.random.default_rng(seed).random((2 * n, 8)), axis=1)[:, :2]
        w = pairs_dispatched(layer_workload(ids, model, contiguous(8, 2)))  # pair-based, as the kernel's counts
        lat = {p: simulate_layer(w, truth, sim_policy(p), **KERNEL_OPTIONS).latency_ns / 1e6 for p in ("static:4", "static:24")}
        results.append({"kernel_layout": KERNEL_LAYOUT, "kernel_deciders": KERNEL_DECIDERS, "model": "m", "tokens_per_gpu": n, "gpus": 2, "experts": 8, "top_k": 2, "hidden": h,
                        "inter": i, "latency_ms": lat,
                        "counts": {"source_expert_pairs": w.pair_counts.sum(axis=1).tolist(),
                                   "dispatch_rows": w.dispatch_rows.tolist(), "tokens_per_gpu": [n, n]}})
    bench = tmp_path / "bench.json"
    bench.write_text(json.dumps({"results": results}))
    prof = fit_profile(bench, rounds=2, iters=8, log=lambda m: None)
    fit = prof["calibration"]
    assert fit["mean_abs_log_error"] < 0.02
    assert abs(fit["params"]["gemm_scale"] - 0.6) < 0.1 and abs(fit["params"]["push_scale"] - 0.5) < 0.15
    out = tmp_path / "p.json"
    out.write_text(json.dumps(prof))
    assert load_profile(out).version.startswith("fit-")


def test_fit_with_a_per_tile_cost_sets_task_claim(tmp_path):
    """--fit-params ...,tile_ns: the per-tile cost is searched too and lands in fixed_ns.task_claim."""
    from weave_sim.calibrate import fit_profile, scaled_profile
    from weave_sim.engine.testing import simulated_bench_file
    from weave_sim.profile import profile_from_dict

    truth = profile_from_dict(scaled_profile(load_profile().raw, 0.7, 0.6, 20.0, tile_ns=3000))
    bench = simulated_bench_file(tmp_path / "bench.json", truth, 1024, 256)  # short K: the per-tile cost matters
    prof = fit_profile(bench, rounds=1, iters=3, log=lambda m: None,
                       params=("gemm_scale", "push_scale", "fixed_us", "barrier_us", "tile_ns"))
    x = prof["calibration"]["params"]
    assert "tile_ns" in x and prof["fixed_ns"]["task_claim"] == int(round(x["tile_ns"]))
    assert "per GEMM tile" in prof["source"]


def test_fit_of_a_subset_keeps_the_rest_of_the_base(tmp_path):
    """--fit-params without push_scale (one GPU: nothing constrains it): the push curve stays the base's, the
    GEMM rate is still recovered, and the provenance names what was fitted."""
    from weave_sim.calibrate import fit_profile, scaled_profile
    from weave_sim.engine.testing import simulated_bench_file
    from weave_sim.profile import profile_from_dict

    base = load_profile().raw
    truth = profile_from_dict(scaled_profile(base, 0.7, 1.0, 20.0))
    bench = simulated_bench_file(tmp_path / "bench.json", truth, 2048, 2048)
    prof = fit_profile(bench, rounds=1, iters=6, log=lambda m: None, params=("gemm_scale", "fixed_us"))
    cal = prof["calibration"]
    assert cal["fitted"] == ["gemm_scale", "fixed_us"] and cal["params"]["push_scale"] == 1.0
    assert prof["nvlink"]["push_gbs_by_ctas"] == base["nvlink"]["push_gbs_by_ctas"]
    assert abs(cal["params"]["gemm_scale"] - 0.7) < 0.1
    assert "fitted: gemm_scale, fixed_us" in prof["source"]
    with pytest.raises(CalibrationError):
        fit_profile(bench, params=())


def test_fit_refuses_a_selection_with_no_points(tmp_path):
    """--policies or --min-tokens that leave nothing to fit say so, naming what the file has, before any search."""
    from weave_sim.calibrate import fit_profile
    from weave_sim.engine.testing import simulated_bench_file

    bench = simulated_bench_file(tmp_path / "bench.json", load_profile(), 1024, 256)
    with pytest.raises(CalibrationError, match=r"no measured latencies of static:99 \(--policies\); it has .*static:"):
        fit_profile(bench, policies=["static:99"], log=lambda m: None)
    with pytest.raises(CalibrationError, match="no configuration with at least 100000 tokens per GPU"):
        fit_profile(bench, min_tokens=100000, log=lambda m: None)


def _numbers(d: dict, prefix: str = "") -> dict:
    out = {}
    for k, v in d.items():
        if isinstance(v, dict):
            out.update(_numbers(v, f"{prefix}{k}."))
        elif isinstance(v, (int, float)) and not isinstance(v, bool):
            out[prefix + k] = float(v)
    return out


@pytest.mark.parametrize("fitted", ["h200-megakernel-ep2", "h200-megakernel-power-ep2"])
def test_applied_fit_reproduces_the_shipped_fit(tmp_path, fitted):
    """The shipped EP=2 fits were made on h200-calibrated-ep2 (this calibration file on h200); applying their
    parameters to the same measurements gives back every number of the fitted profile (power model, HBM term and
    k_fixed mirrored from the fit)."""
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    meas = root / "docs" / "results" / "ep2" / "calib_2xh200_ep2.json"
    traces = [root / t for t in load_profile(fitted).raw["calibration"]["decision_from"]["traces"]]
    prof = calibrate_file(meas, tmp_path / "p.json", base="h200", name="applied", params_from=fitted,
                          decision_traces=traces)
    want = _numbers({k: v for k, v in load_profile(fitted).raw.items() if k != "calibration"})
    got = _numbers({k: v for k, v in prof.items() if k != "calibration"})
    assert got.keys() == want.keys()
    for k in want:
        assert got[k] == pytest.approx(want[k], rel=1e-12, abs=1e-12), k
    assert prof["calibration"]["params_from"] == fitted
    assert prof["calibration"]["params"] == load_profile(fitted).raw["calibration"]["params"]
    assert "applied, not refitted" in prof["source"]
    assert load_profile(tmp_path / "p.json").name == "applied"


def test_applied_fit_moves_a_new_push_curve_like_the_fit(tmp_path):
    """A push curve the fit never saw is scaled the way the fit scaled its own: c CTAs move what push_scale * c
    moved; the GEMM rates and fixed costs come out as the fit set them."""
    from weave_sim.calibrate import apply_fit, scaled_profile

    fit = load_profile("h200-megakernel-ep2").raw["calibration"]["params"]
    base = build_profile(MEAS, base="h200")
    got = apply_fit(base, "h200-megakernel-ep2")
    want = scaled_profile(base, **fit)
    assert got["nvlink"]["push_gbs_by_ctas"] == want["nvlink"]["push_gbs_by_ctas"]
    assert got["nvlink"]["push_gbs_by_ctas"]["8"] < base["nvlink"]["push_gbs_by_ctas"]["8"]
    assert got["fixed_ns"]["count_exchange"] == round(fit["fixed_us"] * 1e3)
    assert got["gemm"]["per_sm_tflops_by_rows"] == want["gemm"]["per_sm_tflops_by_rows"]
    assert "power" not in got  # the fixed-clock fit has no power model


def test_applied_fit_needs_a_fitted_profile(tmp_path):
    from weave_sim.calibrate import apply_fit

    with pytest.raises(CalibrationError, match="not a fitted profile"):
        apply_fit(build_profile(MEAS), "h200")


def test_cli_params_from(tmp_path, capsys):
    from weave_sim.cli import main

    m = tmp_path / "m.json"
    m.write_text(json.dumps(MEAS))
    assert main(["calibrate", str(m), "--params-from", "h200-megakernel-ep2", "-o", str(tmp_path / "p.json")]) == 0
    assert "applied, not refitted" in capsys.readouterr().out
    assert main(["calibrate", str(m), "--params-from", "h200", "-o", str(tmp_path / "q.json")]) == 2
    assert "not a fitted profile" in capsys.readouterr().err
    assert main(["calibrate", "--fit", str(m), "--params-from", "h200-megakernel-ep2", "-o", str(tmp_path / "r.json")]) == 2
    assert "not both" in capsys.readouterr().err


def test_piece_cost_file_sets_the_dispatch_piece(tmp_path):
    m = tmp_path / "m.json"
    m.write_text(json.dumps(MEAS))
    pc = tmp_path / "piece.json"
    pc.write_text(json.dumps({"dispatch_piece_ns": 5476.2, "all": {"cta_gbs": [11.6]}, "traces": [{"trace": "t.json"}]}))
    prof = calibrate_file(m, tmp_path / "p.json", piece_cost=pc)
    assert prof["fixed_ns"]["dispatch_piece"] == 5476
    assert prof["calibration"]["dispatch_piece_from"]["traces"] == ["t.json"]
    assert "dispatch_piece" in prof["calibration"]["measured"]
    pc.write_text(json.dumps({"traces": []}))
    with pytest.raises(CalibrationError, match="dispatch_piece_ns"):
        calibrate_file(m, tmp_path / "q.json", piece_cost=pc)

"""A GEMM tile's fixed cost (profile gemm.k_fixed): tiles of short K cost more per FLOP than the calibrated K,
tiles of long K less (docs/engine.md, "Tile time by K")."""
import copy
import json
from pathlib import Path

import numpy as np
import pytest

from weave_sim.calibrate import CalibrationError, build_profile, fit_profile, gemm_k_fixed
from weave_sim.engine import simulate_layer
from weave_sim.engine.dag import C_GEMM, K_GEMM0, K_GEMM1
from weave_sim.placement import contiguous
from weave_sim.presets import ModelPreset
from weave_sim.profile import ProfileError, load_profile, profile_from_dict
from weave_sim.workload import layer_workload

BASE = load_profile("h200")
ROOT = Path(__file__).resolve().parents[2]


def with_k(share: float | None, k: int = 2048, **top):
    raw = copy.deepcopy(BASE.raw)
    raw.update(top)
    if share is not None:
        raw["gemm"]["k_fixed"] = {"share": share, "k": k}
    return profile_from_dict(raw)


@pytest.fixture(scope="module")
def layer():
    model = ModelPreset("m", 2048, 512, 16, 4, 0, 1)  # GEMM0 at K 2048 (= the calibrated K), GEMM1 at K 512
    ids = np.argsort(np.random.default_rng(2).random((2 * 1024, 16)), axis=1)[:, :4]
    return layer_workload(ids, model, contiguous(16, 2))


def test_profile_reads_the_share_and_scales_by_k():
    p = with_k(0.2)
    assert p.k_factor(2048) == pytest.approx(1.0)
    assert p.k_factor(1024) == pytest.approx(0.2 * 2 + 0.8)
    assert p.k_factor(8192) == pytest.approx(0.2 / 4 + 0.8)
    # time = fixed + m K: the factor times K is affine in K
    ks = np.array([256, 512, 1536, 4096, 7168])
    t = np.array([p.k_factor(k) * k for k in ks])
    assert np.allclose(np.diff(t) / np.diff(ks), 0.8)
    assert BASE.k_factor(512) == 1.0 and with_k(0.0).k_factor(512) == 1.0
    for bad in ({"share": 1.0, "k": 2048}, {"share": -0.1, "k": 2048}, {"share": 0.1, "k": 0}, {"share": 0.1}):
        raw = copy.deepcopy(BASE.raw)
        raw["gemm"]["k_fixed"] = bad
        with pytest.raises(ProfileError, match="k_fixed"):
            profile_from_dict(raw)


@pytest.mark.parametrize("policy", ["kernel:static:8", "kernel:weave:4", "kernel:sequential", "static:8"])
def test_gemm_tasks_carry_the_factor_of_their_k(layer, policy):
    plain = simulate_layer(layer, with_k(None), policy)
    kf = simulate_layer(layer, with_k(0.25), policy)
    g0, g1 = plain.graph, kf.graph
    assert np.array_equal(g0.kind, g1.kind)
    p = with_k(0.25)
    for kind, k in ((K_GEMM0, 2048), (K_GEMM1, 512)):
        m = g0.kind == kind
        assert m.any()
        assert np.allclose(g1.flop_ns[m], g0.flop_ns[m] * p.k_factor(k))
        assert np.array_equal(g1.hbm_ns[m], g0.hbm_ns[m])
        want = np.ceil(np.maximum(g1.flop_ns[m], g1.hbm_ns[m])).astype(np.int64)
        assert np.array_equal(g1.work_ns[m], want)
    # the GEMM1 tiles (K 512 < 2048) got slower, the layer too
    assert kf.latency_ns > plain.latency_ns
    other = g0.cls != C_GEMM
    assert np.array_equal(g0.work_ns[other], g1.work_ns[other])


def points(fixed_us: float, us_per_k: float, ctas: int, rows: int, ks=(512, 1024, 2048, 4096)) -> list[dict]:
    return [{"k": k, "ctas": ctas, "rows_per_expert": rows, "tile_us": fixed_us + us_per_k * k} for k in ks]


def test_share_from_tiles_at_several_k():
    m = {"gemm_k": 2048, "gemm_by_k": points(3.0, 0.009, 16, 2048) + points(3.2, 0.009, 16, 256)
         + points(9.0, 0.011, 132, 2048)  # more CTAs: not used (the fewest CTAs give the cleanest lines)
         + points(50.0, 0.001, 8, 64, ks=(512, 1024))}  # two K values only: no line, ignored
    kf = gemm_k_fixed(m)
    shares = [3.0 / (3.0 + 0.009 * 2048), 3.2 / (3.2 + 0.009 * 2048)]
    assert kf["share"] == pytest.approx(np.median(shares), abs=1e-4)
    assert kf["k"] == 2048 and kf["ctas"] == 16 and kf["fixed_us"] == pytest.approx(3.1, abs=1e-3)
    # a negative intercept is no fixed cost
    assert gemm_k_fixed({"gemm_k": 2048, "gemm_by_k": points(-1.0, 0.01, 16, 2048)})["share"] == 0.0
    with pytest.raises(CalibrationError, match="grow with K"):
        gemm_k_fixed({"gemm_k": 2048, "gemm_by_k": points(20.0, -0.001, 16, 2048)})
    with pytest.raises(CalibrationError, match="three or more K"):
        gemm_k_fixed({"gemm_k": 2048, "gemm_by_k": points(3.0, 0.01, 16, 2048, ks=(512, 1024))})
    with pytest.raises(CalibrationError, match="gemm_k"):
        gemm_k_fixed({"gemm_by_k": points(3.0, 0.01, 16, 2048)})


def test_committed_measurement_and_shipped_power_profiles():
    """The tiles measured on one H200 (tests/kernel/tile_k_probe.py) give a share near 15% at K 2048, and the
    shipped power-model profiles carry exactly what gemm_k_fixed makes of that file."""
    meas = json.loads((ROOT / "docs/results/tile_k/tile_k_1xh200.json").read_text())
    kf = gemm_k_fixed(meas)
    assert 0.10 < kf["share"] < 0.20 and kf["k"] == 2048
    for name in ("h200-megakernel-power-ep1", "h200-megakernel-power-ep2"):
        prof = load_profile(name)
        src = prof.raw["calibration"]["k_fixed_from"]  # this probe, or a later calibration's gemm_by_k
        got = gemm_k_fixed(json.loads((ROOT / src).read_text()))
        assert 0.10 < got["share"] < 0.20 and got["k"] == 2048
        assert prof.raw["gemm"]["k_fixed"] == got and prof.gemm_k_fixed_share == got["share"]


def test_build_profile_and_cli_add_it_only_when_asked(tmp_path, capsys):
    from weave_sim.cli import main
    from weave_sim.engine.testing import simulated_bench_file

    meas = json.loads((ROOT / "docs/results/ep2/calib_2xh200_ep2.json").read_text())
    assert "k_fixed" not in build_profile(meas, base="h200")["gemm"]
    kfile = ROOT / "docs/results/tile_k/tile_k_1xh200.json"
    with_kf = build_profile(meas, base="h200", k_fixed_from=json.loads(kfile.read_text()))
    assert with_kf["gemm"]["k_fixed"]["share"] > 0 and "gemm fixed cost per tile" in with_kf["calibration"]["measured"]
    mfile = ROOT / "docs/results/ep2/calib_2xh200_ep2.json"
    assert main(["calibrate", str(mfile), "--gemm-k", str(kfile), "-o", str(tmp_path / "c.json")]) == 0
    assert "k_fixed" in json.loads((tmp_path / "c.json").read_text())["gemm"]
    # the measurements themselves ("-") have no tiles at several K: a clear error, not a silent profile
    assert main(["calibrate", str(mfile), "--gemm-k", "-o", str(tmp_path / "d.json")]) == 2
    assert "gemm_by_k" in capsys.readouterr().err
    bench = simulated_bench_file(tmp_path / "b.json", BASE, 1024, 512)
    assert main(["calibrate", "--fit", str(bench), "--gemm-k", "-o", str(tmp_path / "y.json")]) == 2
    assert "--gemm-k needs the file" in capsys.readouterr().err
    prof = fit_profile(bench, rounds=1, iters=1, log=lambda m: None, params=("gemm_scale",), k_fixed_path=kfile)
    assert prof["calibration"]["k_fixed_from"] == str(kfile) and "k_fixed" in prof["gemm"]
    assert "tile time by K" in prof["source"]
    # refitting on a base that already has the share keeps one copy of its note
    base = tmp_path / "base.json"
    base.write_text(json.dumps(prof))
    again = fit_profile(bench, base=str(base), rounds=1, iters=1, log=lambda m: None, params=("gemm_scale",),
                        k_fixed_path=kfile)
    assert again["gemm"]["note"].count("k_fixed:") == 1


def test_fit_recovers_the_rate_of_a_k_dependent_benchmark(tmp_path):
    """A benchmark simulated with a fixed share is fitted back to its GEMM rate when the fit knows the share."""
    from weave_sim.engine.testing import simulated_bench_file

    truth = with_k(0.15)
    raw = copy.deepcopy(truth.raw)
    raw["gemm"]["per_sm_tflops_by_rows"] = {k: v * 0.8 for k, v in raw["gemm"]["per_sm_tflops_by_rows"].items()}
    slow = profile_from_dict(raw)
    simulated_bench_file(tmp_path / "b.json", slow, 2048, 512, tokens=2048, policies=("static:8", "sequential"))
    kfile = tmp_path / "k.json"
    kfile.write_text(json.dumps({"gemm_k": 2048, "gemm_by_k": points(0.15 / 0.85 * 18.0, 18.0 / 2048, 16, 2048)}))
    prof = fit_profile(tmp_path / "b.json", base="h200", rounds=1, iters=9, log=lambda m: None,
                       params=("gemm_scale",), k_fixed_path=kfile)
    assert prof["gemm"]["k_fixed"]["share"] == pytest.approx(0.15, abs=1e-3)
    assert prof["calibration"]["params"]["gemm_scale"] == pytest.approx(0.8, abs=0.03)


def test_unreadable_files_are_named(tmp_path):
    from weave_sim.calibrate import calibrate_file

    bad = tmp_path / "broken.json"
    bad.write_text("{not json")
    mfile = ROOT / "docs/results/ep2/calib_2xh200_ep2.json"
    with pytest.raises(CalibrationError, match="cannot read measurements .*broken.json"):
        calibrate_file(mfile, tmp_path / "o.json", k_fixed_path=bad)
    with pytest.raises(CalibrationError, match="cannot read measurements .*missing.json"):
        calibrate_file(tmp_path / "missing.json", tmp_path / "o.json")
    from weave_sim.engine.testing import simulated_bench_file

    bench = simulated_bench_file(tmp_path / "b.json", BASE, 1024, 512)
    with pytest.raises(CalibrationError, match="cannot read measurements .*broken.json"):
        fit_profile(bench, rounds=1, iters=1, log=lambda m: None, params=("gemm_scale",), k_fixed_path=bad)

"""weave_kernel.calibrate: the JSON it writes is what weave_sim.calibrate reads (synthetic points in the full
plan's shape), argument checks, the framework-free calibration sources compile (nvcc, g++), and on GPUs a
--quick run end to end."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest

from weave_kernel import build
from weave_kernel import calibrate as cal
from weave_sim.calibrate import CalibrationError, build_profile
from weave_sim.profile import profile_from_dict

ROOT = Path(__file__).resolve().parents[2]
CSRC = ROOT / "weave_kernel" / "csrc"
PAD_ENERGY = 0.4  # the synthetic padding rows' energy per FLOP, relative to random rows'
HEADER = {"gpu_name": "NVIDIA H200", "driver": "580.159.04", "date": "2026-12-01", "commit": "0123456789abcdef",
          "num_sms": 132}


def synthetic(plan: cal.Plan = cal.FULL, world: int = 2) -> dict:
    """A measurements dictionary with the points a run of `plan` produces (made-up, plausible rates)."""
    push = [{"ctas": c, "peers": q, "gbs": min(11.0 * c, 330.0) - q, "gbs_by_rank": [11.0 * c] * world}
            for q in range(1, world) for c in plan.push_ctas]
    gemm = [{"ctas": n or 132, "rows_per_expert": r, "tflops": (n or 132) * min(3.6, r / 40), "experts": 8}
            for r in plan.gemm_rows for n in plan.gemm_ctas]
    chunks = [{"chunks": k, "time_ns": 1e6 * (1 + 0.01 * k)} for k in plan.chunk_counts]
    power = None
    if plan.power_ctas:  # sustained points as calib_runs.Bench.power writes them: the cap holds from 99 CTAs
        pts = []
        for n in plan.power_ctas:
            ctas = n or 132
            f = min(1.0, (99.0 / ctas) ** 0.4)
            pts.append({"ctas": ctas, "tflops": 4.5 * ctas * f, "sm_mhz": 1980.0 * f,
                        "power_w": min(700.0, 130.0 + 1.3 * 4.5 * ctas * f ** 2.7), "event_reasons": []})
        power = {"limit_w": 700.0, "rows_per_expert": 2048, "sustain_s": plan.power_sustain_s, "points": pts,
                 "hbm": {"tbs": 4.2, "power_w": 480.0, "sm_mhz": 1980.0, "event_reasons": []}}
        pads = []
        for z in plan.power_pad_rows:  # the all-SM point's power, padding rows at PAD_ENERGY: a higher clock
            share = 1.0 - z / 128 + z / 128 * PAD_ENERGY
            f = min(1.0, ((695.0 - 130.0) / (1.3 * 4.5 * 132 * share)) ** (1 / 2.7))
            pads.append({"ctas": 132, "pad_rows": z, "pad_fraction": z / 128, "tflops": 4.5 * 132 * f,
                         "sm_mhz": 1980.0 * f, "power_w": 130.0 + 1.3 * 4.5 * 132 * f ** 2.7 * share,
                         "event_reasons": []})
        if pads:
            power["pad_points"] = pads
    by_k = [{"k": k, "ctas": plan.k_ctas, "rows_per_expert": r, "experts": 4, "tiles": plan.k_tiles,
             "tile_us": 3.0 + 0.009 * k} for r in plan.k_rows for k in plan.k_values]
    return cal.assemble(HEADER, push, gemm, chunks, task_claim_ns=412.3, signal_ns=1234.5, hbm_gbs=4100.0,
                        power=power, extra={"world": world}, gemm_by_k=by_k)


def test_synthetic_run_makes_a_valid_profile():
    m = json.loads(json.dumps(synthetic()))
    prof = build_profile(m, base="h200", name="h200-calibrated")
    p = profile_from_dict(prof)
    assert p.num_sms == 132 and p.version == "2026-12-01-0123456789ab"
    assert sorted(int(c) for c in prof["nvlink"]["push_gbs_by_ctas"]) == list(cal.FULL.push_ctas)
    assert p.bandwidth_gbs(8) == pytest.approx(87.0)
    assert p.gemm_peak_tflops == pytest.approx(132 * 3.6)
    assert p.fixed_ns["task_claim"] == 412 and p.fixed_ns["signal"] == 1234 and p.hbm_gbs == 4100.0
    assert set(p.chunk_eff) == set(cal.FULL.chunk_counts) and p.efficiency(8) == pytest.approx(1.01 / 1.08, rel=1e-5)
    text = cal.format_summary(m)
    assert "push GB/s" in text and "gemm TFLOP/s" in text and "task_claim 412 ns" in text
    assert "sustained gemm" in text and "HBM copy 4.20 TB/s" in text
    assert p.power is not None and p.power.cap_w == 700.0
    assert p.power.w_per_tbs == pytest.approx((480.0 - p.power.base_w) / 4.2, rel=1e-3)
    # the zero-row runs give padding's energy (the fit's base, w and exponent are close to the synthetic ones)
    assert "zero rows in A" in text and len(m["power"]["pad_points"]) == len(cal.FULL.power_pad_rows) == 2
    assert p.power.pad_energy == pytest.approx(PAD_ENERGY, abs=0.02)


def test_tiles_at_several_k_give_the_fixed_share():
    """The plan's K sweep lands in the measurements as gemm_by_k with the curve's K; weave-sim calibrate --gemm-k
    turns it into gemm.k_fixed (tile = 3 us + 9 ns per K here: 3 / (3 + 0.009 x 2048) at K 2048)."""
    for plan in (cal.FULL, cal.QUICK):
        m = json.loads(json.dumps(synthetic(plan)))
        assert m["gemm_k"] == cal.GEMM_K and len(m["gemm_by_k"]) == len(plan.k_values) * len(plan.k_rows)
        prof = profile_from_dict(build_profile(m, base="h200", k_fixed_from=m))
        assert prof.gemm_k_fixed_share == pytest.approx(3.0 / (3.0 + 0.009 * cal.GEMM_K), abs=1e-4)
        assert "fixed 3.00 us per tile" in cal.format_summary(m)
    assert min(cal.FULL.k_values) < cal.GEMM_K < max(cal.FULL.k_values)


def test_quick_plan_is_also_a_valid_profile():
    build_profile(synthetic(cal.QUICK), base="h200")


def test_one_gpu_run_has_no_push_and_is_refused_clearly():
    m = synthetic(world=1)
    assert "nvlink_push" not in m
    assert "not measured" in cal.format_summary(m)
    with pytest.raises(CalibrationError, match="nvlink_push"):
        build_profile(m)


def test_failed_checks_are_printed():
    m = {**synthetic(), "failed_checks": ["push: rows from rank 1 differ"]}
    assert "CHECK FAILED: push: rows" in cal.format_summary(m)


def test_arguments():
    assert cal.plan_for(cal.parse_args([])) == cal.FULL
    assert cal.plan_for(cal.parse_args(["--quick"])) == cal.QUICK
    assert cal.plan_for(cal.parse_args(["--quick", "--repeats", "4"])).repeats == 4
    assert cal.parse_args(["--out", "x/y.json"]).out == Path("x/y.json")
    for bad in (["--repeats", "0"], ["--repeats", "1000"], ["--bogus"]):
        with pytest.raises(SystemExit):
            cal.parse_args(bad)


def test_sizes_and_arithmetic():
    assert cal.experts_for(64, 2048) == 128 and cal.experts_for(1024, 2048) == 16 and cal.experts_for(4096, 8) == 1
    for r in cal.FULL.gemm_rows:  # the GEMM buffers stay small enough to allocate next to a peer
        assert cal.experts_for(r, cal.FULL.gemm_tiles) * r * cal.GEMM_K * 2 <= 64 << 20
    assert cal.useful_tflops(1, 128, 1.0, n=1000, k=1000) == pytest.approx(2 * 128 * 1e6 / 1e9)
    assert cal.span_ns([10, 50, 5, 40, 99, 999], 2) == 45
    assert cal.FULL.push_blocks % 192 == 0  # every CTA count of the push curve divides the blocks evenly
    assert all(cal.FULL.push_blocks % c == 0 for c in cal.FULL.push_ctas)
    assert cal.FULL.push_blocks <= 1024  # kCalibMaxBlocks


def test_main_writes_the_json_rank0(tmp_path, monkeypatch, capsys):
    import weave_kernel.calib_runs as runs

    class FakeBench:
        rank = 0

        @classmethod
        def start(cls):
            return cls()

        def run(self, plan, commit):
            assert plan == cal.QUICK and commit == "abc"
            return synthetic(plan)

        def close(self):
            pass

    monkeypatch.setattr(runs, "Bench", FakeBench)
    out = tmp_path / "m.json"
    assert cal.main(["--quick", "--commit", "abc", "--out", str(out)]) == 0
    build_profile(json.loads(out.read_text()))
    assert "wrote" in capsys.readouterr().out


def test_commit_comes_from_the_environment_first(monkeypatch):
    monkeypatch.setenv("WEAVE_COMMIT", "abc123")
    assert cal.git_commit() == "abc123"
    monkeypatch.delenv("WEAVE_COMMIT")
    assert cal.git_commit() != "abc123"


def test_shipped_calibrated_profile_comes_from_the_committed_measurements(monkeypatch):
    """weave_sim/profiles/h200-calibrated.json = weave-sim calibrate docs/results/calib_2xh200_ws.json --base h200
    --decision TRACES (the weave traces its calibration.decision_from names, relative to the repository)."""
    from weave_sim.calibrate import with_decision
    from weave_sim.profile import load_profile

    monkeypatch.chdir(ROOT)
    m = json.loads((ROOT / "docs" / "results" / "calib_2xh200_ws.json").read_text())
    assert m["world"] == 2 and not m["failed_checks"] and m["commit"] != "unknown"
    shipped = load_profile("h200-calibrated").raw
    m = with_decision(m, shipped["calibration"]["decision_from"]["traces"])
    assert build_profile(m, base="h200", name="h200-calibrated") == shipped
    assert "nvlink_push" not in json.loads((ROOT / "docs" / "results" / "calib_1xh200_quick.json").read_text())


def test_build_compiles_the_calibration_launcher():
    assert "calib.cu" in build.SOURCES


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc not installed")
def test_calib_sources_compile_for_sm90a(tmp_path):
    r = subprocess.run(["nvcc", *build.CUDA_FLAGS, "-D__CUDA_NO_HALF_OPERATORS__", "-D__CUDA_NO_BFLOAT16_CONVERSIONS__",
                        "-Xptxas", "-v", "-c", str(CSRC / "calib.cu"), "-o", str(tmp_path / "calib.o")],
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    # the GEMM kernel uses the megakernel's tile: no serialised wgmma (C7510/C7518), no spills
    assert "C7510" not in r.stderr and "C7518" not in r.stderr and "serialized" not in r.stderr, r.stderr
    assert "calib_gemm_kernel" in r.stderr and " 0 bytes spill stores" in r.stderr, r.stderr
    assert "bytes spill stores" not in r.stderr.replace(" 0 bytes spill stores", ""), r.stderr


def _pybind_include():
    try:
        import pybind11
    except ImportError:
        return None
    return pybind11.get_include()


@pytest.mark.skipif(shutil.which("g++") is None or _pybind_include() is None, reason="needs g++ and pybind11")
def test_binding_compiles_with_the_calibration_entry_points():
    r = subprocess.run(["g++", "-std=c++17", "-fsyntax-only", f"-I{CSRC}", f"-I{_pybind_include()}",
                        f"-I{sysconfig.get_paths()['include']}", "-DTORCH_EXTENSION_NAME=weave_moe_ext",
                        str(CSRC / "binding.cpp")], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr


@pytest.mark.gpu
def test_quick_calibration_on_gpus(tmp_path):
    torch = pytest.importorskip("torch")
    nproc = min(torch.cuda.device_count(), 2)
    env = dict(os.environ, NCCL_NVLS_ENABLE="0", TORCH_SYMM_MEM_DISABLE_MULTICAST="1", NVSHMEM_DISABLE_NVLS="1")
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), env.get("PYTHONPATH", "")) if p)
    out = tmp_path / "calib.json"
    r = subprocess.run([sys.executable, "-m", "torch.distributed.run", f"--nproc_per_node={nproc}",
                        "-m", "weave_kernel.calibrate", "--quick", "--out", str(out)],
                       cwd=ROOT, env=env, capture_output=True, text=True, timeout=900)
    print(r.stdout[-5000:], r.stderr[-5000:])
    assert r.returncode == 0
    m = json.loads(out.read_text())
    assert not m["failed_checks"] and m["num_sms"] >= 100 and m["gemm_peak_tflops"] > 50
    if nproc >= 2:
        build_profile(m)
    else:
        assert "nvlink_push" not in m and m["signal_path"].startswith("two CTAs")

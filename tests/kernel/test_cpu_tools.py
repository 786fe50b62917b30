"""The kernel package's CPU tools (README: predict, whatif, gap, piece_cost, recount; and the host side of the choice)
run on a machine without torch, where `pip install -e .` installs only the simulator's dependencies."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
CPU_TOOLS = ("predict", "whatif", "gap", "piece_cost", "recount", "choice", "routing")


def test_cpu_tools_import_without_torch():
    # sys.modules["torch"] = None makes every `import torch` fail as it would without the package
    code = ("import importlib, sys; sys.modules['torch'] = None\n"
            f"for m in {CPU_TOOLS!r}: importlib.import_module('weave_kernel.' + m)\n"
            "from weave_kernel.choice import DEFAULT_COST_PROFILE; print(DEFAULT_COST_PROFILE)")
    r = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr[-3000:]
    assert r.stdout.strip() == "h200-megakernel"


def test_the_blocker_works():
    """The same harness does see a module that needs torch."""
    code = "import sys; sys.modules['torch'] = None\nimport weave_kernel.megakernel"
    r = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert r.returncode != 0 and "torch" in r.stderr


def test_pad_energy_report_reads_the_committed_run(capsys):
    """tests/kernel/pad_energy_report.py on the committed device call (docs/results/pad_energy/measured/): the
    calibration's padding energy and one row per tile_limits mode and zero-row count, each against its random-row
    twin."""
    import importlib.util

    root = Path(__file__).resolve().parents[2]
    spec = importlib.util.spec_from_file_location("pad_energy_report", root / "tests/kernel/pad_energy_report.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    d = root / "docs/results/pad_energy/measured"
    logs = sorted(d.glob("tile_*zero*.log"))
    assert mod.main([str(d / "calib_pad_1xh200.json"), *map(str, logs)]) == 0
    out = capsys.readouterr().out
    assert "pad_energy (median): 0.537" in out
    rows = [ln for ln in out.splitlines() if ln.strip().startswith("2048,")]
    assert len(rows) == 7  # decode shape: modes 7, 14, 17 at 124 zero rows; MoE shape: modes 7, 17 at 64 and 128
    assert all(0.0 < float(r.split()[-1]) < 1.0 for r in rows)
    log = mod.read_tile_log(d / "tile_decode_zero124.log")
    assert log["zero_rows"] == 124 and log["shape"] == (2048, 128, 128) and set(log["modes"]) == {7, 14, 17}


def test_device_scripts_parse():
    """Every one-call device script under tests/kernel parses (bash -n): a syntax error would cost device time."""
    import shutil

    import pytest

    if shutil.which("bash") is None:
        pytest.skip("no bash")
    root = Path(__file__).resolve().parents[2]
    scripts = sorted((root / "tests/kernel").glob("*.sh"))
    assert len(scripts) >= 10
    for sh in scripts:
        r = subprocess.run(["bash", "-n", str(sh)], capture_output=True, text=True, timeout=60)
        assert r.returncode == 0, f"{sh.name}: {r.stderr}"


def _load(name: str):
    """A script of tests/kernel as a module (its folder first on sys.path, as when it runs)."""
    import importlib.util

    sys.path.insert(0, str(ROOT / "tests/kernel"))
    try:
        spec = importlib.util.spec_from_file_location(name, ROOT / f"tests/kernel/{name}.py")
        mod = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(mod)
    finally:
        sys.path.pop(0)
    return mod


def test_harness_table_reads_the_committed_probe(capsys):
    """tests/kernel/harness_table.py on the committed harness call (docs/results/fp8_harness/): fp8_worker's BENCH
    lines with their clocks, bench's latencies and sustained times, and the ratios between them, as table.txt has
    them."""
    mod = _load("harness_table")
    d = ROOT / "docs/results/fp8_harness"
    worker = mod.worker_rows(str(d / "fp8_worker.log"))
    assert worker[("deepseek-v2", 2048, "weave", "fp8")] == (1.695, 1950.0)
    assert worker[("phi-3.5-moe", 2048, "static:8", "bf16")] == (1.317, 1980.0)
    bench = mod.bench_rows(str(d / "bench_fp8.json"))
    ms, mhz = bench[("deepseek-v2", 2048, "weave", "fp8", "bench")]
    assert abs(ms - 1.415) < 5e-4 and mhz == 1920.0
    assert mod.main([str(d / "fp8_worker.log"), str(d / "bench_fp8.json"), str(d / "bench_bf16.json")]) == 0
    out = capsys.readouterr().out
    assert out.splitlines()[1:] and "geomean fp8 bench / fp8_worker: 0.926 over 12" in out
    assert out == (d / "table.txt").read_text()
    # a line without clocks (fp8_worker without --gpu-state) parses too
    line = "BENCH m n=64 weave: bf16 1.000 / 1.100 ms, fp8 0.500 ms, 10 TFLOP/s, bf16 / fp8 2.000x"
    assert mod.LINE.match(line)[6] == "0.500" and mod.LINE.match(line)[8] is None


def test_fp8_table_check_runs_small(capsys):
    """tests/kernel/fp8_table_check.py on one model, one token count and one layer: both choices simulated, and the
    ratio of the two near 1 (what docs/results/fp8_table/check.txt shows for all of them)."""
    mod = _load("fp8_table_check")
    assert mod.main(["--models", "qwen3-30b-a3b", "--tokens", "2048", "--layers", "1"]) == 0
    out = capsys.readouterr().out
    ratio = float(out.split("t(bf16 table) / t(FP8 table)")[1].split()[0])
    assert 0.95 < ratio < 1.05 and "geomean" in out


def test_final_run_stops_in_time_and_keeps_what_it_measured(tmp_path):
    """final_run.sh (the two-GPU session's script) caps each step by what is left of the call and packs its results
    after every step: with torchrun replaced by a 60 s sleep and END_S=12, both benchmarks of run R are cut short
    (rc 124), the script ends well before the sleeps would, and the tarball holds both logs."""
    import shutil
    import tarfile
    import time

    import pytest

    if any(shutil.which(t) is None for t in ("bash", "timeout", "tar")):
        pytest.skip("needs bash, timeout and tar")
    stubs = tmp_path / "bin"
    stubs.mkdir()
    (stubs / "torchrun").write_text("#!/bin/bash\nsleep 60\n")
    (stubs / "nvidia-smi").write_text("#!/bin/bash\necho 'GPU 0: stub'\n")
    for f in stubs.iterdir():
        f.chmod(0o755)
    out = tmp_path / "out"
    out.mkdir()
    env = {"PATH": f"{stubs}:/usr/bin:/bin", "HOME": str(tmp_path), "OUT": str(out), "END_S": "12",
           "FINAL_STAGES": "none", "FINAL_RUNS": "R", "FINAL_MODELS": "qwen3-30b-a3b", "FINAL_TAG": "stub",
           "FINAL_RESULTS_DIR": str(tmp_path / "results"), "NPROC": "1"}
    t0 = time.monotonic()
    r = subprocess.run(["bash", "tests/kernel/final_run.sh"], cwd=ROOT, env=env, capture_output=True, text=True,
                       timeout=100)
    took = time.monotonic() - t0
    assert r.returncode == 0, r.stderr[-2000:]
    assert "bench_R_stub rc 124" in r.stdout and "bench_Rtrace_stub rc 124" in r.stdout, r.stdout
    assert took < 40, took
    with tarfile.open(out / "results_stub.tgz") as tar:
        names = {Path(n).name for n in tar.getnames()}
    assert {"bench_R_stub.log", "bench_Rtrace_stub.log", "stages.log"} <= names

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

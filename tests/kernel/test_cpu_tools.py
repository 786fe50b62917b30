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

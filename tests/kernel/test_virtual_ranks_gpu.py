"""GPU tests at world sizes 2, 3, 4 and 8 on one GPU: virtual ranks (weave_kernel/virtual.py) against the fp32
reference, in-kernel weave choices against weave_sim, error paths (see virtual_worker.py). Skipped without CUDA;
the CPU-side checks of the harness are in test_virtual_ranks.py."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]

ROOT = Path(__file__).resolve().parents[2]
WORKER = Path(__file__).resolve().parent / "virtual_worker.py"
FUZZ = Path(__file__).resolve().parent / "fuzz_worker.py"


def _run(*cmd: str) -> None:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), env.get("PYTHONPATH", "")) if p)
    r = subprocess.run([sys.executable, *cmd], cwd=ROOT, env=env, capture_output=True, text=True, timeout=1500)
    print(r.stdout[-20000:])
    print(r.stderr[-5000:], file=sys.stderr)
    assert r.returncode == 0, f"worker failed (rc {r.returncode})"
    assert "SUMMARY: 0 failures" in r.stdout


@pytest.mark.parametrize("dispatch", ["threads", "bulk"])
def test_virtual_ranks_worlds_2_3_4_8(dispatch):
    _run(str(WORKER), "--worlds", "2,3,4,8", "--dispatch", dispatch)


def test_random_layers():
    """Randomised geometry, world size, grid, routing and policies (fuzz_worker.py), a fresh seed each run."""
    _run(str(FUZZ), "--cases", "16", "--seed", str(int.from_bytes(os.urandom(2), "little")))

"""GPU tests: the megakernel against the fp32 reference on every preset geometry, skewed and degenerate routing,
repeated calls, bad input and a missing peer (see gpu_worker.py). Skipped without CUDA."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA GPUs")]

ROOT = Path(__file__).resolve().parents[2]
WORKER = Path(__file__).resolve().parent / "gpu_worker.py"


def _run_worker(nproc: int, *extra: str) -> str:
    env = dict(os.environ)
    env.update(NCCL_NVLS_ENABLE="0", TORCH_SYMM_MEM_DISABLE_MULTICAST="1", NVSHMEM_DISABLE_NVLS="1")
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), env.get("PYTHONPATH", "")) if p)
    cmd = [sys.executable, "-m", "torch.distributed.run", f"--nproc_per_node={nproc}", str(WORKER), *extra]
    r = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=1500)
    print(r.stdout[-20000:])
    print(r.stderr[-5000:], file=sys.stderr)
    assert r.returncode == 0, f"worker failed (rc {r.returncode})"
    assert "SUMMARY: 0 failures" in r.stdout
    return r.stdout


def test_megakernel_all_gpus():
    """All visible GPUs (up to 8), one process each."""
    _run_worker(min(torch.cuda.device_count(), 8))


def test_megakernel_world_size_one():
    _run_worker(1, "--quick")

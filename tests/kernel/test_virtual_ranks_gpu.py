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


def test_random_fp8_layers():
    """The same random layers as FP8 experts (fuzz_worker.py --fp8; shared experts included), a fresh seed each run."""
    _run(str(FUZZ), "--cases", "12", "--fp8", "--seed", str(int.from_bytes(os.urandom(2), "little")))


def test_virtual_ranks_free_their_memory_without_the_collector():
    """Dropping a VirtualRanks frees every rank's buffers at once: no reference cycle between the ranks (the fuzz
    worker ran out of GPU memory when connect() kept the peer layers themselves)."""
    import gc

    from weave_kernel.virtual import VirtualRanks
    from weave_sim.placement import contiguous

    def make():
        return VirtualRanks(4, hidden=1024, inter=512, num_experts=16, top_k=4, placement=contiguous(16, 4),
                            max_tokens=2048)

    make()  # a first one: what is built once per process (extension, cost tables) stays
    gc.collect()
    torch.cuda.synchronize()
    base = torch.cuda.memory_allocated()
    gc.disable()
    try:
        for _ in range(3):
            vr = make()
            assert torch.cuda.memory_allocated() > base
            del vr
            torch.cuda.synchronize()
            assert torch.cuda.memory_allocated() == base
    finally:
        gc.enable()

"""tests/kernel/epilogue_stats.py on a synthetic trace."""
from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest


def _ev(name, ts, dur, tid, rb=None):
    e = {"name": name, "ph": "X", "pid": 0, "tid": tid, "ts": ts, "dur": dur}
    if rb is not None:
        e["args"] = {"row_block": rb, "col_block_or_rank": 0}
    return e


def test_epilogue_shares(tmp_path, kernel_script):
    mod = kernel_script("epilogue_stats")
    ev = [_ev("gemm0", 0, 10, 0, 1), _ev("wait", 7, 3, 0, -9), _ev("wait", 6.5, 0.5, 0, -22),
          _ev("gemm1", 10, 4, 0, 1), _ev("wait", 13, 1, 0, -10), _ev("wait", 13, 0.0, 0, -23),
          _ev("gemm0", 0, 20, 1, 2), _ev("wait", 15, 5, 1, -9), _ev("wait", 2, 1.5, 1, 4)]  # a real wait: ignored
    p = tmp_path / "t.json"
    p.write_text(json.dumps({"traceEvents": ev}))
    s = mod.epilogue_stats(str(p))
    assert s["span_us"] == 20
    assert s["epilogue_share_of_sm_time"] == pytest.approx((3 + 1 + 5) / (20 * 2))
    assert s["gemm0"]["tiles"] == 2 and s["gemm0"]["epilogue_share_of_tile_time"] == pytest.approx(8 / 30)
    assert s["gemm0"]["epilogue_median_us"] == pytest.approx(4) and s["gemm0"]["warpgroup_skew_median_us"] == 0.5
    assert s["gemm1"]["epilogue_share_of_tile_time"] == pytest.approx(0.25)


def test_epilogue_steps(tmp_path, kernel_script):
    """The step records of tests/kernel/epilogue_steps.patch (row_block -10 s - kind) are summed per kind and step;
    the patch's plain epilogue records and real waits are not taken for steps."""
    mod = kernel_script("epilogue_stats")
    ev = [_ev("gemm0", 0, 10, 0, 1), _ev("wait", 5, 5, 0, -9), _ev("wait", 5, 2.5, 0, -32), _ev("wait", 7.5, 0.5, 0, -42),
          _ev("wait", 8, 1.0, 0, -52), _ev("wait", 9, 0.75, 0, -62), _ev("wait", 1, 2, 0, 3),
          _ev("gemm0", 10, 10, 0, 2), _ev("wait", 15, 5, 0, -9), _ev("wait", 15, 3.5, 0, -32),
          _ev("gemm1", 20, 4, 0, 1), _ev("wait", 23, 1, 0, -10)]
    p = tmp_path / "t.json"
    p.write_text(json.dumps({"traceEvents": ev}))
    s = mod.epilogue_stats(str(p))
    assert s["gemm0"]["steps_median_us"] == {"staging": 3.0, "stores": 0.5, "fence": 1.0, "signal": 0.75}
    assert s["gemm1"]["steps_median_us"] == {}
    assert s["gemm0"]["epilogue_median_us"] == 5
    assert mod.main([str(p)]) == 0


def test_gemm1_epilogue_steps(tmp_path, kernel_script):
    """The GEMM1 halves of tests/kernel/epilogue_gemm1_steps.patch: -33 / -43 the first half's staging and stores,
    -83 / -93 the second's, -63 the rest."""
    mod = kernel_script("epilogue_stats")
    ev = [_ev("gemm1", 0, 10, 0, 1), _ev("wait", 5, 5, 0, -10), _ev("wait", 5, 0.5, 0, -33), _ev("wait", 5.5, 1.5, 0, -43),
          _ev("wait", 7, 0.25, 0, -83), _ev("wait", 7.25, 1.75, 0, -93), _ev("wait", 9, 1.0, 0, -63)]
    p = tmp_path / "t.json"
    p.write_text(json.dumps({"traceEvents": ev}))
    s = mod.epilogue_stats(str(p))
    assert s["gemm1"]["steps_median_us"] == {"staging": 0.5, "stores": 1.5, "staging 2": 0.25, "stores 2": 1.75,
                                             "signal": 1.0}
    assert "gemm0" not in s


@pytest.mark.skipif(shutil.which("patch") is None, reason="no patch(1)")
@pytest.mark.parametrize("name", ["epilogue_timing.patch", "epilogue_gemm1_steps.patch"])
def test_timing_patches_apply_to_the_sources(tmp_path, name):
    """The in-layer timing patches still apply to the current kernel sources (docs/kernel.md's epilogue sections
    rerun them with tests/kernel/epilogue_run.sh)."""
    src = Path(__file__).resolve().parents[2] / "weave_kernel" / "csrc"
    dst = tmp_path / "csrc"
    shutil.copytree(src, dst)
    r = subprocess.run(["patch", "-s", "-d", str(dst), "-p3", "-i", str(Path(__file__).with_name(name))],
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "EXPERIMENT" in (dst / "tasks.cuh").read_text()


def test_steps_by_next_tile(tmp_path, kernel_script):
    """Each step record is classed by what its CTA does next: a tile within 1 us ('next'), a later one ('later'),
    none ('last'); records outside every tile are left out."""
    mod = kernel_script("epilogue_stats")
    ev = [_ev("gemm1", 0, 10, 0, 1), _ev("wait", 5, 1.5, 0, -43),      # next tile starts 0.5 us after this one
          _ev("gemm1", 10.5, 10, 0, 2), _ev("wait", 16, 2.0, 0, -43),  # next tile starts 9.5 us later
          _ev("gemm1", 30, 10, 0, 3), _ev("wait", 35, 1.0, 0, -43),    # last
          _ev("wait", 45, 9.0, 0, -43),                                # in no tile
          _ev("gemm1", 0, 10, 1, 1), _ev("wait", 4, 0.5, 1, -93)]      # another CTA: last
    p = tmp_path / "t.json"
    p.write_text(json.dumps({"traceEvents": ev}))
    s = mod.steps_by_next_tile(str(p))
    assert s[("gemm1", "stores", "next")] == (1.5, 1) and s[("gemm1", "stores", "later")] == (2.0, 1)
    assert s[("gemm1", "stores", "last")] == (1.0, 1) and s[("gemm1", "stores 2", "last")] == (0.5, 1)
    assert len(s) == 4
    assert mod.main(["--by-next-tile", str(p)]) == 0

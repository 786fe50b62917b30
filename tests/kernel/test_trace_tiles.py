"""tests/kernel/trace_tiles.py: median tile span of a Chrome trace and the TF/s per SM it means."""
from __future__ import annotations

import importlib.util
import json
from pathlib import Path


def _module():
    spec = importlib.util.spec_from_file_location("trace_tiles", Path(__file__).with_name("trace_tiles.py"))
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_trace_tiles_rates(tmp_path):
    events = [{"ph": "X", "name": "gemm0", "dur": d} for d in (10.0, 20.0, 30.0)]
    events += [{"ph": "X", "name": "gemm1", "dur": 5.0}, {"ph": "X", "name": "wait", "dur": 99.0}]
    path = tmp_path / "t.json"
    path.write_text(json.dumps({"traceEvents": events}))
    got = _module().tile_stats(str(path), hidden=1024, inter=512)
    assert got["gemm0"][0] == 3 and got["gemm0"][1] == 20.0
    assert abs(got["gemm0"][2] - 2 * 128 * 256 * 1024 / 20.0 / 1e6) < 1e-9  # 128 x 256 x K MACs per tile, us
    assert got["gemm1"][:2] == (1, 5.0)
    assert set(got) == {"gemm0", "gemm1"}  # waits are not tiles

"""tests/kernel/trace_tiles.py: median tile span of a Chrome trace and the TF/s per SM it means."""
from __future__ import annotations

import json
from pathlib import Path


def test_trace_tiles_rates(tmp_path, kernel_script):
    events = [{"ph": "X", "name": "gemm0", "dur": d} for d in (10.0, 20.0, 30.0)]
    events += [{"ph": "X", "name": "gemm1", "dur": 5.0}, {"ph": "X", "name": "wait", "dur": 99.0}]
    path = tmp_path / "t.json"
    path.write_text(json.dumps({"traceEvents": events}))
    got = kernel_script("trace_tiles").tile_stats(str(path), hidden=1024, inter=512)
    assert got["gemm0"][0] == 3 and got["gemm0"][1] == 20.0
    assert abs(got["gemm0"][2] - 2 * 128 * 256 * 1024 / 20.0 / 1e6) < 1e-9  # 128 x 256 x K MACs per tile, us
    assert got["gemm1"][:2] == (1, 5.0)
    assert set(got) == {"gemm0", "gemm1"}  # waits are not tiles


def test_trace_tiles_by_previous_tile(tmp_path, kernel_script):
    """Consecutive tiles of one track (pid, tid), in time order whatever the file's order; tracks kept apart."""
    ev = lambda name, ts, dur, tid: {"ph": "X", "name": name, "ts": ts, "dur": dur, "pid": 0, "tid": tid}
    events = [ev("gemm1", 30, 7.0, 1), ev("gemm0", 0, 20.0, 1), ev("wait", 25, 1.0, 1), ev("gemm1", 21, 9.0, 1)]
    events += [ev("gemm1", 0, 5.0, 2), ev("gemm1", 6, 6.0, 2), ev("gemm0", 100, 50.0, 3)]
    path = tmp_path / "t.json"
    path.write_text(json.dumps({"traceEvents": events}))
    got = kernel_script("trace_tiles").tiles_after(str(path))
    # track 1: gemm0 -> gemm1 (9) -> gemm1 (7); track 2: gemm1 -> gemm1 (6); track 3 has no pair
    assert got == {("gemm0", "gemm1"): (1, 9.0), ("gemm1", "gemm1"): (2, 6.5)}


def test_trace_vs_sim_tiles_on_a_committed_measurement(tmp_path, capsys, kernel_script):
    """trace_vs_sim_tiles.py on one of the committed EP=1 traces: the measured medians are the trace's, the
    simulated ones come from the bench file's counts, and with the power-model profile (gemm.k_fixed) each kind's
    simulated tile is within 25% of the measured one (docs/results/tile_k/trace_vs_sim_tiles_ep1.txt)."""
    import tarfile

    root = Path(__file__).resolve().parents[2]
    with tarfile.open(root / "docs/results/tile_k/traces_ep1_1xh200.tgz") as tar:
        member = tar.getmember("trace_qwen3-30b-a3b.json")
        assert member.isfile()
        (tmp_path / member.name).write_bytes(tar.extractfile(member).read())
    mod = kernel_script("trace_vs_sim_tiles")
    from weave_sim.profile import load_profile

    bench = root / "docs/results/tile_k/bench_ep1/bench_qwen3-30b-a3b.json"
    trace = tmp_path / "trace_qwen3-30b-a3b.json"
    got = mod.compare(str(bench), str(trace), load_profile("h200-megakernel-power-ep1"), "weave")
    assert got["model"] == "qwen3-30b-a3b" and (got["H"], got["I"]) == (2048, 768)
    for kind in ("gemm0", "gemm1"):
        assert got[kind]["measured_us"] == kernel_script("trace_tiles").tile_stats(str(trace), 2048, 768)[kind][1]
        assert 0.75 < got[kind]["simulated_us"] / got[kind]["measured_us"] < 1.25
    assert mod.main(["--profile", "h200-megakernel-power-ep1", str(bench), str(trace)]) == 0
    assert "qwen3-30b-a3b" in capsys.readouterr().out

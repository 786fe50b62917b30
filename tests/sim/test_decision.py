"""The cost of weave's in-kernel choice: measured from Chrome traces (weave-sim calibrate --decision / --amend), and
which SMs pay it in the engine's model of each kernel version (kernel_deciders)."""
import json

import numpy as np
import pytest

from weave_sim.calibrate import CalibrationError, amend_decision, build_profile, calibrate_file, decision_from_traces
from weave_sim.engine import simulate_layer, write_chrome_trace
from weave_sim.placement import contiguous
from weave_sim.presets import ModelPreset
from weave_sim.profile import load_profile, profile_from_dict
from weave_sim.validate import (KERNEL_DECIDERS, KERNEL_LAYOUT, KERNEL_OPTIONS, TABLE_DECIDER_SOURCES,
                                bench_results, kernel_options)
from weave_sim.workload import layer_workload, pairs_dispatched

from test_calibrate import MEAS


def _workload():
    model = ModelPreset("m", 1024, 512, 8, 2, 0, 1)
    ids = np.argsort(np.random.default_rng(5).random((2 * 512, 8)), axis=1)[:, :2]
    return pairs_dispatched(layer_workload(ids, model, contiguous(8, 2)))


def _profile(decision_ns: int):
    raw = json.loads(json.dumps(load_profile("h200-megakernel-ep2").raw))
    raw["fixed_ns"]["decision"] = decision_ns
    return profile_from_dict(raw, origin="test")


def _choose(trace_path) -> list[dict]:
    return [e for e in json.loads(trace_path.read_text())["traceEvents"] if e.get("name") == "choose"]


@pytest.mark.parametrize("deciders", ["table", "all"])
def test_decision_round_trip_through_a_simulated_trace(tmp_path, deciders):
    """A simulated weave trace's choose records give back the profile's decision cost; 'table' puts them on the
    max_comm_sms deciding SMs of each GPU, 'all' at the end of each GPU's count-exchange task (one record per GPU:
    that task runs on one SM, and every other SM waits for it)."""
    prof = _profile(7300)
    res = simulate_layer(_workload(), prof, "kernel:weave", record_timeline=True,
                         **{**KERNEL_OPTIONS, "kernel_deciders": deciders})
    path = write_chrome_trace(res, tmp_path / "t.json")
    ch = _choose(path)
    per_gpu = {g: len([e for e in ch if e["pid"] == g]) for g in (0, 1)}
    assert per_gpu == ({0: 64, 1: 64} if deciders == "table" else {0: 1, 1: 1})
    dec = decision_from_traces([path])
    assert dec["ns"] == pytest.approx(7300, abs=1) and dec["records"] == len(ch)


def test_every_sm_deciding_costs_the_layer_more():
    w = _workload()
    t = {d: simulate_layer(w, _profile(8000), "kernel:weave", **{**KERNEL_OPTIONS, "kernel_deciders": d}).latency_ns
         for d in ("table", "all")}
    cheap = simulate_layer(w, _profile(0), "kernel:weave", **{**KERNEL_OPTIONS, "kernel_deciders": "all"}).latency_ns
    assert t["all"] > t["table"] and t["all"] >= cheap + 7000  # every SM waits 8 us before its first task


def test_decision_from_traces_rejects_what_holds_no_choice(tmp_path):
    static = tmp_path / "s.json"
    static.write_text(json.dumps({"traceEvents": [{"ph": "X", "name": "gemm0", "pid": 0, "tid": 0, "ts": 0, "dur": 5}]}))
    with pytest.raises(CalibrationError, match="no 'choose' records"):
        decision_from_traces([static])
    with pytest.raises(CalibrationError, match="cannot read"):
        decision_from_traces([tmp_path / "missing.json"])
    with pytest.raises(CalibrationError, match="at least one"):
        decision_from_traces([])


def _kernel_trace(path, durs_us):
    ev = [{"ph": "X", "name": "choose", "pid": 0, "tid": i, "ts": 1.0, "dur": d} for i, d in enumerate(durs_us)]
    path.write_text(json.dumps({"traceEvents": ev}))
    return path


def test_measurements_and_amend_set_the_decision(tmp_path):
    tr = _kernel_trace(tmp_path / "k.json", [7.0, 8.0, 9.5])
    assert build_profile({**MEAS, "decision_ns": 8123.4})["fixed_ns"]["decision"] == 8123
    m = tmp_path / "m.json"
    m.write_text(json.dumps(MEAS))
    prof = calibrate_file(m, tmp_path / "p.json", decision_traces=[tr])
    assert prof["fixed_ns"]["decision"] == 8000 and prof["calibration"]["decision_from"]["records"] == 3
    assert any(x.startswith("decision") for x in prof["calibration"]["measured"])
    shipped = load_profile("h200-megakernel-ep2")
    out = amend_decision("h200-megakernel-ep2", [tr], tmp_path / "a.json")
    assert out["fixed_ns"]["decision"] == 8000 and out["version"].count("+decision") == 1
    assert out["version"].split("+")[0] == shipped.version.split("+")[0]
    rest = {k: v for k, v in out["fixed_ns"].items() if k != "decision"}
    assert rest == {k: v for k, v in shipped.fixed_ns.items() if k != "decision"}
    assert out["gemm"] == shipped.raw["gemm"] and out["nvlink"] == shipped.raw["nvlink"]


def test_amend_refuses_a_profile_fitted_to_weave(tmp_path):
    tr = _kernel_trace(tmp_path / "k.json", [8.0])
    raw = json.loads(json.dumps(load_profile("h200-megakernel-ep2").raw))
    raw["calibration"]["policies"] = ["static:8", "weave"]
    fitted = tmp_path / "f.json"
    fitted.write_text(json.dumps(raw))
    with pytest.raises(CalibrationError, match="refit"):
        amend_decision(fitted, [tr], tmp_path / "a.json")


def test_cli_amend(tmp_path, capsys):
    from weave_sim.cli import main

    tr = _kernel_trace(tmp_path / "k.json", [7.5, 7.7])
    assert main(["calibrate", "--amend", "h200-megakernel-ep2", "--decision", str(tr), "-o", str(tmp_path / "a.json")]) == 0
    assert "decision 7600 ns from 2 choose records" in capsys.readouterr().out
    assert main(["calibrate", "--amend", "h200-megakernel-ep2", "-o", str(tmp_path / "b.json")]) == 2
    assert "--decision" in capsys.readouterr().err


def test_results_name_their_deciders():
    r = {"kernel_layout": KERNEL_LAYOUT, "model": "m"}
    assert kernel_options(r)["kernel_deciders"] == "all"  # kernels before the choice left the critical path
    assert kernel_options({**r, "kernel_deciders": KERNEL_DECIDERS})["kernel_deciders"] == "table"
    with pytest.raises(ValueError, match="kernel_deciders"):
        kernel_options({**r, "kernel_deciders": "some"})
    dated = {"kernel_sources": {"main": sorted(TABLE_DECIDER_SOURCES)[0]}, "results": [r, {**r, "kernel_deciders": "all"}]}
    assert [x["kernel_deciders"] for x in bench_results(dated)] == ["table", "all"]
    assert [x["kernel_deciders"] for x in bench_results({"results": [r]})] == ["all"]


def test_decision_from_a_results_archive(tmp_path):
    """A device run's results_TAG.tgz: every JSON member with choose records counts, other JSON is skipped."""
    import tarfile

    _kernel_trace(tmp_path / "trace_a.json", [6.0, 8.0])
    _kernel_trace(tmp_path / "trace_b.json", [10.0])
    (tmp_path / "bench.json").write_text(json.dumps({"results": []}))
    (tmp_path / "broken.json").write_text("{not json")
    archive = tmp_path / "results_t.tgz"
    with tarfile.open(archive, "w:gz") as tar:
        for name in ("trace_a.json", "trace_b.json", "bench.json", "broken.json"):
            tar.add(tmp_path / name, arcname=f"./{name}")
    dec = decision_from_traces([archive])
    assert dec["ns"] == 8000 and dec["records"] == 3
    assert sorted(dec["median_ns_by_trace"]) == ["results_t.tgz:trace_a.json", "results_t.tgz:trace_b.json"]
    bad = tmp_path / "bad.tgz"
    bad.write_bytes(b"not an archive")
    with pytest.raises(CalibrationError, match="cannot read archive"):
        decision_from_traces([bad])


def test_shipped_ep1_profiles_charge_their_traces_decision():
    """The EP=1 refits name the archive of EP=1 weave traces they took the decision cost from, and it gives it."""
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    for name in ("h200-megakernel-ep1", "h200-megakernel-power-ep1"):
        raw = load_profile(name).raw
        src = raw["calibration"]["decision_from"]
        assert decision_from_traces([root / t for t in src["traces"]])["ns"] == src["ns"] == raw["fixed_ns"]["decision"]

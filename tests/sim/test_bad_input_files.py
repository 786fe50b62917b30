"""Bad input files and output paths: a clear error naming the file (and the field), never a traceback, a hang or a
silently wrong number. Output paths that are unusable, damaged npz traces, malformed Chrome trace events, unusable
kernel-benchmark latencies and measurement fields of the wrong type."""
import glob
import json
import struct
import zipfile
import zlib
from pathlib import Path

import numpy as np
import pytest

from weave_sim.calibrate import CalibrationError, calibrate_file, decision_from_traces, read_measurements
from weave_sim.cli import main
from weave_sim.engine.testing import simulated_bench_file
from weave_sim.profile import load_profile
from weave_sim.timeline_stats import busy_stats
from weave_sim.traces import RoutingTrace, TraceError, load_trace, save_trace

ROOT = Path(__file__).resolve().parents[2]
MODEL = "custom:E=8:k=2:H=256:I=256"
MEAS = {
    "gpu_name": "NVIDIA H200", "driver": "580", "date": "2026-11-30", "commit": "abc123", "num_sms": 132,
    "nvlink_push": [{"ctas": 1, "peers": 1, "gbs": 19.0}, {"ctas": 8, "peers": 1, "gbs": 150.0},
                    {"ctas": 32, "peers": 1, "gbs": 300.0}],
    "gemm": [{"ctas": 16, "rows_per_expert": 32, "tflops": 20.0}, {"ctas": 64, "rows_per_expert": 512, "tflops": 320.0}],
    "chunks": [{"chunks": 1, "time_ns": 1000.0}, {"chunks": 4, "time_ns": 1100.0}],
}


def _err(capsys) -> str:
    err = capsys.readouterr().err
    assert "Traceback" not in err
    return err


def _trace_file(path: Path, tokens: int = 2000) -> Path:
    ids = np.argsort(np.random.default_rng(0).random((tokens, 1, 8)), axis=2)[:, :, :2]
    return save_trace(path, RoutingTrace(ids, metadata={"model": MODEL}))


# --- 1. output paths ------------------------------------------------------------------------------------------------

def test_out_folder_that_is_a_file_fails_before_simulating(tmp_path, capsys, monkeypatch):
    import weave_sim.simcli as simcli

    def never(*a, **k):
        raise AssertionError("simulated although --out cannot be written")

    monkeypatch.setattr(simcli, "simulate_model", never)
    regular = tmp_path / "REG"
    regular.write_text("")
    for out in (regular, regular / "sub"):
        assert main(["simulate", "--model", MODEL, "--tokens", "64", "--gpus", "2", "--no-plots", "--quiet",
                     "--out", str(out)]) == 2
        err = _err(capsys)
        assert f"cannot write --out folder {out}" in err and "Not a directory" in err


@pytest.mark.parametrize("argv", [
    ["trace", "generate", "--kind", "uniform", "--model", MODEL, "--tokens", "64", "-o", "{dir}"],
    ["trace", "convert", "{trace}", "-o", "{dir}"],
    ["trace", "stats", "{trace}", "--json", "{dir}"],
    ["calibrate", "{meas}", "-o", "{dir}"],
    ["calibrate", "--fit", "{meas}", "-o", "{dir}"],
])
def test_output_file_that_is_a_folder_is_one_line(tmp_path, capsys, argv):
    folder = tmp_path / "D"
    folder.mkdir()
    meas = tmp_path / "m.json"
    meas.write_text(json.dumps(MEAS))
    names = {"dir": str(folder), "trace": str(_trace_file(tmp_path / "t.npz")), "meas": str(meas)}
    assert main([a.format(**names) for a in argv]) == 2
    err = _err(capsys)
    assert f"error: cannot write output file {folder}: Is a directory" in err


def test_writers_name_the_file_they_cannot_write(tmp_path):
    """The library functions behind the commands (without the CLI's check up front) raise an OSError naming the path."""
    from weave_sim.calibrate import write_amended

    folder = tmp_path / "D"
    folder.mkdir()
    with pytest.raises(OSError, match=f"cannot write trace file {folder}: Is a directory"):
        _trace_file(folder)
    assert not list(tmp_path.glob(".*.tmp"))
    meas = tmp_path / "m.json"
    meas.write_text(json.dumps(MEAS))
    with pytest.raises(OSError, match=f"cannot write profile {folder}"):
        calibrate_file(meas, folder)
    prof = json.loads(json.dumps(load_profile().raw))
    with pytest.raises(OSError, match=f"cannot write profile {folder}"):
        write_amended(prof, folder, None, "+x", "", "x", {}, "test")


def test_other_os_errors_are_one_line(tmp_path, capsys, monkeypatch):
    import weave_sim.cli as cli

    def denied(args):
        raise PermissionError(13, "Permission denied", str(tmp_path / "x.json"))

    monkeypatch.setattr(cli, "cmd_models", denied)
    assert main(["models"]) == 2
    assert f"weave-sim models: error: {tmp_path / 'x.json'}: Permission denied" in _err(capsys)


# --- 2. damaged npz traces ------------------------------------------------------------------------------------------

def _member_data_offset(raw: bytes, info: zipfile.ZipInfo) -> int:
    name_len, extra_len = struct.unpack("<HH", raw[info.header_offset + 26:info.header_offset + 30])
    return info.header_offset + 30 + name_len + extra_len


def _damaged(tmp_path: Path, how: str) -> Path:
    """A valid trace whose topk_ids member has its deflate stream broken ('deflate') or its CRC changed ('crc')."""
    good = _trace_file(tmp_path / "good.npz")
    raw = bytearray(good.read_bytes())
    with zipfile.ZipFile(good) as z:
        info = z.getinfo("topk_ids.npy")
    assert info.compress_type == zipfile.ZIP_DEFLATED
    if how == "deflate":  # the first block header turns into a stored block with mismatched lengths
        raw[_member_data_offset(raw, info)] = 0
    else:  # the CRC-32 in the local header and in the central directory
        raw[info.header_offset + 14] ^= 0xFF
        central = raw.find(b"topk_ids.npy", raw.find(b"PK\x01\x02")) - 46
        raw[central + 16] ^= 0xFF
    path = tmp_path / f"{how}.npz"
    path.write_bytes(bytes(raw))
    with zipfile.ZipFile(path) as z, pytest.raises(zlib.error if how == "deflate" else zipfile.BadZipFile):
        z.read("topk_ids.npy")  # what numpy's reader runs into
    return path


@pytest.mark.parametrize("how", ["deflate", "crc"])
def test_damaged_npz_member_is_a_trace_error(tmp_path, capsys, how):
    path = _damaged(tmp_path, how)
    with pytest.raises(TraceError, match=f"{path}: not a readable npz file"):
        load_trace(path)
    for argv in (["trace", "stats", str(path)], ["trace", "convert", str(path), "-o", str(tmp_path / "c.npz")]):
        assert main(argv) == 2, argv
        assert f"error: {path}: not a readable npz file" in _err(capsys), argv
    assert not (tmp_path / "c.npz").exists()


@pytest.mark.parametrize("member", ["topk_ids", "request_id"])
def test_unsigned_ids_beyond_int64_are_refused_not_wrapped(tmp_path, capsys, member):
    with np.load(_trace_file(tmp_path / "good.npz")) as z:
        arrays = {name: z[name] for name in z.files}
    arrays["request_id"] = np.zeros(arrays["topk_ids"].shape[0], dtype=np.uint64)
    arrays[member] = arrays[member].astype(np.uint64)
    arrays[member].flat[-1] = 2**63 + 5  # stored as int64 this would read as -9223372036854775803
    path = tmp_path / "u.npz"
    np.savez(path, **arrays)
    for argv in (["trace", "stats", str(path)], ["trace", "convert", str(path), "-o", str(tmp_path / "c.npz")]):
        assert main(argv) == 2, argv
        err = _err(capsys)
        assert f"{member} holds {2**63 + 5}" in err and "-9223372036854775803" not in err, argv


# --- 3. Chrome traces for timeline-stats and calibrate --decision ---------------------------------------------------

def _ev(**kw) -> dict:
    e = {"ph": "X", "pid": 0, "tid": 0, "name": "gemm0", "cat": "compute", "ts": 0.0, "dur": 10.0}
    e.update(kw)
    return {k: v for k, v in e.items() if v is not None}


@pytest.mark.parametrize("events, words", [
    ([_ev(dur=0.0)], "GPU 0's events span no time"),
    ([_ev(dur=None)], "GPU 0's events span no time"),
    ([_ev(tid=-1)], "event 0 ('gemm0') has tid -1: an SM index must be >= 0"),
    ([1, 2, 3], "event 0 is 1, not an object"),
    ([_ev(), _ev(args=5)], "event 1 ('gemm0') has args 5, not an object"),
    ([_ev(pid=None)], "event 0 ('gemm0') has no 'pid'"),
    ([_ev(ts="0")], "event 0 ('gemm0') has ts '0', not a finite number"),
    ([_ev(dur=-5.0)], "event 0 ('gemm0') has dur -5.0, not a finite number >= 0"),
])
def test_timeline_stats_refuses_unusable_events(tmp_path, capsys, events, words):
    path = tmp_path / "t.json"
    path.write_text(json.dumps({"traceEvents": events}))
    with pytest.raises(ValueError, match=f"{path}: "):
        busy_stats(path)
    assert main(["timeline-stats", str(path)]) == 2
    err = _err(capsys)
    assert f"weave-sim timeline-stats: error: {path}: " in err and words in err


def test_calibrate_decision_refuses_unusable_events(tmp_path, capsys):
    path = tmp_path / "t.json"
    path.write_text(json.dumps({"traceEvents": [1, 2]}))
    with pytest.raises(CalibrationError, match="event 0 is 1, not an object"):
        decision_from_traces([path])
    assert main(["calibrate", "--amend", "h200", "--decision", str(path), "-o", str(tmp_path / "p.json")]) == 2
    assert f"{path}: event 0 is 1, not an object" in _err(capsys)


def test_busy_time_with_negative_times_and_overlaps(capsys, tmp_path):
    """Negative timestamps keep the span; events overlapping on one SM count their union as busy time (the kernel
    records its choose inside its count_exchange), each kind keeps its own time."""
    st = busy_stats({"traceEvents": [_ev(ts=-10.0, dur=10.0)]})[0]
    assert st["span_us"] == 10.0 and st["busy_fraction"] == 1.0
    st = busy_stats({"traceEvents": [_ev(name="count_exchange", cat="comm", ts=0.0, dur=10.0),
                                     _ev(name="choose", cat="comm", ts=6.0, dur=4.0),
                                     _ev(ts=5.0, dur=10.0), _ev(tid=1, ts=0.0, dur=15.0)]})[0]
    assert st["span_us"] == 15.0 and st["busy_fraction"] == 1.0
    assert st["work_us_by_kind"] == {"count_exchange": 10.0, "choose": 4.0, "gemm0": 25.0}
    assert st["work_us_by_role"] == {"comm": 10.0, "compute": 25.0}
    path = tmp_path / "t.json"
    path.write_text(json.dumps({"traceEvents": [_ev(), _ev(name="gemm1")]}))
    assert main(["timeline-stats", str(path)]) == 0
    out = capsys.readouterr().out
    assert "100.0%" in out and "200.0%" not in out


# --- 4. kernel benchmark results ------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def bench_result(tmp_path_factory) -> dict:
    path = simulated_bench_file(tmp_path_factory.mktemp("b") / "b.json", load_profile(), 1024, 512, tokens=256)
    return json.loads(path.read_text())["results"][0]


def _set(r: dict, key: str, value) -> dict:
    r = json.loads(json.dumps(r))
    if value is KeyError:
        r.pop(key)
    else:
        r[key] = value
    return r


BAD_RESULTS = [
    (lambda r: _set(r, "latency_ms", {p: 0.0 for p in r["latency_ms"]}), "latency_ms['static:4'] is 0.0, not a finite"),
    (lambda r: _set(r, "latency_ms", {**r["latency_ms"], "static:24": float("nan")}), "latency_ms['static:24'] is nan"),
    (lambda r: _set(r, "latency_ms", {**r["latency_ms"], "static:24": -0.5}), "latency_ms['static:24'] is -0.5"),
    (lambda r: _set(r, "latency_ms", [1, 2]), "latency_ms must be an object"),
    (lambda r: _set(r, "counts", [1, 2]), "counts must be an object"),
    (lambda r: _set(r, "model", KeyError), "result 0 (?/256): has no 'model'"),
    (lambda r: _set(r, "hidden", "1024"), "hidden '1024' is not an integer >= 1"),
    (lambda r: _set(r, "weave_choice", [1]), "weave_choice must be an object"),
]


@pytest.mark.parametrize("bad, words", BAD_RESULTS)
def test_validate_refuses_unusable_results(tmp_path, capsys, bench_result, bad, words):
    path = tmp_path / "bench.json"
    path.write_text(json.dumps({"results": [bad(bench_result)]}))
    assert main(["validate", str(path), "--out", str(tmp_path / "o")]) == 2
    err = _err(capsys)
    assert f"error: {path}: result 0 (" in err and words in err
    assert not (tmp_path / "o" / "validate.json").exists()


@pytest.mark.parametrize("bad, words", [BAD_RESULTS[0], BAD_RESULTS[1], BAD_RESULTS[3]])
def test_calibrate_fits_refuse_unusable_results(tmp_path, capsys, bench_result, bad, words):
    """calibrate --fit and --half-tiles read the results through the same check (no ZeroDivisionError, no fit to
    NaN errors)."""
    from weave_sim.calibrate import amend_half_tile, fit_profile

    path = tmp_path / "bench.json"
    path.write_text(json.dumps({"results": [bad(bench_result)]}))
    with pytest.raises(CalibrationError, match=words.replace("[", r"\[").replace("]", r"\]")):
        fit_profile(path, log=lambda m: None)
    with pytest.raises(CalibrationError, match="result 0"):
        amend_half_tile("h200", path, tmp_path / "h.json", log=lambda m: None)
    out = tmp_path / "p.json"
    assert main(["calibrate", "--fit", str(path), "-o", str(out), "--workers", "1"]) == 2
    assert words in _err(capsys) and not out.exists()


def test_sustained_timings_are_checked_too(tmp_path, capsys, bench_result):
    from weave_sim.benchfile import read_bench

    path = tmp_path / "bench.json"
    good = {**bench_result, "sustained_ms": bench_result["latency_ms"]}
    path.write_text(json.dumps({"results": [{**good, "sustained_ms": [1.0]}]}))
    with pytest.raises(ValueError, match="sustained_ms must be an object"):
        read_bench(path, "sustained")
    path.write_text(json.dumps({"results": [{**good, "sustained_ms": {"static:4": 0.0}}]}))
    with pytest.raises(ValueError, match=r"latency_ms\['static:4'\] is 0.0"):
        read_bench(path, "sustained")


def test_shipped_benchmark_files_still_load():
    from weave_sim.benchfile import read_bench
    from weave_sim.validate import bench_results

    seen = 0
    for f in sorted(glob.glob(str(ROOT / "docs" / "results" / "**" / "*.json"), recursive=True)):
        data = json.loads(Path(f).read_text())
        results = data.get("results") if isinstance(data, dict) else None
        if not (isinstance(results, list) and results and all(isinstance(r, dict) and "latency_ms" in r
                                                               for r in results)):
            continue
        assert len(bench_results(read_bench(f), f)) == len(results), f
        if all(r.get("sustained_ms") for r in results):  # also the old per-rank sustained_gpu_state
            assert len(bench_results(read_bench(f, "sustained"), f)) == len(results), f
        seen += 1
    assert seen > 100


# --- 5. calibration measurements ------------------------------------------------------------------------------------

@pytest.mark.parametrize("broken, words", [
    ({"chunks": [{"chunks": 1, "time_ns": 100.0}, {"chunks": 2, "time_ns": 0}]}, "chunks[1]"),
    ({"chunks": [{"chunks": 1, "time_ns": 100.0}, {"chunks": 0, "time_ns": 50.0}]}, "chunks must be an integer >= 1"),
    ({"chunks": 0}, "chunks must be a list of points"),
    ({"gemm": "abc"}, "gemm must be a list of points"),
    ({"nvlink_push": [1, 2]}, "nvlink_push[0] is 1, not a point"),
    ({"nvlink_push": [{"ctas": "8", "gbs": 1.0}]}, "nvlink_push[0] ctas '8' is not a finite number"),
    ({"power": "x"}, "power must be an object"),
    ({"power": {"points": [{"ctas": 8, "tflops": "x"}]}}, "power.points[0] tflops 'x'"),
    ({"num_sms": "132"}, "num_sms '132' is not an integer >= 1"),
    ({"task_claim_ns": float("nan")}, "task_claim_ns nan"),
])
def test_calibrate_refuses_mistyped_measurements(tmp_path, capsys, broken, words):
    path = tmp_path / "m.json"
    path.write_text(json.dumps({**MEAS, **broken}))
    out = tmp_path / "p.json"
    with pytest.raises(CalibrationError) as exc:
        calibrate_file(path, out)
    assert str(exc.value).startswith(f"{path}: ") and words in str(exc.value)
    assert main(["calibrate", str(path), "-o", str(out)]) == 2
    assert f"error: {path}: " in _err(capsys) and not out.exists()


def test_chunk_efficiency_refuses_a_zero_time():
    from weave_sim.calibrate import chunk_efficiency

    with pytest.raises(CalibrationError, match="bad chunks point"):
        chunk_efficiency([{"chunks": 1, "time_ns": 100.0}, {"chunks": 2, "time_ns": 0.0}])


@pytest.mark.parametrize("flags", [["--fit", "{list}"], ["--amend", "h200", "--half-tiles", "{list}"],
                                   ["{meas}", "--piece-cost", "{list}"]])
def test_calibrate_refuses_a_json_list(tmp_path, capsys, flags):
    lst = tmp_path / "list.json"
    lst.write_text("[1, 2]")
    meas = tmp_path / "m.json"
    meas.write_text(json.dumps(MEAS))
    argv = ["calibrate", *[f.format(list=lst, meas=meas) for f in flags], "-o", str(tmp_path / "p.json")]
    assert main(argv) == 2
    assert f"error: {lst}" in _err(capsys)


def test_shipped_measurement_files_still_read():
    seen = 0
    for f in sorted(glob.glob(str(ROOT / "docs" / "results" / "**" / "*.json"), recursive=True)):
        data = json.loads(Path(f).read_text())
        if isinstance(data, dict) and any(k in data for k in ("nvlink_push", "gemm_by_k", "dispatch_piece_ns")):
            read_measurements(f)
            seen += 1
    assert seen >= 10

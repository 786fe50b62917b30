"""The benchmark's GPU-state record and interleaved timing, without a GPU: nvidia-smi lines parsed and summarised
per window, the sampler silent where nvidia-smi is missing, and the repetitions of several policies alternating."""
import pytest

from weave_kernel import gpu_state, symm
from weave_kernel.gpu_state import GpuStateSampler, decode_reasons, parse_sample, summarize


def test_parse_sample_reads_fields_and_rejects_garbage():
    s = parse_sample("1980, 412.35, 41, 0x0000000000000004\n")
    assert s == {"sm_mhz": 1980.0, "power_w": 412.35, "temp_c": 41.0, "reasons": 4}
    assert parse_sample("[N/A], 412.35, 41, 0x0") is None
    assert parse_sample("No devices were found") is None
    assert parse_sample("1980, 412.35, 41") is None


def test_decode_reasons_names_bits_and_keeps_unknown_ones():
    assert decode_reasons(0) == []
    assert decode_reasons(0x4 | 0x40) == ["sw_power_cap", "hw_thermal_slowdown"]
    assert decode_reasons(0x10000) == ["0x10000"]


def test_summarize_window_and_nearest_sample():
    mk = lambda mhz, w, reasons=0: {"sm_mhz": mhz, "power_w": w, "temp_c": 50.0, "reasons": reasons}  # noqa: E731
    samples = [(1.0, mk(1980, 300)), (2.0, mk(1755, 690, 0x4)), (3.0, mk(1830, 650, 0x1)), (9.0, mk(1400, 700))]
    s = summarize(samples, 1.5, 3.5)
    assert s["samples"] == 2 and s["sm_mhz_min"] == 1755 and s["power_w_max"] == 690
    assert s["event_reasons"] == ["sw_power_cap"]  # gpu_idle (0x1) is not a slowdown
    near = summarize(samples, 8.0, 8.5)  # no sample inside: the nearest one
    assert near["samples"] == 1 and near["sm_mhz_min"] == 1400
    assert summarize([], 0.0, 1.0) is None


def test_sampler_summary_names_the_gpu():
    s = GpuStateSampler("GPU-1234")
    assert s.summary(0.0, 1.0) is None
    s.samples.append((0.5, {"sm_mhz": 1980.0, "power_w": 300.0, "temp_c": 40.0, "reasons": 0}))
    got = s.summary(0.0, 1.0)
    assert got["gpu"] == "GPU-1234" and got["power_w_median"] == 300.0


def test_sampler_records_nothing_without_nvidia_smi(monkeypatch):
    monkeypatch.setattr(gpu_state.shutil, "which", lambda name: None)
    s = GpuStateSampler("0").start()
    assert s.reason_field is None and s.summary(0.0, 1e12) is None
    s.stop()


def test_interleaved_timing_alternates_and_takes_medians(monkeypatch):
    calls, seen = [], []
    ticks = {"a": iter([5.0, 1.0, 3.0]), "b": iter([2.0, 9.0, 4.0])}

    def fake_time(fn, warmup, repeats, calls_per_rep, before=None):
        assert (warmup, repeats) == (1, 1)
        name = fn()
        seen.append(name)
        return next(ticks[name])

    monkeypatch.setattr(symm, "cuda_time_ms", fake_time)
    fns = {"a": lambda: calls.append("a") or "a", "b": lambda: calls.append("b") or "b"}
    out = symm.interleaved_time_ms(fns, warmup=2, repeats=3, calls=4)
    assert calls[:4] == ["a", "a", "b", "b"]  # warm-up of each first
    assert seen == ["a", "b", "a", "b", "a", "b"]
    assert out == pytest.approx({"a": 3.0, "b": 4.0})


def test_alternating_rounds_cancel_a_bias_along_the_round(monkeypatch):
    """alternate=True: rounds forward and backward in turn (3 repeats -> 4 rounds), the median of pair means; a
    function timed later in a round, which runs slower by its place, gets no advantage from coming first."""
    import itertools

    from weave_kernel import symm

    place = itertools.count()
    seen = []

    def fake_time(fn, warmup, repeats, calls_per_rep, before=None):
        name = fn()
        seen.append(name)
        return {"a": 10.0, "b": 10.0, "c": 12.0}[name] + (next(place) % 3)  # +0, +1, +2 by place in the round

    monkeypatch.setattr(symm, "cuda_time_ms", fake_time)
    fns = {k: (lambda k=k: k) for k in "abc"}
    out = symm.interleaved_time_ms({k: f for k, f in fns.items()}, warmup=0, repeats=3, alternate=True)
    assert seen == list("abc" "cba" "abc" "cba")
    assert out == pytest.approx({"a": 11.0, "b": 11.0, "c": 13.0})  # equal places, equal bias
    place = itertools.count()
    plain = symm.interleaved_time_ms(fns, warmup=0, repeats=3)
    assert plain == pytest.approx({"a": 10.0, "b": 11.0, "c": 14.0})  # the fixed order favours the first
    with pytest.raises(ValueError, match="repeats >= 1"):
        symm.interleaved_time_ms(fns, warmup=0, repeats=0, alternate=True)


def test_shuffled_rounds_time_every_function_once_per_round_in_a_seeded_order(monkeypatch):
    """shuffle_seed: every round a permutation of the functions, the same for the same seed (every rank draws the
    same orders), not one fixed order; each figure the median over rounds; alternate and shuffle exclude each other."""
    from weave_kernel import symm

    seen = []

    def fake_time(fn, warmup, repeats, calls_per_rep, before=None):
        name = fn()
        seen.append(name)
        return {"a": 1.0, "b": 2.0, "c": 3.0, "d": 4.0, "e": 5.0}[name] + 0.1 * (len(seen) % 5)

    monkeypatch.setattr(symm, "cuda_time_ms", fake_time)
    fns = {k: (lambda k=k: k) for k in "abcde"}
    out = symm.interleaved_time_ms(fns, warmup=0, repeats=6, shuffle_seed=3)
    rounds = [seen[i:i + 5] for i in range(0, 30, 5)]
    assert all(sorted(r) == list("abcde") for r in rounds)
    assert len({tuple(r) for r in rounds}) > 1
    for k, base in zip("abcde", (1.0, 2.0, 3.0, 4.0, 5.0)):  # the median of the six rounds' times
        t = sorted(base + 0.1 * ((i + 1) % 5) for i, n in enumerate(seen) if n == k)
        assert out[k] == pytest.approx((t[2] + t[3]) / 2)
    first = list(seen)
    seen.clear()
    symm.interleaved_time_ms(fns, warmup=0, repeats=6, shuffle_seed=3)
    assert seen == first
    with pytest.raises(ValueError, match="exclude"):
        symm.interleaved_time_ms(fns, warmup=0, repeats=2, alternate=True, shuffle_seed=1)


def test_sustained_calls_fill_the_window_and_agree(monkeypatch):
    import torch

    monkeypatch.setattr(symm, "cuda_time_ms", lambda fn, w, r, c=1, before=None: 2.0)  # 2 ms per call
    monkeypatch.setattr(torch.cuda, "synchronize", lambda *a, **k: None)
    assert gpu_state.sustained_calls(lambda: None, 1.0) == 500
    assert gpu_state.sustained_calls(lambda: None, 0.001) == 4  # at least 4
    # ranks agree on the largest count (the benchmark passes an all-reduce MAX)
    assert gpu_state.sustained_calls(lambda: None, 1.0, agree=lambda n: max(n, 731)) == 731


def test_sustained_times_run_forward_then_reverse(monkeypatch):
    from types import SimpleNamespace

    from weave_kernel import bench_timing as bench

    order, drift = [], iter(range(100))
    monkeypatch.setattr(bench, "sustained_calls", lambda fn, s, agree: 10)
    monkeypatch.setattr(bench, "sustained_ms", lambda fn, s, idle_s, calls: (fn() + next(drift), 0.0, 1.0))
    monkeypatch.setattr(bench, "max_over_ranks", lambda v: v)
    monkeypatch.setattr(bench.dist, "barrier", lambda: None)
    fns = {"a": lambda: order.append("a") or 10.0, "b": lambda: order.append("b") or 20.0}
    out = bench.sustained_times(fns, SimpleNamespace(sustained=1.0), world=1)
    assert order == ["a", "b", "b", "a"]
    # a steady drift of +1 per measurement cancels: a = 10 + (0 + 3) / 2, b = 20 + (1 + 2) / 2
    assert out["sustained_ms"] == {"a": 11.5, "b": 21.5}
    assert out["sustained_ms_passes"] == {"a": [10.0, 13.0], "b": [21.0, 22.0]}


def test_for_device_falls_back_to_the_index(monkeypatch):
    import types

    import torch

    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda dev: types.SimpleNamespace(uuid="abcd"))
    monkeypatch.setattr(gpu_state.shutil, "which", lambda name: None)  # nvidia-smi answers nothing
    s = GpuStateSampler.for_device(torch.device("cuda", 3))
    assert s.ident == "3" and s.reason_field is None and s.summary(0.0, 1.0) is None


def test_start_is_idempotent(monkeypatch):
    s = GpuStateSampler("0")
    s._proc = object()  # as if started: a second start must not launch another nvidia-smi
    def forbidden(*a, **k):
        raise AssertionError("a started sampler queried nvidia-smi again")

    monkeypatch.setattr(gpu_state.shutil, "which", lambda name: "/usr/bin/nvidia-smi")
    monkeypatch.setattr(gpu_state.subprocess, "run", forbidden)
    monkeypatch.setattr(gpu_state.subprocess, "Popen", forbidden)
    assert s.start() is s

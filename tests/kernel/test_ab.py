"""bench --ab-csrc pieces that run without a GPU: the other build's name and its missing-sources error, and the
interleaved A/B summary."""
from __future__ import annotations

from pathlib import Path

import pytest
import torch

from weave_kernel.bench import parse_args
from weave_kernel.bench_report import (ab_summary, format_weave_table, graph_summary, ratio, sustained_geomeans,
                                       weave_geomeans)
from weave_kernel.build import CSRC, load_extension, other_name


def test_other_build_has_its_own_module_name_and_needs_sources(tmp_path):
    assert other_name(CSRC) != "weave_moe_ext" and other_name(CSRC).startswith("weave_moe_ext_")
    assert other_name(CSRC) == other_name(Path(str(CSRC)))
    assert other_name(tmp_path) != other_name(CSRC)
    with pytest.raises(FileNotFoundError, match="binding.cpp"):
        load_extension(csrc=tmp_path)


def test_ab_summary_geomean_and_worst_error():
    rows = [{"ab": {"weave": {"a_over_b": 1.21, "b_rel_err_vs_reference": 5e-3},
                    "static:20": {"a_over_b": 1.0, "b_rel_err_vs_reference": 4e-3}}},
            {"ab": {"weave": {"a_over_b": 1 / 1.1, "b_rel_err_vs_reference": 6e-3}}},
            {"latency_ms": {}}]
    text = ab_summary(rows)
    weave = next(line for line in text.splitlines() if "weave" in line)
    assert "1.049x over 2 configs" in weave  # sqrt(1.21 / 1.1)
    assert "0.909-1.210" in weave and "6.0e-03" in weave
    assert "1.000x over 1 configs" in next(line for line in text.splitlines() if "static:20" in line)


def test_ab_summary_adds_the_sustained_ratio_where_measured():
    rows = [{"ab": {"weave": {"a_over_b": 1.0, "b_rel_err_vs_reference": 5e-3, "a_over_b_sustained": 1.04}}},
            {"ab": {"weave": {"a_over_b": 1.0, "b_rel_err_vs_reference": 5e-3, "a_over_b_sustained": 1.0}}},
            {"ab": {"static:20": {"a_over_b": 1.0, "b_rel_err_vs_reference": 5e-3}}}]
    lines = ab_summary(rows).splitlines()
    sust = [line for line in lines if "sust." in line]
    assert len(sust) == 1 and "weave sust." in sust[0] and "1.020x over 2 configs" in sust[0]  # sqrt(1.04)
    assert "1.000-1.040" in sust[0]


def test_ab_sustained_times_alternate_a_b_b_a(monkeypatch):
    """--ab-sustained: each version alone for the window, A B B A, the mean of its two windows, slowest rank."""
    from weave_kernel import bench_timing as bench

    seen = []
    ms = {"a": iter([1.0, 1.2]), "b": iter([2.0, 2.4])}

    def fake_sustained(fn, seconds, idle_s, calls):
        assert (seconds, idle_s, calls) == (1.5, 0.5, 7)
        name = fn()
        seen.append(name)
        return next(ms[name]), 0.0, 0.0

    monkeypatch.setattr(bench, "sustained_ms", fake_sustained)
    monkeypatch.setattr(bench, "sustained_calls", lambda fn, s, agree: 7)
    monkeypatch.setattr(bench, "max_over_ranks", lambda v: v)
    monkeypatch.setattr(bench.dist, "barrier", lambda: None)
    out = bench.ab_sustained_times({"a": lambda: "a", "b": lambda: "b"}, 1.5)
    assert seen == list("abba")
    assert out["a_sustained_ms"] == pytest.approx(1.1) and out["b_sustained_ms"] == pytest.approx(2.2)
    assert out["a_over_b_sustained"] == pytest.approx(0.5)


def test_graph_summary_geomean_and_host_time():
    rows = [{"graph_speedup": {"weave": 1.05, "static:8": 1.0}, "host_us_per_call": {"weave": 60.0, "static:8": 50.0}},
            {"graph_speedup": {"weave": 1 / 1.05}, "host_us_per_call": {"weave": 80.0}},
            {"latency_ms": {}}]
    lines = graph_summary(rows).splitlines()
    weave = next(line for line in lines if "weave" in line)
    assert "1.000x over 2 configs" in weave and "0.952-1.050" in weave and "70 us" in weave
    assert "50 us" in next(line for line in lines if "static:8" in line)


def test_placement_option():
    assert parse_args([]).placement == "contiguous" and parse_args(["--placement", "balanced"]).placement == "balanced"
    with pytest.raises(SystemExit):
        parse_args(["--placement", "round-robin"])


def test_cuda_graph_option_takes_three_modes():
    assert parse_args([]).cuda_graph == "off"
    assert parse_args(["--cuda-graph", "ab"]).cuda_graph == "ab"
    with pytest.raises(SystemExit):
        parse_args(["--cuda-graph", "yes"])


@pytest.mark.parametrize("argv, match", [
    (["--ab-csrc", "x", "--ab-cost-profile", "h200"], "give one"),
    (["--ab-cost-profile", "no-such-profile"], "no hardware profile"),
    (["--models", "qwen3-30b-a3b,custom:E=4"], "needs k, H, I"),
    (["--models", "gpt-9"], "unknown model"),
])
def test_ab_cost_profile_options_fail_before_touching_a_gpu(argv, match):
    from weave_kernel.bench import main

    with pytest.raises(SystemExit, match=match):
        main(argv)


def test_weave_summary_without_static20_or_a_sweep():
    """A run without static:20 or a weave:C sweep (the A/B runs) says n/a and -, not nanx and nan."""
    row = {"model": "m", "tokens_per_gpu": 4096, "latency_ms": {"reference": 1.0, "static:8": 0.5, "weave": 0.4},
           "best_static": "static:8", "weave_vs_best_static": 1.25, "weave_vs_static20": None,
           "weave_vs_reference": 2.5, "speedup_best_static": 2.0, "weave_fraction_of_lower_bound": 0.5,
           "weave_choice": {"kernel": [{"c_star": 1, "k_star": 1}], "agrees": [True]}}
    g = weave_geomeans([row])
    assert ratio(g["all"]["weave_vs_static20"]) == "n/a" and ratio(g["all"]["weave_vs_best_static"]) == "1.250x"
    assert g["all"]["best_single_static"] == "static:8" and ratio(g["all"]["weave_vs_best_single_static"]) == "1.250x"
    assert g["weave_fraction_of_lower_bound_4096_mean"] == 0.5 and g["choice_agreement"] == "1/1"
    line = format_weave_table([row]).splitlines()[1]
    assert "nan" not in line and line.split()[7:9] == ["-", "-"]  # best weave:C and its ms


def test_sustained_summary_from_the_sustained_times():
    """bench --sustained: weave against the other policies on the back-to-back times, not the bench-style ones."""
    def row(tokens, sus, lb=1.0):
        return {"model": "m", "tokens_per_gpu": tokens, "lower_bound_ms": lb, "sustained_ms": sus,
                "latency_ms": {"reference": 9.0, "static:8": 9.0, "static:20": 9.0, "weave": 1.0}}

    rows = [row(4096, {"reference": 4.0, "static:8": 2.2, "static:20": 2.4, "weave": 2.0}),
            row(2048, {"reference": 2.5, "static:8": 0.9, "static:20": 1.1, "weave": 1.0}),
            row(8192, {"static:8": 4.0, "weave": 4.0})]  # no static:20 or reference here
    g = sustained_geomeans(rows)
    assert g["points"] == 3
    assert g["weave_vs_static20"] == pytest.approx((1.2 * 1.1) ** 0.5)
    assert g["weave_vs_reference"] == pytest.approx((2.0 * 2.5) ** 0.5)
    assert g["weave_vs_best_static"] == pytest.approx((1.1 * 0.9 * 1.0) ** (1 / 3))
    assert g["weave_vs_best_static_worst"] == pytest.approx(0.9)
    assert g["weave_fraction_of_lower_bound_4096_mean"] == pytest.approx(0.5)
    assert sustained_geomeans([{**rows[0], "sustained_ms": None}]) is None  # a run without --sustained
    assert "sustained" not in weave_geomeans([{**rows[0], "sustained_ms": None, "weave_vs_best_static": 1.0,
                                              "weave_vs_static20": 1.0, "weave_vs_reference": 1.0,
                                              "speedup_best_static": 1.0}])


def test_tables_keep_their_columns_for_long_model_specs():
    """A model spec is longer than a preset name: the model column widens instead of running into the next."""
    row = {"model": "custom:E=32:k=4:H=1024:I=512:layers=2", "tokens_per_gpu": 4096,
           "latency_ms": {"reference": 1.0, "static:8": 0.5, "weave": 0.4}, "best_static": "static:8",
           "weave_vs_best_static": 1.25, "weave_vs_static20": None, "weave_vs_reference": 2.5,
           "speedup_best_static": 2.0, "weave_fraction_of_lower_bound": 0.5,
           "weave_choice": {"kernel": [{"c_star": 1, "k_star": 1}], "agrees": [True]}}
    head, line = format_weave_table([row]).splitlines()
    assert line.split()[:2] == [row["model"], "4096"]
    assert line.index("4096") + 4 == head.index("tok/GPU") + len("tok/GPU")  # right-aligned under its header


@pytest.mark.skipif(torch.cuda.is_available(), reason="on a GPU machine this would start the benchmark")
def test_bench_without_cuda_says_so():
    from weave_kernel.bench import main

    with pytest.raises(SystemExit, match="needs CUDA GPUs"):
        main(["--models", "qwen3-30b-a3b", "--tokens", "128"])


def test_expert_dtype_option_and_header():
    """--expert-dtype: bf16 (the default) or fp8, named in the run's header; anything else is refused by argparse."""
    from weave_kernel.bench_report import run_header
    from weave_kernel.routing import spec_from_args

    def parsed(argv):
        args = parse_args(argv)
        args.spec = spec_from_args(args)  # as main() sets it
        return args

    assert parse_args([]).expert_dtype == "bf16"
    args = parsed(["--expert-dtype", "fp8"])
    assert args.expert_dtype == "fp8"
    assert "fp8 experts" in run_header(args, 2, "H200") and ", bf16," not in run_header(args, 2, "H200")
    assert ", bf16," in run_header(parsed([]), 2, "H200")
    with pytest.raises(SystemExit):
        parse_args(["--expert-dtype", "fp16"])


@pytest.mark.parametrize("fp8", [False, True])
def test_bench_shared_weights_match_the_layers_dtype(fp8):
    """bench --shared with --expert-dtype fp8 gave the FP8 layer bf16 shared weights (refused at the first call):
    shared_weights gives an FP8 layer (e4m3, scales) pairs and the reference their bf16 values."""
    from weave_kernel import fp8 as f8
    from weave_kernel.bench import shared_weights
    from weave_kernel.validate import check_shared_weights

    H, Is = 256, 384
    kern, ref = shared_weights(H, Is, fp8, "cpu", torch.Generator().manual_seed(0))
    check_shared_weights(*kern, hidden=H, inter_shared=Is, device="cpu", fp8=fp8)
    check_shared_weights(*ref, hidden=H, inter_shared=Is, device="cpu")
    if not fp8:
        assert kern is ref
        return
    for (q, s), r in zip(kern, ref):
        assert torch.equal(f8.dequant_weight(q, s).to(torch.bfloat16), r)
    w = shared_weights(H, Is, False, "cpu", torch.Generator().manual_seed(0))[0]  # the same draw, unquantized
    assert all(0 < float((r.float() - b.float()).norm() / b.float().norm()) < 0.05 for r, b in zip(ref, w))


def test_bench_lower_bound_of_fp8_experts():
    """FP8 results carry their own bound (e4m3 bytes, FP8 peak) beside the bf16 one they are judged by."""
    import numpy as np

    from weave_kernel.bench import lower_bound
    from weave_sim.placement import contiguous
    from weave_sim.presets import get_model

    m = get_model("qwen3-30b-a3b")
    ids = np.argsort(np.random.default_rng(0).random((2 * 512, m.num_experts)), axis=1)[:, :m.top_k]
    lb, vol = lower_bound(ids, m, contiguous(m.num_experts, 2))
    lb_again, vol8 = lower_bound(ids, m, contiguous(m.num_experts, 2), expert_dtype="fp8")
    assert "fp8_bound_ms" not in vol and lb_again == lb
    assert lb / 2 <= vol8["fp8_bound_ms"] < lb


def test_ab_times_alternates_which_version_goes_first(monkeypatch):
    """bench.ab_times: B checked once against the reference, then A and B timed in rounds A-B, B-A, ... (repeats
    rounded up to even), each figure the median over round pairs of the pair's mean, so neither version always
    runs right after the other's calls."""
    from types import SimpleNamespace

    import torch

    from weave_kernel import bench_timing as bench, symm

    order = []

    class Fake:
        def __init__(self, name, y):
            self.name, self.y = name, y

        def __call__(self, *inputs, policy, check=True):
            order.append((self.name, check))
            return self.y

        def raise_if_error(self):
            pass

    ms = {"a": iter([1.0, 1.2, 1.1, 1.3]), "b": iter([2.0, 2.2, 2.1, 2.3])}

    def fake_time(fn, warmup, repeats, calls, before=None):
        assert (warmup, repeats, calls) == (1, 1, 4) and before is bench.sync_ranks
        fn()
        return next(ms[order[-1][0]])

    monkeypatch.setattr(symm, "cuda_time_ms", fake_time)
    monkeypatch.setattr(bench, "max_over_ranks", lambda v: v)
    y = torch.ones(4)
    out = bench.ab_times(Fake("a", y), Fake("b", 2 * y), "static:8", (), y, SimpleNamespace(repeats=3, calls_per_rep=4))
    assert order[0] == ("b", True)  # the checked call of B
    assert [n for n, _ in order[1:]] == list("abbaabba")
    # pair means (1.0 + 1.2) / 2 = 1.1 and (1.1 + 1.3) / 2 = 1.2, median 1.15; B the same plus 1
    assert out["a_ms"] == pytest.approx(1.15) and out["b_ms"] == pytest.approx(2.15)
    assert out["a_over_b"] == out["a_ms"] / out["b_ms"] and abs(out["b_rel_err_vs_reference"] - 1.0) < 1e-6


def test_ab_times_passes_the_shared_expert_to_both_versions(monkeypatch):
    """bench.ab_times with --shared: both versions' checked and timed calls get the shared expert's arguments."""
    from types import SimpleNamespace

    import torch

    from weave_kernel import bench_timing as bench, symm

    seen = []

    class Fake:
        def __init__(self, name):
            self.name = name

        def __call__(self, *inputs, policy, check=True, **kw):
            seen.append((self.name, check, kw))
            return torch.ones(4)

        def raise_if_error(self):
            pass

    def fake_time(fn, warmup, repeats, calls, before=None):
        fn()
        return 1.0

    monkeypatch.setattr(symm, "cuda_time_ms", fake_time)
    monkeypatch.setattr(bench, "max_over_ranks", lambda v: v)
    shared = {"shared": ("w13s", "w2s"), "shared_order": "last"}
    bench.ab_times(Fake("a"), Fake("b"), "weave:8", (), torch.ones(4), SimpleNamespace(repeats=2, calls_per_rep=4),
                   shared)
    assert {n for n, _, _ in seen} == {"a", "b"} and all(kw == shared for _, _, kw in seen)
    assert seen[0][:2] == ("b", True)

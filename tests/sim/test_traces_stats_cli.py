"""Trace statistics on a hand-checked example, the shipped profiles, and the `trace` CLI commands."""
import argparse
import json

import numpy as np
import pytest

from weave_sim.traces import (RoutingTrace, default_trace, expert_loads, format_stats_table, load_expert_load_profiles,
                              load_trace, token_reuse, trace_stats, zipf_exponent)
from weave_sim.traces.cli import add_trace_commands


def test_stats_on_a_tiny_known_example():
    # 4 tokens, 1 layer, top-2 of 4 experts. Loads: e0 4, e1 2, e2 1, e3 1 (mean 2).
    ids = np.array([[[0, 1]], [[0, 1]], [[0, 2]], [[3, 0]]])
    stats = trace_stats(ids, num_experts=4, request_id=np.array([0, 0, 0, 1]))
    layer = stats["layers"][0]
    assert expert_loads(ids, 4).tolist() == [[4, 2, 1, 1]]
    assert (layer["tokens"], layer["mean_load"], layer["max_load"], layer["min_load"]) == (4, 2.0, 4, 1)
    assert layer["max_over_mean"] == 2.0
    assert layer["cv"] == pytest.approx(np.std([4, 2, 1, 1]) / 2.0)
    # Pairs within a request: (t0,t1) share 2 of 2, (t1,t2) share 1 of 2; t3 starts a new request.
    assert layer["reuse"] == pytest.approx(0.75)
    # Without request ids t3 follows t2 and shares expert 0: (2 + 1 + 1) / 6.
    assert token_reuse(ids)[0] == pytest.approx(4 / 6)
    # Zipf slope through (log 1, log 4), (log 2, log 2), (log 3, log 1), (log 4, log 1).
    x, y = np.log([1, 2, 3, 4]), np.log([4, 2, 1, 1])
    assert layer["zipf_s"] == pytest.approx(-np.polyfit(x, y, 1)[0])
    assert stats["summary"]["reuse_by_chance"] == 0.5
    table = format_stats_table(stats)
    assert "max_over_mean" in table and "4 tokens" in table


def test_zipf_exponent_of_exact_power_law():
    loads = 1000.0 * np.arange(1, 33, dtype=float) ** -1.3
    assert zipf_exponent(np.random.default_rng(0).permutation(loads)[None])[0] == pytest.approx(1.3)
    assert zipf_exponent(np.full((1, 8), 5.0))[0] == pytest.approx(0.0)


def test_stats_of_the_shipped_subset_match_the_full_file_summary():
    stats = trace_stats(default_trace())
    summary = stats["summary"]
    # The full 102k-token file: max/mean 2.45 mean (2.00-3.60), reuse 0.44 (chance 0.125).
    assert 2.2 < summary["max_over_mean"]["mean"] < 2.7
    assert 0.38 < summary["reuse"]["mean"] < 0.50 and summary["reuse_by_chance"] == 0.125


def test_expert_load_profiles():
    profiles = load_expert_load_profiles()
    olmoe, mixtral = profiles["olmoe-1b-7b"], profiles["mixtral-8x7b"]
    assert olmoe.layer_idx == (0, 7, 15) and set(olmoe.domains) == {"arxiv", "book", "c4", "github", "wikipedia"}
    assert olmoe.counts["c4"].shape == (3, 64) and mixtral.counts["c4"].shape == (3, 8)
    assert np.all(olmoe.counts["c4"].sum(axis=1) == olmoe.tokens_per_domain * 8)
    skew = olmoe.counts["arxiv"].max(axis=1) / olmoe.counts["arxiv"].mean(axis=1)
    assert skew.max() > 7.0  # OLMoE is strongly skewed; Mixtral is not
    assert (mixtral.total_counts().max(axis=1) / mixtral.total_counts().mean(axis=1)).max() < 1.3


@pytest.fixture
def cli():
    parser = argparse.ArgumentParser(prog="weave-sim")
    add_trace_commands(parser.add_subparsers(dest="command", required=True))

    def run(*argv):
        args = parser.parse_args([str(a) for a in argv])
        return args.func(args)
    return run


def test_cli_generate_then_stats(cli, tmp_path, capsys):
    out = tmp_path / "gen.npz"
    assert cli("trace", "generate", "--kind", "zipf", "--model", "phi-3.5-moe", "--tokens", 300, "--seed", 3,
               "-o", out, "-p", "s=0.8") == 0
    trace = load_trace(out)
    assert trace.model == "phi-3.5-moe" and trace.topk_ids.shape == (300, 32, 2)
    assert trace.metadata["generator"] == "zipf" and trace.metadata["params"]["s"][0] == 0.8
    capsys.readouterr()
    assert cli("trace", "stats", out, "--json", tmp_path / "s.json") == 0
    printed = capsys.readouterr().out
    assert "phi-3.5-moe: 300 tokens, 32 layers" in printed
    saved = json.loads((tmp_path / "s.json").read_text())
    assert saved["num_tokens"] == 300 and len(saved["layers"]) == 32


def test_cli_generate_list_params_and_errors(cli, tmp_path, capsys):
    assert cli("trace", "generate", "--kind", "dirichlet", "--model", "mixtral-8x7b", "--tokens", 50,
               "-o", tmp_path / "d.npz", "-p", "alpha=0.5") == 0
    assert cli("trace", "generate", "--kind", "zipf", "--model", "mixtral-8x7b", "--tokens", 50,
               "-o", tmp_path / "bad.npz", "-p", "bogus=1") == 2
    assert "bogus" in capsys.readouterr().err
    assert cli("trace", "stats", tmp_path / "missing.npz") == 2
    assert "not found" in capsys.readouterr().err


def test_cli_convert_raw_npz_and_npy(cli, tmp_path, capsys):
    trace = default_trace().select(np.arange(200))
    raw = tmp_path / "raw.npz"  # shaped like the upstream file: int8 ids, extra keys, JSON strings
    np.savez(raw, topk_ids=trace.topk_ids.astype(np.int8), topk_probs=trace.topk_probs.astype(np.float16),
             request_id=trace.request_id.astype(np.int32), position=trace.position.astype(np.int32),
             requests=np.array(json.dumps([{"dataset": "x"}])),
             metadata=np.array(json.dumps({"model": "gpt-oss-20b", "source": "upstream", "license": "Apache-2.0"})))
    assert cli("trace", "convert", raw, "-o", tmp_path / "conv.npz") == 0
    assert "dropped keys requests" in capsys.readouterr().out
    converted = load_trace(tmp_path / "conv.npz")
    assert np.array_equal(converted.topk_ids, trace.topk_ids)
    assert np.array_equal(converted.topk_probs, trace.topk_probs)
    assert converted.metadata["source"] == "upstream" and converted.metadata["converted_from"] == "raw.npz"
    with np.load(tmp_path / "conv.npz") as data:
        assert "requests" not in data.files

    np.save(tmp_path / "ids.npy", trace.topk_ids)
    assert cli("trace", "convert", tmp_path / "ids.npy", "-o", tmp_path / "n.npz") == 2  # no model
    assert "no model" in capsys.readouterr().err
    assert cli("trace", "convert", tmp_path / "ids.npy", "-o", tmp_path / "n.npz", "--model", "gpt-oss-20b",
               "--source", "my lab", "--license", "CC-BY-4.0") == 0
    converted = load_trace(tmp_path / "n.npz")
    assert converted.metadata["license"] == "CC-BY-4.0" and converted.topk_probs is None
    bad = trace.topk_ids.copy()
    bad[0, 0, 0] = 40
    np.save(tmp_path / "bad.npy", bad)
    assert cli("trace", "convert", tmp_path / "bad.npy", "-o", tmp_path / "b.npz", "--model", "gpt-oss-20b") == 2
    assert "out of range" in capsys.readouterr().err and not (tmp_path / "b.npz").exists()


def test_routing_trace_properties():
    trace = RoutingTrace(np.zeros((3, 2, 1), np.int16), metadata={"model": "x"})
    assert (trace.num_tokens, trace.num_layers, trace.top_k, trace.model) == (3, 2, 1, "x")
    assert trace.topk_ids.dtype == np.int64
    assert RoutingTrace(np.zeros((3, 2, 1), np.int64)).model is None

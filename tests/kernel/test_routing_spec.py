"""weave_kernel.routing's RoutingSpec: what the kernel benchmark routes, recorded so that its layers can be rebuilt
(CPU only)."""
from __future__ import annotations

import argparse

import numpy as np
import pytest

from weave_kernel.recount import counts_for
from weave_kernel.routing import (RoutingSpec, add_routing_args, bench_routing, default_layers, parse_layers,
                                  rank_routing, result_routing, spec_from_args, spec_of_config)
from weave_sim.presets import get_model
from weave_sim.traces import DEFAULT_TRACE, routing_for


def _args(*argv):
    ap = argparse.ArgumentParser()
    add_routing_args(ap)
    return ap.parse_args(list(argv))


def test_default_is_the_per_rank_zipf_draw():
    spec = spec_from_args(_args())
    assert spec == RoutingSpec("zipf", zipf_s=1.0) and not spec.per_layer
    m = get_model("qwen3-30b-a3b")
    ids, w = rank_routing(spec, m, 2, 64, seed=5, rank=1)
    want, want_w = bench_routing(64, m.num_experts, m.top_k, seed=5, rank=1)
    assert np.array_equal(ids, want) and np.array_equal(w, want_w)
    # a results file before "routing" existed names only its Zipf exponent
    assert spec_of_config({"zipf": 1.3}) == RoutingSpec("zipf", zipf_s=1.3)
    assert default_layers(spec, 48) == [None]
    with pytest.raises(ValueError, match="no layers"):
        parse_layers("3", spec, 48)
    with pytest.raises(ValueError, match="no layers"):
        rank_routing(spec, m, 2, 64, seed=5, rank=1, layer=0)


def test_synthetic_ranks_are_slices_of_one_batch():
    spec = spec_from_args(_args("--synthetic", "fitted"))
    m = get_model("deepseek-v2-lite")
    world, n, seed = 3, 100, 2
    full = routing_for(m, world * n, synthetic="fitted", seed=seed * 100003 + n)
    for layer in (0, 13, m.num_moe_layers - 1):
        for r in range(world):
            ids, w = rank_routing(spec, m, world, n, seed=seed, rank=r, layer=layer)
            assert ids.dtype == np.int32 and ids.shape == (n, m.top_k)
            assert np.array_equal(ids, full[r * n:(r + 1) * n, layer])
            assert np.allclose(w.sum(axis=1), 1.0) and (w > 0).all()
    # layers differ (per-layer routing), and so do ranks
    a = rank_routing(spec, m, world, n, seed=seed, rank=0, layer=0)[0]
    assert not np.array_equal(a, rank_routing(spec, m, world, n, seed=seed, rank=0, layer=1)[0])
    assert not np.array_equal(a, rank_routing(spec, m, world, n, seed=seed, rank=1, layer=0)[0])


def test_generator_params_reach_the_generator():
    m = get_model("qwen3-30b-a3b")
    flat = spec_from_args(_args("--synthetic", "zipf", "-p", "imbalance=1.05"))
    skew = spec_from_args(_args("--synthetic", "zipf", "-p", "imbalance=4.0"))
    assert flat.params == {"imbalance": 1.05}

    def max_over_mean(spec):
        ids = np.concatenate([rank_routing(spec, m, 2, 4096, seed=0, rank=r, layer=0)[0] for r in range(2)])
        load = np.bincount(ids.ravel(), minlength=m.num_experts)
        return load.max() / load.mean()

    assert max_over_mean(flat) < 1.5 < 3.0 < max_over_mean(skew)


def test_trace_routing_and_its_record():
    spec = spec_from_args(_args("--routing-trace", "default", "--mode", "decode"))
    m = get_model("gpt-oss-20b")
    d = spec.to_dict()
    assert d["source"] == "trace" and d["mode"] == "decode" and len(d["trace_sha256"]) == 16
    assert spec_of_config({"routing": d, "seed": 0}) == spec
    full = routing_for(m, 2 * 64, trace=DEFAULT_TRACE, mode="decode", seed=1 * 100003 + 64)
    ids, _ = rank_routing(spec, m, 2, 64, seed=1, rank=1, layer=7)
    assert np.array_equal(ids, full[64:, 7])
    # the record names the file's digest: another file under that name is an error, not other routing
    with pytest.raises(ValueError, match="not the file"):
        spec_of_config({"routing": {**d, "trace_sha256": "0" * 16}})
    # a trace of another model is an error (the shipped trace is gpt-oss-20b's)
    with pytest.raises(Exception, match="gpt-oss-20b"):
        rank_routing(spec, get_model("qwen3-30b-a3b"), 2, 64, seed=1, rank=0, layer=0)


@pytest.mark.parametrize("argv, match", [
    (("--synthetic", "nope"), "unknown synthetic"),
    (("--synthetic", "zipf", "--routing-trace", "default"), "not both"),
    (("-p", "s=1.2"), "--synthetic only"),
    (("--synthetic", "zipf", "--zipf", "1.3"), "does not combine"),
    (("--routing-trace", "/nonexistent/trace.npz"), "not found"),
    (("--synthetic", "zipf", "-p", "novalue"), "KEY=VALUE"),
])
def test_bad_routing_options_are_clear_errors(argv, match):
    with pytest.raises(ValueError, match=match):
        spec_from_args(_args(*argv))


def test_layers():
    spec = RoutingSpec("synthetic", kind="fitted")
    assert default_layers(spec, 48) == [0, 16, 31, 47]
    assert default_layers(spec, 2) == [0, 1]
    assert parse_layers("", spec, 48) == [0, 16, 31, 47]
    assert parse_layers("all", spec, 5) == [0, 1, 2, 3, 4]
    assert parse_layers("3,7", spec, 48) == [3, 7]
    for bad in ("48", "-1", ","):
        with pytest.raises(ValueError, match="MoE layers lie in"):
            parse_layers(bad, spec, 48)
    m = get_model("qwen3-30b-a3b")
    with pytest.raises(ValueError, match="must lie in"):
        rank_routing(spec, m, 2, 8, seed=0, rank=0, layer=48)
    with pytest.raises(ValueError, match="must lie in"):
        rank_routing(spec, m, 2, 8, seed=0, rank=0, layer=None)


def test_results_rebuild_their_layer():
    """recount (and whatif, validate through the counts) rebuild a per-layer result's routing from the file."""
    cfg = {"seed": 4, "routing": RoutingSpec("synthetic", kind="fitted").to_dict()}
    m = get_model("deepseek-v2-lite")
    r = {"model": m.name, "experts": m.num_experts, "top_k": m.top_k, "gpus": 2, "tokens_per_gpu": 128, "layer": 9}
    for rank in range(2):
        got = result_routing(cfg, r, rank)[0]
        assert np.array_equal(got, rank_routing(RoutingSpec("synthetic", kind="fitted"), m, 2, 128, seed=4,
                                                rank=rank, layer=9)[0])
    c = counts_for(r, cfg)
    pairs = np.asarray(c["source_expert_pairs"])
    ids0 = result_routing(cfg, r, 0)[0]
    assert (pairs[0] == np.bincount(ids0.ravel(), minlength=m.num_experts)).all()
    other = counts_for({**r, "layer": 10}, cfg)
    assert other["source_expert_pairs"] != c["source_expert_pairs"]


@pytest.mark.parametrize("argv, match", [
    (["--synthetic", "nope"], "unknown synthetic"),
    (["--layers", "2"], "no layers"),
    (["--synthetic", "fitted", "--models", "qwen3-30b-a3b", "--layers", "48"], "MoE layers lie in"),
])
def test_bench_rejects_bad_routing_before_touching_a_gpu(argv, match, capsys):
    from weave_kernel.bench import main

    with pytest.raises(SystemExit, match=match):
        main(argv)

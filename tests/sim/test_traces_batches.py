"""Batch formation from a trace (prefill runs, decode one-per-request) and `routing_for`."""
import numpy as np
import pytest
from hypothesis import given, strategies as st

from weave_sim.presets import get_model
from weave_sim.traces import (RoutingTrace, TraceError, decode_batch, decode_indices, default_trace, generate,
                              prefill_batch, prefill_indices, request_spans, routing_for, save_trace)


def _toy_trace(lengths, shuffle_ids=False):
    """A gpt-oss-shaped trace whose requests have the given lengths; position counts from 0."""
    num_tokens = int(sum(lengths))
    ids = generate("uniform", num_experts=32, top_k=4, num_layers=24, num_tokens=num_tokens, seed=0).topk_ids
    request_id = np.repeat(np.arange(len(lengths)) * 7 + 3, lengths)  # arbitrary, non-contiguous labels
    position = np.concatenate([np.arange(n) for n in lengths])
    return RoutingTrace(ids, request_id=request_id, position=position, metadata={"model": "gpt-oss-20b"})


def _runs(trace, idx):
    """Split batch token indices into maximal runs of the same request."""
    rid = trace.request_id[idx]
    cut = np.flatnonzero(rid[1:] != rid[:-1]) + 1
    return np.split(idx, cut)


@given(lengths=st.lists(st.integers(1, 30), min_size=1, max_size=12), num_tokens=st.integers(1, 200),
       seed=st.integers(0, 1000))
def test_prefill_runs_are_consecutive_tokens_of_requests(lengths, num_tokens, seed):
    trace = _toy_trace(lengths)
    idx = prefill_indices(trace, num_tokens, seed)
    assert idx.shape == (num_tokens,) and idx.dtype == np.int64
    for run in _runs(trace, idx):
        pos = trace.position[run]
        # A run is consecutive positions of one request, from its first token; a request that is used
        # again right after itself (wrap-around with one request) restarts at position 0.
        restarts = np.flatnonzero(np.diff(pos) != 1) + 1
        for piece in np.split(pos, restarts):
            assert piece[0] == 0 and np.all(np.diff(piece) == 1)
    assert np.array_equal(prefill_batch(trace, num_tokens, seed), trace.topk_ids[idx])


def test_prefill_uses_whole_requests_and_wraps():
    trace = _toy_trace([5, 3, 4])
    idx = prefill_indices(trace, 12, seed=1)
    assert sorted(idx.tolist()) == list(range(12))  # exactly the whole trace, in request runs
    wrapped = prefill_indices(trace, 30, seed=1)
    assert np.bincount(wrapped, minlength=12).min() >= 2  # every token used before any is used thrice
    assert not np.array_equal(prefill_indices(trace, 12, seed=1), prefill_indices(trace, 12, seed=2))


def test_prefill_without_request_id_is_one_stream():
    trace = RoutingTrace(_toy_trace([10]).topk_ids)
    idx = prefill_indices(trace, 25, seed=3)
    assert np.all(np.diff(idx) % 10 == 1)  # consecutive, wrapping from token 9 to token 0


@given(lengths=st.lists(st.integers(1, 20), min_size=1, max_size=40), num_tokens=st.integers(1, 100),
       seed=st.integers(0, 1000))
def test_decode_takes_one_token_per_request(lengths, num_tokens, seed):
    trace = _toy_trace(lengths)
    idx = decode_indices(trace, num_tokens, seed)
    assert idx.shape == (num_tokens,)
    counts = np.bincount(np.searchsorted(np.unique(trace.request_id), trace.request_id[idx]),
                         minlength=len(lengths))
    if num_tokens <= len(lengths):
        assert counts.max() == 1  # distinct requests
    else:
        assert counts.max() - counts.min() <= 1  # requests reused round-robin
    assert np.array_equal(decode_batch(trace, num_tokens, seed), trace.topk_ids[idx])


def test_decode_without_request_id_treats_tokens_as_requests():
    trace = RoutingTrace(_toy_trace([50]).topk_ids)
    idx = decode_indices(trace, 20, seed=0)
    assert np.unique(idx).size == 20


def test_request_spans_group_interleaved_requests_in_file_order():
    trace = RoutingTrace(np.zeros((5, 1, 1), np.int64), request_id=np.array([9, 4, 9, 4, 4]))
    order, starts = request_spans(trace)
    assert order.tolist() == [0, 2, 1, 3, 4] and starts.tolist() == [0, 2, 5]


def test_routing_for_synthetic_uses_the_model_geometry():
    preset = get_model("deepseek-v2-lite")
    ids = routing_for("deepseek-v2-lite", 512, seed=4)
    assert ids.shape == (512, preset.num_moe_layers, preset.top_k) and ids.dtype == np.int64
    assert ids.max() < preset.num_experts
    assert np.array_equal(ids, routing_for(preset, 512, seed=4))  # a ModelPreset works too
    assert not np.array_equal(ids, routing_for("deepseek-v2-lite", 512, seed=5))
    uniform = routing_for("deepseek-v2-lite", 512, synthetic="uniform", seed=4)
    assert not np.array_equal(ids, uniform)
    assert routing_for("mixtral-8x7b", 64, synthetic="zipf", s=1.5).shape == (64, 32, 2)


def test_routing_for_fitted_decode_has_no_reuse():
    from weave_sim.traces import token_reuse
    prefill = routing_for("gpt-oss-20b", 3000, synthetic="fitted", mode="prefill", seed=1)
    decode = routing_for("gpt-oss-20b", 3000, synthetic="fitted", mode="decode", seed=1)
    assert token_reuse(prefill).mean() > 0.35 and token_reuse(decode).mean() < 0.25


def test_routing_for_default_skew_is_realistic():
    ids = routing_for("deepseek-v3", 16384, seed=0)
    loads = np.stack([np.bincount(ids[:, layer].ravel(), minlength=256) for layer in range(ids.shape[1])])
    imbalance = loads.max(axis=1) / loads.mean(axis=1)
    assert 1.5 < imbalance.mean() < 3.0


def test_routing_for_from_trace_object_and_path(tmp_path):
    trace = default_trace()
    prefill = routing_for("gpt-oss-20b", 1000, trace=trace, mode="prefill", seed=2)
    assert np.array_equal(prefill, prefill_batch(trace, 1000, 2))
    decode = routing_for("gpt-oss-20b", 40, trace=trace, mode="decode", seed=2)
    assert np.array_equal(decode, decode_batch(trace, 40, 2))
    path = save_trace(tmp_path / "t.npz", trace.select(np.arange(300)))
    assert routing_for("gpt-oss-20b", 500, trace=path, seed=1).shape == (500, 24, 4)


def test_routing_for_rejects_mismatches():
    trace = default_trace()
    with pytest.raises(TraceError, match="model mismatch"):
        routing_for("mixtral-8x7b", 10, trace=trace)
    with pytest.raises(ValueError, match="mode"):
        routing_for("gpt-oss-20b", 10, trace=trace, mode="training")
    with pytest.raises(ValueError, match="with a trace"):
        routing_for("gpt-oss-20b", 10, trace=trace, s=1.0)
    with pytest.raises(ValueError, match="at least one token"):
        prefill_batch(trace, 0)

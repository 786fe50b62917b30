"""Forming one batch's routing from a trace, and `routing_for`, the one call the rest of the toolkit uses.

A recorded trace is a sequence of requests; a batch is a choice of its tokens:
- prefill: runs of consecutive tokens of several requests (a request's tokens are the trace tokens with
  its request_id, in file order), requests taken in a seeded random order, each from its first token;
  the last run is cut to fill the batch exactly. A trace with fewer tokens than the batch wraps around:
  once every request has been used, a new random order starts. Without request_id the trace is one
  stream: one run from a seeded random start, continuing at token 0 after the last token.
- decode: one token from each of many requests, at a seeded random position in it. With fewer
  requests than batch tokens, requests are reused round-robin in fresh random orders (every request once
  before any twice), each time at an independently drawn position, so with replacement across a
  request's positions. Without request_id every token counts as its own request.
"""
from __future__ import annotations

from pathlib import Path

import numpy as np

from weave_sim.presets import ModelPreset, get_model
from weave_sim.traces.format import RoutingTrace, TraceError, choose_model, load_trace, validate_trace
from weave_sim.traces.generators import generate

BATCH_MODES = ("prefill", "decode")


def request_spans(trace: RoutingTrace) -> tuple[np.ndarray, np.ndarray]:
    """Token indices grouped by request.

    Returns (order int64 `[T]`, starts int64 `[R + 1]`): the tokens of request r are
    order[starts[r]:starts[r + 1]], in file order; requests are numbered by first appearance.
    Without request_id there is one request holding every token.
    """
    num_tokens = trace.num_tokens
    if trace.request_id is None:
        return np.arange(num_tokens, dtype=np.int64), np.array([0, num_tokens], dtype=np.int64)
    _, first_idx, inverse = np.unique(trace.request_id, return_index=True, return_inverse=True)
    rank = np.argsort(np.argsort(first_idx))  # request number by first appearance
    order = np.argsort(rank[inverse], kind="stable")
    counts = np.bincount(rank[inverse], minlength=first_idx.size)
    return order.astype(np.int64), np.concatenate([[0], np.cumsum(counts)]).astype(np.int64)


def _cycled_requests(rng: np.random.Generator, num_requests: int, min_count: int) -> np.ndarray:
    """Request numbers in fresh random orders, concatenated until at least min_count entries."""
    num_rounds = -(-min_count // num_requests)
    return np.concatenate([rng.permutation(num_requests) for _ in range(num_rounds)])


def prefill_indices(trace: RoutingTrace, num_tokens: int, seed: int) -> np.ndarray:
    """Token indices `[num_tokens]` int64 of a prefill batch (see the module docstring)."""
    _check_batch(trace, num_tokens)
    rng = np.random.default_rng(seed)
    if trace.request_id is None:
        start = int(rng.integers(trace.num_tokens))
        return (start + np.arange(num_tokens, dtype=np.int64)) % trace.num_tokens
    order, starts = request_spans(trace)
    lengths = np.diff(starts)
    # Each request has >= 1 token, so num_tokens requests always suffice.
    picked = _cycled_requests(rng, lengths.size, min(num_tokens, -(-num_tokens // int(lengths.min()))))
    ends = np.cumsum(lengths[picked])
    num_runs = int(np.searchsorted(ends, num_tokens)) + 1
    picked = picked[:num_runs]
    run_lengths = lengths[picked].copy()
    run_lengths[-1] -= int(ends[num_runs - 1]) - num_tokens
    run_offsets = np.repeat(np.cumsum(run_lengths) - run_lengths, run_lengths)
    within = np.arange(num_tokens, dtype=np.int64) - run_offsets
    return order[np.repeat(starts[picked], run_lengths) + within]


def decode_indices(trace: RoutingTrace, num_tokens: int, seed: int) -> np.ndarray:
    """Token indices `[num_tokens]` int64 of a decode batch (see the module docstring)."""
    _check_batch(trace, num_tokens)
    rng = np.random.default_rng(seed)
    order, starts = request_spans(trace)
    if trace.request_id is None:
        starts = np.arange(trace.num_tokens + 1, dtype=np.int64)  # every token its own request
    lengths = np.diff(starts)
    picked = _cycled_requests(rng, lengths.size, num_tokens)[:num_tokens]
    within = (rng.random(num_tokens) * lengths[picked]).astype(np.int64)
    return order[starts[picked] + within]


def _check_batch(trace: RoutingTrace, num_tokens: int) -> None:
    if num_tokens < 1:
        raise ValueError(f"a batch needs at least one token, got {num_tokens}")
    if trace.num_tokens < 1:
        raise TraceError("cannot form a batch from an empty trace")


def prefill_batch(trace: RoutingTrace, num_tokens: int, seed: int = 0) -> np.ndarray:
    """topk_ids int64 `[num_tokens, L, k]` of a prefill batch: runs of consecutive request tokens."""
    return trace.topk_ids[prefill_indices(trace, num_tokens, seed)]


def decode_batch(trace: RoutingTrace, num_tokens: int, seed: int = 0) -> np.ndarray:
    """topk_ids int64 `[num_tokens, L, k]` of a decode batch: one token from each of many requests."""
    return trace.topk_ids[decode_indices(trace, num_tokens, seed)]


def routing_for(model: str | ModelPreset, num_tokens: int, *, trace=None, synthetic: str = "zipf",
                mode: str = "prefill", seed: int = 0, **params) -> np.ndarray:
    """The routing of one batch of `num_tokens` tokens through every MoE layer of `model` (a preset name
    or a ModelPreset).

    trace: a RoutingTrace or a path to an interchange-format file (loaded with this model); the batch is
        formed from it by `mode` ("prefill" or "decode"). A trace must fit the model.
    Without a trace: the `synthetic` generator (see `generators.GENERATORS`) with the model's geometry,
        `seed` and `params`; the default, zipf with no params, aims at an expected max/mean expert load of
        DEFAULT_IMBALANCE (2.0) in every layer. Synthetic tokens are independent except in `fitted`, whose
        token-to-token reuse is turned off (reuse=0 unless given) in decode mode.
    Returns topk_ids int64 `[num_tokens, num_moe_layers, top_k]`, experts in [0, num_experts),
    distinct within each token's top-k.
    """
    preset = model if isinstance(model, ModelPreset) else get_model(model)
    if mode not in BATCH_MODES:
        raise ValueError(f"mode must be one of {BATCH_MODES}, got {mode!r}")
    if trace is None:
        if mode == "decode" and synthetic == "fitted":
            # A decode batch holds one token of each request: no token follows another of its request.
            params.setdefault("reuse", 0.0)
        return generate(synthetic, num_experts=preset.num_experts, top_k=preset.top_k,
                        num_layers=preset.num_moe_layers, num_tokens=num_tokens, seed=seed, **params).topk_ids
    if params:
        raise ValueError(f"generator params {sorted(params)} given together with a trace")
    if isinstance(trace, (str, Path)):
        trace = load_trace(trace, model=preset.name)  # validated against the model while loading
    else:
        choose_model(trace.model, preset.name)  # a trace of another model is an error, not a reshape
        validate_trace(trace, preset)
    form = prefill_batch if mode == "prefill" else decode_batch
    return form(trace, num_tokens, seed)

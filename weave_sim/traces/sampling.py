"""Vectorised top-k sampling without replacement, and the skew arithmetic the generators share.

Every synthetic generator reduces to per-layer expert weights `weights[num_layers, num_experts]` and one
call to `sample_topk`, which draws each token's top-k as successive sampling without replacement
(Plackett-Luce): the first expert is drawn with probability proportional to its weight, the next from the
remaining experts, and so on. Equivalently: draw experts i.i.d. from the weights and keep the first k
distinct ones, which is what the rejection loop below does, slot by slot, on whole columns at once.

Why not Gumbel-top-k: it needs a `[tokens, layers, experts]` noise tensor (about 1e9 floats for 65536
tokens x 58 layers x 256 experts), whereas i.i.d. draws need `[tokens, layers, top_k]` plus a few
redraws, and an alias table makes each draw two gathers.
"""
from __future__ import annotations

import numpy as np

#: Rejection rounds per slot before the exact masked draw takes over (reached only under extreme skew,
#: where the experts already chosen hold almost all the weight).
_MAX_REJECTION_ROUNDS = 12

#: Inclusion probabilities are clipped below 1 so that the weight of an expert stays finite.
_MAX_INCLUSION = 0.999


def normalise_weights(weights: np.ndarray) -> np.ndarray:
    """Return float64 `[L, E]` weights that sum to 1 per layer; rejects negative, NaN or all-zero rows."""
    w = np.asarray(weights, dtype=np.float64)
    if w.ndim != 2:
        raise ValueError(f"weights must be [num_layers, num_experts], got shape {w.shape}")
    if not np.all(np.isfinite(w)) or np.any(w < 0):
        raise ValueError("weights must be finite and non-negative")
    totals = w.sum(axis=1, keepdims=True)
    if np.any(totals <= 0):
        raise ValueError("every layer needs at least one expert with positive weight")
    return w / totals


def build_alias_tables(weights: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Vose alias tables for each layer.

    weights: `[L, E]` non-negative, rows summing to 1 (see `normalise_weights`).
    Returns (accept `[L, E]` float64, alias `[L, E]` int64): draw a column e uniformly, keep it with
    probability accept[l, e], otherwise take alias[l, e].
    """
    num_layers, num_experts = weights.shape
    accept = np.ones((num_layers, num_experts))
    alias = np.tile(np.arange(num_experts, dtype=np.int64), (num_layers, 1))
    for layer_idx in range(num_layers):
        scaled = weights[layer_idx] * num_experts
        small = [e for e in range(num_experts) if scaled[e] < 1.0]
        large = [e for e in range(num_experts) if scaled[e] >= 1.0]
        while small and large:
            s, g = small.pop(), large.pop()
            accept[layer_idx, s] = scaled[s]
            alias[layer_idx, s] = g
            scaled[g] -= 1.0 - scaled[s]
            (small if scaled[g] < 1.0 else large).append(g)
        # Leftovers are 1 up to rounding; they keep accept = 1 and alias = themselves.
    return accept, alias


def _draw(rng: np.random.Generator, accept: np.ndarray, alias: np.ndarray, size: int) -> np.ndarray:
    """`size` i.i.d. draws from one layer's alias table (accept float32 `[E]`, alias int32 `[E]`), int32."""
    num_experts = accept.shape[0]
    # One float32 uniform per draw: its integer part picks the column, its fraction (>= 14 bits for
    # E <= 1024) is the accept test. float32 halves the memory traffic; the clamp guards rounding to E.
    scaled = rng.random(size, dtype=np.float32) * np.float32(num_experts)
    column = np.minimum(scaled.astype(np.int32), num_experts - 1)
    fraction = scaled - column
    return np.where(fraction < accept[column], column, alias[column])


def masked_draw(rng: np.random.Generator, weights: np.ndarray, chosen: np.ndarray) -> np.ndarray:
    """Exact draw for rows that rejection could not settle.

    weights: `[E]` one layer's weights; chosen: `[n, j]` experts already taken in each row.
    Returns `[n]` experts not in their row's `chosen`; if the remaining weight is zero (fewer than k
    experts with positive weight) the draw is uniform over the experts not yet chosen.
    """
    num_rows = chosen.shape[0]
    w = np.tile(weights, (num_rows, 1))
    np.put_along_axis(w, chosen, 0.0, axis=1)
    empty = w.sum(axis=1) <= 0
    if np.any(empty):
        fallback = np.ones((int(empty.sum()), weights.shape[0]))
        np.put_along_axis(fallback, chosen[empty], 0.0, axis=1)
        w[empty] = fallback
    cdf = np.cumsum(w, axis=1)
    target = rng.random(num_rows) * cdf[:, -1]
    picked = (cdf > target[:, None]).argmax(axis=1)
    return picked.astype(np.int64)


def sample_topk(rng: np.random.Generator, weights: np.ndarray, num_tokens: int, top_k: int) -> np.ndarray:
    """Draw each token's top-k experts per layer by successive sampling without replacement.

    weights: `[num_layers, num_experts]` non-negative (normalised here).
    Returns topk_ids int64 `[num_tokens, num_layers, top_k]`; the k experts of a token in a layer are
    distinct, in the order drawn (most likely first, in distribution).
    """
    w = normalise_weights(weights)
    num_layers, num_experts = w.shape
    if not 1 <= top_k <= num_experts:
        raise ValueError(f"top_k must be in 1..{num_experts}, got {top_k}")
    if num_tokens < 0:
        raise ValueError(f"num_tokens must be >= 0, got {num_tokens}")
    accept, alias = build_alias_tables(w)
    out = np.empty((num_tokens, num_layers, top_k), dtype=np.int64)
    for layer_idx in range(num_layers):
        out[:, layer_idx, :] = sample_rows(rng, w[layer_idx], accept[layer_idx], alias[layer_idx],
                                           num_tokens, top_k)
    return out


#: Tokens per block in `sample_rows`: its [block, E] "taken" bitmap (2 MB at E = 256) stays in cache.
_BLOCK_TOKENS = 8192


def sample_rows(rng, weights, accept, alias, num_tokens: int, top_k: int) -> np.ndarray:
    """One layer of `sample_topk`: int64 `[num_tokens, top_k]`, distinct per row.

    weights `[E]` (normalised), accept/alias `[E]` from `build_alias_tables`. Tokens are done in blocks
    with a reused flat "taken" bitmap, which makes the duplicate test one gather per draw instead of a
    comparison against every earlier slot.
    """
    num_experts = accept.shape[0]
    accept32, alias32 = accept.astype(np.float32), alias.astype(np.int32)
    ids = np.empty((num_tokens, top_k), dtype=np.int64)
    block = min(num_tokens, _BLOCK_TOKENS)
    taken = np.zeros(block * num_experts, dtype=bool)
    row_base = np.arange(block, dtype=np.int64) * num_experts
    for first in range(0, num_tokens, block):
        rows = min(block, num_tokens - first)
        ids[first:first + rows] = _sample_block(rng, weights, accept32, alias32, top_k, taken, row_base[:rows])
    return ids


def _sample_block(rng, weights, accept, alias, top_k, taken, row_base) -> np.ndarray:
    """`[len(row_base), top_k]` distinct draws per row; `taken` is all False on entry and on exit."""
    num_rows = row_base.shape[0]
    ids = np.empty((num_rows, top_k), dtype=np.int64)
    for slot in range(top_k):
        column = _draw(rng, accept, alias, num_rows)
        pending = np.flatnonzero(taken[row_base + column]) if slot else np.empty(0, dtype=np.int64)
        for _ in range(_MAX_REJECTION_ROUNDS):
            if pending.size == 0:
                break
            redraw = _draw(rng, accept, alias, pending.size)
            column[pending] = redraw
            pending = pending[taken[row_base[pending] + redraw]]
        if pending.size:
            column[pending] = masked_draw(rng, weights, ids[pending, :slot])
        ids[:, slot] = column
        taken[row_base + column] = True
    taken[(row_base[:, None] + ids).ravel()] = False  # reset only what was set
    return ids


def inclusion_probabilities(weights: np.ndarray, top_k: int) -> np.ndarray:
    """Approximate probability that each expert is among a token's top-k under `sample_topk`.

    weights: `[L, E]`. Returns float64 `[L, E]`, each row summing to top_k. Uses Rosen's approximation
    for successive sampling, pi_e = 1 - exp(-lam * w_e) with lam chosen so that the row sums to k
    (accurate to a few percent for the skews we generate; the tests check it against sampling).
    """
    w = normalise_weights(weights)
    num_experts = w.shape[1]
    if top_k >= num_experts:
        return np.ones_like(w)
    row_sum = lambda lam: (1.0 - np.exp(-lam[:, None] * w)).sum(axis=1)  # noqa: E731, increasing in lam
    lo, hi = np.zeros(w.shape[0]), np.ones(w.shape[0])
    # Grow the bracket; rows with fewer than k positive weights never reach k and stop at the cap.
    while np.any((row_sum(hi) < top_k) & (hi < 1e12)):
        hi = np.where(row_sum(hi) < top_k, hi * 2.0, hi)
    for _ in range(60):
        mid = 0.5 * (lo + hi)
        low = row_sum(mid) < top_k
        lo, hi = np.where(low, mid, lo), np.where(low, hi, mid)
    return 1.0 - np.exp(-hi[:, None] * w)


def weights_for_inclusion(inclusion: np.ndarray) -> np.ndarray:
    """Inverse of `inclusion_probabilities`: weights whose top-k inclusion is about `inclusion`.

    inclusion: `[L, E]` target probabilities in [0, 1] (rows summing to k). Returns `[L, E]` weights
    summing to 1 per row; targets are clipped to `_MAX_INCLUSION` so that no weight is infinite.
    """
    pi = np.clip(np.asarray(inclusion, dtype=np.float64), 0.0, _MAX_INCLUSION)
    return normalise_weights(-np.log1p(-pi))


def zipf_weights(num_experts: int, exponent_per_layer: np.ndarray) -> np.ndarray:
    """`[L, E]` Zipf weights by rank, w_r proportional to (r + 1) ** -s, hottest expert first."""
    ranks = np.arange(1, num_experts + 1, dtype=np.float64)
    s = np.asarray(exponent_per_layer, dtype=np.float64).reshape(-1, 1)
    return normalise_weights(ranks[None, :] ** -s)


def imbalance_of(weights: np.ndarray, top_k: int) -> np.ndarray:
    """Expected max/mean expert load per layer at large token counts: `[L]` float64."""
    pi = inclusion_probabilities(weights, top_k)
    return pi.max(axis=1) / pi.mean(axis=1)


def zipf_exponent_for_imbalance(num_experts: int, top_k: int, imbalance_per_layer) -> np.ndarray:
    """Zipf exponent s per layer whose expected max/mean load equals the target.

    imbalance_per_layer: `[L]` targets >= 1; a target at or above E/k (all load on k experts) cannot
    be reached and raises ValueError. Returns `[L]` float64 exponents (bisection, 40 steps).
    """
    target = np.asarray(imbalance_per_layer, dtype=np.float64).reshape(-1)
    ceiling = num_experts / top_k
    if top_k >= num_experts and np.all(target == 1.0):
        return np.zeros_like(target)  # every expert is always chosen: any exponent gives 1
    if not np.all((target >= 1.0) & (target < ceiling)):  # (NaN fails too)
        raise ValueError(f"imbalance (max/mean load) must be in [1, {ceiling:g}) for "
                         f"{num_experts} experts and top-{top_k}, got {target.min():g}..{target.max():g}")
    lo = np.zeros_like(target)
    hi = np.full_like(target, 8.0)
    for _ in range(40):
        mid = 0.5 * (lo + hi)
        too_flat = imbalance_of(zipf_weights(num_experts, mid), top_k) < target
        lo = np.where(too_flat, mid, lo)
        hi = np.where(too_flat, hi, mid)
    return 0.5 * (lo + hi)

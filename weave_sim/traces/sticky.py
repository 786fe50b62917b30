"""Top-k sampling with token-to-token reuse: consecutive tokens keep some of each other's experts.

Model: each of a token's k slots keeps the expert of the same slot of the previous token with
probability keep_prob[layer] (a "sticky" slot); the other slots are fresh draws without replacement from
the layer's weights that avoid the kept experts. Reuse is then about keep + (1 - keep) * chance.

The chain is sequential in tokens, but it is built without a Python loop over tokens: draw every fresh
slot first, forward-fill kept slots from their last fresh draw, then redraw fresh slots that collide
with a kept expert. A redraw only changes later tokens, so the first token with a collision moves
strictly later on every pass and the loop ends; in practice after a handful of passes.
"""
from __future__ import annotations

import numpy as np

from weave_sim.traces.sampling import build_alias_tables, masked_draw, normalise_weights, sample_rows


def _fill_source(keep: np.ndarray) -> np.ndarray:
    """source[t, j] = last t' <= t with keep[t', j] False: the row whose fresh draw slot j carries."""
    source = np.where(keep, 0, np.arange(keep.shape[0])[:, None])
    np.maximum.accumulate(source, axis=0, out=source)
    return source


def _next_fresh(keep: np.ndarray) -> np.ndarray:
    """`[T + 1, k]`: the first row >= t whose slot is fresh (T when none); the chain from a fresh row r
    in slot j covers rows r .. next_fresh[r + 1, j] - 1."""
    num_tokens = keep.shape[0]
    nxt = np.where(keep, num_tokens, np.arange(num_tokens)[:, None])
    nxt = np.minimum.accumulate(nxt[::-1], axis=0)[::-1]
    return np.vstack([nxt, np.full((1, keep.shape[1]), num_tokens)])


def _ranges(starts: np.ndarray, ends: np.ndarray) -> np.ndarray:
    """Concatenation of arange(s, e) for each pair (empty ranges allowed)."""
    lengths = np.maximum(ends - starts, 0)
    total = int(lengths.sum())
    offsets = np.repeat(starts - (np.cumsum(lengths) - lengths), lengths)
    return offsets + np.arange(total)


def _duplicate_slots(values: np.ndarray) -> np.ndarray:
    """bool `[n, k]`: slot j holds an expert that another slot of the same row also holds."""
    k = values.shape[1]
    dup = np.zeros(values.shape, dtype=bool)
    for j in range(k):
        for other in range(j + 1, k):
            same = values[:, j] == values[:, other]
            dup[:, j] |= same
            dup[:, other] |= same
    return dup


def _sticky_layer(rng, weights, accept, alias, num_tokens: int, top_k: int, keep_prob: float) -> np.ndarray:
    fresh = sample_rows(rng, weights, accept, alias, num_tokens, top_k)
    keep = rng.random((num_tokens, top_k)) < keep_prob
    keep[0] = False
    values = np.take_along_axis(fresh, _fill_source(keep), axis=0)
    next_fresh = _next_fresh(keep)
    candidates = np.arange(num_tokens)  # rows that may hold a duplicate; shrinks to the repaired chains
    for _ in range(num_tokens + 1):
        rows_now = values[candidates]
        ordered = np.sort(rows_now, axis=1)
        bad = (ordered[:, 1:] == ordered[:, :-1]).any(axis=1)
        if not bad.any():
            return values
        bad_rows, dup = candidates[bad], _duplicate_slots(rows_now[bad])
        # Repair only rows whose previous row is clean: their kept experts are then distinct, so the
        # collision involves a fresh slot, which is redrawn. Rows after a bad row wait, because repairing
        # their predecessor may already fix them (repairing them now would cut sticky chains needlessly).
        waiting = np.isin(bad_rows - 1, bad_rows)
        fix_rows, redraw = bad_rows[~waiting], dup[~waiting] & ~keep[bad_rows[~waiting]]
        cut = ~redraw.any(axis=1)  # safety net, not reached when the previous row is clean
        if cut.any():
            later_dup = dup[~waiting][cut] & (np.cumsum(dup[~waiting][cut], axis=1) > 1)
            redraw[cut] = later_dup
            keep[fix_rows[cut]] &= ~later_dup
            values = np.take_along_axis(fresh, _fill_source(keep), axis=0)
            next_fresh = _next_fresh(keep)
        touched = [bad_rows[waiting]]
        for slot in range(top_k):
            rows = fix_rows[redraw[:, slot]]
            if rows.size == 0:
                continue
            new = masked_draw(rng, weights, np.delete(values[rows], slot, axis=1))
            fresh[rows, slot] = values[rows, slot] = new
            # The new expert flows down the slot's chain of kept rows after each repaired row.
            chain = _ranges(rows + 1, next_fresh[rows + 1, slot])
            values[chain, slot] = np.repeat(new, next_fresh[rows + 1, slot] - rows - 1)
            touched.append(chain)
        candidates = np.unique(np.concatenate(touched))
    raise RuntimeError("sticky sampling did not converge")  # unreachable: see the module docstring


def sample_sticky(rng: np.random.Generator, weights: np.ndarray, num_tokens: int, top_k: int,
                  keep_prob) -> np.ndarray:
    """Top-k per token and layer with reuse between consecutive tokens.

    weights: `[L, E]` non-negative; keep_prob: `[L]` (or scalar) in [0, 1), the chance that a slot keeps
    the previous token's expert. Returns int64 `[num_tokens, L, top_k]`, distinct per token and layer.
    keep_prob 0 is exactly `sampling.sample_topk`.
    """
    w = normalise_weights(weights)
    num_layers = w.shape[0]
    keep = np.broadcast_to(np.asarray(keep_prob, dtype=np.float64), (num_layers,))
    if np.any(keep < 0) or np.any(keep >= 1):
        raise ValueError(f"keep_prob must be in [0, 1), got {keep.min()}..{keep.max()}")
    accept, alias = build_alias_tables(w)
    out = np.empty((num_tokens, num_layers, top_k), dtype=np.int64)
    for layer_idx in range(num_layers):
        out[:, layer_idx, :] = _sticky_layer(rng, w[layer_idx], accept[layer_idx], alias[layer_idx],
                                             num_tokens, top_k, float(keep[layer_idx]))
    return out


# Mean-field arithmetic of the sticky model, used by the `fitted` generator to aim at a target.
# With inclusion pi_e (probability that expert e is in a token's top-k) and keep probability a:
#   P(e kept)                    = a * pi_e
#   P(e drawn fresh | not kept)  = q_e = (1 - a) * pi_e / (1 - a * pi_e)   (so that the marginal stays pi)
#   reuse = E|S_t & S_t-1| / k   = a + (1 - a) * sum_e pi_e * q_e / k
# and the fresh draws need weights whose (Rosen) inclusion is q.


def fresh_inclusion(inclusion: np.ndarray, keep_prob: np.ndarray) -> np.ndarray:
    """q `[L, E]`: inclusion the fresh draws need so that the overall inclusion stays `inclusion`."""
    a = np.asarray(keep_prob, dtype=np.float64).reshape(-1, 1)
    return (1.0 - a) * inclusion / (1.0 - a * inclusion)


def expected_reuse(inclusion: np.ndarray, keep_prob: np.ndarray, top_k: int) -> np.ndarray:
    """Mean-field expected reuse `[L]` of the sticky model at this inclusion `[L, E]` and keep_prob `[L]`."""
    a = np.asarray(keep_prob, dtype=np.float64).reshape(-1)
    q = fresh_inclusion(inclusion, a)
    return a + (1.0 - a) * (inclusion * q).sum(axis=1) / top_k


def keep_prob_for_reuse(inclusion: np.ndarray, reuse, top_k: int) -> np.ndarray:
    """keep_prob `[L]` in [0, 0.99] whose `expected_reuse` equals `reuse` (clipped to the reachable range)."""
    target = np.broadcast_to(np.asarray(reuse, dtype=np.float64), (inclusion.shape[0],))
    lo, hi = np.zeros(inclusion.shape[0]), np.full(inclusion.shape[0], 0.99)
    for _ in range(40):  # expected_reuse increases with keep_prob
        mid = 0.5 * (lo + hi)
        low = expected_reuse(inclusion, mid, top_k) < target
        lo, hi = np.where(low, mid, lo), np.where(low, hi, mid)
    return 0.5 * (lo + hi)

"""Per-layer load statistics of a routing trace: the numbers that decide how hard a layer is to schedule."""
from __future__ import annotations

import numpy as np

from weave_sim.traces.format import RoutingTrace, resolve_model

#: Columns of the per-layer table, in print order.
LAYER_COLUMNS = ("layer", "tokens", "mean_load", "max_load", "min_load", "max_over_mean", "cv",
                 "zipf_s", "reuse")


def expert_loads(topk_ids: np.ndarray, num_experts: int) -> np.ndarray:
    """Token-expert pairs per expert and layer.

    topk_ids: int `[T, L, k]` with ids in [0, num_experts). Returns int64 `[L, num_experts]`.
    """
    num_tokens, num_layers, _ = topk_ids.shape
    flat = topk_ids + (np.arange(num_layers, dtype=np.int64) * num_experts)[None, :, None]
    return np.bincount(flat.ravel(), minlength=num_layers * num_experts).reshape(num_layers, num_experts)


def zipf_exponent(loads: np.ndarray) -> np.ndarray:
    """Least-squares slope s of log(load) = c - s * log(rank) over each layer's non-zero loads.

    loads: `[L, E]`. Returns `[L]` float64 (0 for a perfectly even layer, larger = more skewed).
    """
    loads = np.atleast_2d(np.asarray(loads, dtype=np.float64))
    ordered = -np.sort(-loads, axis=1)
    log_rank = np.log(np.arange(1, loads.shape[1] + 1, dtype=np.float64))
    slopes = np.zeros(loads.shape[0])
    for layer_idx, row in enumerate(ordered):
        keep = row > 0
        if keep.sum() < 2:
            continue
        x, y = log_rank[keep], np.log(row[keep])
        slopes[layer_idx] = -np.polyfit(x, y, 1)[0]
    return slopes


def token_reuse(topk_ids: np.ndarray, request_id: np.ndarray | None = None) -> np.ndarray:
    """Mean fraction of a token's top-k experts that the previous token of the same request also chose.

    topk_ids: `[T, L, k]`; request_id: `[T]` or None (one stream). Returns `[L]` float64 in [0, 1];
    NaN for a layer when no two consecutive tokens share a request. By chance (uniform routing) it is k/E.
    """
    if topk_ids.shape[0] < 2:
        return np.full(topk_ids.shape[1], np.nan)
    same_request = np.ones(topk_ids.shape[0] - 1, dtype=bool)
    if request_id is not None:
        same_request = request_id[1:] == request_id[:-1]
    if not same_request.any():
        return np.full(topk_ids.shape[1], np.nan)
    cur, prev = topk_ids[1:][same_request], topk_ids[:-1][same_request]
    shared = np.zeros(topk_ids.shape[1])
    for slot in range(topk_ids.shape[2]):  # k passes of [pairs, L, k] instead of one [pairs, L, k, k]
        shared += (cur[:, :, slot:slot + 1] == prev).any(axis=2).sum(axis=0)
    return shared / (cur.shape[0] * topk_ids.shape[2])


def trace_stats(trace_or_ids, num_experts: int | None = None, request_id: np.ndarray | None = None) -> dict:
    """Per-layer imbalance statistics.

    trace_or_ids: a RoutingTrace (its model gives num_experts, its request_id the request boundaries)
        or int topk_ids `[T, L, k]` (then pass num_experts, else max id + 1 is assumed).
    Returns a JSON-able dict: geometry (num_tokens, num_layers, top_k, num_experts, model), "layers"
    (one dict per layer with LAYER_COLUMNS: loads are token-expert pairs; cv = std/mean of the per-expert
    loads; zipf_s from `zipf_exponent`; reuse from `token_reuse`) and "summary" (mean/min/max over layers
    of max_over_mean, cv, zipf_s and reuse).
    """
    model = None
    if isinstance(trace_or_ids, RoutingTrace):
        ids, model = trace_or_ids.topk_ids, trace_or_ids.model
        request_id = trace_or_ids.request_id if request_id is None else request_id
        if num_experts is None and model is not None:
            num_experts = resolve_model(model).num_experts
    else:
        ids = np.asarray(trace_or_ids, dtype=np.int64)
        if ids.ndim != 3:
            raise ValueError(f"topk_ids must be [num_tokens, num_layers, top_k], got shape {ids.shape}")
    num_tokens, num_layers, top_k = ids.shape
    if num_experts is None:
        num_experts = int(ids.max()) + 1
    loads = expert_loads(ids, num_experts)
    mean_load = num_tokens * top_k / num_experts
    zipf_s = zipf_exponent(loads)
    reuse = token_reuse(ids, request_id)
    layers = [{
        "layer": layer_idx,
        "tokens": num_tokens,
        "mean_load": mean_load,
        "max_load": int(loads[layer_idx].max()),
        "min_load": int(loads[layer_idx].min()),
        "max_over_mean": float(loads[layer_idx].max() / mean_load),
        "cv": float(loads[layer_idx].std() / mean_load),
        "zipf_s": float(zipf_s[layer_idx]),
        "reuse": float(reuse[layer_idx]),
    } for layer_idx in range(num_layers)]
    summary = {column: _describe([row[column] for row in layers])
               for column in ("max_over_mean", "cv", "zipf_s", "reuse")}
    summary["reuse_by_chance"] = top_k / num_experts
    return {"model": model, "num_tokens": num_tokens, "num_layers": num_layers, "top_k": top_k,
            "num_experts": num_experts, "layers": layers, "summary": summary}


def _describe(values) -> dict:
    """mean/min/max ignoring NaN (all NaN gives NaN)."""
    values = np.asarray(values, dtype=np.float64)
    finite = values[~np.isnan(values)]
    if finite.size == 0:
        return {"mean": float("nan"), "min": float("nan"), "max": float("nan")}
    return {"mean": float(finite.mean()), "min": float(finite.min()), "max": float(finite.max())}


def format_stats_table(stats: dict) -> str:
    """The `trace_stats` result as a fixed-width text table with a header line naming the geometry."""
    head = (f"model {stats['model'] or '?'}: {stats['num_tokens']} tokens, {stats['num_layers']} layers, "
            f"top-{stats['top_k']} of {stats['num_experts']} experts (loads in token-expert pairs)")
    lines = [head, "  ".join(f"{c:>13}" for c in LAYER_COLUMNS)]
    for row in stats["layers"]:
        cells = []
        for column in LAYER_COLUMNS:
            value = row[column]
            cells.append(f"{value:>13d}" if isinstance(value, int) else f"{value:>13.3f}")
        lines.append("  ".join(cells))
    summary = stats["summary"]
    lines.append("summary over layers (mean / min / max): " + "; ".join(
        f"{c} {summary[c]['mean']:.3f} / {summary[c]['min']:.3f} / {summary[c]['max']:.3f}"
        for c in ("max_over_mean", "cv", "zipf_s", "reuse")) + f"; reuse by chance {summary['reuse_by_chance']:.3f}")
    return "\n".join(lines)

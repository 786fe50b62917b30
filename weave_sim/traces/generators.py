"""Seeded synthetic routing for any geometry (experts, top-k, layers, tokens).

Each generator turns its parameters into per-layer expert weights and draws every token's top-k by
successive sampling without replacement (`sampling.sample_topk`); `drifting` then relabels experts over
time and `fitted` adds token-to-token reuse. A generator is one function and one `GENERATORS` line:

    fn(rng, num_experts, top_k, num_layers, num_tokens, **params) -> (topk_ids [T, L, k] int64, params)

where the returned params are the resolved values (JSON-able), recorded in the trace's metadata.
"""
from __future__ import annotations

import functools
from pathlib import Path

import numpy as np

from weave_sim.traces import sampling
from weave_sim.traces.format import RoutingTrace, load_trace
from weave_sim.traces.sticky import fresh_inclusion, keep_prob_for_reuse, sample_sticky
from weave_sim.traces.stats import expert_loads, token_reuse, zipf_exponent

#: Default skew when a generator is given neither an exponent nor a target: expected max/mean expert
#: load per layer at large token counts. The real GPT-OSS-20B trace averages 2.45 (2.0-3.6 by layer).
DEFAULT_IMBALANCE = 2.0

#: Most routing entries (tokens x MoE layers x top-k) a run generates or forms: 2 GiB of int64 (weave_sim.config
#: checks a run's against it too).
MAX_ROUTING_ENTRIES = 1 << 28


def _numbers(value, name: str, scalar: bool = False) -> np.ndarray:
    """A parameter that must be a finite number (scalar) or a number or (nested) list of them, as float64; else a
    ValueError naming it and its value."""
    try:
        arr = np.asarray(value, dtype=np.float64)
    except (TypeError, ValueError, OverflowError):
        arr = None
    if (arr is None or isinstance(value, (bool, str, bytes)) or (scalar and arr.ndim != 0)
            or (arr.size and not np.all(np.isfinite(arr)))):
        what = "one finite number" if scalar else "a finite number or a list of finite numbers"
        raise ValueError(f"parameter {name} must be {what}, got {value!r:.200}")
    return arr


def _number(value, name: str) -> float:
    """A parameter that must be one finite number."""
    return float(_numbers(value, name, scalar=True))


def _per_layer(value, num_layers: int, name: str) -> np.ndarray:
    """A scalar or a `[num_layers]` sequence as float64 `[num_layers]`."""
    arr = _numbers(value, name)
    if arr.ndim == 0:
        return np.full(num_layers, float(arr))
    if arr.shape != (num_layers,):
        raise ValueError(f"{name} must be a scalar or have one value per layer ({num_layers}), got {arr.shape}")
    return arr


def resample_layers(values, num_layers: int) -> np.ndarray:
    """Stretch a per-layer profile `[L_src]` to `[num_layers]` by linear interpolation over relative depth."""
    values = np.asarray(values, dtype=np.float64).reshape(-1)
    if values.size == 1:
        return np.full(num_layers, values[0])
    return np.interp(np.linspace(0.0, 1.0, num_layers), np.linspace(0.0, 1.0, values.size), values)


def _permute_experts(rng: np.random.Generator, weights: np.ndarray) -> np.ndarray:
    """Shuffle expert ids independently per layer, so that the hot experts differ across layers."""
    return rng.permuted(weights, axis=1)


def _zipf_exponents(num_experts, top_k, num_layers, s, imbalance) -> np.ndarray:
    if s is not None and imbalance is not None:
        raise ValueError("give either s (Zipf exponent) or imbalance (target max/mean load), not both")
    if s is not None:
        exponents = _per_layer(s, num_layers, "s")
        if np.any(exponents < 0):
            raise ValueError(f"Zipf exponent s must be >= 0, got {exponents.min()}")
        return exponents
    if imbalance is None:
        # Halfway to the ceiling E/k when DEFAULT_IMBALANCE is out of reach (top-k close to E).
        imbalance = min(DEFAULT_IMBALANCE, (1.0 + num_experts / top_k) / 2.0)
    target = _per_layer(imbalance, num_layers, "imbalance")
    return sampling.zipf_exponent_for_imbalance(num_experts, top_k, target)


def uniform(rng, num_experts, top_k, num_layers, num_tokens):
    """Every expert equally likely: the balanced baseline."""
    weights = np.ones((num_layers, num_experts))
    return sampling.sample_topk(rng, weights, num_tokens, top_k), {}


def zipf(rng, num_experts, top_k, num_layers, num_tokens, *, s=None, imbalance=None):
    """Expert popularity w_r proportional to (r + 1) ** -s by rank, ranks shuffled per layer.

    s: Zipf exponent (scalar or per layer), or imbalance: target expected max/mean load (scalar or per
    layer) from which s is solved for this geometry; neither means imbalance = DEFAULT_IMBALANCE (or
    halfway to the ceiling E/k when that is lower).
    """
    exponents = _zipf_exponents(num_experts, top_k, num_layers, s, imbalance)
    weights = _permute_experts(rng, sampling.zipf_weights(num_experts, exponents))
    return sampling.sample_topk(rng, weights, num_tokens, top_k), {"s": exponents.round(6).tolist()}


def dirichlet(rng, num_experts, top_k, num_layers, num_tokens, *, alpha=4.0):
    """Per-layer expert popularity drawn from a symmetric Dirichlet(alpha); small alpha = more skew.

    alpha: concentration, scalar or per layer, > 0. Expected max/mean at alpha 4: about 2.9 for 256
    experts top-8, 2.1 for 32 experts top-4 (alpha 8: 2.3 and 1.75).
    """
    concentration = _per_layer(alpha, num_layers, "alpha")
    if np.any(concentration <= 0):
        raise ValueError(f"Dirichlet alpha must be > 0, got {concentration.min()}")
    # Gamma draws normalised per row are Dirichlet; a floor keeps tiny alphas from making zero rows.
    weights = rng.gamma(concentration[:, None], size=(num_layers, num_experts)) + 1e-300
    return sampling.sample_topk(rng, weights, num_tokens, top_k), {"alpha": concentration.tolist()}


def drifting(rng, num_experts, top_k, num_layers, num_tokens, *, s=None, imbalance=None,
             drift_experts_per_1k_tokens=None, layer_shift_experts=None):
    """Hot experts that move: a Zipf popularity laid out on consecutive expert ids (hottest first), whose
    block rotates by `drift_experts_per_1k_tokens` ids per 1000 tokens and by `layer_shift_experts` ids
    per layer. With contiguous placement the hot GPU changes along the batch and across layers.

    Defaults: drift E/64 ids per 1000 tokens (an eighth of the ids over 8192 tokens), layer shift E/8
    ids; skew as for `zipf`.
    """
    exponents = _zipf_exponents(num_experts, top_k, num_layers, s, imbalance)
    drift = (num_experts / 64 if drift_experts_per_1k_tokens is None
             else _number(drift_experts_per_1k_tokens, "drift_experts_per_1k_tokens"))
    layer_shift = num_experts / 8 if layer_shift_experts is None else _number(layer_shift_experts, "layer_shift_experts")
    ranks = sampling.sample_topk(rng, sampling.zipf_weights(num_experts, exponents), num_tokens, top_k)
    offset = (np.arange(num_tokens)[:, None] * drift / 1000.0 + np.arange(num_layers)[None, :] * layer_shift)
    # The same integer rotation for every slot of a token keeps its k experts distinct. (Reduced mod E before the cast,
    # so that a huge drift or shift rotates as it says instead of overflowing int64; the same ids otherwise.)
    ids = (ranks + np.floor(np.mod(offset, num_experts)).astype(np.int64)[:, :, None]) % num_experts
    return ids, {"s": exponents.round(6).tolist(), "drift_experts_per_1k_tokens": drift,
                 "layer_shift_experts": layer_shift}


def _profile_inclusion(rng, counts: np.ndarray, num_experts: int, top_k: int) -> np.ndarray:
    """Per-expert inclusion probabilities `[P, num_experts]` from counts `[P, E_src]`.

    Same expert count: the counts as they are. Otherwise the sorted load curve (load / mean against rank
    quantile) is resampled to num_experts ranks and the ranks shuffled per layer.
    """
    relative = counts / counts.mean(axis=1, keepdims=True)
    if counts.shape[1] != num_experts:
        ordered = -np.sort(-relative, axis=1)
        src_q = (np.arange(counts.shape[1]) + 0.5) / counts.shape[1]
        dst_q = (np.arange(num_experts) + 0.5) / num_experts
        relative = np.stack([np.interp(dst_q, src_q, row) for row in ordered])
        relative = _permute_experts(rng, relative / relative.mean(axis=1, keepdims=True))
    return np.clip(relative * top_k / num_experts, 0.0, 1.0)


def load_profile(rng, num_experts, top_k, num_layers, num_tokens, *, profile="olmoe-1b-7b", domain="all",
                 counts=None, profile_layer_idx=None, profile_num_layers=None):
    """Popularity taken from measured per-expert counts (the OLMoE / Mixtral profiles by default).

    profile: "olmoe-1b-7b" or "mixtral-8x7b" (see `load_expert_load_profiles`); domain: one of its
    domains or "all" (summed). Or counts: explicit `[P, E_src]` counts, with profile_layer_idx (`[P]`
    model layers they describe) and profile_num_layers. Each generated layer uses the profile row of the
    nearest relative depth; weights are chosen so that each expert's inclusion probability matches its
    share of the counts.
    """
    if counts is None:
        from weave_sim.traces.shipped import load_expert_load_profiles

        profiles = load_expert_load_profiles()
        if profile not in profiles:
            raise ValueError(f"unknown load profile {profile!r}; known: {', '.join(profiles)}")
        prof = profiles[profile]
        if domain != "all" and domain not in prof.counts:
            raise ValueError(f"unknown domain {domain!r} for {profile}; known: all, {', '.join(prof.domains)}")
        table = prof.total_counts() if domain == "all" else prof.counts[domain]
        profile_layer_idx, profile_num_layers = prof.layer_idx, prof.num_model_layers
    else:
        table = _numbers(counts, "counts")
        if table.ndim == 1:
            table = table[None, :]
        if table.ndim != 2 or table.shape[1] < 1:
            raise ValueError(f"parameter counts must be [E_src] or [P, E_src] per-expert counts, got shape {table.shape}")
        profile, domain = "explicit", None
        profile_layer_idx = range(table.shape[0]) if profile_layer_idx is None else profile_layer_idx
        profile_num_layers = table.shape[0] if profile_num_layers is None else profile_num_layers
        idx = _numbers(list(profile_layer_idx), "profile_layer_idx")
        if idx.shape != (table.shape[0],):
            raise ValueError(f"parameter profile_layer_idx must give one model layer per row of counts "
                             f"({table.shape[0]}), got {list(profile_layer_idx)!r:.200}")
        num = _number(profile_num_layers, "profile_num_layers")
        if num < 1 or num != int(num) or np.any(idx < 0) or np.any(idx >= num):
            raise ValueError(f"parameter profile_num_layers must be an integer >= 1 above every profile_layer_idx, "
                             f"got {profile_num_layers!r} for layers {idx.tolist()!r:.200}")
    table = np.asarray(table, dtype=np.float64)
    if np.any(table < 0) or np.any(table.sum(axis=1) <= 0):
        raise ValueError("profile counts must be non-negative with a positive total per layer")
    src_depth = np.asarray(profile_layer_idx, dtype=np.float64) / max(profile_num_layers - 1, 1)
    dst_depth = np.arange(num_layers) / max(num_layers - 1, 1)
    rows = np.abs(dst_depth[:, None] - src_depth[None, :]).argmin(axis=1)
    inclusion = _profile_inclusion(rng, table, num_experts, top_k)[rows]
    weights = sampling.weights_for_inclusion(inclusion)
    return sampling.sample_topk(rng, weights, num_tokens, top_k), {
        "profile": profile, "domain": domain, "profile_rows": rows.tolist()}


def fit_params(trace: RoutingTrace, num_experts: int | None = None) -> dict:
    """The statistics `fitted` reproduces, measured on a trace: per-layer `imbalance` (max/mean load),
    `zipf_s` and `reuse` (fraction of top-k shared with the previous token of the same request)."""
    from weave_sim.traces.format import resolve_model

    if num_experts is None:
        num_experts = resolve_model(trace.model).num_experts if trace.model else int(trace.topk_ids.max()) + 1
    loads = expert_loads(trace.topk_ids, num_experts)
    return {"imbalance": (loads.max(axis=1) / loads.mean(axis=1)).tolist(),
            "zipf_s": zipf_exponent(loads).tolist(),
            "reuse": np.nan_to_num(token_reuse(trace.topk_ids, trace.request_id)).tolist()}


@functools.lru_cache(maxsize=1)
def _default_fit_params_cached() -> tuple:
    from weave_sim.traces.shipped import default_trace

    return tuple(fit_params(default_trace()).items())


def _default_fit_params() -> dict:
    """fit_params of the shipped subset, measured once per process (a fresh dict each call)."""
    return {key: list(value) for key, value in _default_fit_params_cached()}


def fitted(rng, num_experts, top_k, num_layers, num_tokens, *, source=None, imbalance=None, reuse=None,
           zipf_s=None, match="imbalance"):
    """Routing with a real trace's per-layer skew and token-to-token reuse, for any geometry.

    source: a RoutingTrace or a trace path to measure (default: the shipped GPT-OSS-20B subset), or
    the statistics directly: imbalance / zipf_s / reuse, each a scalar or per-layer list (any length;
    stretched over relative depth to num_layers). match: "imbalance" solves each layer's Zipf exponent
    so that its expected max/mean load equals the source's (transfers across expert counts); "zipf" uses
    the source's fitted exponents as they are. Reuse is reproduced by keeping each slot's expert from
    the previous token with a probability solved from the mean-field model in `sticky`.
    """
    for name, value in (("imbalance", imbalance), ("reuse", reuse), ("zipf_s", zipf_s)):
        if value is not None and _numbers(value, name).ndim > 1:
            raise ValueError(f"parameter {name} must be a number or a per-layer list, got {value!r:.200}")
    if source is not None and not isinstance(source, (RoutingTrace, str, Path)):
        raise ValueError(f"parameter source must be a RoutingTrace or a trace path, got {source!r:.200}")
    if imbalance is None or reuse is None or (match == "zipf" and zipf_s is None):
        if source is None:
            measured = _default_fit_params()
        else:
            measured = fit_params(source if isinstance(source, RoutingTrace) else load_trace(source))
        imbalance = measured["imbalance"] if imbalance is None else imbalance
        reuse = measured["reuse"] if reuse is None else reuse
        zipf_s = measured["zipf_s"] if zipf_s is None else zipf_s
    if match == "imbalance":
        # The ceiling E/k (all load on k experts) cannot be reached; stay 5% below it.
        target = np.clip(resample_layers(imbalance, num_layers), 1.0, max(1.0, 0.95 * num_experts / top_k))
        exponents = sampling.zipf_exponent_for_imbalance(num_experts, top_k, target)
    elif match == "zipf":
        exponents = resample_layers(zipf_s, num_layers)
    else:
        raise ValueError(f"match must be 'imbalance' or 'zipf', got {match!r}")
    inclusion = sampling.inclusion_probabilities(
        _permute_experts(rng, sampling.zipf_weights(num_experts, exponents)), top_k)
    target_reuse = np.clip(resample_layers(reuse, num_layers), 0.0, 0.99)
    keep_prob = keep_prob_for_reuse(inclusion, target_reuse, top_k)
    # Fresh draws avoid kept experts, which are mostly hot ones; aim them at the inclusion that keeps
    # the overall marginal at `inclusion` (see sticky.fresh_inclusion).
    weights = sampling.weights_for_inclusion(fresh_inclusion(inclusion, keep_prob))
    ids = sample_sticky(rng, weights, num_tokens, top_k, keep_prob)
    return ids, {"match": match, "s": exponents.round(6).tolist(), "reuse": target_reuse.round(6).tolist(),
                 "keep_prob": keep_prob.round(6).tolist()}


#: Generator name -> function; add a generator with one function and one line here.
GENERATORS = {
    "uniform": uniform,
    "zipf": zipf,
    "dirichlet": dirichlet,
    "drifting": drifting,
    "load_profile": load_profile,
    "fitted": fitted,
}


def generate(kind: str, *, num_experts: int, top_k: int, num_layers: int, num_tokens: int, seed: int,
             **params) -> RoutingTrace:
    """Synthetic routing of `num_tokens` tokens: a RoutingTrace with topk_ids int64
    `[num_tokens, num_layers, top_k]` (distinct experts per token and layer), no probabilities and no
    request ids (one stream). Same (kind, geometry, seed, params) gives the same ids. metadata records
    generator, seed and the resolved params; model is None (set it with `with_metadata(model=...)`).
    """
    if kind not in GENERATORS:
        raise ValueError(f"unknown generator {kind!r}; known: {', '.join(GENERATORS)}")
    if not 1 <= top_k <= num_experts:
        raise ValueError(f"top_k must be in 1..num_experts ({num_experts}), got {top_k}")
    if num_layers < 1 or num_tokens < 1:
        raise ValueError(f"num_layers and num_tokens must be >= 1, got {num_layers}, {num_tokens}")
    if num_tokens * num_layers * top_k > MAX_ROUTING_ENTRIES:
        raise ValueError(f"{num_tokens} tokens x {num_layers} layers x top-{top_k} is more routing than a trace "
                         f"holds ({MAX_ROUTING_ENTRIES} entries): use fewer tokens, or a model with fewer layers")
    rng = np.random.default_rng(seed)
    try:
        ids, resolved = GENERATORS[kind](rng, num_experts, top_k, num_layers, num_tokens, **params)
    except TypeError as exc:
        if "unexpected keyword" in str(exc):
            raise ValueError(f"generator {kind!r}: {exc}") from None
        # a parameter of the wrong type that no check above caught (e.g. a list where a name belongs)
        raise ValueError(f"generator {kind!r}: a parameter has the wrong type ({exc}); given "
                         f"{ {k: v for k, v in params.items() if not isinstance(v, RoutingTrace)}!r:.300}") from None
    meta = {"generator": kind, "seed": seed, "params": resolved, "source": "synthetic"}
    return RoutingTrace(ids, metadata=meta)




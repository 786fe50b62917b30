"""Small layers and profiles for tests, examples and quick experiments (no traces needed).

`tiny_profile` shrinks the H200 profile (fewer SMs, optional fixed-cost and rate overrides) so that whole
random layers simulate in milliseconds; `gumbel_routing` draws top-k routing with a tunable expert skew.
"""
from __future__ import annotations

import copy

import numpy as np

from ..placement import Placement, contiguous, round_robin
from ..presets import ModelPreset
from ..profile import HardwareProfile, load_profile, profile_from_dict
from ..workload import LayerWorkload, layer_workload, pairs_dispatched


def tiny_profile(num_sms: int = 16, *, fixed_ns: dict | None = None, per_sm_tflops: float | None = None,
                 hbm_gbs: float | None = None, gemm_peak_tflops: float | None = None, rho: float | None = None,
                 tile: int | None = None, base: str = "h200") -> HardwareProfile:
    """The `base` profile with `num_sms` SMs; fixed_ns entries override (missing keys keep their value).

    per_sm_tflops: make the GEMM rate flat at this value for every row count.
    tile: the cost model's square GEMM tile (its parallelism cap counts tiles of this size).
    """
    raw = copy.deepcopy(load_profile(base).raw)
    raw["num_sms"] = num_sms
    raw["name"] = f"{raw['name']}-tiny{num_sms}"
    if fixed_ns is not None:
        raw["fixed_ns"] = {**raw["fixed_ns"], **fixed_ns}
    if per_sm_tflops is not None:
        raw["gemm"]["per_sm_tflops_by_rows"] = {"1": per_sm_tflops, "1024": per_sm_tflops}
    if hbm_gbs is not None:
        raw["hbm_gbs"] = hbm_gbs
    if gemm_peak_tflops is not None:
        raw["gemm"]["peak_tflops"] = gemm_peak_tflops
    if tile is not None:
        raw["gemm"]["tile_rows"] = raw["gemm"]["tile_cols"] = tile
    if rho is not None:
        raw["rho"] = rho
    return profile_from_dict(raw, origin="tiny_profile")


ZERO_FIXED = {"launch": 0, "host_sync": 0, "grid_barrier": 0, "task_claim": 0, "signal": 0,
              "count_exchange": 0, "decision": 0}


def gumbel_routing(num_tokens: int, num_experts: int, top_k: int, *, skew: float = 0.0,
                   seed: int = 0) -> np.ndarray:
    """int64 [num_tokens, top_k]: distinct experts per token, popularity log-normal with sigma `skew`."""
    rng = np.random.default_rng(seed)
    logits = rng.gumbel(size=(num_tokens, num_experts)) + skew * rng.standard_normal(num_experts)
    return np.argsort(-logits, axis=1, kind="stable")[:, :top_k].astype(np.int64)


def tiny_model(hidden: int = 128, ffn: int = 128, experts: int = 8, top_k: int = 2) -> ModelPreset:
    return ModelPreset("tiny", hidden, ffn, experts, top_k, 0, 1)


def random_layer(num_gpus: int, tokens: int, model: ModelPreset, *, skew: float = 0.0, seed: int = 0,
                 placement: str = "contiguous") -> LayerWorkload:
    """A LayerWorkload of `tokens` tokens with Gumbel routing on `num_gpus` GPUs."""
    place: Placement = (contiguous if placement == "contiguous" else round_robin)(model.num_experts, num_gpus)
    ids = gumbel_routing(tokens, model.num_experts, model.top_k, skew=skew, seed=seed)
    return layer_workload(ids, model, place)


def simulated_bench_file(path, profile: HardwareProfile, hidden: int, inter: int, *, tokens: int = 1024,
                         policies=("static:4", "static:24"), seed: int = 0, expert_dtype: str = "bf16"):
    """Write a kernel-benchmark JSON (weave_kernel.bench's result format) of one 2-GPU layer (8 experts, top-2,
    uniform random routing) whose latencies `profile` simulated: what `weave-sim calibrate --fit` should fit
    back. expert_dtype 'fp8': FP8 experts (profile.fp8_profile of `profile`, e4m3 bytes), recorded as bench
    --expert-dtype fp8 records them, for `calibrate --fp8`. Returns the path."""
    import json
    from pathlib import Path

    from ..profile import fp8_profile
    from ..validate import KERNEL_LAYOUTS, kernel_layout_for, sim_policy
    from .run import simulate_layer

    model = ModelPreset("m", hidden, inter, 8, 2, 0, 1)
    ids = np.argsort(np.random.default_rng(seed).random((2 * tokens, 8)), axis=1)[:, :2]
    w = pairs_dispatched(layer_workload(ids, model, contiguous(8, 2)))  # the kernel's counts are pair-based
    fp8 = expert_dtype == "fp8"
    layout = kernel_layout_for(expert_dtype)
    opts = {**KERNEL_LAYOUTS[layout], **({"expert_dtype": "fp8"} if fp8 else {})}
    prof = fp8_profile(profile) if fp8 else profile
    lat = {p: simulate_layer(w, prof, sim_policy(p), **opts).latency_ns / 1e6 for p in policies}
    Path(path).write_text(json.dumps({"results": [{
        "kernel_layout": layout, "model": "m", "tokens_per_gpu": tokens, "gpus": 2, "experts": 8, "top_k": 2,
        "hidden": hidden, "inter": inter, "latency_ms": lat, **({"expert_dtype": "fp8"} if fp8 else {}),
        "counts": {"source_expert_pairs": w.pair_counts.sum(axis=1).tolist(), "dispatch_rows": w.dispatch_rows.tolist(),
                   "tokens_per_gpu": [tokens, tokens]}}]}))
    return Path(path)

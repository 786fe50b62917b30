"""The counts the kernel exchanges, in the form weave_sim reads, and the cost model's (c*, K*) for them.

The `weave` policy evaluates weave_sim's cost model inside the kernel (csrc/choice.cuh over
csrc/cost_model.cuh). These helpers build the same inputs on the host so that tests and the benchmark can
compare the kernel's choice with `weave_sim.costmodel.choose`, and so that `weave-sim validate` can rebuild the
workload of a benchmark result (`counts`).

This kernel dispatches one row per (token, expert) pair, so `dispatch_rows[s][d]` is pair-based: the pairs of
source s routed to experts owned by d (`dispatch_rows_kind: "pairs"`), not distinct tokens.
"""
from __future__ import annotations

import numpy as np

# The cost profile whose table the kernel's `weave` reads unless told otherwise: fitted to this kernel
# (docs/results.md); "h200" is the seed. Here rather than in megakernel.py so that the CPU tools (predict, whatif,
# gap, recount) run without torch.
DEFAULT_COST_PROFILE = "h200-megakernel"


def counts_from_routing(ids_per_rank, num_experts: int, placement) -> dict:
    """ids_per_rank: one [N_s, k] array of global expert ids per source rank (N_s may differ)."""
    pairs = np.stack([np.bincount(np.asarray(ids).ravel().astype(np.int64), minlength=num_experts)
                      for ids in ids_per_rank]).astype(np.int64)
    owner = np.asarray(placement.owner)
    g = len(ids_per_rank)
    rows = np.stack([pairs[:, owner == d].sum(axis=1) for d in range(g)], axis=1).astype(np.int64)
    return {
        "source_expert_pairs": pairs.tolist(),
        "dispatch_rows": rows.tolist(),
        "tokens_per_gpu": [int(np.asarray(ids).shape[0]) for ids in ids_per_rank],
        "dispatch_rows_kind": "pairs",
    }


def geometry_model(hidden: int, inter: int, num_experts: int, top_k: int, name: str = "kernel-layer"):
    """A weave_sim ModelPreset with just this layer's geometry (tests cut experts and tokens of the presets)."""
    from weave_sim.presets import ModelPreset

    return ModelPreset(name=name, hidden_size=hidden, expert_ffn_size=inter, num_experts=num_experts,
                       top_k=top_k, num_shared_experts=0, num_moe_layers=1)


def model_choice(counts: dict, model, placement, profile=DEFAULT_COST_PROFILE) -> list[dict]:
    """weave_sim.costmodel.choose for the counts: per GPU {"c_star", "k_star", "time_ns"}."""
    from weave_sim import costmodel
    from weave_sim.profile import HardwareProfile, load_profile
    from weave_sim.workload import workload_from_counts

    prof = profile if isinstance(profile, HardwareProfile) else load_profile(profile)
    w = workload_from_counts(counts["source_expert_pairs"], counts["dispatch_rows"], model, placement,
                             counts["tokens_per_gpu"])
    ch = costmodel.choose(costmodel.Volumes.from_workloads([w], prof), prof)
    return [{"c_star": int(ch.num_comm_sms[0, g]), "k_star": int(ch.num_chunks[0, g]),
             "time_ns": float(ch.time_ns[0, g])} for g in range(placement.num_gpus)]


def choice_agrees(kernel: dict | None, python: dict, rel_time: float = 1e-9) -> bool:
    """Same (c*, K*) and the same predicted time (relative rel_time)."""
    if kernel is None:
        return False
    same_t = abs(kernel["time_ns"] - python["time_ns"]) <= rel_time * max(abs(python["time_ns"]), 1e-300)
    return kernel["c_star"] == python["c_star"] and kernel["k_star"] == python["k_star"] and same_t

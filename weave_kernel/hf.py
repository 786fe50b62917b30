"""Hugging Face transformers MoE blocks -> WeaveMoE, by the blocks' structure (transformers 5.x layout).

    from weave_kernel.hf import replace_moe_blocks
    n = replace_moe_blocks(model, max_tokens=8192)     # every supported MoE block of the model, in place
    from weave_kernel.hf import from_hf_block
    moe = from_hf_block(model.model.layers[3].mlp, max_tokens=8192, backend="torch")

A block qualifies when it has
- `gate`: a top-k router with `weight` [E, H] and `top_k` (Mixtral, Qwen2/3-MoE, Qwen3-Next, Qwen3.5-MoE, OLMoE,
  DeepSeek-V3 and the like); with `e_score_correction_bias` it is DeepSeek-V3's sigmoid router (n_group /
  topk_group / routed_scaling_factor / norm_topk_prob read from it), else a softmax router (norm_topk_prob read from
  it; Mixtral's, which has none, always renormalises);
- `experts` with `gate_up_proj` [E, 2I, H] (gate rows first) and `down_proj` [E, H, I], SiLU activation, no biases;
- optionally `shared_experts` (DeepSeek) or `shared_expert` (Qwen) with gate_proj / up_proj / down_proj Linears
  without bias, and `shared_expert_gate` (a Linear H -> 1: the shared row weighted by its sigmoid).
Anything else (expert biases, other activations, routers with other rules) raises UnsupportedBlock rather than
computing something else. The router's logits are computed in the dtype the checkpoint's code uses (float32 for
DeepSeek-V3's router, the router weight's dtype otherwise), so near-ties break the same way.
"""
from __future__ import annotations

import torch

from .module import WeaveMoE


class UnsupportedBlock(ValueError):
    """The module is not an MoE block WeaveMoE computes exactly."""


def _linear_weight(mod, name: str, block) -> torch.Tensor:
    lin = getattr(mod, name, None)
    if not isinstance(lin, torch.nn.Linear):
        raise UnsupportedBlock(f"{type(block).__name__}: shared expert without a {name} Linear")
    if lin.bias is not None:
        raise UnsupportedBlock(f"{type(block).__name__}: shared expert {name} has a bias")
    return lin.weight


def _is_silu(act) -> bool:
    return isinstance(act, torch.nn.SiLU) or type(act).__name__ in ("SiLUActivation", "SiLU")


def describe_block(block) -> dict:
    """The WeaveMoE arguments and weights of an HF MoE block; raises UnsupportedBlock."""
    name = type(block).__name__
    gate, experts = getattr(block, "gate", None), getattr(block, "experts", None)
    if gate is None or experts is None or not isinstance(getattr(gate, "weight", None), torch.Tensor):
        raise UnsupportedBlock(f"{name}: no gate (router with a weight) and experts")
    if not hasattr(experts, "gate_up_proj") or not hasattr(experts, "down_proj"):
        raise UnsupportedBlock(f"{name}: experts without gate_up_proj / down_proj (fused 3-D expert weights)")
    for attr in ("gate_up_proj_bias", "down_proj_bias"):
        if getattr(experts, attr, None) is not None:
            raise UnsupportedBlock(f"{name}: experts have {attr}; the kernel's experts have no biases")
    if not _is_silu(getattr(experts, "act_fn", None)):
        raise UnsupportedBlock(f"{name}: expert activation {type(getattr(experts, 'act_fn', None)).__name__}, not SiLU")
    gu, down = experts.gate_up_proj, experts.down_proj
    E, two_i, H = gu.shape
    I = two_i // 2
    if tuple(down.shape) != (E, H, I) or tuple(gate.weight.shape) != (E, H):
        raise UnsupportedBlock(f"{name}: expert shapes {tuple(gu.shape)} / {tuple(down.shape)} and router "
                               f"{tuple(gate.weight.shape)} do not form one SwiGLU MoE")
    top_k = getattr(gate, "top_k", None) or getattr(block, "top_k", None)
    if not top_k:
        raise UnsupportedBlock(f"{name}: the router does not say its top_k")
    kw = dict(hidden=H, inter=I, num_experts=E, top_k=int(top_k))
    bias = getattr(gate, "e_score_correction_bias", None)
    if bias is not None:  # DeepSeek-V3's router
        kw.update(scoring="sigmoid", score_bias=True, norm_topk=bool(getattr(gate, "norm_topk_prob", True)),
                  routed_scale=float(getattr(gate, "routed_scaling_factor", 1.0)),
                  n_group=int(getattr(gate, "num_group", 1) or 1), topk_group=int(getattr(gate, "topk_group", 1) or 1),
                  router_dtype=torch.float32)
    else:
        kw.update(scoring="softmax", norm_topk=bool(getattr(gate, "norm_topk_prob", True)),
                  router_dtype=gate.weight.dtype)
    weights = {"router": gate.weight, "score_bias": bias, "gate_up": gu, "down": down}
    shared = getattr(block, "shared_experts", None) or getattr(block, "shared_expert", None)
    if shared is not None:
        if not _is_silu(getattr(shared, "act_fn", None)):
            raise UnsupportedBlock(f"{name}: shared expert activation is not SiLU")
        sg, su, sd = (_linear_weight(shared, n, block) for n in ("gate_proj", "up_proj", "down_proj"))
        kw["shared_inter"] = sg.shape[0]
        weights["shared"] = (sg, su, sd)
        sgate = getattr(block, "shared_expert_gate", None)
        if sgate is not None:
            if not isinstance(sgate, torch.nn.Linear) or sgate.bias is not None or tuple(sgate.weight.shape) != (1, H):
                raise UnsupportedBlock(f"{name}: shared_expert_gate is not a Linear H -> 1 without bias")
            kw["shared_gate"] = True
            weights["shared_gate"] = sgate.weight
    return {"kwargs": kw, "weights": weights}


def from_hf_block(block, *, max_tokens: int, **kwargs) -> WeaveMoE:
    """A WeaveMoE computing `block` (an HF MoE block), its weights copied; kwargs go to WeaveMoE (backend, policy,
    placement, group, device, check, shared_order, ...)."""
    d = describe_block(block)
    w = d["weights"]
    kwargs.setdefault("device", w["gate_up"].device)
    moe = WeaveMoE(**d["kwargs"], max_tokens=max_tokens, **kwargs)
    moe.load_router(w["router"], w["score_bias"])
    with torch.no_grad():
        idx = torch.as_tensor(moe.local, device=w["gate_up"].device)
        moe.w13.copy_(w["gate_up"][idx])
        moe.w2.copy_(w["down"][idx])
    if "shared" in w:
        moe.load_shared(*w["shared"], gate_weight=w.get("shared_gate"))
    return moe


def replace_moe_blocks(model: torch.nn.Module, *, max_tokens: int, **kwargs) -> int:
    """Swap every submodule of `model` that describe_block accepts for a WeaveMoE (from_hf_block); returns how many.
    Modules that look like MoE blocks (a gate and experts) but are not supported raise UnsupportedBlock."""
    targets = [(name, mod) for name, mod in model.named_modules()
               if name and hasattr(mod, "gate") and hasattr(mod, "experts") and not isinstance(mod, WeaveMoE)]
    for name, mod in targets:
        parent_name, _, attr = name.rpartition(".")
        parent = model.get_submodule(parent_name) if parent_name else model
        setattr(parent, attr, from_hf_block(mod, max_tokens=max_tokens, **kwargs))
    return len(targets)

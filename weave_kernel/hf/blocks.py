"""Hugging Face transformers MoE blocks described and swapped for WeaveMoE, by the blocks' structure (transformers 5.x
layout): describe_block, from_hf_block, replace_moe_blocks (the package docstring, weave_kernel.hf, says which blocks
qualify)."""
from __future__ import annotations

import torch

from ..module import WeaveMoE, kernel_options


class UnsupportedBlock(ValueError):
    """The module is not an MoE block WeaveMoE computes exactly."""


# The routers whose rule WeaveMoE reproduces, read from their code in transformers 5.24: scoring, whether the top-k
# weights are renormalised ("attr": the router's norm_topk_prob), routed_scaling_factor applied, group-limited top-k
# (True: num_group / topk_group; "topk_method": DeepSeek-V2's greedy or group_limited_greedy), the correction bias,
# and logits in fp32 (else in the router weight's dtype).
def _rule(scoring, norm, scale=False, groups=False, bias=False, fp32=False) -> dict:
    return dict(scoring=scoring, norm=norm, scale=scale, groups=groups, bias=bias, fp32=fp32)


ROUTERS = {
    "MixtralTopKRouter": _rule("softmax", True),
    "Qwen2MoeTopKRouter": _rule("softmax", "attr"),
    "Qwen3MoeTopKRouter": _rule("softmax", "attr"),
    "Qwen3NextTopKRouter": _rule("softmax", "attr"),
    "Qwen3_5MoeTopKRouter": _rule("softmax", True),
    "OlmoeTopKRouter": _rule("softmax", "attr"),
    "DeepseekV2TopkRouter": _rule("softmax", False, scale=True, groups="topk_method", fp32=True),
    "DeepseekV3TopkRouter": _rule("sigmoid", "attr", scale=True, groups=True, bias=True, fp32=True),
    "Glm4MoeTopkRouter": _rule("sigmoid", "attr", scale=True, groups=True, bias=True, fp32=True),
}


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
    """The WeaveMoE arguments of an HF MoE block and where its weights are; raises UnsupportedBlock. Reads only the
    block's structure, attributes, shapes and dtypes, so it works on a model built on the meta device too.
    Returns {"kwargs": WeaveMoE's arguments, "weights": the block's tensors by role (router, score_bias, gate_up,
    down, and shared (gate, up, down) / shared_gate where there are), "names": each role's name inside the block
    (e.g. "experts.gate_up_proj"; a tuple of three for "shared"), and "unused": the names of a shared expert of
    width 0 and its gate, which add nothing}. load_block_weights copies the weights."""
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
    if gu.dtype != torch.bfloat16 or down.dtype != torch.bfloat16:
        raise UnsupportedBlock(f"{name}: experts in {gu.dtype}; WeaveMoE computes in bf16 (the kernel's dtype) and "
                               f"takes bf16 hidden states: cast the model first, model.to(torch.bfloat16)")
    E, two_i, H = gu.shape
    I = two_i // 2
    if tuple(down.shape) != (E, H, I) or tuple(gate.weight.shape) != (E, H):
        raise UnsupportedBlock(f"{name}: expert shapes {tuple(gu.shape)} / {tuple(down.shape)} and router "
                               f"{tuple(gate.weight.shape)} do not form one SwiGLU MoE")
    rule = ROUTERS.get(type(gate).__name__)
    if rule is None:
        raise UnsupportedBlock(f"{name}: router {type(gate).__name__} is not one weave_kernel.hf knows "
                               f"({', '.join(sorted(ROUTERS))}); give WeaveMoE its rule with router=")
    top_k = getattr(gate, "top_k", None)
    if not top_k:
        raise UnsupportedBlock(f"{name}: the router does not say its top_k")
    kw = dict(hidden=H, inter=I, num_experts=E, top_k=int(top_k), scoring=rule["scoring"],
              norm_topk=bool(getattr(gate, "norm_topk_prob")) if rule["norm"] == "attr" else rule["norm"],
              routed_scale=float(getattr(gate, "routed_scaling_factor", 1.0)) if rule["scale"] else 1.0,
              router_dtype=torch.float32 if rule["fp32"] else gate.weight.dtype)
    groups = rule["groups"]
    if groups == "topk_method":  # DeepSeek-V2: greedy, or group-limited greedy
        method = getattr(gate, "topk_method", None)
        if method not in ("greedy", "group_limited_greedy"):
            raise UnsupportedBlock(f"{name}: topk_method {method!r}")
        groups = method == "group_limited_greedy"
    if groups:
        kw.update(n_group=int(gate.num_group), topk_group=int(gate.topk_group))
    bias = None
    if rule["bias"]:
        bias = gate.e_score_correction_bias
        kw["score_bias"] = True
    weights = {"router": gate.weight, "score_bias": bias, "gate_up": gu, "down": down}
    shared = getattr(block, "shared_experts", None) or getattr(block, "shared_expert", None)
    if shared is not None:
        if not _is_silu(getattr(shared, "act_fn", None)):
            raise UnsupportedBlock(f"{name}: shared expert activation is not SiLU")
        sg, su, sd = (_linear_weight(shared, n, block) for n in ("gate_proj", "up_proj", "down_proj"))
        if any(t.dtype != torch.bfloat16 for t in (sg, su, sd)):
            raise UnsupportedBlock(f"{name}: shared expert in {sg.dtype}; WeaveMoE computes in bf16: cast the model "
                                   f"first, model.to(torch.bfloat16)")
    if shared is not None and sg.shape[0] > 0:  # a shared expert of width 0 (n_shared_experts=0) adds nothing
        kw["shared_inter"] = sg.shape[0]
        weights["shared"] = (sg, su, sd)
        sgate = getattr(block, "shared_expert_gate", None)
        if sgate is not None:
            if not isinstance(sgate, torch.nn.Linear) or sgate.bias is not None or tuple(sgate.weight.shape) != (1, H):
                raise UnsupportedBlock(f"{name}: shared_expert_gate is not a Linear H -> 1 without bias")
            kw["shared_gate"] = True
            weights["shared_gate"] = sgate.weight
    unused = []  # a shared expert of width 0 and its gate: tensors of the block WeaveMoE has no use for
    if shared is not None and "shared" not in weights:
        unused = [*shared.parameters(), *getattr(block, "shared_expert_gate", torch.nn.Module()).parameters()]
    return {"kwargs": kw, "weights": weights, "names": _role_names(block, weights, unused)}


def _role_names(block, weights: dict, unused: list) -> dict:
    """Each role's parameter (or buffer) name inside `block`, found by identity; "unused": the names of `unused`."""
    by_id = {id(t): n for n, t in (*block.named_parameters(), *block.named_buffers())}
    names = {}
    for role, t in weights.items():
        if t is None:
            continue
        names[role] = tuple(by_id[id(x)] for x in t) if role == "shared" else by_id[id(t)]
    if unused:
        names["unused"] = tuple(by_id[id(t)] for t in unused)
    return names


@torch.no_grad()
def load_block_weights(moe: WeaveMoE, weights: dict) -> None:
    """Copy an HF block's weights (describe_block's "weights") into `moe`: the router, its score bias, this rank's
    experts (moe.local) and the shared expert."""
    moe.load_router(weights["router"], weights["score_bias"])
    if moe.fp8:  # quantized (load_experts), gate and up rows in their own 128-row blocks
        gu, I = weights["gate_up"], moe.inter
        moe.load_experts(gu[:, :I], gu[:, I:], weights["down"])
    else:
        idx = torch.as_tensor(moe.local, device=weights["gate_up"].device)
        moe.w13.copy_(weights["gate_up"][idx])
        moe.w2.copy_(weights["down"][idx])
    if "shared" in weights:
        moe.load_shared(*weights["shared"], gate_weight=weights.get("shared_gate"))


def from_hf_block(block, *, max_tokens: int, **kwargs) -> WeaveMoE:
    """A WeaveMoE computing `block` (an HF MoE block), its weights copied; kwargs go to WeaveMoE (backend, policy,
    placement, group, device, check, shared_order, ...)."""
    d = describe_block(block)
    kwargs.setdefault("device", d["weights"]["gate_up"].device)
    moe = WeaveMoE(**d["kwargs"], max_tokens=max_tokens, **kwargs)
    load_block_weights(moe, d["weights"])
    return moe


def _moe_targets(model: torch.nn.Module) -> list:
    """(name, module) of every submodule that looks like an MoE block (a gate and experts), not yet swapped."""
    return [(name, mod) for name, mod in model.named_modules()
            if name and hasattr(mod, "gate") and hasattr(mod, "experts") and not isinstance(mod, WeaveMoE)]


def _refuse_router_logits(model, targets, what_to_do: str) -> None:
    if targets and getattr(getattr(model, "config", None), "output_router_logits", False):
        raise ValueError("the model's config has output_router_logits=True, and WeaveMoE blocks return no router "
                         f"logits (transformers' auxiliary loss would fail on the missing ones): {what_to_do}")


def _sharing(kwargs: dict, share_kernel: bool) -> tuple[bool, dict]:
    """Whether blocks share kernels (kernel backend, no kernel= given), and the kwargs a sharing block takes."""
    share = share_kernel and kwargs.get("backend", "kernel") == "kernel" and kwargs.get("kernel") is None
    return share, {k: v for k, v in kwargs.items() if k not in kernel_options() | {"kernel"}}


def _geometry(desc: dict, device) -> tuple:
    """The key of the blocks that can share one kernel: their geometry and device."""
    return tuple(desc["kwargs"].get(k, 0) for k in ("hidden", "inter", "num_experts", "top_k", "shared_inter")) \
        + (str(device),)


def replace_moe_blocks(model: torch.nn.Module, *, max_tokens: int, share_kernel: bool = True, **kwargs) -> int:
    """Swap every submodule of `model` that describe_block accepts for a WeaveMoE (from_hf_block); returns how many.
    share_kernel (kernel backend): the blocks of one geometry and device run on one MoEMegakernel (WeaveMoE's
    kernel=), built by the first of them with kwargs' kernel options, so a model holds one layer's buffers instead of
    one per layer (megakernel.workspace_bytes: qwen3-30b-a3b's 48 layers at max_tokens 4096 over 8 GPUs hold 1.5 GiB
    per GPU on one kernel, 73 GiB on one kernel each).
    Modules that look like MoE blocks (a gate and experts) but are not supported raise UnsupportedBlock. All or
    nothing: every block is described before any is swapped, and a failure while swapping puts the swapped ones
    back. A WeaveMoE returns no router logits, so a model whose config asks for them (output_router_logits) is
    refused; an explicit model(..., output_router_logits=True) after the swap fails in transformers' own code."""
    targets = _moe_targets(model)
    _refuse_router_logits(model, targets, "set model.config.output_router_logits = False first")
    descs = [describe_block(mod) for _, mod in targets]  # every block supported, before the model changes
    share, own = _sharing(kwargs, share_kernel)
    kernels = {}  # (geometry, device) -> the MoEMegakernel the first block of it built
    done = []
    try:
        for (name, mod), d in zip(targets, descs):
            parent_name, _, attr = name.rpartition(".")
            parent = model.get_submodule(parent_name) if parent_name else model
            key = _geometry(d, kwargs.get("device", d["weights"]["gate_up"].device)) if share else None
            if key in kernels:
                moe = from_hf_block(mod, max_tokens=max_tokens, kernel=kernels[key], **own)
            else:
                moe = from_hf_block(mod, max_tokens=max_tokens, **kwargs)
                if key is not None:
                    kernels[key] = moe.layer
            setattr(parent, attr, moe)
            done.append((parent, attr, mod))
    except BaseException:
        for parent, attr, mod in done:
            setattr(parent, attr, mod)
        raise
    return len(targets)

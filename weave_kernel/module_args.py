"""WeaveMoE's arguments checked before anything is allocated, and a block's kernel= checked against the block: what
weave_kernel.module's constructor runs first (split from it by role)."""
from __future__ import annotations

import inspect
import math
import numbers

import torch

from .validate import full_device

SCORINGS = ("softmax", "sigmoid")
BACKENDS = ("kernel", "torch")


def kernel_options() -> set:
    """The MoEMegakernel options WeaveMoE passes through (its kernel_kwargs): timeout_s, cost_profile, dispatch, ..."""
    from .megakernel import MoEMegakernel

    return set(inspect.signature(MoEMegakernel.__init__).parameters) - {
        "self", "hidden", "inter", "num_experts", "top_k", "placement", "max_tokens", "group", "device", "shared_inter",
        "expert_dtype"}  # (the block's own: it decides what the block stores, and blocks on one kernel must agree)


def check_block_args(*, hidden, inter, num_experts, top_k, max_tokens, backend, policy, scoring, norm_topk,
                     routed_scale, score_bias, router, n_group, topk_group, router_dtype, shared_inter, shared_gate,
                     shared_order, check, on_overflow, expert_dtype, kernel_kwargs) -> tuple:
    """WeaveMoE's arguments checked as the kernel would take them, on either backend and before anything is
    allocated (TypeError / ValueError naming the argument). Returns (hidden, inter, num_experts, top_k, max_tokens,
    shared_inter, n_group, topk_group) as ints, and whether the experts are FP8."""
    from .buffers import check_expert_dtype, check_options, recv_pairs_of
    from .megakernel import FP8_BLOCK, SHARED_ORDERS, build_cost_table
    from .policies import dispatch_issuers, parse_policy

    for name, v, lo in (("hidden", hidden, 1), ("inter", inter, 1), ("num_experts", num_experts, 1),
                        ("top_k", top_k, 1), ("max_tokens", max_tokens, 1), ("shared_inter", shared_inter, 0),
                        ("n_group", n_group, 1), ("topk_group", topk_group, 1)):
        if isinstance(v, bool) or not isinstance(v, numbers.Integral):
            raise TypeError(f"{name} must be an integer, got {v!r}")
        if v < lo:
            raise ValueError(f"{name} must be >= {lo}, got {v}")
    hidden, inter, num_experts, top_k, max_tokens, shared_inter, n_group, topk_group = (
        int(v) for v in (hidden, inter, num_experts, top_k, max_tokens, shared_inter, n_group, topk_group))
    fp8 = check_expert_dtype(expert_dtype) == "fp8"  # the kernel's FP8 limits, on either backend
    if fp8:
        if hidden % FP8_BLOCK or inter % FP8_BLOCK:
            raise ValueError(f"expert_dtype='fp8' needs hidden and inter multiples of {FP8_BLOCK} (the weights' "
                             f"scale blocks), got hidden {hidden}, inter {inter}")
        if shared_inter % FP8_BLOCK:
            raise ValueError(f"expert_dtype='fp8' needs shared_inter a multiple of {FP8_BLOCK} (the FP8 shared "
                             f"expert's scale blocks), got shared_inter {shared_inter}: or use bf16 experts "
                             f"(expert_dtype='bf16')")
    kernel_args = kernel_options()
    unknown = sorted(set(kernel_kwargs) - kernel_args)
    if unknown:
        raise TypeError(f"WeaveMoE got unexpected keyword arguments {unknown}; besides its own it takes "
                        f"MoEMegakernel's {sorted(kernel_args)}")
    if "recv_capacity" in kernel_kwargs:  # its value too, so that a block tested on the torch backend builds
        recv_pairs_of(1, max_tokens, top_k, kernel_kwargs["recv_capacity"])
    if "dispatch" in kernel_kwargs:
        dispatch_issuers(kernel_kwargs["dispatch"])
    check_options(**{k: v for k, v in kernel_kwargs.items() if k in ("timeout_s", "num_ctas", "timeline_per_cta")})
    if "cost_profile" in kernel_kwargs:
        build_cost_table(kernel_kwargs["cost_profile"])
    if shared_order not in SHARED_ORDERS:
        raise ValueError(f"shared_order must be one of {SHARED_ORDERS}, got {shared_order!r}")
    parse_policy(policy, 1 << 30)  # its syntax here; its C against the grid once the kernel layer exists
    if not isinstance(router_dtype, torch.dtype) or not router_dtype.is_floating_point:
        raise TypeError(f"router_dtype must be a floating point torch.dtype (torch.float32, torch.bfloat16, ...), "
                        f"got {router_dtype!r}")
    if not math.isfinite(float(routed_scale)):
        raise ValueError(f"routed_scale must be finite, got {routed_scale}")
    if on_overflow not in ("split", "raise"):
        raise ValueError(f"on_overflow must be 'split' or 'raise', got {on_overflow!r}")
    if backend not in BACKENDS:
        raise ValueError(f"backend must be one of {BACKENDS}, got {backend!r}")
    if scoring not in SCORINGS:
        raise ValueError(f"scoring must be one of {SCORINGS}, got {scoring!r}")
    for flag, v in (("norm_topk", norm_topk), ("score_bias", score_bias), ("check", check)):
        if not isinstance(v, bool):  # "no" would read as True
            raise ValueError(f"{flag} must be True or False, got {v!r}")
    if not 1 <= top_k <= num_experts:
        raise ValueError(f"top_k {top_k} must be in [1, num_experts={num_experts}]")
    if n_group < 1 or num_experts % n_group or not 1 <= topk_group <= n_group:
        raise ValueError(f"n_group ({n_group}) must divide num_experts ({num_experts}) and topk_group ({topk_group}) "
                         f"be in [1, n_group]")
    if n_group > 1 and top_k > topk_group * (num_experts // n_group):
        raise ValueError(f"top_k {top_k} exceeds the {topk_group} x {num_experts // n_group} experts of the groups "
                         f"it may pick from")
    if shared_gate and shared_inter <= 0:
        raise ValueError("shared_gate needs a shared expert (shared_inter > 0)")
    if router is not None:  # the rule's options would be silently unused
        rule = {"scoring": (scoring, "softmax"), "norm_topk": (norm_topk, True), "routed_scale": (routed_scale, 1.0),
                "score_bias": (score_bias, False), "n_group": (n_group, 1), "topk_group": (topk_group, 1),
                "router_dtype": (router_dtype, torch.float32)}
        set_too = sorted(k for k, (v, default) in rule.items() if v != default)
        if set_too:
            raise ValueError(f"router= replaces the built-in routing rule, so {', '.join(set_too)} would be unused: "
                             f"apply them inside the router function, or drop router=")
    return (hidden, inter, num_experts, top_k, max_tokens, shared_inter, n_group, topk_group), fp8


def same_placement(a, b, world: int) -> bool:
    """Whether placements a and b give every rank the same experts in the same local order."""
    return all(list(a.local_experts(g)) == list(b.local_experts(g)) for g in range(world))


def check_shared_kernel(kernel, *, hidden: int, inter: int, num_experts: int, top_k: int, max_tokens: int,
                        shared_inter: int, placement, world: int, group, device, expert_dtype: str = "bf16"):
    """The MoEMegakernel of `kernel` (a MoEMegakernel, or a WeaveMoE on the kernel backend) if a block of this geometry
    can run on it (WeaveMoE's kernel=), else a ValueError naming what differs."""
    from .module import WeaveMoE

    if isinstance(kernel, WeaveMoE):
        if kernel.layer is None:
            raise ValueError("kernel= got a WeaveMoE without a kernel (backend='torch'); pass one on the kernel backend "
                             "or its MoEMegakernel (block.layer)")
        kernel = kernel.layer
    from .megakernel import MoEMegakernel

    if not isinstance(kernel, MoEMegakernel):
        raise TypeError(f"kernel= takes a MoEMegakernel or a WeaveMoE, got {type(kernel).__name__}")
    want = {"hidden": hidden, "inter": inter, "num_experts": num_experts, "top_k": top_k, "max_tokens": max_tokens,
            "world": world}
    have = {k: getattr(kernel, k) for k in want}
    diff = [f"{k} {have[k]} (this block: {want[k]})" for k in want if have[k] != want[k]]
    if shared_inter and kernel.shared_inter != shared_inter:
        diff.append(f"shared_inter {kernel.shared_inter} (this block: {shared_inter})")
    kernel_dtype = "fp8" if getattr(kernel, "fp8", False) else "bf16"
    if kernel_dtype != expert_dtype:
        diff.append(f"expert_dtype {kernel_dtype!r} (this block: {expert_dtype!r})")
    if diff:
        raise ValueError(f"kernel= was built for another geometry: {', '.join(diff)}")
    def world_if_none(g):  # group=None means the default group
        import torch.distributed as dist

        return dist.group.WORLD if g is None and dist.is_available() and dist.is_initialized() else g

    if world_if_none(kernel.group) is not world_if_none(group):
        raise ValueError("kernel= was built on another process group than this block's group=")
    if full_device(device) != full_device(kernel.device):
        raise ValueError(f"kernel= lives on {kernel.device}, this block on {device}")
    if not same_placement(kernel.placement, placement, world):
        raise ValueError("kernel= places the experts differently from this block's placement (every block on one "
                         "kernel has the same placement: pass placement=kernel.placement, or build another kernel)")
    return kernel

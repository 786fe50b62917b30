"""Input checks for the megakernel, runnable without a GPU. Every failure names the argument and the fix."""
from __future__ import annotations

import torch


def _tensor(name: str, t, dtypes: tuple, shape: tuple, device) -> None:
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    if t.dtype not in dtypes:
        raise TypeError(f"{name} must have dtype {' or '.join(str(d) for d in dtypes)}, got {t.dtype}")
    if tuple(t.shape) != shape:
        raise ValueError(f"{name} must have shape {list(shape)}, got {list(t.shape)}")
    if device is not None and t.device != torch.device(device):
        raise ValueError(f"{name} is on {t.device}, the layer runs on {device}")
    if not t.is_contiguous():
        raise ValueError(f"{name} must be contiguous (call .contiguous())")


def check_shared_weights(w13s, w2s, *, hidden: int, inter_shared: int, device=None) -> None:
    """The shared expert's weights: w13s [2*Is, H] (gate rows, then up rows) and w2s [H, Is], bf16, contiguous."""
    _tensor("w13s", w13s, (torch.bfloat16,), (2 * inter_shared, hidden), device)
    _tensor("w2s", w2s, (torch.bfloat16,), (hidden, inter_shared), device)


def check_shared_scale(scale, num_tokens: int, device=None) -> None:
    """The shared expert's weight per token: [N] fp32, contiguous."""
    _tensor("shared_scale", scale, (torch.float32,), (num_tokens,), device)


def check_layer_inputs(x, topk_ids, topk_weights, w13, w2, *, hidden: int, inter: int, num_experts: int,
                       num_local_experts: int, top_k: int, max_tokens: int, device=None,
                       check_ids: bool = True) -> None:
    """Check one call's tensors against the layer. check_ids scans topk_ids (one host sync)."""
    if not isinstance(x, torch.Tensor) or x.dim() != 2:
        raise ValueError(f"x must be a 2-D tensor [num_tokens, {hidden}]")
    n = x.shape[0]
    if n > max_tokens:
        raise ValueError(f"{n} tokens exceed the {max_tokens} the buffers were sized for (max_tokens)")
    _tensor("x", x, (torch.bfloat16,), (n, hidden), device)
    _tensor("topk_ids", topk_ids, (torch.int32, torch.int64), (n, top_k), device)
    _tensor("topk_weights", topk_weights, (torch.float32,), (n, top_k), device)
    _tensor("w13", w13, (torch.bfloat16,), (num_local_experts, 2 * inter, hidden), device)
    _tensor("w2", w2, (torch.bfloat16,), (num_local_experts, hidden, inter), device)
    if check_ids and n:
        lo, hi = int(topk_ids.min()), int(topk_ids.max())
        if lo < 0 or hi >= num_experts:
            bad = lo if lo < 0 else hi
            raise ValueError(f"topk_ids holds expert id {bad}, outside [0, {num_experts})")

"""Input checks for the megakernel, runnable without a GPU. Every failure names the argument and the fix."""
from __future__ import annotations

import torch


def full_device(d) -> torch.device:
    """d as a torch.device; "cuda" without an index is the current CUDA device, named (where CUDA is available)."""
    d = torch.device(d)
    if d.type == "cuda" and d.index is None and torch.cuda.is_available():
        return torch.device("cuda", torch.cuda.current_device())
    return d


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


def check_shared_weights(w13s, w2s, *, hidden: int, inter_shared: int, device=None, fp8: bool = False) -> None:
    """The shared expert's weights: w13s [2*Is, H] (gate rows, then up rows) and w2s [H, Is], bf16, contiguous; fp8:
    each a pair (e4m3 weights, fp32 scales [rows / 128, columns / 128]) (weave_kernel/fp8.py)."""
    if not fp8:
        _tensor("w13s", w13s, (torch.bfloat16,), (2 * inter_shared, hidden), device)
        _tensor("w2s", w2s, (torch.bfloat16,), (hidden, inter_shared), device)
        return
    for name, w, rows, cols in (("w13s", w13s, 2 * inter_shared, hidden), ("w2s", w2s, hidden, inter_shared)):
        if not isinstance(w, (tuple, list)) or len(w) != 2:
            raise ValueError(f"{name} of an FP8 layer must be a pair (e4m3 [{rows}, {cols}], fp32 scales "
                             f"[{rows // 128}, {cols // 128}]), got {type(w).__name__}")
        _tensor(f"{name} q", w[0], (torch.float8_e4m3fn,), (rows, cols), device)
        _tensor(f"{name} scale", w[1], (torch.float32,), (rows // 128, cols // 128), device)


def check_shared_scale(scale, num_tokens: int, device=None) -> None:
    """The shared expert's weight per token: [N] fp32, contiguous."""
    _tensor("shared_scale", scale, (torch.float32,), (num_tokens,), device)


_IDS = (torch.int32, torch.int64)


def _check_ids(topk_ids, num_experts: int) -> None:
    lo, hi = int(topk_ids.min()), int(topk_ids.max())
    if lo < 0 or hi >= num_experts:
        bad = lo if lo < 0 else hi
        raise ValueError(f"topk_ids holds expert id {bad}, outside [0, {num_experts})")


def _fp8_weights_fine(w13, w2, hidden, inter, num_local_experts) -> tuple | None:
    """The four tensors of FP8 weight pairs if each has the dtype, shape and layout the layer needs (e4m3 weights,
    fp32 block scales), else None."""
    el, h, i, b = num_local_experts, hidden, inter, 128  # b: fp8.BLOCK (the bf16 path does not load fp8.py)
    if not (isinstance(w13, (tuple, list)) and isinstance(w2, (tuple, list)) and len(w13) == 2 and len(w2) == 2
            and h % b == 0 and i % b == 0):
        return None
    want = ((w13[0], torch.float8_e4m3fn, (el, 2 * i, h)), (w13[1], torch.float32, (el, 2 * i // b, h // b)),
            (w2[0], torch.float8_e4m3fn, (el, h, i)), (w2[1], torch.float32, (el, h // b, i // b)))
    for t, dtype, shape in want:
        if not (isinstance(t, torch.Tensor) and t.dtype is dtype and t.shape == shape and t.is_contiguous()):
            return None
    return w13[0], w13[1], w2[0], w2[1]


def _inputs_fine(x, topk_ids, topk_weights, w13, w2, hidden, inter, num_local_experts, top_k, max_tokens,
                 device, fp8: bool = False) -> bool:
    """True when every tensor of a call has the dtype, shape, device and layout the layer needs: the common case,
    decided in about half the host time of the checks below (which run whenever this says False, and name what
    is wrong). fp8: w13 and w2 are (e4m3, scales) pairs."""
    T = torch.Tensor
    if fp8:
        weights = _fp8_weights_fine(w13, w2, hidden, inter, num_local_experts)
        if weights is None:
            return False
    elif isinstance(w13, T) and isinstance(w2, T) and w13.dtype is torch.bfloat16 and w2.dtype is torch.bfloat16 \
            and w13.shape == (num_local_experts, 2 * inter, hidden) and w2.shape == (num_local_experts, hidden, inter) \
            and w13.is_contiguous() and w2.is_contiguous():
        weights = (w13, w2)
    else:
        return False
    if not (isinstance(x, T) and isinstance(topk_ids, T) and isinstance(topk_weights, T)) or x.dim() != 2:
        return False
    n = x.shape[0]
    ok = (n <= max_tokens and x.dtype is torch.bfloat16 and x.shape == (n, hidden) and topk_ids.dtype in _IDS
          and topk_ids.shape == (n, top_k) and topk_weights.dtype is torch.float32 and topk_weights.shape == (n, top_k)
          and x.is_contiguous() and topk_ids.is_contiguous() and topk_weights.is_contiguous())
    if ok and device is not None:
        dev = device if isinstance(device, torch.device) else torch.device(device)
        ok = x.device == dev and topk_ids.device == dev and topk_weights.device == dev \
            and weights[0].device == dev and weights[1].device == dev \
            and (len(weights) == 2 or (weights[2].device == dev and weights[3].device == dev))
    return ok


def check_layer_inputs(x, topk_ids, topk_weights, w13, w2, *, hidden: int, inter: int, num_experts: int,
                       num_local_experts: int, top_k: int, max_tokens: int, device=None,
                       check_ids: bool = True, fp8: bool = False) -> None:
    """Check one call's tensors against the layer. check_ids scans topk_ids (one host sync). fp8: w13 and w2 are
    (e4m3 weights, fp32 block scales) pairs (weave_kernel/fp8.py)."""
    if _inputs_fine(x, topk_ids, topk_weights, w13, w2, hidden, inter, num_local_experts, top_k, max_tokens, device,
                    fp8):
        if check_ids and x.shape[0]:
            _check_ids(topk_ids, num_experts)
        return
    if fp8:
        from .fp8 import check_fp8_weights

        check_fp8_weights(w13, w2, hidden=hidden, inter=inter, num_local_experts=num_local_experts)
        for name, w in (("w13", w13), ("w2", w2)):
            for t in w:
                if device is not None and t.device != torch.device(device):
                    raise ValueError(f"{name} is on {t.device}, the layer runs on {device}")
        _check_tokens(x, topk_ids, topk_weights, hidden=hidden, num_experts=num_experts, top_k=top_k,
                      max_tokens=max_tokens, device=device, check_ids=check_ids)
        return
    _check_tokens(x, topk_ids, topk_weights, hidden=hidden, num_experts=num_experts, top_k=top_k,
                  max_tokens=max_tokens, device=device, check_ids=False)
    _tensor("w13", w13, (torch.bfloat16,), (num_local_experts, 2 * inter, hidden), device)
    _tensor("w2", w2, (torch.bfloat16,), (num_local_experts, hidden, inter), device)
    if check_ids and x.shape[0]:
        _check_ids(topk_ids, num_experts)


def _check_tokens(x, topk_ids, topk_weights, *, hidden: int, num_experts: int, top_k: int, max_tokens: int,
                  device, check_ids: bool) -> None:
    """x [N, H] bf16, topk_ids [N, k] int32/int64, topk_weights [N, k] fp32 (and the ids in range)."""
    if not isinstance(x, torch.Tensor) or x.dim() != 2:
        raise ValueError(f"x must be a 2-D tensor [num_tokens, {hidden}]")
    n = x.shape[0]
    if n > max_tokens:
        raise ValueError(f"{n} tokens exceed the {max_tokens} the buffers were sized for (max_tokens)")
    _tensor("x", x, (torch.bfloat16,), (n, hidden), device)
    _tensor("topk_ids", topk_ids, (torch.int32, torch.int64), (n, top_k), device)
    _tensor("topk_weights", topk_weights, (torch.float32,), (n, top_k), device)
    if check_ids and n:
        _check_ids(topk_ids, num_experts)

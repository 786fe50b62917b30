"""FP8 (e4m3) formats of the experts, DeepSeek-V3 style, and an fp32 reference MoE that uses them.

Activations carry one float32 scale per row and per block of 128 columns; weights carry one float32 scale per
128 x 128 block, laid out [..., N // 128, K // 128] as DeepSeek-V3's `weight_scale_inv`. A scale is a multiplier:
value = q * s, with s = max(amax / 448, 2**-40) for the block's largest magnitude amax, so the block's largest
element quantizes to +-448 (the e4m3 maximum) and an all-zero block gets the floor 2**-40 instead of 0.
Everything is computed in float32 exactly as written here, because a CUDA kernel has to match it: the
megakernel's FP8 path (being built) reproduces `quantize_act` bit for bit on its SwiGLU outputs, except where its
fp32 accumulation order makes the unquantized values themselves differ.

`moe_reference_fp8` is the oracle of that path: tokens quantized per 128 columns, both GEMMs on dequantized
operands in fp32, the SwiGLU output quantized again before the down projection, each expert's output row
rounded to bf16, and the top-k combine in fp32 in the order j = 0..k-1.
"""
from __future__ import annotations

import torch

E4M3_MAX = 448.0
BLOCK = 128
SCALE_FLOOR = 2.0 ** -40
FP8 = torch.float8_e4m3fn


def _scale(amax: torch.Tensor) -> torch.Tensor:
    """s = max(amax / 448, 2**-40), an IEEE float32 division on every device. (Dividing by the Python number 448
    would not be one on CUDA: torch multiplies by the rounded reciprocal of a scalar divisor there, which the kernel's
    own quantization of x would then have to copy.)"""
    return (amax / torch.full_like(amax, E4M3_MAX)).clamp_min(SCALE_FLOOR)


def _check_finite(t: torch.Tensor, name: str) -> None:
    if not bool(torch.isfinite(t).all()):
        raise ValueError(f"{name} has non-finite values")


def _check_k(x: torch.Tensor, fn: str) -> int:
    if x.dim() == 0 or x.shape[-1] % BLOCK:
        raise ValueError(f"{fn}: the last dimension of x must be a multiple of {BLOCK}, got shape {tuple(x.shape)}")
    return x.shape[-1]


def _quantize_act(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    k = x.shape[-1]
    lead = x.shape[:-1]
    xb = x.float().reshape(*lead, k // BLOCK, BLOCK)
    amax = xb.abs().amax(dim=-1)
    s = _scale(amax)
    q = (xb / s.unsqueeze(-1)).clamp(-E4M3_MAX, E4M3_MAX).to(FP8)
    return q.reshape(x.shape).contiguous(), s.contiguous()


def quantize_act(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """x [..., K] (K % 128 == 0) -> (q [..., K] float8_e4m3fn, s [..., K // 128] float32), x ~= q * s per block."""
    _check_k(x, "quantize_act")
    _check_finite(x, "x")
    return _quantize_act(x)


def dequant_act(q: torch.Tensor, s: torch.Tensor) -> torch.Tensor:
    """q [..., K] e4m3, s [..., K // 128] -> float32 [..., K] = q * s (each scale over its 128 columns)."""
    if q.dim() == 0 or q.shape[-1] % BLOCK or tuple(s.shape) != (*q.shape[:-1], q.shape[-1] // BLOCK):
        raise ValueError(f"dequant_act: s must have shape q.shape[:-1] + (K // {BLOCK},) with K % {BLOCK} == 0; "
                         f"got q {tuple(q.shape)}, s {tuple(s.shape)}")
    return q.float() * s.float().repeat_interleave(BLOCK, dim=-1)


def quantize_weight(w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """w [..., N, K] (N, K % 128 == 0) -> (q [..., N, K] e4m3, s [..., N // 128, K // 128] float32)."""
    if w.dim() < 2 or w.shape[-2] % BLOCK or w.shape[-1] % BLOCK:
        raise ValueError(f"quantize_weight: w must be [..., N, K] with N and K multiples of {BLOCK}, got shape "
                         f"{tuple(w.shape)}")
    _check_finite(w, "w")
    *lead, n, k = w.shape
    wb = w.float().reshape(*lead, n // BLOCK, BLOCK, k // BLOCK, BLOCK)
    amax = wb.abs().amax(dim=(-3, -1))
    s = _scale(amax)
    q = (wb / s[..., :, None, :, None]).clamp(-E4M3_MAX, E4M3_MAX).to(FP8)
    return q.reshape(w.shape).contiguous(), s.contiguous()


def dequant_weight(q: torch.Tensor, s: torch.Tensor) -> torch.Tensor:
    """q [..., N, K] e4m3, s [..., N // 128, K // 128] -> float32 [..., N, K] = q * s per 128 x 128 block."""
    if (q.dim() < 2 or q.shape[-2] % BLOCK or q.shape[-1] % BLOCK
            or tuple(s.shape) != (*q.shape[:-2], q.shape[-2] // BLOCK, q.shape[-1] // BLOCK)):
        raise ValueError(f"dequant_weight: s must have shape q.shape[:-2] + (N // {BLOCK}, K // {BLOCK}) with N, K "
                         f"multiples of {BLOCK}; got q {tuple(q.shape)}, s {tuple(s.shape)}")
    full = s.float().repeat_interleave(BLOCK, dim=-2).repeat_interleave(BLOCK, dim=-1)
    return q.float() * full


def _expect(t, name: str, dtype: torch.dtype, shape: tuple[int, ...]) -> None:
    if not isinstance(t, torch.Tensor):
        raise ValueError(f"{name} must be a torch.Tensor of shape {list(shape)}, got {type(t).__name__}")
    if t.dtype != dtype:
        raise ValueError(f"{name} must be {dtype}, got {t.dtype} (expected shape {list(shape)})")
    if tuple(t.shape) != shape:
        raise ValueError(f"{name} must have shape {list(shape)}, got {list(t.shape)}")
    if not t.is_contiguous():
        raise ValueError(f"{name} must be contiguous (shape {list(shape)})")


def _pair(p, name: str):
    if not isinstance(p, (tuple, list)) or len(p) != 2:
        raise ValueError(f"{name} must be a pair (q float8_e4m3fn, s float32), got {type(p).__name__}")
    return p


def check_fp8_weights(w13, w2, *, hidden: int, inter: int, num_local_experts: int) -> None:
    """Validate FP8 expert weights without touching their values (no device sync).

    w13 = (q [El, 2I, H] e4m3, s [El, 2I/128, H/128] float32); w2 = (q [El, H, I] e4m3, s [El, H/128, I/128]
    float32); all contiguous and on one device. Raises ValueError naming the offending tensor.
    """
    if hidden <= 0 or inter <= 0 or hidden % BLOCK or inter % BLOCK:
        raise ValueError(f"FP8 experts need hidden and inter positive multiples of {BLOCK}, got hidden={hidden}, "
                         f"inter={inter}")
    if num_local_experts <= 0:
        raise ValueError(f"num_local_experts must be positive, got {num_local_experts}")
    el, h, i = num_local_experts, hidden, inter
    w13_q, w13_s = _pair(w13, "w13")
    w2_q, w2_s = _pair(w2, "w2")
    _expect(w13_q, "w13 q", FP8, (el, 2 * i, h))
    _expect(w13_s, "w13 scale", torch.float32, (el, 2 * i // BLOCK, h // BLOCK))
    _expect(w2_q, "w2 q", FP8, (el, h, i))
    _expect(w2_s, "w2 scale", torch.float32, (el, h // BLOCK, i // BLOCK))
    dev = w13_q.device
    for name, t in (("w13 scale", w13_s), ("w2 q", w2_q), ("w2 scale", w2_s)):
        if t.device != dev:
            raise ValueError(f"{name} is on {t.device}, but w13 q is on {dev}: all FP8 weights must share a device")


def quantize_experts(w13: torch.Tensor, w2: torch.Tensor):
    """bf16/fp32 experts w13 [E, 2I, H], w2 [E, H, I] -> ((w13_q, w13_s), (w2_q, w2_s)).

    Needs H % 128 == 0 and I % 128 == 0, so that the gate rows [0, I) and the up rows [I, 2I) fall in separate
    128-row blocks and never share a scale.
    """
    if w13.dim() != 3 or w2.dim() != 3:
        raise ValueError(f"w13 must be [E, 2I, H] and w2 [E, H, I], got w13 {list(w13.shape)}, w2 {list(w2.shape)}")
    e, two_i, h = w13.shape
    i = two_i // 2
    if two_i % 2 or tuple(w2.shape) != (e, h, i):
        raise ValueError(f"w2 must have shape [E, H, I] = {[e, h, i]} to match w13 {list(w13.shape)}, got "
                         f"{list(w2.shape)}")
    if h % BLOCK or i % BLOCK:
        raise ValueError(f"FP8 experts need H and I multiples of {BLOCK}, got H={h}, I={i}")
    return quantize_weight(w13), quantize_weight(w2)


def moe_reference_fp8(x: torch.Tensor, topk_ids: torch.Tensor, topk_weights: torch.Tensor, w13, w2) -> torch.Tensor:
    """The FP8 MoE layer in fp32 over all E experts: returns y [T, H] bf16.

    x [T, H]; topk_ids [T, k] (expert ids in [0, E)); topk_weights [T, k]; w13 = (q [E, 2I, H], s [E, 2I/128, H/128]);
    w2 = (q [E, H, I], s [E, H/128, I/128]). Per routed pair: x quantized per 128 columns and dequantized,
    gu = xd @ W13d^T, h = g / (1 + exp(-g)) * u, h quantized per 128 columns and dequantized, o = hd @ W2d^T
    rounded to bf16; y[t] = sum over j = 0..k-1 in order of topk_weights[t, j] * o, in fp32, then bf16.
    """
    from .reference import check_routing

    w13_q, w13_s = w13
    w2_q, w2_s = w2
    check_routing(x, topk_ids, topk_weights, w13_q.shape[0])
    n, k = topk_ids.shape
    inter = w13_q.shape[1] // 2
    hidden = w2_q.shape[1]
    xq, xs = quantize_act(x)
    xd = dequant_act(xq, xs)
    flat_ids = topk_ids.reshape(-1).long()
    token_of_pair = torch.arange(n, device=x.device).repeat_interleave(k)
    o = torch.zeros(n * k, hidden, dtype=torch.float32, device=x.device)
    for e in torch.unique(flat_ids).tolist():
        pairs = torch.nonzero(flat_ids == e).squeeze(1)
        gu = xd[token_of_pair[pairs]] @ dequant_weight(w13_q[e], w13_s[e]).t()
        g, u = gu[:, :inter], gu[:, inter:]
        h = g / (1 + torch.exp(-g)) * u
        hq, hs = quantize_act(h)
        out = dequant_act(hq, hs) @ dequant_weight(w2_q[e], w2_s[e]).t()
        o[pairs] = out.to(torch.bfloat16).float()
    o = o.view(n, k, hidden)
    w = topk_weights.float()
    y = torch.zeros(n, hidden, dtype=torch.float32, device=x.device)
    for j in range(k):
        y += w[:, j, None] * o[:, j]
    return y.to(torch.bfloat16)


def shared_ffn_fp8(x: torch.Tensor, w13s, w2s) -> torch.Tensor:
    """The shared expert of an FP8 layer on every row of x [N, H], as the megakernel computes it: x quantized per 128
    columns, GEMM0 on the dequantized operands in fp32, h = silu(gate) * up quantized again, GEMM1, fp32 [N, H] (the
    kernel rounds it to bf16 before adding it in the reduction). w13s = (q [2Is, H], s [2Is/128, H/128]), w2s = (q [H,
    Is], s [H/128, Is/128]). Non-finite values give NaN rows, as in the kernel (no ValueError here)."""
    xd = dequant_act(*_quantize_act(x))
    gu = xd @ dequant_weight(*w13s).t()
    i = gu.shape[1] // 2
    g, u = gu[:, :i], gu[:, i:]
    h = g / (1.0 + torch.exp(-g)) * u
    return dequant_act(*_quantize_act(h)) @ dequant_weight(*w2s).t()

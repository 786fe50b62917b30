"""PyTorch references for the expert-parallel MoE layer.

Weight layout (shared with the megakernel):
    w13: [num_local_experts, 2*I, H] bf16, rows [0, I) are the gate W1, rows [I, 2I) the up projection W3.
    w2:  [num_local_experts, H, I] bf16.
Each token t computes y[t] = sum_j topk_weights[t, j] * W2_e (silu(W1_e x[t]) * W3_e x[t]), e = topk_ids[t, j].
With a shared expert (w13s [2Is, H], w2s [H, Is]) every token adds its output with weight 1.

Two functions:
- `moe_reference`: one process, all experts, fp32: the correctness oracle.
- `ep_moe_reference`: the expert-parallel layer as SGLang-style serving runs it with no overlap: NCCL
  `all_to_all_single` for dispatch and combine, `torch._grouped_mm` for the experts (a loop of matmuls where
  grouped_mm is unavailable, e.g. on CPU). Baseline (a) of the benchmark. With FP8 experts (w13 and w2 given as
  (e4m3 weights, fp32 block scales) pairs, weave_kernel/fp8.py) it computes what the FP8 megakernel does:
  `grouped_ffn_fp8`, x and h quantized per (row, 128 columns), fp32 GEMMs on the dequantized operands, expert rows
  rounded to bf16 and combined in fp32 in the order j = 0..k-1, as fp8.moe_reference_fp8 does over all experts; an
  FP8 shared expert (two such pairs) is fp8.shared_ffn_fp8 rounded to bf16 and added last, as the kernel adds it.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F


def moe_reference(
    x: torch.Tensor,
    topk_ids: torch.Tensor,
    topk_weights: torch.Tensor,
    w13: torch.Tensor,
    w2: torch.Tensor,
    shared: tuple[torch.Tensor, torch.Tensor] | None = None,
    shared_scale: torch.Tensor | None = None,
) -> torch.Tensor:
    """Dense single-process MoE in fp32.

    x: [N, H]; topk_ids: [N, k] int (global expert ids in [0, E)); topk_weights: [N, k];
    w13: [E, 2I, H]; w2: [E, H, I] (all experts); shared: None or (w13s [2Is, H], w2s [H, Is]);
    shared_scale: None (weight 1) or [N], each token's weight for the shared expert. Returns y [N, H] float32.
    """
    num_experts, two_i, _ = w13.shape
    check_routing(x, topk_ids, topk_weights, num_experts)
    inter = two_i // 2
    xf = x.float()
    y = torch.zeros(x.shape[0], w2.shape[1], dtype=torch.float32, device=x.device)
    flat_ids = topk_ids.reshape(-1).long()
    flat_w = topk_weights.reshape(-1).float()
    token_of_pair = torch.arange(x.shape[0], device=x.device).repeat_interleave(topk_ids.shape[1])
    for e in torch.unique(flat_ids).tolist():
        pairs = torch.nonzero(flat_ids == e).squeeze(1)
        tok = token_of_pair[pairs]
        h = xf[tok] @ w13[e].float().t()
        a = F.silu(h[:, :inter]) * h[:, inter:]
        out = a @ w2[e].float().t()
        y.index_add_(0, tok, out * flat_w[pairs, None])
    if shared is not None:
        ys = shared_ffn(xf, shared[0].float(), shared[1].float())
        y += ys if shared_scale is None else ys * shared_scale.float()[:, None]
    return y


def check_routing(x: torch.Tensor, topk_ids: torch.Tensor, topk_weights: torch.Tensor, num_experts: int) -> None:
    """The references' own input check (independent of the kernel's, weave_kernel/validate.py): x [N, H],
    topk_ids [N, k] integer ids in [0, num_experts), topk_weights [N, k]. A negative id would otherwise index
    from the end (expert E - 1 for -1) and a short id tensor would drop tokens, both without a word."""
    if x.dim() != 2:
        raise ValueError(f"x must be [num_tokens, hidden], got shape {tuple(x.shape)}")
    n = x.shape[0]
    if topk_ids.dim() != 2 or topk_ids.shape[0] != n or topk_weights.shape != topk_ids.shape:
        raise ValueError(f"topk_ids and topk_weights must both be [{n}, top_k] for x of {n} tokens, got "
                         f"{tuple(topk_ids.shape)} and {tuple(topk_weights.shape)}")
    if topk_ids.dtype.is_floating_point or topk_ids.dtype == torch.bool:
        raise ValueError(f"topk_ids must be an integer tensor, got {topk_ids.dtype}")
    if topk_ids.numel() and not 0 <= int(topk_ids.min()) <= int(topk_ids.max()) < num_experts:
        raise ValueError(f"expert ids must lie in [0, {num_experts}), got [{int(topk_ids.min())}, "
                         f"{int(topk_ids.max())}]")


def shared_ffn(x: torch.Tensor, w13s: torch.Tensor, w2s: torch.Tensor) -> torch.Tensor:
    """The shared expert on every row of x: W2s (silu(W1s x) * W3s x), in x's dtype. w13s [2Is, H], w2s [H, Is]."""
    inter = w13s.shape[0] // 2
    h = x @ w13s.t()
    return (F.silu(h[:, :inter]) * h[:, inter:]) @ w2s.t()


def grouped_ffn(xs: torch.Tensor, counts: torch.Tensor, w13: torch.Tensor, w2: torch.Tensor) -> torch.Tensor:
    """SwiGLU FFN over rows grouped by local expert.

    xs: [R, H] rows sorted by local expert; counts: [E_loc] rows per local expert (sum R), int64 on any device.
    Uses torch._grouped_mm (bf16, CUDA, sm90) when it applies, else a loop of matmuls in xs's dtype.
    """
    inter = w13.shape[1] // 2
    if xs.is_cuda and hasattr(torch, "_grouped_mm") and xs.dtype == torch.bfloat16:
        offs = torch.cumsum(counts.to(device=xs.device, dtype=torch.int32), 0, dtype=torch.int32)
        h = torch._grouped_mm(xs, w13.transpose(-2, -1), offs=offs)
        a = F.silu(h[:, :inter]) * h[:, inter:]
        return torch._grouped_mm(a, w2.transpose(-2, -1), offs=offs)
    out = torch.empty(xs.shape[0], w2.shape[1], dtype=xs.dtype, device=xs.device)
    start = 0
    for le, n in enumerate(counts.tolist()):
        if n:
            h = xs[start : start + n] @ w13[le].t()
            a = F.silu(h[:, :inter]) * h[:, inter:]
            out[start : start + n] = a @ w2[le].t()
        start += n
    return out


def grouped_ffn_fp8(xd: torch.Tensor, counts: torch.Tensor, w13, w2) -> torch.Tensor:
    """The FP8 experts' SwiGLU FFN over rows grouped by local expert, as the FP8 megakernel computes it.

    xd: [R, H] float32 rows already quantized per 128 columns and dequantized (fp8.dequant_act), sorted by local
    expert; counts: [E_loc] rows per local expert; w13 = (q [E_loc, 2I, H] e4m3, s [E_loc, 2I/128, H/128] fp32),
    w2 = (q [E_loc, H, I], s [E_loc, H/128, I/128]). Per expert: gu = xd @ W13d^T (fp32), h = g / (1 + exp(-g)) * u,
    h quantized per 128 columns and dequantized, o = hd @ W2d^T; returns o rounded to bf16 [R, H] (the kernel's
    expert rows), the operations of fp8.moe_reference_fp8 row for row. Non-finite values give NaN rows (as in the
    kernel), not an error.
    """
    from .fp8 import _quantize_act, dequant_act, dequant_weight

    (w13_q, w13_s), (w2_q, w2_s) = w13, w2
    inter = w13_q.shape[1] // 2
    out = torch.empty(xd.shape[0], w2_q.shape[1], dtype=torch.bfloat16, device=xd.device)
    start = 0
    for le, n in enumerate(counts.tolist()):
        if n:
            gu = xd[start : start + n] @ dequant_weight(w13_q[le], w13_s[le]).t()
            g, u = gu[:, :inter], gu[:, inter:]
            h = g / (1 + torch.exp(-g)) * u
            o = dequant_act(*_quantize_act(h)) @ dequant_weight(w2_q[le], w2_s[le]).t()
            out[start : start + n] = o.to(torch.bfloat16)
        start += n
    return out


def shared_rows_fp8(x: torch.Tensor, w13s, w2s) -> torch.Tensor:
    """The FP8 shared expert's rows as the FP8 megakernel adds them: fp8.shared_ffn_fp8 rounded to bf16, [N, H]."""
    from .fp8 import shared_ffn_fp8

    return shared_ffn_fp8(x, w13s, w2s).to(torch.bfloat16)


def _is_pair(w) -> bool:
    return isinstance(w, (tuple, list))


def ep_moe_reference(
    x: torch.Tensor,
    topk_ids: torch.Tensor,
    topk_weights: torch.Tensor,
    w13_local: torch.Tensor,
    w2_local: torch.Tensor,
    expert_owner: torch.Tensor,
    expert_local_index: torch.Tensor,
    group=None,
    shared: tuple[torch.Tensor, torch.Tensor] | None = None,
    shared_scale: torch.Tensor | None = None,
) -> torch.Tensor:
    """Expert-parallel MoE layer on this rank (no overlap): all_to_all dispatch, grouped FFN, all_to_all combine.

    x: [N, H]; topk_ids: [N, k] global expert ids; topk_weights: [N, k] float;
    w13_local: [E_loc, 2I, H]; w2_local: [E_loc, H, I] (this rank's experts);
    expert_owner / expert_local_index: [E] int64 (weave_sim Placement.owner and .local_index()).
    Without an initialised process group (or world size 1) the exchanges are identities.
    shared: None or the shared expert's (w13s [2Is, H], w2s [H, Is]), run on this rank's tokens after the routed
    experts (dense matmuls, no overlap) and added, weighted per token by shared_scale [N] if given.
    Returns y [N, H] in x's dtype (accumulated in fp32).

    FP8 experts: w13_local = (q [E_loc, 2I, H] e4m3, s [E_loc, 2I/128, H/128] fp32) and w2_local = (q, s) likewise
    (fp8.check_fp8_weights). Each rank quantizes its x per (row, 128 columns) and sends the e4m3 rows with their
    scales, the owners run grouped_ffn_fp8 and send back bf16 rows, and each token sums its k rows in fp32 in the
    order j = 0..k-1 (fp8.moe_reference_fp8's semantics, which the FP8 megakernel reproduces). Their shared expert is
    FP8 too, shared = ((q [2Is, H], s [2Is/128, H/128]), (q [H, Is], s [H/128, Is/128])): shared_rows_fp8 of this
    rank's x (bf16 rows), times shared_scale if given, added after the k routed rows in the same fp32 sum, as the
    FP8 megakernel's reduction does.
    """
    import torch.distributed as dist

    fp8 = _is_pair(w13_local)
    if shared is not None:
        if not isinstance(shared, (tuple, list)) or len(shared) != 2:
            raise ValueError("shared must be a pair (w13s, w2s)")
        if any(_is_pair(w) != fp8 for w in shared):
            raise ValueError("FP8 experts take an FP8 shared expert, ((w13s_q, w13s_s), (w2s_q, w2s_s)), and bf16 "
                             "experts a bf16 one, (w13s, w2s), as the megakernel does"
                             if fp8 else "bf16 experts take a bf16 shared expert (w13s, w2s), not (e4m3, scales) pairs")
    num_local = (w13_local[0] if fp8 else w13_local).shape[0]
    check_routing(x, topk_ids, topk_weights, expert_owner.numel())

    distributed = dist.is_available() and dist.is_initialized() and dist.get_world_size(group) > 1
    world = dist.get_world_size(group) if distributed else 1
    dev = x.device
    n, k = topk_ids.shape
    owner = expert_owner.to(dev)
    local_index = expert_local_index.to(dev)
    flat_ids = topk_ids.reshape(-1).long()
    dest = owner[flat_ids]
    order = torch.argsort(dest * num_local + local_index[flat_ids], stable=True)
    send_counts = torch.bincount(dest, minlength=world)
    token_of_pair = torch.arange(n, device=dev).repeat_interleave(k)
    if fp8:  # the rows travel in e4m3 (as bytes) with their scales, as the kernel sends them
        from .fp8 import _quantize_act, dequant_act

        xq, xs = _quantize_act(x)
        send = [xq.view(torch.uint8)[token_of_pair[order]], xs[token_of_pair[order]]]
    else:
        send = [x[token_of_pair[order]]]
    send_le = local_index[flat_ids[order]]
    send_x = send[0]
    if distributed:
        recv_counts = torch.empty_like(send_counts)
        dist.all_to_all_single(recv_counts, send_counts, group=group)
        send_splits, recv_splits = send_counts.tolist(), recv_counts.tolist()  # host sync, as SGLang does
        recv = []
        for t in send:
            r = t.new_empty(sum(recv_splits), t.shape[1])
            dist.all_to_all_single(r, t, recv_splits, send_splits, group=group)
            recv.append(r)
        recv_le = send_le.new_empty(sum(recv_splits))
        dist.all_to_all_single(recv_le, send_le, recv_splits, send_splits, group=group)
    else:
        recv, recv_le = send, send_le
    le_order = torch.argsort(recv_le, stable=True)
    counts = torch.bincount(recv_le, minlength=num_local)
    if fp8:
        rows = dequant_act(recv[0][le_order].view(torch.float8_e4m3fn), recv[1][le_order])
        out_sorted = grouped_ffn_fp8(rows, counts, w13_local, w2_local)
    else:
        out_sorted = grouped_ffn(recv[0][le_order], counts, w13_local, w2_local)
    out = torch.empty_like(out_sorted)
    out[le_order] = out_sorted
    if distributed:
        back = out.new_empty(send_x.shape[0], out.shape[1])
        dist.all_to_all_single(back, out, send_splits, recv_splits, group=group)
    else:
        back = out
    per_pair = torch.empty_like(back)
    per_pair[order] = back
    if fp8:  # fp32, j = 0..k-1 in order (fp8.moe_reference_fp8)
        o, w = per_pair.view(n, k, x.shape[1]).float(), topk_weights.float()
        y = torch.zeros(n, x.shape[1], dtype=torch.float32, device=dev)
        for j in range(k):
            y += w[:, j, None] * o[:, j]
        if shared is not None:  # the kernel's reduction: the shared row (bf16) last, weight 1 or the token's scale
            ys = shared_rows_fp8(x, shared[0], shared[1]).float()
            y += ys if shared_scale is None else shared_scale.float()[:, None] * ys
        return y.to(x.dtype)
    y = (per_pair.view(n, k, x.shape[1]).float() * topk_weights.float().unsqueeze(-1)).sum(1)
    if shared is not None:
        ys = shared_ffn(x, shared[0], shared[1]).float()
        y += ys if shared_scale is None else ys * shared_scale.float()[:, None]
    return y.to(x.dtype)


def make_weights(num_experts: int, hidden: int, inter: int, *, dtype=torch.bfloat16, device="cpu",
                 generator: torch.Generator | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Random expert weights scaled so activations stay O(1): w13 [E, 2I, H], w2 [E, H, I]."""
    w13 = torch.randn(num_experts, 2 * inter, hidden, generator=generator, device=device) / hidden**0.5
    w2 = torch.randn(num_experts, hidden, inter, generator=generator, device=device) / inter**0.5
    return w13.to(dtype), w2.to(dtype)


def make_shared_weights(hidden: int, inter_shared: int, *, dtype=torch.bfloat16, device="cpu",
                        generator: torch.Generator | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Random shared-expert weights, scaled as make_weights: w13s [2Is, H], w2s [H, Is]."""
    w13, w2 = make_weights(1, hidden, inter_shared, dtype=dtype, device=device, generator=generator)
    return w13[0].contiguous(), w2[0].contiguous()

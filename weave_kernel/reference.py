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
  grouped_mm is unavailable, e.g. on CPU). Baseline (a) of the benchmark.
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
    """
    import torch.distributed as dist

    distributed = dist.is_available() and dist.is_initialized() and dist.get_world_size(group) > 1
    world = dist.get_world_size(group) if distributed else 1
    dev = x.device
    n, k = topk_ids.shape
    owner = expert_owner.to(dev)
    local_index = expert_local_index.to(dev)
    flat_ids = topk_ids.reshape(-1).long()
    dest = owner[flat_ids]
    order = torch.argsort(dest * w13_local.shape[0] + local_index[flat_ids], stable=True)
    send_counts = torch.bincount(dest, minlength=world)
    token_of_pair = torch.arange(n, device=dev).repeat_interleave(k)
    send_x = x[token_of_pair[order]]
    send_le = local_index[flat_ids[order]]
    if distributed:
        recv_counts = torch.empty_like(send_counts)
        dist.all_to_all_single(recv_counts, send_counts, group=group)
        send_splits, recv_splits = send_counts.tolist(), recv_counts.tolist()  # host sync, as SGLang does
        recv_x = x.new_empty(sum(recv_splits), x.shape[1])
        dist.all_to_all_single(recv_x, send_x, recv_splits, send_splits, group=group)
        recv_le = send_le.new_empty(sum(recv_splits))
        dist.all_to_all_single(recv_le, send_le, recv_splits, send_splits, group=group)
    else:
        recv_x, recv_le = send_x, send_le
    le_order = torch.argsort(recv_le, stable=True)
    counts = torch.bincount(recv_le, minlength=w13_local.shape[0])
    out_sorted = grouped_ffn(recv_x[le_order], counts, w13_local, w2_local)
    out = torch.empty_like(out_sorted)
    out[le_order] = out_sorted
    if distributed:
        back = out.new_empty(send_x.shape[0], out.shape[1])
        dist.all_to_all_single(back, out, send_splits, recv_splits, group=group)
    else:
        back = out
    per_pair = torch.empty_like(back)
    per_pair[order] = back
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

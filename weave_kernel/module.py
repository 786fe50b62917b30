"""`WeaveMoE`: the megakernel as a `torch.nn.Module` for model code. Router, routed experts and an optional shared
expert of one MoE block on this rank; one megakernel launch per forward.

    moe = WeaveMoE(hidden=H, inter=I, num_experts=E, top_k=k, max_tokens=T,      # collective on every rank
                   scoring="softmax", norm_topk=True, shared_inter=Is, shared_gate=True)
    moe.load_router(router_weight)                     # [E, H] (the gate Linear of HF MoE blocks)
    moe.load_experts(gate_proj, up_proj, down_proj)    # all E experts: [E, I, H], [E, I, H], [E, H, I] (or lists)
    moe.load_shared(gate, up, down, gate_weight=g)     # [Is, H], [Is, H], [H, Is]; g [1, H] for a gated shared expert
    y = moe(x)                                         # x [..., H] bf16 -> y [..., H] bf16

FP8 experts (expert_dtype="fp8", weave_kernel/fp8.py, DeepSeek-V3's format): the block holds this rank's experts as
e4m3 weights with one fp32 scale per 128 x 128 block, w13_q [El, 2I, H] / w13_s [El, 2I/128, H/128] and w2_q [El, H, I]
/ w2_s [El, H/128, I/128] (instead of bf16 w13 / w2); load_experts quantizes bf16 weights (fp8.quantize_weight, gate
and up rows in separate 128-row blocks), load_experts_fp8 copies a checkpoint's e4m3 weights and weight_scale_inv
tensors as they are. x and y stay bf16: the kernel quantizes x per (row, 128 columns) and h likewise; the torch
backend computes the same (reference.ep_moe_reference on the pairs: fp8.moe_reference_fp8's semantics, not the bf16
layer on dequantized weights). As the FP8 kernel: hidden, inter and shared_inter multiples of 128, dispatch "threads".
A shared expert is FP8 too: w13s_q [2Is, H] e4m3 / w13s_s [2Is/128, H/128] fp32 and w2s_q [H, Is] / w2s_s
[H/128, Is/128] (instead of bf16 w13s / w2s); load_shared quantizes, load_shared_fp8 copies a checkpoint's e4m3 and
weight_scale_inv; its row is fp8.shared_ffn_fp8 rounded to bf16, added (times the shared gate) in the fp32 sum after
the k routed rows, on either backend.

Routing (what the common checkpoints do; `router=` takes any other function x [N, H] -> (ids [N, k], weights [N, k])):
- scoring "softmax" (Mixtral, Qwen-MoE, DeepSeek-V2): p = softmax(x W_r^T) over all experts, the top-k of p, weights p
  renormalised over the k when norm_topk;
- scoring "sigmoid" (DeepSeek-V3): s = sigmoid(x W_r^T), the top-k of s + score_bias (the checkpoint's correction
  bias, used only to pick), weights s renormalised when norm_topk;
- group-limited (DeepSeek-V3's n_group / topk_group, with "sigmoid"; DeepSeek-V2's with "softmax"): the experts
  form n_group equal groups, each group is scored by the sum of its two best picking scores ("sigmoid") or its best
  score ("softmax"), and the top-k is taken among the experts of the topk_group best groups only;
- either way the weights are multiplied by routed_scale.
The router runs in fp32 (router_dtype: the logits' dtype; HF Qwen / Mixtral compute them in the model's). The shared
expert's row is added with weight 1, or sigmoid(x g^T) per token with shared_gate
(Qwen-MoE), inside the kernel's reduction.

backend="kernel" runs MoEMegakernel (CUDA, Hopper); backend="torch" runs weave_kernel.reference.ep_moe_reference (any
device; the all-to-all baseline), so model code can be written and tested without the kernel. The torch backend
checks each call as the kernel does (at most max_tokens rows, expert ids in [0, E) when check=True, x on the
weights' device), and refuses at construction what the kernel refuses (weave_kernel.geometry: H, I and the shared
width multiples of 64, at most 512 experts, world x experts <= 2048, ...).
"""
from __future__ import annotations

from collections.abc import Callable, Sequence

import torch

from .geometry import check_geometry
from .module_args import check_block_args, check_shared_kernel, same_placement
from .module_args import BACKENDS, SCORINGS, kernel_options  # noqa: F401 (this module's names before the split)
from .reference import ep_moe_reference
from .validate import check_layer_inputs, full_device

def _stack(t, name: str, shape: tuple) -> torch.Tensor:
    """A list of E per-expert tensors or one stacked tensor -> [E, ...] with the given trailing shape."""
    want = f"{name} must be {list(shape)}" + (f" (or a list of {shape[0]} tensors {list(shape[1:])})"
                                              if len(shape) > 1 else "")
    if isinstance(t, (list, tuple)):
        got = [tuple(e.shape) if isinstance(e, torch.Tensor) else type(e).__name__ for e in t]
        if len(t) != shape[0] or any(g != tuple(shape[1:]) for g in got):
            raise ValueError(f"{want}, got a list of {len(t)}: {sorted(set(got), key=str)}")
        return torch.stack(list(t))
    if not isinstance(t, torch.Tensor) or tuple(t.shape) != shape:
        raise ValueError(f"{want}, got {tuple(t.shape) if isinstance(t, torch.Tensor) else type(t).__name__}")
    return t


class WeaveMoE(torch.nn.Module):
    """One MoE block on this rank of an expert-parallel group (module docstring). Inference only (no gradients)."""

    def __init__(self, *, hidden: int, inter: int, num_experts: int, top_k: int, max_tokens: int, placement=None,
                 group=None, device=None, backend: str = "kernel", policy: str = "weave", scoring: str = "softmax",
                 norm_topk: bool = True, routed_scale: float = 1.0, score_bias: bool = False,
                 router: Callable | None = None, n_group: int = 1, topk_group: int = 1,
                 router_dtype: torch.dtype = torch.float32,
                 shared_inter: int = 0, shared_gate: bool = False,
                 shared_order: str = "last", check: bool = True, kernel=None, on_overflow: str = "split",
                 expert_dtype: str = "bf16", **kernel_kwargs):
        """placement: a weave_sim Placement (default contiguous over the group, or kernel='s); check=False skips the
        kernel call's host-side id scan and error read (two host syncs per forward; a CUDA graph capture needs it
        off): call raise_if_error() after the forwards then. kernel_kwargs go to MoEMegakernel: timeout_s,
        cost_profile, dispatch, num_ctas, recv_capacity (receive buffers below the worst case; a batch that does not
        fit raises megakernel.ReceiveOverflow and the block stays usable), ...; checked by name on either backend,
        used by the kernel's. policy and shared_order are checked on either backend too, and so are the kernel's
        geometry limits (weave_kernel.geometry); router= replaces the built-in rule, so scoring, norm_topk,
        routed_scale, score_bias, n_group, topk_group and router_dtype must then keep their defaults (a ValueError
        names any that do not).

        on_overflow (kernel backend, check=True): what a forward does when its batch does not fit the receive buffers
        (a kernel built with recv_capacity below the worst case raises megakernel.ReceiveOverflow on every rank):
        "split" runs it again as two halves (each rank halves its own rows, so the ranks stay in step; again if a
        half does not fit), "raise" lets the exception through. With check=False an overflow is only found by
        raise_if_error(), and the kernel is then unusable.

        kernel: run this block on an existing MoEMegakernel (or another WeaveMoE's) instead of building one. A
        MoEMegakernel holds no weights, only its buffers (about world x max_tokens x top_k rows of H and I per rank:
        buffers.workspace_bytes), and a model's blocks run one after another, so all blocks of one geometry can
        share one: the memory of one layer's buffers instead of one per layer. It must match this block (hidden,
        inter, experts, top_k, max_tokens, placement, group, device; shared_inter equal, or 0 here); its options
        (kernel_kwargs) are the ones it was built with, so none may be passed with it. set_placement() on a kernel
        changes the placement of every block on it, but not the experts the blocks loaded: their forwards then raise
        RuntimeError (build them again with the new placement).

        expert_dtype: "bf16" (w13 / w2 bf16) or "fp8" (module docstring: e4m3 experts with 128 x 128 block scales,
        w13_q / w13_s / w2_q / w2_s, and a shared expert's w13s_q / w13s_s / w2s_q / w2s_s; hidden, inter and
        shared_inter multiples of 128, dispatch "threads"; refused on either backend before anything is allocated). A
        block on kernel= must have the kernel's expert dtype."""
        super().__init__()
        import torch.distributed as dist

        from weave_sim.placement import contiguous

        from .buffers import check_fits, workspace_bytes
        from .megakernel import FP8_BLOCK, MoEMegakernel
        from .policies import parse_policy

        (hidden, inter, num_experts, top_k, max_tokens, shared_inter, n_group, topk_group), fp8 = check_block_args(
            hidden=hidden, inter=inter, num_experts=num_experts, top_k=top_k, max_tokens=max_tokens, backend=backend,
            policy=policy, scoring=scoring, norm_topk=norm_topk, routed_scale=routed_scale, score_bias=score_bias,
            router=router, n_group=n_group, topk_group=topk_group, router_dtype=router_dtype,
            shared_inter=shared_inter, shared_gate=shared_gate, shared_order=shared_order, check=check,
            on_overflow=on_overflow, expert_dtype=expert_dtype, kernel_kwargs=kernel_kwargs)
        distributed = dist.is_available() and dist.is_initialized()
        self.world = dist.get_world_size(group) if distributed else 1
        self.rank = dist.get_rank(group) if distributed else 0
        self.group = group
        if placement is None and isinstance(getattr(kernel, "layer", kernel), MoEMegakernel):
            placement = getattr(kernel, "layer", kernel).placement  # a shared kernel's placement by default
        self.placement = placement if placement is not None else contiguous(num_experts, self.world)
        if self.placement.num_experts != num_experts or self.placement.num_gpus != self.world:
            raise ValueError(f"placement of {self.placement.num_experts} experts over {self.placement.num_gpus} GPUs; "
                             f"this block has {num_experts} experts over {self.world} ranks")
        self.hidden, self.inter, self.num_experts, self.top_k = hidden, inter, num_experts, top_k
        self.max_tokens = max_tokens
        self.shared_inter, self.shared_order = int(shared_inter), shared_order
        self.backend, self.policy, self.scoring, self.norm_topk = backend, policy, scoring, norm_topk
        self.routed_scale, self.custom_router, self.check = float(routed_scale), router, check
        self.on_overflow = on_overflow
        self.expert_dtype, self.fp8 = expert_dtype, fp8
        self.n_group, self.topk_group, self.router_dtype = n_group, topk_group, router_dtype
        dev = full_device(device if device is not None else ("cuda" if torch.cuda.is_available() else "cpu"))
        if backend == "kernel" and (dev.type != "cuda" or not torch.cuda.is_available()):
            raise RuntimeError(f"backend='kernel' runs the CUDA megakernel (Hopper GPUs) and needs a CUDA device, not "
                               f"{dev}{'' if torch.cuda.is_available() else ' (this torch sees no GPU)'}; "
                               f"backend='torch' runs the same block on any device")
        # the kernel's limits on either backend, so that a block tested on the torch backend runs on the kernel's
        check_geometry(hidden, inter, num_experts, top_k, self.world, self.placement.num_gpus, shared_inter)
        self.local = [int(e) for e in self.placement.local_experts(self.rank)]
        e_loc = len(self.local)
        # what this block allocates on its device, checked on every rank before anything is (module check_fits)
        expert_bytes = (e_loc * 3 * inter * hidden + 4 * e_loc * 3 * (inter // FP8_BLOCK) * (hidden // FP8_BLOCK)
                        if fp8 else 2 * e_loc * 3 * inter * hidden)
        shared_bytes = (3 * shared_inter * hidden + 4 * 3 * (shared_inter // FP8_BLOCK) * (hidden // FP8_BLOCK)
                        if fp8 else 2 * 3 * shared_inter * hidden)
        need = {"weights": 4 * num_experts * (hidden + 1) + expert_bytes
                + (shared_bytes + 4 * hidden if shared_inter else 0)}
        if backend == "kernel" and kernel is None:
            need.update(workspace_bytes(
                hidden=hidden, inter=inter, num_experts=num_experts, top_k=top_k, world=self.world,
                max_tokens=max_tokens, shared_inter=shared_inter,
                num_ctas=kernel_kwargs.get("num_ctas") or torch.cuda.get_device_properties(dev).multi_processor_count,
                timeline_per_cta=kernel_kwargs.get("timeline_per_cta", 0),
                recv_capacity=kernel_kwargs.get("recv_capacity"), expert_dtype=expert_dtype))
        need["total"] = sum(v for k, v in need.items() if k != "total")
        check_fits(need, dev, group=group, distributed=distributed, world=self.world, rank=self.rank,
                   what="this MoE block's weights and buffers",
                   hint="spread the experts over more GPUs, lower max_tokens, or run the blocks of one geometry on "
                        "one kernel (kernel=; hf.replace_moe_blocks does)" if kernel is None else "")
        bf = dict(dtype=torch.bfloat16, device=dev)
        frozen = dict(requires_grad=False)
        self.router_weight = torch.nn.Parameter(torch.zeros(num_experts, hidden, dtype=torch.float32, device=dev),
                                                **frozen)
        self.score_bias = torch.nn.Parameter(torch.zeros(num_experts, dtype=torch.float32, device=dev), **frozen) \
            if score_bias else None
        self.w13 = self.w2 = self.w13_q = self.w13_s = self.w2_q = self.w2_s = None
        if fp8:  # e4m3 weights and their fp32 scales per 128 x 128 block (fp8.check_fp8_weights' layout)
            from .fp8 import FP8, BLOCK

            f8, f32 = dict(dtype=FP8, device=dev), dict(dtype=torch.float32, device=dev)
            self.w13_q = torch.nn.Parameter(torch.zeros(e_loc, 2 * inter, hidden, **f8), **frozen)
            self.w13_s = torch.nn.Parameter(torch.ones(e_loc, 2 * inter // BLOCK, hidden // BLOCK, **f32), **frozen)
            self.w2_q = torch.nn.Parameter(torch.zeros(e_loc, hidden, inter, **f8), **frozen)
            self.w2_s = torch.nn.Parameter(torch.ones(e_loc, hidden // BLOCK, inter // BLOCK, **f32), **frozen)
        else:
            self.w13 = torch.nn.Parameter(torch.zeros(e_loc, 2 * inter, hidden, **bf), **frozen)
            self.w2 = torch.nn.Parameter(torch.zeros(e_loc, hidden, inter, **bf), **frozen)
        self.w13s = self.w2s = self.shared_gate = None
        self.w13s_q = self.w13s_s = self.w2s_q = self.w2s_s = None
        if shared_inter and fp8:  # as the routed experts: e4m3 and fp32 scales per 128 x 128 block
            self.w13s_q = torch.nn.Parameter(torch.zeros(2 * shared_inter, hidden, **f8), **frozen)
            self.w13s_s = torch.nn.Parameter(torch.ones(2 * shared_inter // BLOCK, hidden // BLOCK, **f32), **frozen)
            self.w2s_q = torch.nn.Parameter(torch.zeros(hidden, shared_inter, **f8), **frozen)
            self.w2s_s = torch.nn.Parameter(torch.ones(hidden // BLOCK, shared_inter // BLOCK, **f32), **frozen)
        elif shared_inter:
            self.w13s = torch.nn.Parameter(torch.zeros(2 * shared_inter, hidden, **bf), **frozen)
            self.w2s = torch.nn.Parameter(torch.zeros(hidden, shared_inter, **bf), **frozen)
        if shared_inter and shared_gate:
            self.shared_gate = torch.nn.Parameter(torch.zeros(1, hidden, dtype=torch.float32, device=dev), **frozen)
        self.layer = None
        if kernel is not None:
            if backend != "kernel":
                raise ValueError("kernel= runs the block on an existing MoEMegakernel, which is backend='kernel'")
            if kernel_kwargs:
                raise TypeError(f"kernel= takes the layer as it was built; its options {sorted(kernel_kwargs)} belong to "
                                f"the block (or MoEMegakernel) that builds it, not to the blocks that share it")
            self.layer = check_shared_kernel(kernel, hidden=hidden, inter=inter, num_experts=num_experts, top_k=top_k,
                                             max_tokens=max_tokens, shared_inter=shared_inter,
                                             placement=self.placement, world=self.world, group=group, device=dev,
                                             expert_dtype=expert_dtype)
            parse_policy(policy, self.layer.num_ctas)
        elif backend == "kernel":
            self.layer = MoEMegakernel(hidden=hidden, inter=inter, num_experts=num_experts, top_k=top_k,
                                       placement=self.placement, max_tokens=max_tokens, group=group, device=dev,
                                       shared_inter=shared_inter, expert_dtype=expert_dtype, **kernel_kwargs)
            parse_policy(policy, self.layer.num_ctas)
        self._owner = torch.as_tensor(self.placement.owner)
        self._local_index = torch.as_tensor(self.placement.local_index())

    # ---- weights ------------------------------------------------------------------------------------------
    @torch.no_grad()
    def load_router(self, weight: torch.Tensor, score_bias: torch.Tensor | None = None) -> None:
        """weight [E, H] (any float dtype); score_bias [E] (scoring "sigmoid" with score_bias=True)."""
        if score_bias is not None and self.score_bias is None:
            raise ValueError("score_bias given, but the block was built with score_bias=False")
        w = _stack(weight, "router weight", (self.num_experts, self.hidden))  # both checked before either is copied
        b = _stack(score_bias, "score_bias", (self.num_experts,)) if score_bias is not None else None
        self.router_weight.copy_(w.float())
        if b is not None:
            self.score_bias.copy_(b.float())

    @torch.no_grad()
    def load_experts(self, gate_proj, up_proj, down_proj) -> None:
        """All E experts' weights in global order, each stacked [E, ...] or a list of E: gate_proj [I, H] (W1 of
        Mixtral), up_proj [I, H] (W3), down_proj [H, I] (W2). This rank keeps its local experts."""
        E, H, I = self.num_experts, self.hidden, self.inter
        g, u, d = (_stack(t, n, s) for t, n, s in ((gate_proj, "gate_proj", (E, I, H)), (up_proj, "up_proj", (E, I, H)),
                                                    (down_proj, "down_proj", (E, H, I))))
        if self.fp8:
            self._quantize_experts(g, u, d)
            return
        idx = torch.as_tensor(self.local, device=g.device)
        self.w13.copy_(torch.cat([g[idx], u[idx]], dim=1))
        self.w2.copy_(d[idx])

    def _quantize_experts(self, g, u, d) -> None:
        """FP8 blocks' load_experts: this rank's experts quantized on the block's device, one expert at a time (an
        fp32 copy of one expert at most), all of them before any is stored."""
        from .fp8 import quantize_weight

        dev = self.w13_q.device
        parts = []
        for e in self.local:
            try:
                parts.append((*quantize_weight(torch.cat([g[e], u[e]]).to(dev)), *quantize_weight(d[e].to(dev))))
            except ValueError as err:  # non-finite values
                raise ValueError(f"load_experts: expert {e}: {err}") from None
        for t, j in ((self.w13_q, 0), (self.w13_s, 1), (self.w2_q, 2), (self.w2_s, 3)):
            t.copy_(torch.stack([p[j] for p in parts]))

    @torch.no_grad()
    def load_experts_fp8(self, gate_proj, up_proj, down_proj, gate_scale, up_scale, down_scale) -> None:
        """FP8 blocks: all E experts' e4m3 weights and their DeepSeek-V3 `weight_scale_inv` block scales in global
        order, each stacked [E, ...] or a list of E, stored as they are (no requantization): gate_proj / up_proj
        [I, H] and down_proj [H, I] float8_e4m3fn; gate_scale / up_scale [I/128, H/128] and down_scale
        [H/128, I/128] (value = q * scale per 128 x 128 block; float32, or bf16 / fp16, widened exactly), finite.
        This rank keeps its local experts. Everything is checked before anything is copied."""
        from .fp8 import BLOCK, FP8

        if not self.fp8:
            raise ValueError("load_experts_fp8 is for blocks built with expert_dtype='fp8'; this block's experts are "
                             "bf16: pass bf16 weights to load_experts (fp8.dequant_weight dequantizes e4m3 ones)")
        E, H, I, B = self.num_experts, self.hidden, self.inter, BLOCK
        specs = (("gate_proj", gate_proj, (E, I, H)), ("up_proj", up_proj, (E, I, H)),
                 ("down_proj", down_proj, (E, H, I)), ("gate_scale", gate_scale, (E, I // B, H // B)),
                 ("up_scale", up_scale, (E, I // B, H // B)), ("down_scale", down_scale, (E, H // B, I // B)))
        got = []
        for n, (name, t, shape) in enumerate(specs):
            if isinstance(t, (list, tuple)):
                bad = sorted({str(x.dtype) for x in t if isinstance(x, torch.Tensor)} - {str(FP8)}) if n < 3 else []
                if bad:  # before torch.stack would promote a mix of dtypes
                    raise ValueError(f"{name} must be {FP8} (e4m3 weights), got a list holding {', '.join(bad)}")
            st = _stack(t, name, shape)
            if n < 3 and st.dtype != FP8:
                raise ValueError(f"{name} must be {FP8} (e4m3 weights; load_experts quantizes bf16 ones), got "
                                 f"{st.dtype}")
            if n >= 3:
                if st.dtype not in (torch.float32, torch.bfloat16, torch.float16):
                    raise ValueError(f"{name} must be float32 block scales (weight_scale_inv), got {st.dtype}")
                if not bool(torch.isfinite(st).all()):
                    raise ValueError(f"{name} has non-finite values")
            got.append(st)
        g, u, d, gs, us, ds = got
        idx = self.local
        self.w13_q.copy_(torch.cat([g[idx], u[idx]], dim=1))
        self.w13_s.copy_(torch.cat([gs[idx], us[idx]], dim=1))
        self.w2_q.copy_(d[idx])
        self.w2_s.copy_(ds[idx])

    def expert_weights(self) -> tuple:
        """(w13, w2) as the layer takes them: bf16 tensors, or (FP8) the (e4m3, scales) pairs."""
        if self.fp8:
            return (self.w13_q, self.w13_s), (self.w2_q, self.w2_s)
        return self.w13, self.w2

    def shared_weights(self) -> tuple | None:
        """The shared expert as the layer takes it (its shared=): (w13s, w2s) bf16, or (FP8) the pairs ((w13s_q,
        w13s_s), (w2s_q, w2s_s)); None without one."""
        if not self.shared_inter:
            return None
        if self.fp8:
            return (self.w13s_q, self.w13s_s), (self.w2s_q, self.w2s_s)
        return self.w13s, self.w2s

    def _shared_args(self, gate_proj, up_proj, down_proj, gate_weight) -> tuple:
        """load_shared's and load_shared_fp8's common checks: (gate, up, down, gate_weight or None), shapes checked."""
        if not self.shared_inter:
            raise ValueError("this block was built without a shared expert (shared_inter=0)")
        if (gate_weight is None) != (self.shared_gate is None):
            raise ValueError("gate_weight goes with shared_gate=True, and only with it")
        H, Is = self.hidden, self.shared_inter
        g = _stack(gate_proj, "shared gate_proj", (Is, H))  # every argument checked before anything is copied
        u = _stack(up_proj, "shared up_proj", (Is, H))
        d = _stack(down_proj, "shared down_proj", (H, Is))
        gw = _stack(gate_weight, "shared gate_weight", (1, H)) if gate_weight is not None else None
        return g, u, d, gw

    @torch.no_grad()
    def load_shared(self, gate_proj: torch.Tensor, up_proj: torch.Tensor, down_proj: torch.Tensor,
                    gate_weight: torch.Tensor | None = None) -> None:
        """The shared expert: gate_proj [Is, H], up_proj [Is, H], down_proj [H, Is] (DeepSeek's shared_experts hold
        all of them as one MLP of width num_shared x I); gate_weight [1, H] with shared_gate (Qwen's
        shared_expert_gate). FP8 blocks quantize the weights (fp8.quantize_weight; gate and up rows in their own
        128-row blocks, Is % 128 == 0); load_shared_fp8 takes a checkpoint's e4m3 ones as they are."""
        g, u, d, gw = self._shared_args(gate_proj, up_proj, down_proj, gate_weight)
        if self.fp8:
            from .fp8 import quantize_weight

            dev = self.w13s_q.device
            try:  # both quantized before either is stored
                w13, w2 = quantize_weight(torch.cat([g.to(dev), u.to(dev)], dim=0)), quantize_weight(d.to(dev))
            except ValueError as err:  # non-finite values
                raise ValueError(f"load_shared: {err}") from None
            for dst, src in ((self.w13s_q, w13[0]), (self.w13s_s, w13[1]), (self.w2s_q, w2[0]), (self.w2s_s, w2[1])):
                dst.copy_(src)
        else:
            self.w13s.copy_(torch.cat([g, u], dim=0))
            self.w2s.copy_(d)
        if gw is not None:
            self.shared_gate.copy_(gw.float())

    @torch.no_grad()
    def load_shared_fp8(self, gate_proj, up_proj, down_proj, gate_scale, up_scale, down_scale,
                        gate_weight: torch.Tensor | None = None) -> None:
        """FP8 blocks: the shared expert's e4m3 weights and their DeepSeek-V3 `weight_scale_inv` block scales, stored
        as they are (no requantization): gate_proj / up_proj [Is, H] and down_proj [H, Is] float8_e4m3fn;
        gate_scale / up_scale [Is/128, H/128] and down_scale [H/128, Is/128] (value = q * scale per 128 x 128
        block; float32, or bf16 / fp16, widened exactly), finite; gate_weight [1, H] with shared_gate. Everything is
        checked before anything is copied."""
        from .fp8 import BLOCK, FP8

        if not self.fp8:
            raise ValueError("load_shared_fp8 is for blocks built with expert_dtype='fp8'; this block's experts are "
                             "bf16: pass bf16 weights to load_shared (fp8.dequant_weight dequantizes e4m3 ones)")
        g, u, d, gw = self._shared_args(gate_proj, up_proj, down_proj, gate_weight)
        H, Is, B = self.hidden, self.shared_inter, BLOCK
        for name, t in (("gate_proj", g), ("up_proj", u), ("down_proj", d)):
            if t.dtype != FP8:
                raise ValueError(f"shared {name} must be {FP8} (e4m3 weights; load_shared quantizes bf16 ones), got "
                                 f"{t.dtype}")
        sc = []
        for name, t, shape in (("gate_scale", gate_scale, (Is // B, H // B)), ("up_scale", up_scale, (Is // B, H // B)),
                               ("down_scale", down_scale, (H // B, Is // B))):
            t = _stack(t, f"shared {name}", shape)
            if t.dtype not in (torch.float32, torch.bfloat16, torch.float16):
                raise ValueError(f"shared {name} must be float32 block scales (weight_scale_inv), got {t.dtype}")
            if not bool(torch.isfinite(t).all()):
                raise ValueError(f"shared {name} has non-finite values")
            sc.append(t)
        self.w13s_q.copy_(torch.cat([g, u], dim=0))
        self.w13s_s.copy_(torch.cat([sc[0], sc[1]], dim=0))
        self.w2s_q.copy_(d)
        self.w2s_s.copy_(sc[2])
        if gw is not None:
            self.shared_gate.copy_(gw.float())

    # ---- forward ------------------------------------------------------------------------------------------
    def route(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(topk_ids [N, k] int32, topk_weights [N, k] fp32) for the rows of x [N, H]."""
        if not isinstance(x, torch.Tensor) or x.dim() != 2 or x.shape[1] != self.hidden:
            got = list(x.shape) if isinstance(x, torch.Tensor) else type(x).__name__
            raise ValueError(f"route() takes x [num_tokens, {self.hidden}] (flatten with x.reshape(-1, {self.hidden})), "
                             f"got {got}")
        if self.custom_router is not None:
            return self._check_routing(self.custom_router(x), x.shape[0])
        rd = self.router_dtype
        logits = (x.to(rd) @ self.router_weight.to(rd).t()).float()
        scores = torch.softmax(logits, dim=-1) if self.scoring == "softmax" else torch.sigmoid(logits)
        pick = scores if self.score_bias is None else scores + self.score_bias
        if self.n_group > 1:  # only the experts of the topk_group best groups may be picked
            grouped = pick.view(pick.shape[0], self.n_group, self.num_experts // self.n_group)  # (0 rows too)
            group_score = (grouped.topk(2, dim=-1).values.sum(-1) if self.scoring == "sigmoid" and grouped.shape[-1] > 1
                           else grouped.max(dim=-1).values)
            keep = torch.zeros_like(group_score, dtype=torch.bool)
            keep.scatter_(1, group_score.topk(self.topk_group, dim=-1).indices, True)
            pick = pick.masked_fill(~keep.repeat_interleave(grouped.shape[-1], dim=1), float("-inf"))
        ids = torch.topk(pick, self.top_k, dim=-1).indices
        w = scores.gather(1, ids)
        if self.norm_topk:
            w = w / w.sum(dim=-1, keepdim=True).clamp_min(1e-20)
        return ids.to(torch.int32), (w * self.routed_scale).float().contiguous()

    def _check_routing(self, out, n: int) -> tuple[torch.Tensor, torch.Tensor]:
        """A custom router's (ids, weights): integer ids and float weights, both [n, top_k] (shapes only: the ids'
        range is checked by the call, as the kernel's check=True does, without a host sync here)."""
        if not isinstance(out, (tuple, list)) or len(out) != 2:
            raise TypeError(f"router= must return (topk_ids, topk_weights), got {type(out).__name__}")
        ids, w = out
        want = [n, self.top_k]
        for name, t, is_float in (("topk_ids", ids, False), ("topk_weights", w, True)):
            if not isinstance(t, torch.Tensor):
                raise TypeError(f"router= returned {name} of type {type(t).__name__}, not a tensor")
            if list(t.shape) != want:
                raise ValueError(f"router= returned {name} of shape {list(t.shape)}; this block needs {want} "
                                 f"(num_tokens x top_k)")
            if t.is_floating_point() != is_float or t.is_complex() or t.dtype == torch.bool:
                raise TypeError(f"router= returned {name} of dtype {t.dtype}; it must be "
                                f"{'a floating point' if is_float else 'an integer'} tensor")
        return ids.to(torch.int32).contiguous(), w.float().contiguous()

    @torch.no_grad()
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not isinstance(x, torch.Tensor) or x.dim() == 0 or x.shape[-1] != self.hidden:
            got = list(x.shape) if isinstance(x, torch.Tensor) else type(x).__name__
            raise ValueError(f"x must end in the hidden size {self.hidden}, got shape {got}")
        if x.dtype != torch.bfloat16:
            raise TypeError(f"x must be bf16 (the kernel's dtype), got {x.dtype}")
        flat = x.reshape(-1, self.hidden).contiguous()
        if self.fp8 and flat.data_ptr() % 16:  # the FP8 kernel reads x in 16-byte pieces
            flat = flat.clone()
        ids, w = self.route(flat)
        shared = self.shared_weights()
        scale = torch.sigmoid(flat.float() @ self.shared_gate.t()).squeeze(1).contiguous() \
            if self.shared_gate is not None else None
        if self.backend == "kernel":
            self._check_kernel_placement()
            y = self._kernel_call(flat, ids, w, shared, scale)
        else:  # the kernel's per-call contract, so code tested here runs on the kernel backend unchanged
            w13, w2 = self.expert_weights()
            check_layer_inputs(flat, ids, w, w13, w2, hidden=self.hidden, inter=self.inter,
                               num_experts=self.num_experts, num_local_experts=len(self.local), top_k=self.top_k,
                               max_tokens=self.max_tokens, device=self.router_weight.device, check_ids=self.check,
                               fp8=self.fp8)
            y = ep_moe_reference(flat, ids, w, w13, w2, self._owner, self._local_index, group=self.group,
                                 shared=shared, shared_scale=scale)
        return y.reshape(x.shape)

    def _check_kernel_placement(self) -> None:
        """Refuse a forward after the kernel's placement changed (MoEMegakernel.set_placement, e.g. through another
        block on a shared kernel): this block's w13 / w2 hold the experts of the placement it was built with."""
        kp = self.layer.placement
        if kp is self.placement:
            return
        if not same_placement(kp, self.placement, self.world):
            raise RuntimeError("this block's experts were loaded for the placement it was built with, and its kernel's "
                               "placement has changed since (MoEMegakernel.set_placement): build the block again with "
                               "placement=kernel.placement and load its experts")
        self.placement = kp  # the same placement as another object: compared once

    def _kernel_call(self, x, ids, w, shared, scale, depth: int = 0) -> torch.Tensor:
        """One kernel call; a batch that overflows the receive buffers runs again as two halves (on_overflow
        "split"). Every rank finds an overflow alike, so every rank splits, and the ranks' calls stay paired."""
        from .megakernel import ReceiveOverflow

        try:
            return self.layer(x, ids, w, *self.expert_weights(), policy=self.policy, shared=shared,
                              shared_order=self.shared_order, shared_scale=scale, check=self.check)
        except ReceiveOverflow:
            if self.on_overflow != "split" or depth >= 16:
                raise
        h = (x.shape[0] + 1) // 2
        parts = [self._kernel_call(x[a:b], ids[a:b], w[a:b], shared, None if scale is None else scale[a:b], depth + 1)
                 for a, b in ((0, h), (h, x.shape[0]))]
        return torch.cat(parts)

    def raise_if_error(self) -> None:
        """After forwards with check=False: synchronise and raise if the kernel flagged an error (kernel backend)."""
        if self.layer is not None:
            self.layer.raise_if_error()

    def extra_repr(self) -> str:
        return (f"hidden={self.hidden}, inter={self.inter}, experts={self.num_experts} ({len(self.local)} here), "
                f"top_k={self.top_k}, scoring={self.scoring}, shared_inter={self.shared_inter}, backend={self.backend}, "
                f"policy={self.policy}, expert_dtype={self.expert_dtype}")


def stack_expert_weights(experts: Sequence, names=("gate_proj", "up_proj", "down_proj")) -> tuple:
    """(gate [E, I, H], up [E, I, H], down [E, H, I]) from a list of expert modules whose Linear layers carry `names`
    (HF Qwen / DeepSeek: gate_proj, up_proj, down_proj; Mixtral: w1, w3, w2)."""
    return tuple(torch.stack([getattr(m, n).weight for m in experts]) for n in names)

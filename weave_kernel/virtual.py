"""Virtual ranks: G ranks of the megakernel in one process on one GPU, for correctness at any world size.

The kernel addresses its peers only through `peer_base` (one base address per rank), flags and copies; nothing in
it needs the ranks to be on different GPUs. `VirtualRanks` builds G `MoEMegakernel` objects on one device, each
with plain buffers and a grid of `ctas_per_rank` CTAs (default: the SMs divided by G), points every rank's
`peer_base` at all G buffers and launches the G grids on G streams, so that they run at the same time and talk
through the same code paths as real ranks (count exchange, dispatch flags, combine pushes, epochs). Plain
launches, not cooperative ones: a cooperative launch promises that one grid is co-resident, not that G grids run
together; G x ctas_per_rank <= SMs lets all of them start, and a CTA that never starts ends in a timeout error,
not a hang.

What it shows: that the kernel is correct for world sizes no machine here has (4, 8, odd ones). What it does not
show: speed. The ranks share one GPU's SMs, L2 and HBM, and "NVLink" traffic is local memory traffic.

    vr = VirtualRanks(4, hidden=H, inter=I, num_experts=E, top_k=k, placement=contiguous(E, 4), max_tokens=512)
    ys = vr(xs, ids, ws, w13s, w2s, policy="weave")      # one tensor per rank in each list
"""
from __future__ import annotations

import torch

from .buffers import DEFAULT_TIMEOUT_S
from .megakernel import DEFAULT_COST_PROFILE, SHARED_ORDERS, MoEMegakernel, ReceiveOverflow
from .policies import parse_policy
from .validate import check_layer_inputs, check_shared_weights


def default_ctas_per_rank(num_sms: int, world: int) -> int:
    """The grid of each virtual rank: an equal share of the SMs."""
    if world < 1:
        raise ValueError(f"world size {world} must be >= 1")
    n = num_sms // world
    if n < max(2, world):
        raise ValueError(f"{num_sms} SMs give {n} CTAs per rank for {world} virtual ranks; each needs at least "
                         f"max(2, world) = {max(2, world)}")
    return n


class VirtualRanks:
    """`world` megakernel ranks of one layer in this process, on `device` (default: the current GPU)."""

    def __init__(self, world: int, *, hidden: int, inter: int, num_experts: int, top_k: int, placement,
                 max_tokens: int, device=None, ctas_per_rank: int | None = None,
                 timeout_s: float = DEFAULT_TIMEOUT_S, timeline_per_cta: int = 0,
                 cost_profile=DEFAULT_COST_PROFILE, ext=None, dispatch: str = "threads", shared_inter: int = 0,
                 recv_capacity: int | None = None, expert_dtype: str = "bf16"):
        from .build import load_extension

        self.world = int(world)
        self.device = torch.device(device) if device is not None else torch.device("cuda", torch.cuda.current_device())
        ext = ext if ext is not None else load_extension()
        max_ctas = ext.max_ctas(self.device.index)
        if max_ctas <= 0:
            raise RuntimeError("the megakernel does not fit one CTA per SM on this device")
        n = default_ctas_per_rank(max_ctas, self.world) if ctas_per_rank is None else int(ctas_per_rank)
        if n * self.world > max_ctas:
            raise ValueError(f"{self.world} ranks x {n} CTAs exceed the {max_ctas} SMs: the grids could not all run "
                             f"at once")
        self.layers = [
            MoEMegakernel(hidden=hidden, inter=inter, num_experts=num_experts, top_k=top_k, placement=placement,
                          max_tokens=max_tokens, device=self.device, timeout_s=timeout_s,
                          timeline_per_cta=timeline_per_cta, cost_profile=cost_profile, ext=ext,
                          virtual=(r, self.world), num_ctas=n, dispatch=dispatch, shared_inter=shared_inter,
                          recv_capacity=recv_capacity, expert_dtype=expert_dtype)
            for r in range(self.world)
        ]
        for layer in self.layers:
            layer.connect(self.layers)
        self.num_ctas = n
        self.streams = [torch.cuda.Stream(self.device) for _ in range(self.world)]
        torch.cuda.synchronize(self.device)

    def __getitem__(self, rank: int) -> MoEMegakernel:
        return self.layers[rank]

    def set_placement(self, placement) -> None:
        """MoEMegakernel.set_placement on every rank (the weights of later calls in the new local order)."""
        for layer in self.layers:
            layer._placement_tables(placement)  # all ranks accept it before any changes
        torch.cuda.synchronize(self.device)  # no rank's call still reads the old tables
        for layer in self.layers:
            layer.set_placement(placement)
        torch.cuda.synchronize(self.device)  # the ranks' own streams see the new tables

    def __call__(self, xs, topk_ids, topk_weights, w13s, w2s, *, policy: str = "static:8", check: bool = True,
                 record_timeline: bool = False, outs=None, shared=None, shared_order: str = "last",
                 shared_scales=None) -> list[torch.Tensor]:
        """One call of the layer on every rank (lists indexed by rank). Every rank's inputs are checked before
        any grid starts (a rank that never launches would leave the others waiting until their timeout).
        check=True also synchronises and raises if any rank's kernel flagged an error.
        shared: None or, per rank, the shared expert's (w13s, w2s) (FP8 ranks: ((q, s), (q, s)) as
        MoEMegakernel.__call__ takes them); shared_scales: None or per rank [N_r] fp32
        (MoEMegakernel.__call__'s shared_scale)."""
        args = (xs, topk_ids, topk_weights, w13s, w2s) + ((outs,) if outs is not None else ()) + \
            ((shared,) if shared is not None else ())
        if any(len(a) != self.world for a in args):
            raise ValueError(f"every per-rank argument must be a list of {self.world} tensors")
        parse_policy(policy, self.num_ctas)
        for r, layer in enumerate(self.layers):
            if layer.broken:
                raise RuntimeError(f"virtual rank {r} is unusable after an earlier failure: {layer.broken}")
            check_layer_inputs(xs[r], topk_ids[r], topk_weights[r], w13s[r], w2s[r], hidden=layer.hidden,
                               inter=layer.inter, num_experts=layer.num_experts,
                               num_local_experts=layer.num_local_experts, top_k=layer.top_k,
                               max_tokens=layer.max_tokens, device=self.device, check_ids=True, fp8=layer.fp8)
            if shared is not None:
                if layer.shared_inter <= 0:
                    raise ValueError("shared= needs the ranks built with shared_inter > 0")
                check_shared_weights(shared[r][0], shared[r][1], hidden=layer.hidden, inter_shared=layer.shared_inter,
                                     device=self.device, fp8=layer.fp8)
        if shared_order not in SHARED_ORDERS:
            raise ValueError(f"shared_order must be one of {SHARED_ORDERS}, got {shared_order!r}")
        if check and any(layer._unread or layer._captured for layer in self.layers):
            self.raise_if_error()  # what unchecked calls left is theirs, never recoverable (MoEMegakernel.__call__)
        cur = torch.cuda.current_stream(self.device)
        ys = []
        for r, (layer, stream) in enumerate(zip(self.layers, self.streams)):
            stream.wait_stream(cur)  # inputs written on the caller's stream
            pairs = (w13s[r], w2s[r]) + (tuple(shared[r]) if shared else ())
            ws = tuple(t for p in pairs for t in p) if layer.fp8 else pairs  # FP8: (weights, scales) pairs
            for t in (xs[r], topk_ids[r], topk_weights[r]) + ws:
                t.record_stream(stream)  # not reused by the allocator before this rank's grid is done
            with torch.cuda.stream(stream):
                ys.append(layer(xs[r], topk_ids[r], topk_weights[r], w13s[r], w2s[r], policy=policy, check=False,
                                record_timeline=record_timeline, out=None if outs is None else outs[r],
                                shared=None if shared is None else shared[r], shared_order=shared_order,
                                shared_scale=None if shared_scales is None else shared_scales[r]))
        for stream, y in zip(self.streams, ys):
            cur.wait_stream(stream)
            y.record_stream(cur)
        if check:
            self.raise_if_error(_just_called=True)
        return ys

    def raise_if_error(self, _just_called: bool = False) -> None:
        """Synchronise; raise RuntimeError naming every rank whose kernel flagged an error. A receive overflow
        found right after the call that overflowed (check=True) raises ReceiveOverflow and leaves the ranks usable,
        as MoEMegakernel.raise_if_error does (every rank finds it alike)."""
        msgs, overflows = [], []
        for layer in self.layers:
            try:
                layer.raise_if_error(_just_called=_just_called)
            except ReceiveOverflow as exc:
                overflows.append((layer, exc))
            except RuntimeError as exc:
                msgs.append(str(exc))
        if overflows and not msgs and len(overflows) == self.world:
            first = overflows[0][1]
            raise ReceiveOverflow("; ".join(str(e) for _, e in overflows), owner=first.owner, rows=first.rows)
        for layer, exc in overflows:  # not every rank overflowed (or others failed too): unusable, as any error
            layer.broken = layer.broken or str(exc)
        if overflows or msgs:
            raise RuntimeError("; ".join(msgs + [str(e) for _, e in overflows]))

    def poison_scratch(self) -> None:
        """NaN into every rank's receive, combine and h rows (between calls)."""
        torch.cuda.synchronize(self.device)
        for layer in self.layers:
            layer.poison_scratch()
        torch.cuda.synchronize(self.device)

    def last_choices(self) -> list[dict | None]:
        return [layer.last_choice() for layer in self.layers]

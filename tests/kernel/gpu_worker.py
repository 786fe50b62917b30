"""GPU correctness worker: run under torchrun (one process per GPU) by test_megakernel_gpu.py.

Every case draws fresh random inputs, poisons the output and the kernel's scratch rows with NaN, runs the
megakernel with several policies on the same layer (epochs advance, nothing is reset) and compares with the
fp32 dense reference: ||y - y_ref|| / ||y_ref|| <= 1e-2. Prints one line per (case, policy) and exits 1 on any
failure. Usage: torchrun --nproc_per_node=G tests/kernel/gpu_worker.py [--quick] [--trace-dir DIR]
"""
from __future__ import annotations

import argparse
import os
import sys
import traceback
import warnings

import numpy as np
import torch
import torch.distributed as dist

from weave_kernel.choice import choice_agrees, counts_from_routing, geometry_model, model_choice
from weave_kernel.megakernel import MoEMegakernel
from weave_kernel.reference import ep_moe_reference, make_shared_weights, make_weights, moe_reference, shared_ffn
from weave_kernel.symm import init_ranks
from weave_kernel.routing import single_expert_routing, skewed_routing
from weave_kernel.timeline import write_chrome_trace
from weave_sim.costtable import CostTable
from weave_sim.placement import contiguous, round_robin
from weave_sim.presets import get_model

TOL = 1e-2
FAILURES: list[str] = []
DISPATCH = ["threads"]  # how comm CTAs copy rows (MoEMegakernel's `dispatch`), set by --dispatch


def log(msg: str) -> None:
    if dist.get_rank() == 0:
        print(msg, flush=True)


def rel_err(y: torch.Tensor, ref: torch.Tensor) -> float:
    y = y.float()
    if not torch.isfinite(y).all():
        return float("inf")
    return float((y - ref).norm() / ref.norm().clamp_min(1e-30))


def gather_routing(ids: np.ndarray, w: np.ndarray, x: torch.Tensor):
    """All ranks' routing and tokens (variable token counts per rank) for the dense reference."""
    world = dist.get_world_size()
    objs = [None] * world
    dist.all_gather_object(objs, (ids, w))
    xs = [None] * world
    dist.all_gather_object(xs, x.cpu())
    return objs, xs


def poisoned_run(label: str, layer, call, out: torch.Tensor, ref: torch.Tensor) -> bool:
    """Poison `out` and the layer's scratch rows with NaN, run `call` (one layer call or graph replay writing
    `out`), compare `out` with `ref` on every rank (rel. error <= TOL); log PASS/FAIL with each rank's error and
    record a failure. Every rank must call it."""
    out.fill_(float("nan"))
    torch.cuda.synchronize()
    dist.barrier()
    layer.poison_scratch()
    torch.cuda.synchronize()
    dist.barrier()
    try:
        call()
        torch.cuda.synchronize()
        err = rel_err(out, ref)
    except Exception as exc:  # noqa: BLE001 - report and continue with the other cases
        err = float("inf")
        traceback.print_exc()
        print(f"rank {dist.get_rank()}: {' '.join(label.split())}: {exc}", flush=True)
    return check_all_ranks(label, err)


def check_all_ranks(label: str, err: float) -> bool:
    """Gather this rank's rel. error, log PASS/FAIL with every rank's, record a failure. Every rank must call it."""
    errs = [None] * dist.get_world_size()
    dist.all_gather_object(errs, err)
    ok = all(e <= TOL for e in errs)
    log(f"{'PASS' if ok else 'FAIL'} {label} rel_err {' '.join(f'{e:.2e}' for e in errs)}")
    if not ok:
        FAILURES.append(" ".join(label.split()))
    return ok


def same_outcome(label: str, got: str, want: str) -> bool:
    """Gather every rank's outcome `got`; log PASS if all are `want`, else FAIL with each rank's, and record it.
    Every rank must call it."""
    every = [None] * dist.get_world_size()
    dist.all_gather_object(every, got)
    ok = all(g == want for g in every)
    log(f"{'PASS' if ok else 'FAIL'} {label}: {every}")
    if not ok:
        FAILURES.append(" ".join(label.split()))
    return ok


def expect_refused(what: str, call, exc_type=ValueError) -> None:
    """`call` must raise exc_type (bad input refused on the host); log it, record a failure if it did not."""
    try:
        call()
    except exc_type as exc:
        log(f"PASS {what} refused: {exc}")
        return
    FAILURES.append(what)
    log(f"FAIL {what} was not refused")


def run_case(name: str, *, hidden: int, inter: int, num_experts: int, top_k: int, tokens: list[int],
             routing: str = "skewed", placement: str = "contiguous",
             policies=("sequential", "static:8", "static:64", "weave", "weave:16", "weave-nosteal"),
             repeats: int = 1, seed: int = 0, layer_cache: dict | None = None, ep_ref: bool = False,
             x_scale: float = 1.0, shared_inter: int = 0, shared_calls=(None,), shared_gate: bool = False) -> None:
    """shared_inter > 0: the layer has a shared expert of that width; shared_calls: per policy, one call per entry,
    None (without the shared expert) or its ticket order "first" / "last"; shared_gate: weigh its row per token
    (shared_scale, random in [0, 1))."""
    rank, world = dist.get_rank(), dist.get_world_size()
    dev = torch.device("cuda", torch.cuda.current_device())
    pl = contiguous(num_experts, world) if placement == "contiguous" else round_robin(num_experts, world)
    key = (hidden, inter, num_experts, top_k, placement, max(tokens), shared_inter)
    layer = (layer_cache or {}).get(key)
    if layer is None:
        layer = MoEMegakernel(hidden=hidden, inter=inter, num_experts=num_experts, top_k=top_k, placement=pl,
                              max_tokens=max(tokens), timeline_per_cta=512, dispatch=DISPATCH[0],
                              shared_inter=shared_inter)
        if layer_cache is not None:
            layer_cache[key] = layer
    gen = torch.Generator(device=dev).manual_seed(1000 + seed)  # same weights on every rank
    w13_all, w2_all = make_weights(num_experts, hidden, inter, device=dev, generator=gen)
    local = torch.as_tensor(pl.local_experts(rank), device=dev)
    w13 = w13_all[local].contiguous()
    w2 = w2_all[local].contiguous()
    sw = make_shared_weights(hidden, shared_inter, device=dev, generator=gen) if shared_inter else None
    for rep in range(repeats):
        n = tokens[rank % len(tokens)]
        s = seed * 7919 + rep * 31 + rank
        if routing == "skewed":
            ids, w = skewed_routing(n, num_experts, top_k, seed=s, zipf_s=1.2)
        elif routing == "one_expert":
            ids, w = single_expert_routing(n, top_k, expert=num_experts - 1, num_experts=num_experts, seed=s)
        else:
            raise ValueError(routing)
        x = (x_scale * torch.randn(n, hidden, generator=torch.Generator().manual_seed(s))).to(torch.bfloat16)
        all_routing, all_x = gather_routing(ids, w, x)
        # dense reference over everyone's tokens; this rank's rows are its slice
        ids_cat = torch.as_tensor(np.concatenate([r[0] for r in all_routing])).to(dev)
        w_cat = torch.as_tensor(np.concatenate([r[1] for r in all_routing])).to(dev)
        x_cat = torch.cat(all_x).to(dev)
        ref_all = moe_reference(x_cat, ids_cat, w_cat, w13_all, w2_all)
        start = sum(tokens[g % len(tokens)] for g in range(rank))
        ref = ref_all[start:start + n]
        x_d = x.to(dev)
        ids_d = torch.as_tensor(ids).to(dev)
        w_d = torch.as_tensor(w).to(dev)
        gate = torch.rand(n, generator=torch.Generator().manual_seed(s + 5)).to(dev) if shared_gate else None
        ref_sh = None
        if sw is not None:
            ys = shared_ffn(x_d.float(), sw[0].float(), sw[1].float())
            ref_sh = ref + (ys if gate is None else ys * gate[:, None])
        for pol in policies:
            for order in shared_calls:
                y = torch.empty(n, hidden, dtype=torch.bfloat16, device=dev)
                tag = "" if order is None else f" shared:{order}"
                poisoned_run(f"{name:<34} rep {rep} {pol + tag:<11} tokens {tokens}", layer,
                             lambda: layer(x_d, ids_d, w_d, w13, w2, policy=pol, out=y,
                                           shared=None if order is None else sw, shared_order=order or "last",
                                           shared_scale=None if order is None else gate),
                             y, ref if order is None else ref_sh)
                if pol.startswith("weave"):
                    check_choice(f"{name} rep {rep} {pol}{tag}", layer, pol, [r[0] for r in all_routing], pl,
                                 geometry_model(hidden, inter, num_experts, top_k))
        if ep_ref:
            with_sh = sw is not None and any(o is not None for o in shared_calls)
            yr = ep_moe_reference(x_d, ids_d, w_d, w13, w2, torch.as_tensor(pl.owner),
                                  torch.as_tensor(pl.local_index()), shared=sw if with_sh else None,
                                  shared_scale=gate if with_sh else None)
            check_all_ranks(f"{name:<34} rep {rep} ep_reference", rel_err(yr, ref_sh if with_sh else ref))


def graph_case(name: str, *, hidden: int, inter: int, num_experts: int, top_k: int, tokens: list[int],
               policies=("static:8", "weave", "sequential"), replays: int = 3, seed: int = 0,
               shared_inter: int = 0) -> None:
    """The layer captured in a CUDA graph: one graph per policy over fixed input tensors, replayed with fresh
    routing and tokens copied in before each replay (output and scratch poisoned first), an eager call of
    another policy between replays (the device epoch counter must keep every rank's flags apart), the
    replays' weave choices checked like eager calls'. Also: capturing with check=True is refused."""
    rank, world = dist.get_rank(), dist.get_world_size()
    dev = torch.device("cuda", torch.cuda.current_device())
    pl = contiguous(num_experts, world)
    n = tokens[rank % len(tokens)]
    layer = MoEMegakernel(hidden=hidden, inter=inter, num_experts=num_experts, top_k=top_k, placement=pl,
                          max_tokens=n, dispatch=DISPATCH[0], shared_inter=shared_inter)
    gen = torch.Generator(device=dev).manual_seed(2000 + seed)
    w13_all, w2_all = make_weights(num_experts, hidden, inter, device=dev, generator=gen)
    local = torch.as_tensor(pl.local_experts(rank), device=dev)
    w13, w2 = w13_all[local].contiguous(), w2_all[local].contiguous()
    sw = make_shared_weights(hidden, shared_inter, device=dev, generator=gen) if shared_inter else None
    ksh = {"shared": sw, "shared_order": "last"} if sw is not None else {}
    x_s = torch.zeros(n, hidden, dtype=torch.bfloat16, device=dev)
    ids_s = torch.zeros(n, top_k, dtype=torch.int32, device=dev)
    w_s = torch.zeros(n, top_k, dtype=torch.float32, device=dev)
    y_s = torch.zeros(n, hidden, dtype=torch.bfloat16, device=dev)
    refused = False
    try:
        with warnings.catch_warnings():  # the refused call leaves the graph empty, which torch warns about
            warnings.simplefilter("ignore", UserWarning)
            with torch.cuda.graph(torch.cuda.CUDAGraph()):
                layer(x_s, ids_s, w_s, w13, w2, policy="static:8", out=y_s, **ksh)
    except ValueError as exc:
        refused = "check=False" in str(exc)
    flags = [None] * world
    dist.all_gather_object(flags, refused)
    log(f"{'PASS' if all(flags) else 'FAIL'} {name:<34} capture with check=True refused")
    if not all(flags):
        FAILURES.append(f"{name} check=True capture")
    graphs = {}
    torch.cuda.synchronize()
    dist.barrier()
    for pol in policies:  # every rank captures the same graphs in the same order (nothing runs while capturing)
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            layer(x_s, ids_s, w_s, w13, w2, policy=pol, check=False, out=y_s, **ksh)
        graphs[pol] = g
    for rep in range(replays):
        s = seed * 7919 + rep * 31 + rank
        ids, w = skewed_routing(n, num_experts, top_k, seed=s, zipf_s=1.2)
        x = torch.randn(n, hidden, generator=torch.Generator().manual_seed(s)).to(torch.bfloat16)
        all_routing, all_x = gather_routing(ids, w, x)
        ids_cat = torch.as_tensor(np.concatenate([r[0] for r in all_routing])).to(dev)
        w_cat = torch.as_tensor(np.concatenate([r[1] for r in all_routing])).to(dev)
        ref_all = moe_reference(torch.cat(all_x).to(dev), ids_cat, w_cat, w13_all, w2_all)
        start = sum(tokens[g % len(tokens)] for g in range(rank))
        ref = ref_all[start:start + n]
        if sw is not None:
            ref = ref + shared_ffn(x.to(dev).float(), sw[0].float(), sw[1].float())
        x_s.copy_(x.to(dev))
        ids_s.copy_(torch.as_tensor(ids, dtype=torch.int32))
        w_s.copy_(torch.as_tensor(w))
        for pol, g in graphs.items():
            poisoned_run(f"{name:<34} rep {rep} graph {pol:<11} tokens {tokens}", layer,
                         lambda: (g.replay(), torch.cuda.synchronize(), layer.raise_if_error()), y_s, ref)
            if pol.startswith("weave"):
                check_choice(f"{name} rep {rep} graph {pol}", layer, pol, [r[0] for r in all_routing], pl,
                             geometry_model(hidden, inter, num_experts, top_k))
        # an eager call between replays, on other inputs: the next replay must not see its flags as its own
        y_e = torch.empty(n, hidden, dtype=torch.bfloat16, device=dev)
        xf, idf, wf = (t.flip(0).contiguous() for t in (x_s, ids_s, w_s))
        poisoned_run(f"{name:<34} rep {rep} eager static:20 between replays", layer,
                     lambda: layer(xf, idf, wf, w13, w2, policy="static:20", out=y_e, **ksh), y_e, ref.flip(0))


# FP8 experts: the kernel's h and accumulation differ slightly from fp8.moe_reference_fp8's fp32 (docs/kernel.md, "FP8
# experts in the layer"; tests/kernel/fp8_worker.py's bounds): 3e-2 against it
TOL_FP8 = 3e-2


def fp8_case(name: str, *, hidden: int, inter: int, num_experts: int, top_k: int, tokens: list[int], seed: int = 0,
             policies=("sequential", "static:8", "weave", "weave-nosteal"), graph: bool = True) -> None:
    """FP8 experts on real ranks (e4m3 rows and scales over the link): every policy against fp8.moe_reference_fp8
    over all ranks' tokens (output and scratch poisoned first), every policy's output bit-identical to the first's on
    each rank, the in-kernel choice checked; then (graph) static:8 and weave captured in CUDA graphs and replayed on
    fresh inputs copied in."""
    from weave_kernel.fp8 import moe_reference_fp8, quantize_experts

    rank, world = dist.get_rank(), dist.get_world_size()
    dev = torch.device("cuda", torch.cuda.current_device())
    pl = contiguous(num_experts, world)
    n = tokens[rank % len(tokens)]
    gen = torch.Generator(device=dev).manual_seed(3000 + seed)  # the same weights on every rank
    w13_all, w2_all = quantize_experts(*make_weights(num_experts, hidden, inter, device=dev, generator=gen))
    local = torch.as_tensor(pl.local_experts(rank), device=dev)
    w13 = (w13_all[0][local].contiguous(), w13_all[1][local].contiguous())
    w2 = (w2_all[0][local].contiguous(), w2_all[1][local].contiguous())
    layer = MoEMegakernel(hidden=hidden, inter=inter, num_experts=num_experts, top_k=top_k, placement=pl,
                          max_tokens=n, expert_dtype="fp8")

    def inputs(rep: int):
        s = seed * 7919 + rep * 31 + rank
        ids, w = skewed_routing(n, num_experts, top_k, seed=s, zipf_s=1.2)
        x = (0.5 * torch.randn(n, hidden, generator=torch.Generator().manual_seed(s))).to(torch.bfloat16)
        all_routing, all_x = gather_routing(ids, w, x)
        ids_cat = torch.as_tensor(np.concatenate([r[0] for r in all_routing])).to(dev)
        w_cat = torch.as_tensor(np.concatenate([r[1] for r in all_routing])).to(dev)
        ref_all = moe_reference_fp8(torch.cat(all_x).to(dev), ids_cat, w_cat, w13_all, w2_all).float()
        start = sum(tokens[g % len(tokens)] for g in range(rank))
        return x.to(dev), torch.as_tensor(ids).to(dev), torch.as_tensor(w).to(dev), ref_all[start:start + n], \
            [r[0] for r in all_routing]

    x_d, ids_d, w_d, ref, ids_all = inputs(0)
    first = None
    for pol in policies:
        y = torch.empty(n, hidden, dtype=torch.bfloat16, device=dev)
        out = poisoned_run_tol(f"{name:<34} fp8 {pol:<13} tokens {tokens}", layer,
                               lambda: layer(x_d, ids_d, w_d, w13, w2, policy=pol, out=y), y, ref, TOL_FP8)
        same = "same" if first is None or torch.equal(y.view(torch.int16), first.view(torch.int16)) else "differs"
        first = y.clone() if first is None else first
        same_outcome(f"{name:<34} fp8 {pol:<13} bits equal to {policies[0]}'s", same, "same")
        if pol.startswith("weave") and out:
            check_choice(f"{name} fp8 {pol}", layer, pol, ids_all, pl, geometry_model(hidden, inter, num_experts, top_k))
    if not graph:
        return
    x_s, ids_s, w_s = x_d.clone(), ids_d.to(torch.int32).clone(), w_d.clone()
    y_s = torch.zeros(n, hidden, dtype=torch.bfloat16, device=dev)
    torch.cuda.synchronize()
    dist.barrier()
    graphs = {}
    for pol in ("static:8", "weave"):
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            layer(x_s, ids_s, w_s, w13, w2, policy=pol, check=False, out=y_s)
        graphs[pol] = g
    for rep in (1, 2):
        x, ids, w, ref, _ = inputs(rep)
        x_s.copy_(x)
        ids_s.copy_(ids.to(torch.int32))
        w_s.copy_(w)
        for pol, g in graphs.items():
            poisoned_run_tol(f"{name:<34} fp8 rep {rep} graph {pol:<8}", layer,
                             lambda: (g.replay(), torch.cuda.synchronize(), layer.raise_if_error()), y_s, ref, TOL_FP8)


def poisoned_run_tol(label: str, layer, call, out: torch.Tensor, ref: torch.Tensor, tol: float) -> bool:
    """poisoned_run with its own bound."""
    global TOL
    saved, TOL = TOL, tol
    try:
        return poisoned_run(label, layer, call, out, ref)
    finally:
        TOL = saved


def module_case(name: str, *, hidden: int, inter: int, num_experts: int, top_k: int, tokens: list[int],
                shared_inter: int, scoring: str, norm: bool, scale: float, bias: bool, gated: bool, seed: int,
                n_group: int = 1, topk_group: int = 1, graph: bool = False) -> None:
    """WeaveMoE (the nn.Module) with the kernel backend against the fp32 reference on the module's own routing (its
    route() is checked against an HF-style loop on CPU, tests/kernel/test_module.py), and against the torch backend
    (the all-to-all reference path, all ranks); graph: also a CUDA graph of the whole forward (router included,
    check=False), replayed on new tokens copied into its input."""
    from weave_kernel.module import WeaveMoE

    rank = dist.get_rank()
    dev = torch.device("cuda", torch.cuda.current_device())
    g = torch.Generator(device=dev).manual_seed(3000 + seed)  # the same weights on every rank
    r = lambda *sh, d=1.0: (torch.randn(*sh, device=dev, generator=g) / d**0.5).to(torch.bfloat16)  # noqa: E731
    router, gate, up = r(num_experts, hidden, d=hidden), r(num_experts, inter, hidden, d=hidden), \
        r(num_experts, inter, hidden, d=hidden)
    down = r(num_experts, hidden, inter, d=inter)
    sg, su, sd = r(shared_inter, hidden, d=hidden), r(shared_inter, hidden, d=hidden), r(hidden, shared_inter, d=shared_inter)
    sgate, sbias = r(1, hidden, d=hidden), torch.randn(num_experts, device=dev, generator=g)
    n = tokens[rank % len(tokens)]
    kw = dict(hidden=hidden, inter=inter, num_experts=num_experts, top_k=top_k, max_tokens=max(tokens), scoring=scoring,
              norm_topk=norm, routed_scale=scale, score_bias=bias, shared_inter=shared_inter, shared_gate=gated,
              n_group=n_group, topk_group=topk_group)
    mods = {b: WeaveMoE(**kw, backend=b, device="cuda") for b in ("kernel", "torch")}  # "cuda": the current device
    for b, m in mods.items():
        if m.w13.device != dev or (b == "kernel" and m.layer.device != dev):
            FAILURES.append(f"{name} {b}: device='cuda' gave {m.w13.device}")
            log(f"FAIL {name:<34} WeaveMoE {b} backend, device='cuda' gave {m.w13.device}, not {dev}")
    for m in mods.values():
        m.load_router(router, sbias if bias else None)
        m.load_experts(gate, up, down)
        m.load_shared(sg, su, sd, sgate if gated else None)
    x = torch.randn(n, hidden, generator=torch.Generator().manual_seed(seed * 31 + rank)).to(torch.bfloat16).to(dev)
    ids, tw = mods["kernel"].route(x)
    scl = torch.sigmoid(x.float() @ sgate.float().t()).squeeze(1) if gated else None
    ref = moe_reference(x, ids, tw, torch.cat([gate, up], 1), down, shared=(torch.cat([sg, su], 0), sd),
                        shared_scale=scl)
    y = torch.empty(n, hidden, dtype=torch.bfloat16, device=dev)
    poisoned_run(f"{name:<34} WeaveMoE kernel backend", mods["kernel"].layer, lambda: y.copy_(mods["kernel"](x)), y, ref)
    check_all_ranks(f"{name:<34} WeaveMoE torch backend", rel_err(mods["torch"](x), ref))
    if graph:
        gm = WeaveMoE(**kw, backend="kernel", check=False)
        gm.load_state_dict(mods["kernel"].state_dict())
        x_s = torch.zeros_like(x)
        g = torch.cuda.CUDAGraph()
        torch.cuda.synchronize()
        dist.barrier()
        with torch.cuda.graph(g):
            y_s = gm(x_s)
        for rep in range(2):
            x2 = torch.randn(n, hidden, generator=torch.Generator().manual_seed(seed * 77 + rep * 5 + rank))
            x_s.copy_(x2.to(torch.bfloat16))
            ids2, tw2 = mods["kernel"].route(x_s)
            scl2 = torch.sigmoid(x_s.float() @ sgate.float().t()).squeeze(1) if gated else None
            ref2 = moe_reference(x_s, ids2, tw2, torch.cat([gate, up], 1), down, shared=(torch.cat([sg, su], 0), sd),
                                 shared_scale=scl2)
            poisoned_run(f"{name:<34} WeaveMoE graph replay {rep}", gm.layer,
                         lambda: (g.replay(), torch.cuda.synchronize(), gm.raise_if_error()), y_s, ref2)


def shared_kernel_case(name: str, *, hidden: int, inter: int, num_experts: int, top_k: int, tokens: list[int],
                       shared_inter: int, seed: int) -> None:
    """Blocks of one geometry on one MoEMegakernel (WeaveMoE's kernel=, as hf.replace_moe_blocks and the e2e stack
    build a model): three blocks with their own weights, the third without the shared expert, called in turn and
    the first again, each against the fp32 reference on its own routing; a CUDA graph of two of them chained
    (check=False blocks on the same kernel) replayed on new tokens; the kernel's allocations against
    megakernel.workspace_bytes; kernel= of another geometry and a layer larger than the GPU refused."""
    from weave_kernel.buffers import workspace_bytes
    from weave_kernel.module import WeaveMoE

    rank, world = dist.get_rank(), dist.get_world_size()
    dev = torch.device("cuda", torch.cuda.current_device())

    def weights(s: int) -> dict:  # the same on every rank
        g = torch.Generator(device=dev).manual_seed(5000 + 10 * seed + s)
        r = lambda *sh, d: (torch.randn(*sh, device=dev, generator=g) / d**0.5).to(torch.bfloat16)  # noqa: E731
        return {"router": r(num_experts, hidden, d=hidden), "gate": r(num_experts, inter, hidden, d=hidden),
                "up": r(num_experts, inter, hidden, d=hidden), "down": r(num_experts, hidden, inter, d=inter),
                "shared": (r(shared_inter, hidden, d=hidden), r(shared_inter, hidden, d=hidden),
                           r(hidden, shared_inter, d=shared_inter))}

    kw = dict(hidden=hidden, inter=inter, num_experts=num_experts, top_k=top_k, max_tokens=max(tokens))

    def block(w: dict, with_shared: bool, **extra) -> WeaveMoE:
        b = WeaveMoE(**kw, shared_inter=shared_inter if with_shared else 0, **extra)
        b.load_router(w["router"])
        b.load_experts(w["gate"], w["up"], w["down"])
        if with_shared:
            b.load_shared(*w["shared"])
        return b

    def reference(b: WeaveMoE, w: dict, x: torch.Tensor) -> torch.Tensor:
        ids, tw = b.route(x)
        sh = (torch.cat(w["shared"][:2], 0), w["shared"][2]) if b.w13s is not None else None
        return moe_reference(x, ids, tw, torch.cat([w["gate"], w["up"]], 1), w["down"], shared=sh)

    ws = [weights(i) for i in range(3)]
    first = block(ws[0], True)
    blocks = [(first, ws[0]), (block(ws[1], True, kernel=first), ws[1]), (block(ws[2], False, kernel=first.layer), ws[2])]
    lay = first.layer
    want = workspace_bytes(hidden=hidden, inter=inter, num_experts=num_experts, top_k=top_k, world=world,
                           max_tokens=max(tokens), shared_inter=shared_inter, num_ctas=lay.num_ctas,
                           timeline_per_cta=lay.timeline_per_cta)
    same = all(b.layer is lay for b, _ in blocks) and lay.workspace_bytes() == want
    if rank == 0:
        log(f"     {name}: one kernel's buffers {want['total'] / 2**20:.1f} MiB ({lay.workspace_bytes()})")
    check_all_ranks(f"{name:<34} 3 blocks, 1 kernel, bytes as planned", 0.0 if same else float("inf"))
    n = tokens[rank % len(tokens)]
    for i, (b, w) in enumerate(blocks + blocks[:1]):
        x = torch.randn(n, hidden, generator=torch.Generator().manual_seed(seed * 41 + i * 7 + rank))
        x = x.to(torch.bfloat16).to(dev)
        y = torch.empty(n, hidden, dtype=torch.bfloat16, device=dev)
        poisoned_run(f"{name:<34} block {i % 3} of 3 (call {i})", lay, lambda: y.copy_(b(x)), y, reference(b, w, x))
    # a graph of two chained blocks on the shared kernel
    ga, gb = block(ws[0], True, kernel=first, check=False), block(ws[2], False, kernel=first, check=False)
    x_s = torch.zeros(n, hidden, dtype=torch.bfloat16, device=dev)
    graph = torch.cuda.CUDAGraph()
    torch.cuda.synchronize()
    dist.barrier()
    with torch.cuda.graph(graph):
        ya = ga(x_s)
        yb = gb(ya)
    for rep in range(2):
        x_s.copy_(torch.randn(n, hidden, generator=torch.Generator().manual_seed(seed * 97 + rep * 5 + rank)))
        ya.fill_(float("nan"))
        yb.fill_(float("nan"))
        torch.cuda.synchronize()
        dist.barrier()
        lay.poison_scratch()
        torch.cuda.synchronize()
        dist.barrier()
        graph.replay()
        torch.cuda.synchronize()
        lay.raise_if_error()
        check_all_ranks(f"{name:<34} graph replay {rep}, block A", rel_err(ya, reference(ga, ws[0], x_s)))
        check_all_ranks(f"{name:<34} graph replay {rep}, block B on A", rel_err(yb, reference(gb, ws[2], ya)))
    del graph
    bad = dict(kw, inter=inter * 2)
    expect_refused(f"{name}: kernel= of another geometry", lambda: WeaveMoE(**bad, kernel=first))
    expect_refused(f"{name}: kernel options with kernel=", lambda: WeaveMoE(**kw, kernel=first, timeout_s=1.0),
                   TypeError)
    expect_refused(f"{name}: a layer larger than the GPU (max_tokens 2^21, H 7168, k 8)",
                   lambda: MoEMegakernel(hidden=7168, inter=2048, num_experts=8 * world, top_k=8,
                                         placement=contiguous(8 * world, world), max_tokens=1 << 21), MemoryError)
    torch.cuda.synchronize()
    dist.barrier()


def capacity_case(name: str, *, hidden: int, inter: int, top_k: int, seed: int) -> None:
    """A layer built with a receive capacity below the worst case (recv_capacity=400 pairs, max_tokens 512): calls
    that fit run correctly; a call whose routing sends every pair to rank 0's experts (world x 300 x top_k pairs)
    raises ReceiveOverflow on every rank, and the next call that fits is correct again (per policy, outputs
    poisoned); the layer's buffers are smaller than the worst case's. Last, an overflow under check=False found by a
    later raise_if_error() leaves the layer unusable, as any error does."""
    from weave_kernel.megakernel import ReceiveOverflow

    rank, world = dist.get_rank(), dist.get_world_size()
    dev = torch.device("cuda", torch.cuda.current_device())
    E = 8 * world
    pl = contiguous(E, world)
    layer = MoEMegakernel(hidden=hidden, inter=inter, num_experts=E, top_k=top_k, placement=pl, max_tokens=512,
                          dispatch=DISPATCH[0], recv_capacity=400)
    full = MoEMegakernel(hidden=hidden, inter=inter, num_experts=E, top_k=top_k, placement=pl, max_tokens=512,
                         dispatch=DISPATCH[0])
    smaller = layer.workspace_bytes()["total"] < full.workspace_bytes()["total"] and layer.recv_capacity == 400
    if rank == 0:
        log(f"     {name}: buffers {layer.workspace_bytes()['total'] / 2**20:.1f} MiB at recv_capacity 400, "
            f"{full.workspace_bytes()['total'] / 2**20:.1f} MiB for the worst case ({full.recv_capacity} pairs)")
    del full
    check_all_ranks(f"{name:<34} smaller buffers", 0.0 if smaller else float("inf"))
    gen = torch.Generator(device=dev).manual_seed(4000 + seed)
    w13_all, w2_all = make_weights(E, hidden, inter, device=dev, generator=gen)
    local = torch.as_tensor(pl.local_experts(rank), device=dev)
    w13, w2 = w13_all[local].contiguous(), w2_all[local].contiguous()

    def inputs(n: int, s: int, to_rank0: bool):
        g = torch.Generator().manual_seed(s)
        if to_rank0:  # every pair onto rank 0's experts
            ids = torch.stack([torch.randperm(len(pl.local_experts(0)), generator=g)[:top_k] for _ in range(n)])
            ids = torch.as_tensor(pl.local_experts(0))[ids]
        else:
            ids = torch.as_tensor(skewed_routing(n, E, top_k, seed=s, zipf_s=1.2)[0]).long()
        w = torch.softmax(torch.randn(n, top_k, generator=g), -1)
        x = torch.randn(n, hidden, generator=g).to(torch.bfloat16)
        ref = moe_reference(x.to(dev), ids.to(dev), w.to(dev), w13_all, w2_all)
        return x.to(dev), ids.to(torch.int32).to(dev), w.to(dev), ref

    fit_n = max(1, 100 // world)  # at most 400 pairs in all: fits any routing
    for i, pol in enumerate(("static:8", "weave", "sequential")):
        x, ids, w, ref = inputs(fit_n, seed * 101 + i * 7 + rank, False)
        y = torch.empty(fit_n, hidden, dtype=torch.bfloat16, device=dev)
        poisoned_run(f"{name:<34} {pol:<10} fits", layer, lambda: layer(x, ids, w, w13, w2, policy=pol, out=y), y, ref)
        xo, ido, wo, _ = inputs(300, seed * 103 + i * 7 + rank, True)
        torch.cuda.synchronize()
        dist.barrier()
        try:
            layer(xo, ido, wo, w13, w2, policy=pol)
            got = "no error"
        except ReceiveOverflow as exc:
            usable = exc.owner == 0 and exc.rows > layer.plan.recv_cap_rows and layer.broken is None
            got = "overflow" if usable else f"wrong details {exc}"
        except Exception as exc:  # noqa: BLE001 - reported as a failure below
            got = f"{type(exc).__name__}: {exc}"
        if not same_outcome(f"{name:<34} {pol:<10} overflow raised on every rank, layer usable", got, "overflow"):
            return
        x, ids, w, ref = inputs(fit_n, seed * 107 + i * 7 + rank, False)
        y = torch.empty(fit_n, hidden, dtype=torch.bfloat16, device=dev)
        poisoned_run(f"{name:<34} {pol:<10} fits after the overflow", layer,
                     lambda: layer(x, ids, w, w13, w2, policy=pol, out=y), y, ref)
    # WeaveMoE on such a kernel splits a batch that does not fit (on_overflow="split"): every pair to rank 0's experts
    from weave_kernel.module import WeaveMoE

    own0 = torch.as_tensor(pl.local_experts(0), device=dev)

    def to_rank0(x):
        n = x.shape[0]
        sel = (torch.arange(n, device=dev)[:, None] + torch.arange(top_k, device=dev)[None, :]) % own0.numel()
        return own0[sel].to(torch.int32), torch.softmax(x[:, :top_k].float(), -1)

    for pol in ("weave", "static:8"):
        for mode in ("split", "raise"):
            blk = WeaveMoE(hidden=hidden, inter=inter, num_experts=E, top_k=top_k, max_tokens=512, policy=pol,
                           router=to_rank0, on_overflow=mode, recv_capacity=400)
            blk.load_experts(w13_all[:, :inter], w13_all[:, inter:], w2_all)
            x = torch.randn(300, hidden, generator=torch.Generator().manual_seed(seed * 113 + rank))
            x = x.to(torch.bfloat16).to(dev)
            if mode == "split":
                ids0, w0 = to_rank0(x)
                y = torch.empty(300, hidden, dtype=torch.bfloat16, device=dev)
                poisoned_run(f"{name:<34} WeaveMoE {pol} splits an overflowing batch", blk.layer,
                             lambda: y.copy_(blk(x)), y, moe_reference(x, ids0, w0, w13_all, w2_all))
            else:
                expect_refused(f"{name}: WeaveMoE {pol} on_overflow='raise'", lambda: blk(x), ReceiveOverflow)
    xo, ido, wo, _ = inputs(300, seed * 109 + rank, True)
    torch.cuda.synchronize()
    dist.barrier()
    layer(xo, ido, wo, w13, w2, policy="static:8", check=False)
    try:
        layer.raise_if_error()
        got = "no error"
    except ReceiveOverflow as exc:
        got = f"ReceiveOverflow (should be a plain error here): {exc}"
    except RuntimeError:
        got = "broken" if layer.broken else "not marked broken"
    same_outcome(f"{name:<34} overflow under check=False: layer unusable on every rank", got, "broken")
    expect_refused(f"{name}: recv_capacity 0", lambda: MoEMegakernel(
        hidden=hidden, inter=inter, num_experts=E, top_k=top_k, placement=pl, max_tokens=512, recv_capacity=0))
    torch.cuda.synchronize()
    dist.barrier()


CHOICES_CHECKED = [0, 0]  # [agreeing, total] (c*, K*) comparisons, summed over ranks


def check_choice(label: str, layer, pol: str, ids_per_rank, placement, model) -> None:
    """The kernel's in-kernel (c*, K*) for this call equals weave_sim.costmodel.choose on the same counts,
    and the call used C (weave:C) or min(c*, CTAs - 1) (weave) comm CTAs."""
    rank, world = dist.get_rank(), dist.get_world_size()
    try:
        kc = layer.last_choice()
        counts = counts_from_routing(ids_per_rank, model.num_experts, placement)
        pc = model_choice(counts, model, placement)[rank]
        want_used = int(pol.split(":")[1]) if ":" in pol else min(pc["c_star"], layer.num_ctas - 1)
        ok = choice_agrees(kc, pc) and kc["comm_ctas_used"] == want_used
        msg = f"kernel {kc} python {pc}"
        cks = f"(c*, K*) = ({kc['c_star']}, {kc['k_star']}) used {kc['comm_ctas_used']}"
    except Exception as exc:  # noqa: BLE001
        ok, msg, cks = False, f"{type(exc).__name__}: {exc}", "?"
    res = [None] * world
    dist.all_gather_object(res, (ok, msg, cks))
    all_ok = all(r[0] for r in res)
    CHOICES_CHECKED[0] += sum(r[0] for r in res)
    CHOICES_CHECKED[1] += len(res)
    short = " | ".join(f"r{g} {c}" for g, (_, m, c) in enumerate(res))
    log(f"{'PASS' if all_ok else 'FAIL'} choice {label:<44} {short}")
    if not all_ok:
        for g, (o, m, _) in enumerate(res):
            if not o:
                log(f"  rank {g}: {m}")
        FAILURES.append(f"choice {label}")


def check_errors(trace_dir: str | None) -> None:
    """Bad ids in the kernel, a missing peer (timeout, no hang), timeline output."""
    rank, world = dist.get_rank(), dist.get_world_size()
    dev = torch.device("cuda", torch.cuda.current_device())
    H, I, E, k = 256, 128, 4 * world, 2
    pl = contiguous(E, world)
    w13, w2 = (t.to(dev) for t in make_weights(E // world, H, I))
    x = torch.randn(100, H, device=dev).to(torch.bfloat16)
    ids, w = skewed_routing(100, E, k, seed=rank)
    ids_d, w_d = torch.as_tensor(ids).to(dev), torch.as_tensor(w).to(dev)

    layer = MoEMegakernel(hidden=H, inter=I, num_experts=E, top_k=k, placement=pl, max_tokens=128,
                          timeline_per_cta=256, dispatch=DISPATCH[0])
    layer(x, ids_d, w_d, w13, w2, policy="static:16", record_timeline=True)
    torch.cuda.synchronize()
    events, _ = layer.timeline_events()
    kinds = sorted({e["name"] for e in events})
    need = {"count_exchange", "gemm0", "gemm1", "reduce"} | ({"dispatch"} if world > 1 else set())  # own rows: no copy
    ok = need <= set(kinds)
    log(f"{'PASS' if ok else 'FAIL'} timeline kinds {kinds} ({len(events)} events on rank 0)")
    if not ok:
        FAILURES.append("timeline")
    if trace_dir:
        allev = [None] * world
        dist.all_gather_object(allev, events)
        if rank == 0:
            write_chrome_trace(os.path.join(trace_dir, "kernel_trace_small.json"), [e for ev in allev for e in ev])

    # the shared expert's tiles: GEMM events marked shared, one per (row block, column block) of this rank's tokens
    ls = MoEMegakernel(hidden=H, inter=I, num_experts=E, top_k=k, placement=pl, max_tokens=128,
                       timeline_per_cta=256, dispatch=DISPATCH[0], shared_inter=192)
    sw = make_shared_weights(H, 192, device=dev)
    for order in ("first", "last"):
        ls(x, ids_d, w_d, w13, w2, policy="weave", record_timeline=True, shared=sw, shared_order=order)
        torch.cuda.synchronize()
        ev, _ = ls.timeline_events()
        sh0 = [e for e in ev if e["name"] == "gemm0" and e["args"].get("shared")]
        sh1 = [e for e in ev if e["name"] == "gemm1" and e["args"].get("shared")]
        ok = len(sh0) == 1 * 2 and len(sh1) == 1 * 1  # 100 tokens: one row block; Is 192: 2 GEMM0 columns, H 256: 1
        log(f"{'PASS' if ok else 'FAIL'} shared:{order} timeline: {len(sh0)} shared GEMM0 and {len(sh1)} GEMM1 events")
        if not ok:
            FAILURES.append(f"shared timeline {order}")
    expect_refused("shared weights of the wrong shape", lambda: ls(x, ids_d, w_d, w13, w2, shared=(sw[1], sw[0])))
    expect_refused("shared= on a layer built without a shared expert", lambda: layer(x, ids_d, w_d, w13, w2, shared=sw))

    # weave: the in-kernel choice appears in the count_exchange records' args
    layer(x, ids_d, w_d, w13, w2, policy="weave", record_timeline=True)
    torch.cuda.synchronize()
    events, _ = layer.timeline_events()
    ce = [e for e in events if e["name"] == "count_exchange"]
    ch = layer.last_choice()
    cho = [e for e in events if e["name"] == "choose"]
    # two count_exchange records per CTA: routing + count push, then layout + choice (the wait between them
    # is a separate 'wait' record). The CTAs below the table's max_comm_sms evaluate the choice and carry it;
    # the others skip it and carry none.
    deciders = min(CostTable(layer.cost_table_np).max_comm_sms, layer.num_ctas)
    decided = {e["tid"] for e in cho}  # tid = the SM of the CTA
    ok = bool(ce) and len(ce) == 2 * layer.num_ctas and ch is not None and len(cho) == len(decided) == deciders
    ok = ok and all((e["args"].get("c_star"), e["args"].get("k_star")) ==
                    ((ch["c_star"], ch["k_star"]) if e["tid"] in decided else (None, None)) for e in ce + cho)
    dur = sorted(e["dur"] for e in cho)
    log(f"{'PASS' if ok else 'FAIL'} weave timeline args {ce[0]['args'] if ce else None} choice {ch}; "
        f"'choose' records {len(cho)}, duration median {dur[len(dur) // 2] if dur else float('nan'):.2f} us, "
        f"max {dur[-1] if dur else float('nan'):.2f} us")
    if not ok:
        FAILURES.append("weave timeline args")
    # a static call after a weave call: last_choice() is None again
    layer(x, ids_d, w_d, w13, w2, policy="static:16")
    ok = layer.last_choice() is None
    log(f"{'PASS' if ok else 'FAIL'} last_choice() is None after a static call")
    if not ok:
        FAILURES.append("last_choice after static")
    # host-side id check
    bad = ids_d.clone()
    bad[3, 1] = E
    expect_refused("host-side id check", lambda: layer(x, bad, w_d, w13, w2))
    # in-kernel id check (every rank passes a bad id, so nobody waits for a peer)
    try:
        layer(x, bad, w_d, w13, w2, check=False)
        layer.raise_if_error()
        FAILURES.append("kernel id check")
        log("FAIL in-kernel id check did not raise")
    except RuntimeError as exc:
        log(f"PASS in-kernel id check: {exc}")
    torch.cuda.synchronize()
    dist.barrier()
    # a peer that never calls: rank 0 must raise after the timeout, not hang
    if world > 1:
        layer2 = MoEMegakernel(hidden=H, inter=I, num_experts=E, top_k=k, placement=pl, max_tokens=128,
                               timeout_s=0.3, dispatch=DISPATCH[0])
        if rank == 0:
            try:
                layer2(x, ids_d, w_d, w13, w2)
                FAILURES.append("timeout")
                print("FAIL missing peer did not raise", flush=True)
            except RuntimeError as exc:
                print(f"PASS missing peer raises: {exc}", flush=True)
        torch.cuda.synchronize()
        dist.barrier()


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true", help="fewer cases")
    ap.add_argument("--trace-dir", default=None)
    ap.add_argument("--sanitize", action="store_true", help="one tiny case (for compute-sanitizer)")
    ap.add_argument("--dispatch", default="threads", help="threads, bulk or bulk:W (MoEMegakernel's dispatch)")
    args = ap.parse_args()
    DISPATCH[0] = args.dispatch
    init_ranks()
    world = dist.get_world_size()
    torch.manual_seed(0)
    # every preset geometry (H, I, k as in the model; fewer experts and tokens)
    if args.sanitize:
        run_case("sanitize E4 k2", hidden=256, inter=192, num_experts=4 * world, top_k=2, tokens=[150, 70],
                 policies=("sequential", "static:16", "weave"), repeats=2)
        run_case("sanitize shared expert", hidden=256, inter=192, num_experts=4 * world, top_k=2, tokens=[150, 70],
                 policies=("sequential", "static:16", "weave"), shared_inter=384, shared_calls=("first", "last"))
        graph_case("sanitize CUDA graph", hidden=256, inter=192, num_experts=4 * world, top_k=2, tokens=[150, 70],
                   policies=("static:16", "weave"), replays=2)
        graph_case("sanitize CUDA graph, shared expert", hidden=256, inter=192, num_experts=4 * world, top_k=2,
                   tokens=[150, 70], policies=("static:16", "weave"), replays=2, shared_inter=192)
        fp8_case("sanitize fp8", hidden=256, inter=256, num_experts=4 * world, top_k=2, tokens=[150, 70],
                 policies=("sequential", "static:16", "weave"), graph=False)
        log(f"SUMMARY: {len(FAILURES)} failures")
        dist.destroy_process_group()
        return 1 if FAILURES else 0
    models = ["deepseek-v3", "phi-3.5-moe", "qwen3-30b-a3b", "qwen3.5-35b-a3b", "deepseek-v2-lite",
              "deepseek-v2", "gpt-oss-20b", "mixtral-8x7b", "olmoe-1b-7b"]
    if args.quick:
        models = ["qwen3-30b-a3b", "gpt-oss-20b"]
    for i, name in enumerate(models):
        m = get_model(name)
        e = min(m.num_experts, 8 * world)
        k = min(m.top_k, e // 2)
        run_case(f"{name} E{e} k{k}", hidden=m.hidden_size, inter=m.expert_ffn_size, num_experts=e, top_k=k,
                 tokens=[200 + 37 * g for g in range(world)], seed=i, ep_ref=(i == 0))
    # FP8 experts (e4m3 rows and scales over the link; CUDA graphs): qwen3-30b-a3b's and deepseek-v3's widths
    fp8_case(f"fp8 qwen3-30b-a3b dims E{8 * world}", hidden=2048, inter=768, num_experts=8 * world, top_k=4,
             tokens=[300 + 41 * g for g in range(world)], seed=50)
    if not args.quick:
        fp8_case(f"fp8 deepseek-v3 dims E{4 * world}", hidden=7168, inter=2048, num_experts=4 * world, top_k=4,
                 tokens=[129, 1] + [64] * 6, seed=51, graph=False)
    # the shared expert fused into the layer (both ticket orders, every policy), as DeepSeek-V2-Lite has it
    # (2 x 1408); tiny token counts (a 1-row block); one layer called with and without it in turn
    m = get_model("deepseek-v2-lite")
    e = min(m.num_experts, 8 * world)
    run_case(f"deepseek-v2-lite E{e} shared {m.num_shared_experts}x", hidden=m.hidden_size, inter=m.expert_ffn_size,
             num_experts=e, top_k=min(m.top_k, e // 2), tokens=[200 + 37 * g for g in range(world)], seed=30,
             shared_inter=m.num_shared_experts * m.expert_ffn_size, shared_calls=("first", "last"), ep_ref=True)
    cache_sh: dict = {}
    run_case("shared expert, tokens 1 / 64", hidden=768, inter=384, num_experts=4 * world, top_k=2, tokens=[1, 64],
             seed=31, shared_inter=384, shared_calls=("last", "first"), policies=("sequential", "static:8", "weave"))
    run_case("shared expert, gated per token", hidden=2048, inter=512, num_experts=8 * world, top_k=4,
             tokens=[333, 129], seed=33, shared_inter=512, shared_calls=("last", "first"), shared_gate=True,
             policies=("sequential", "static:20", "weave"), ep_ref=True)
    run_case("shared expert on / off, one layer", hidden=1024, inter=256, num_experts=8 * world, top_k=4,
             tokens=[513, 300], repeats=2, seed=32, layer_cache=cache_sh, shared_inter=512,
             shared_calls=("last", None, "first", None), policies=("static:20", "weave", "sequential"))
    # the nn.Module wrapper: Qwen-style (softmax, renormalised, gated shared expert) and DeepSeek-V3-style routing
    module_case("WeaveMoE qwen-style", hidden=2048, inter=512, num_experts=8 * world, top_k=4, tokens=[300, 77],
                shared_inter=512, scoring="softmax", norm=True, scale=1.0, bias=False, gated=True, seed=40)
    module_case("WeaveMoE deepseek-v3-style", hidden=1024, inter=256, num_experts=16 * world, top_k=8,
                tokens=[257, 400], shared_inter=256, scoring="sigmoid", norm=True, scale=2.5, bias=True, gated=False,
                seed=41, n_group=8, topk_group=4, graph=True)
    capacity_case("receive capacity below the worst case", hidden=1024, inter=256, top_k=4, seed=43)
    shared_kernel_case("one kernel for three blocks", hidden=1024, inter=256, num_experts=8 * world, top_k=4,
                       tokens=[300, 129], shared_inter=512, seed=42)
    cache: dict = {}
    # gate pre-activations of several hundred: silu's fast division at both ends (exp(-g) overflowing to inf
    # for g < -87 must give 0, not NaN; g > 88 must give g)
    run_case("large activations (x * 40)", hidden=512, inter=256, num_experts=4 * world, top_k=2,
             tokens=[300, 111], seed=25, x_scale=40.0, policies=("sequential", "static:8", "weave"))
    run_case("zero-token experts E64 k2 N=50", hidden=512, inter=256, num_experts=64, top_k=2, tokens=[50],
             seed=20)
    run_case("all tokens on one expert", hidden=1024, inter=512, num_experts=8 * world, top_k=4, tokens=[777, 301],
             routing="one_expert", seed=21)
    run_case("round-robin placement N=1", hidden=768, inter=384, num_experts=4 * world, top_k=2, tokens=[1, 64],
             placement="round-robin", seed=22)
    run_case("repeated calls, one layer", hidden=2048, inter=768, num_experts=16 * world, top_k=8,
             tokens=[1000, 513], repeats=3, seed=23, layer_cache=cache,
             policies=("static:20", "weave", "sequential", "weave:1", "static:1", "weave:100", "static:100"))
    run_case("repeated calls, other sizes", hidden=2048, inter=768, num_experts=16 * world, top_k=8,
             tokens=[1000, 100], repeats=2, seed=24, layer_cache=cache,
             policies=("static:24", "weave", "weave", "static:24", "weave:24"))
    graph_case("CUDA graph replays", hidden=2048, inter=768, num_experts=16 * world, top_k=8, tokens=[384, 129],
               seed=26)
    graph_case("CUDA graph replays, shared expert", hidden=2048, inter=768, num_experts=16 * world, top_k=8,
               tokens=[384, 129], seed=27, policies=("static:8", "weave"), replays=2, shared_inter=1536)
    check_errors(args.trace_dir)
    dist.barrier()
    log(f"CHOICE AGREEMENT: {CHOICES_CHECKED[0]}/{CHOICES_CHECKED[1]} (rank, call) pairs: kernel (c*, K*) == "
        "weave_sim.costmodel.choose")
    log(f"SUMMARY: {len(FAILURES)} failures" + (": " + "; ".join(FAILURES) if FAILURES else ""))
    rc = 1 if FAILURES else 0
    dist.destroy_process_group()
    return rc


if __name__ == "__main__":
    sys.exit(main())

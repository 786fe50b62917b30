"""GPU correctness at world sizes this machine does not have: G virtual ranks in one process on one GPU
(weave_kernel/virtual.py), run by test_virtual_ranks_gpu.py. No speed is measured here.

For each world size: every case draws fresh random inputs per rank (different token counts per rank, some
ranks without tokens), poisons every rank's output and scratch rows with NaN, runs several policies on the
same layer (epochs advance, nothing is reset) and compares every rank's output with the fp32 dense reference
over all ranks' tokens: ||y - y_ref|| / ||y_ref|| <= 1e-2. Every weave call's in-kernel (c*, K*) is compared
with weave_sim.costmodel.choose on the same counts. Then error paths: a bad expert id, one rank that never
launches (the others must raise after their timeout, not hang). Prints one line per check and exits 1 on any
failure. Usage: python tests/kernel/virtual_worker.py [--worlds 2,3,4,8] [--quick] [--dispatch threads|bulk]
(--dispatch bulk: the comm CTAs copy their rows by bulk copies, csrc/bulk_copy.cuh)
"""
from __future__ import annotations

import argparse
import sys
import time
import traceback

import numpy as np
import torch

from weave_kernel.choice import choice_agrees, counts_from_routing, geometry_model, model_choice
from weave_kernel.fp8 import moe_reference_fp8, quantize_experts, quantize_weight, shared_ffn_fp8
from weave_kernel.reference import make_shared_weights, make_weights, moe_reference, shared_ffn
from weave_kernel.routing import single_expert_routing, skewed_routing
from weave_kernel.virtual import VirtualRanks
from weave_sim.placement import Placement, balanced, contiguous, explicit, round_robin
from weave_sim.presets import get_model

TOL = 1e-2
TOL_FP8 = 3e-2  # FP8 experts against fp8.moe_reference_fp8 (tests/kernel/fp8_worker.py's tolerance)
# FP8, ranks of fewer than FEW_ROWS tokens: half an e4m3 ulp (2^-4). The kernel sums in another fp32 order than the
# reference; where that moves a block's amax by one bit, its scale and all 128 of its e4m3 values can round the other
# way, and with one or a few rows nothing averages that out (fuzz 21/1772: one token, 4.1e-2 on every policy alike).
TOL_FP8_FEW, FEW_ROWS = 6.25e-2, 16
FAILURES: list[str] = []
CHOICES = [0, 0]
DISPATCH = ["threads"]  # how comm CTAs copy rows (MoEMegakernel's `dispatch`), set by --dispatch


def log(msg: str) -> None:
    print(msg, flush=True)


def rel_err(y: torch.Tensor, ref: torch.Tensor) -> float:
    y = y.float()
    if not torch.isfinite(y).all():
        return float("inf")
    if ref.numel() == 0:
        return 0.0
    return float((y - ref).norm() / ref.norm().clamp_min(1e-30))


def rank_experts(w, placement: Placement, rank: int):
    """Rank `rank`'s experts of all-expert weights, in its local order: rows of a tensor [E, ...], or of both tensors
    of an FP8 (q, s) pair (the layout MoEMegakernel takes)."""
    if isinstance(w, (tuple, list)):
        return tuple(rank_experts(t, placement, rank) for t in w)
    return w[torch.as_tensor(placement.local_experts(rank), device=w.device)].contiguous()


def policies_for(n: int) -> tuple[str, ...]:
    """The policies every case runs on a grid of n CTAs per rank: both ends of the static range included."""
    return ("sequential", "static:1", f"static:{max(1, n // 4)}", f"static:{n - 1}", "weave", f"weave:{max(1, n // 2)}",
            "weave-nosteal")


def run_case(vr: VirtualRanks | None, name: str, *, world: int, hidden: int, inter: int, num_experts: int,
             top_k: int, tokens: list[int], routing="skewed", placement: str | Placement = "contiguous",
             policies=None, repeats: int = 1, seed: int = 0, ctas_per_rank: int | None = None,
             max_tokens: int | None = None, shared_inter: int = 0, shared_order: str | None = None,
             expert_dtype: str = "bf16") -> VirtualRanks:
    """routing: "skewed", "one_expert" or a callable (num_tokens, seed) -> (ids int32 [n, k], weights float32 [n, k]).
    placement: "contiguous", "round-robin" or a Placement. shared_inter > 0: a shared expert of that width on every
    rank, called in `shared_order` ("first" / "last"; None: the layer's calls leave it out). expert_dtype "fp8": the
    same weights quantized (fp8.quantize_experts / quantize_weight), checked against fp8.moe_reference_fp8 (+
    fp8.shared_ffn_fp8 rounded to bf16, as the kernel adds it) within TOL_FP8 (TOL_FP8_FEW on ranks of few tokens)."""
    fp8 = expert_dtype == "fp8"

    def tol(n: int) -> float:  # a rank of n tokens
        return (TOL_FP8_FEW if n < FEW_ROWS else TOL_FP8) if fp8 else TOL
    dev = torch.device("cuda", torch.cuda.current_device())
    if isinstance(placement, Placement):
        pl = placement
    else:
        pl = contiguous(num_experts, world) if placement == "contiguous" else round_robin(num_experts, world)
    if vr is None:
        vr = VirtualRanks(world, hidden=hidden, inter=inter, num_experts=num_experts, top_k=top_k, placement=pl,
                          max_tokens=max_tokens or max(max(tokens), 1), dispatch=DISPATCH[0],
                          ctas_per_rank=ctas_per_rank, shared_inter=shared_inter, expert_dtype=expert_dtype)
    policies = policies or policies_for(vr.num_ctas)
    gen = torch.Generator(device=dev).manual_seed(1000 + seed)
    w13_all, w2_all = make_weights(num_experts, hidden, inter, device=dev, generator=gen)
    if fp8:
        w13_all, w2_all = quantize_experts(w13_all, w2_all)
    w13s = [rank_experts(w13_all, pl, r) for r in range(world)]
    w2s = [rank_experts(w2_all, pl, r) for r in range(world)]
    model = geometry_model(hidden, inter, num_experts, top_k)
    sw = make_shared_weights(hidden, shared_inter, device=dev, generator=gen) if shared_order else None
    if fp8 and sw is not None:
        sw = (quantize_weight(sw[0]), quantize_weight(sw[1]))
    for rep in range(repeats):
        ids, ws, xs = [], [], []
        for r in range(world):
            n = tokens[(r + rep) % len(tokens)]
            s = seed * 7919 + rep * 31 + r
            if callable(routing):
                i, w = routing(n, s)
            elif routing == "skewed":
                i, w = skewed_routing(n, num_experts, top_k, seed=s, zipf_s=1.2)
            else:
                i, w = single_expert_routing(n, top_k, expert=num_experts - 1, num_experts=num_experts, seed=s)
            ids.append(i)
            ws.append(w)
            xs.append(torch.randn(n, hidden, generator=torch.Generator().manual_seed(s)).to(torch.bfloat16))
        oracle = moe_reference_fp8 if fp8 else moe_reference
        ref_all = oracle(torch.cat(xs).to(dev), torch.as_tensor(np.concatenate(ids)).to(dev),
                         torch.as_tensor(np.concatenate(ws)).to(dev), w13_all, w2_all).float()
        if sw is not None and fp8:
            ref_all = ref_all + shared_ffn_fp8(torch.cat(xs).to(dev), *sw).to(torch.bfloat16).float()
        elif sw is not None:
            ref_all = ref_all + shared_ffn(torch.cat(xs).to(dev).float(), sw[0].float(), sw[1].float())
        refs = list(torch.split(ref_all, [x.shape[0] for x in xs]))
        xs_d = [x.to(dev) for x in xs]
        ids_d = [torch.as_tensor(i).to(dev) for i in ids]
        ws_d = [torch.as_tensor(w).to(dev) for w in ws]
        ntok = [x.shape[0] for x in xs]
        for pol in policies:
            outs = [torch.full((n, hidden), float("nan"), dtype=torch.bfloat16, device=dev) for n in ntok]
            vr.poison_scratch()
            try:
                vr(xs_d, ids_d, ws_d, w13s, w2s, policy=pol, outs=outs, shared=None if sw is None else [sw] * world,
                   shared_order=shared_order or "last")
                torch.cuda.synchronize()
                errs = [rel_err(outs[r], refs[r]) for r in range(world)]
            except Exception as exc:  # noqa: BLE001 - report, continue with a fresh layer
                traceback.print_exc()
                log(f"  {name} {pol}: {exc}")
                errs = [float("inf")] * world
                vr = VirtualRanks(world, hidden=hidden, inter=inter, num_experts=num_experts, top_k=top_k,
                                  placement=pl, max_tokens=vr[0].max_tokens, dispatch=DISPATCH[0],
                                  ctas_per_rank=vr.num_ctas, shared_inter=vr[0].shared_inter,
                                  expert_dtype=expert_dtype)
            ok = all(e <= tol(n) for e, n in zip(errs, ntok))
            log(f"{'PASS' if ok else 'FAIL'} G={world} {name:<30} rep {rep} {pol:<11} tokens {ntok}"
                f"{'' if sw is None else ' shared:' + shared_order}{' fp8' if fp8 else ''} "
                f"rel_err max {max(errs):.2e}" + (f" (ranks {' '.join(f'{e:.1e}' for e in errs)})" if world > 1 else ""))
            if not ok:
                FAILURES.append(f"G={world} {name} rep {rep} {pol}")
            if pol.startswith("weave") and ok:
                check_choice(f"G={world} {name} rep {rep} {pol}", vr, pol, ids, pl, model)
    return vr


def check_choice(label: str, vr: VirtualRanks, pol: str, ids, placement, model) -> None:
    """Every rank's in-kernel (c*, K*) equals weave_sim's on the same counts; the call used C (weave:C) or
    min(c*, CTAs - 1) comm CTAs."""
    bad = []
    try:
        py = model_choice(counts_from_routing(ids, model.num_experts, placement), model, placement)
        kcs = vr.last_choices()
    except Exception as exc:  # noqa: BLE001 - a failure to compare is a failure
        py, kcs = [], []
        bad.append(f"{type(exc).__name__}: {exc}")
    for r, kc in enumerate(kcs):
        pc = py[r]
        want_used = int(pol.split(":")[1]) if ":" in pol else min(pc["c_star"], vr.num_ctas - 1)
        ok = choice_agrees(kc, pc) and kc["comm_ctas_used"] == want_used
        CHOICES[0] += ok
        CHOICES[1] += 1
        if not ok:
            bad.append(f"rank {r}: kernel {kc} python {pc}")
    log(f"{'PASS' if not bad else 'FAIL'} choice {label}" + ("" if not bad else ": " + "; ".join(bad)))
    if bad:
        FAILURES.append(f"choice {label}")


def check_errors(world: int) -> None:
    """A bad id raises on the host and in the kernel; a rank that never launches makes the others time out."""
    dev = torch.device("cuda", torch.cuda.current_device())
    H, I, E, k = 256, 128, 4 * world, 2
    pl = contiguous(E, world)
    vr = VirtualRanks(world, hidden=H, inter=I, num_experts=E, top_k=k, placement=pl, max_tokens=128, timeout_s=0.3,
                      dispatch=DISPATCH[0])
    w13s, w2s = zip(*[(a.to(dev), b.to(dev)) for a, b in (make_weights(E // world, H, I) for _ in range(world))])
    xs = [torch.randn(100, H, device=dev).to(torch.bfloat16) for _ in range(world)]
    ids, ws = zip(*[skewed_routing(100, E, k, seed=r) for r in range(world)])
    ids = [torch.as_tensor(i).to(dev) for i in ids]
    ws = [torch.as_tensor(w).to(dev) for w in ws]
    bad = [i.clone() for i in ids]
    bad[world - 1][3, 1] = E
    try:
        vr(xs, bad, ws, list(w13s), list(w2s), policy="static:4")
        log(f"FAIL G={world} host-side id check did not raise")
        FAILURES.append(f"G={world} host id check")
    except ValueError as exc:
        log(f"PASS G={world} host-side id check: {exc}")
    # rank 0 launches alone: it must raise after its timeout
    t0 = time.time()
    try:
        vr[0](xs[0], ids[0], ws[0], w13s[0], w2s[0], policy="static:4")
        log(f"FAIL G={world} a rank whose peers never launch did not raise")
        FAILURES.append(f"G={world} missing peer")
    except RuntimeError as exc:
        log(f"PASS G={world} missing peers raise after {time.time() - t0:.2f} s: {exc}")


def check_capacity(world: int) -> None:
    """recv_capacity below the worst case (400 pairs a rank): calls that fit are correct; one that sends every pair
    to rank 0's experts raises ReceiveOverflow (every rank alike) and the ranks stay usable, per policy."""
    from weave_kernel.megakernel import ReceiveOverflow

    dev = torch.device("cuda", torch.cuda.current_device())
    H, I, E, k = 1024, 256, 8 * world, 4
    pl = contiguous(E, world)
    vr = VirtualRanks(world, hidden=H, inter=I, num_experts=E, top_k=k, placement=pl, max_tokens=512,
                      dispatch=DISPATCH[0], recv_capacity=400)
    w13_all, w2_all = make_weights(E, H, I, device=dev, generator=torch.Generator(device=dev).manual_seed(4100 + world))
    w13s = [rank_experts(w13_all, pl, r) for r in range(world)]
    w2s = [rank_experts(w2_all, pl, r) for r in range(world)]

    def inputs(n: int, s: int, to_rank0: bool):
        xs, ids, ws = [], [], []
        for r in range(world):
            g = torch.Generator().manual_seed(s * 17 + r)
            if to_rank0:
                i = torch.stack([torch.randperm(len(pl.local_experts(0)), generator=g)[:k] for _ in range(n)])
                i = torch.as_tensor(pl.local_experts(0))[i]
            else:
                i = torch.as_tensor(skewed_routing(n, E, k, seed=s * 17 + r, zipf_s=1.2)[0]).long()
            ws.append(torch.softmax(torch.randn(n, k, generator=g), -1).to(dev))
            ids.append(i.to(torch.int32).to(dev))
            xs.append(torch.randn(n, H, generator=g).to(torch.bfloat16).to(dev))
        return xs, ids, ws

    fit_n = max(1, 100 // world)
    for j, pol in enumerate(("static:4", "weave", "sequential")):
        for step in ("fits", "overflows", "fits again"):
            xs, ids, ws = inputs(300 if step == "overflows" else fit_n, 50 * world + 3 * j + len(step),
                                 step == "overflows")
            label = f"G={world} recv_capacity 400 {pol:<10} {step}"
            outs = [torch.full((x.shape[0], H), float("nan"), dtype=torch.bfloat16, device=dev) for x in xs]
            vr.poison_scratch()
            try:
                ys = vr(xs, ids, ws, w13s, w2s, policy=pol, outs=outs)
                if step == "overflows":
                    log(f"FAIL {label}: no ReceiveOverflow")
                    FAILURES.append(label)
                    return
            except ReceiveOverflow as exc:
                ok = step == "overflows" and exc.owner == 0 and not any(layer.broken for layer in vr.layers)
                log(f"{'PASS' if ok else 'FAIL'} {label}: {str(exc)[:120]}")
                if not ok:
                    FAILURES.append(label)
                    return
                continue
            errs = [rel_err(ys[r], moe_reference(xs[r], ids[r], ws[r], w13_all, w2_all)) for r in range(world)]
            ok = max(errs) <= TOL
            log(f"{'PASS' if ok else 'FAIL'} {label} rel_err max {max(errs):.2e}")
            if not ok:
                FAILURES.append(label)
    del vr
    torch.cuda.empty_cache()


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--worlds", default="2,3,4,8")
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--dispatch", default="threads", help="threads, bulk or bulk:W (MoEMegakernel's dispatch)")
    args = ap.parse_args()
    DISPATCH[0] = args.dispatch
    torch.manual_seed(0)
    worlds = [int(w) for w in args.worlds.split(",")]
    models = ["deepseek-v3", "phi-3.5-moe", "qwen3-30b-a3b", "deepseek-v2-lite", "gpt-oss-20b"]
    if args.quick:
        models = models[2:3]
    t_start = time.time()
    for world in worlds:
        for i, name in enumerate(models):
            m = get_model(name)
            e = world * min(m.num_experts // world, 8)  # a multiple of the world size, 8 per rank at most
            k = min(m.top_k, e // 2)
            tok = [150 + 37 * g for g in range(world)]
            tok[world // 2] = 0  # a rank without tokens still serves its experts
            run_case(None, f"{name} E{e} k{k}", world=world, hidden=m.hidden_size, inter=m.expert_ffn_size,
                     num_experts=e, top_k=k, tokens=tok, seed=i)
        # the shared expert (a rank without tokens has no shared rows), both ticket orders on one layer
        m = get_model("deepseek-v2-lite")
        e = world * min(m.num_experts // world, 8)
        tok = [150 + 37 * g for g in range(world)]
        tok[world // 2] = 0
        vs = None
        for order in ("first", "last"):
            vs = run_case(vs, f"deepseek-v2-lite E{e} shared", world=world, hidden=m.hidden_size,
                          inter=m.expert_ffn_size, num_experts=e, top_k=min(m.top_k, e // 2), tokens=tok, seed=27,
                          shared_inter=m.num_shared_experts * m.expert_ffn_size, shared_order=order)
        del vs
        run_case(None, "zero-token experts", world=world, hidden=512, inter=256, num_experts=world * (64 // world), top_k=2,
                 tokens=[50, 1], seed=20)
        run_case(None, "all tokens on one expert", world=world, hidden=1024, inter=512, num_experts=8 * world,
                 top_k=4, tokens=[500, 301], routing="one_expert", seed=21)
        run_case(None, "round-robin placement", world=world, hidden=768, inter=384, num_experts=4 * world, top_k=2,
                 tokens=[1, 64, 0], placement="round-robin", seed=22)
        vr = run_case(None, "repeated calls", world=world, hidden=2048, inter=768, num_experts=16 * world, top_k=8,
                      tokens=[400, 513, 7], repeats=3, seed=23)
        run_case(vr, "repeated calls, other sizes", world=world, hidden=2048, inter=768, num_experts=16 * world,
                 top_k=8, tokens=[100, 513], repeats=2, seed=24)
        # experts moved between the ranks of a built layer (what bench --placement balanced does per configuration)
        moved = balanced(np.random.default_rng(25).zipf(1.3, 16 * world).astype(float), world)
        vr.set_placement(moved)
        run_case(vr, "after set_placement", world=world, hidden=2048, inter=768, num_experts=16 * world, top_k=8,
                 tokens=[300, 41, 513], placement=moved, repeats=2, seed=25)
        if world > 1:  # a placement the layer cannot run is refused, and the tables stay as they were
            try:
                vr.set_placement(explicit(np.zeros(16 * world, dtype=np.int64), world))
                FAILURES.append(f"G={world} set_placement accepted an uneven placement")
            except ValueError as exc:
                log(f"PASS G={world} uneven set_placement refused: {exc}")
            run_case(vr, "after a refused set_placement", world=world, hidden=2048, inter=768,
                     num_experts=16 * world, top_k=8, tokens=[64, 200], placement=moved, seed=26)
        check_errors(world)
        check_capacity(world)
        del vr
        torch.cuda.empty_cache()
    log(f"CHOICE AGREEMENT: {CHOICES[0]}/{CHOICES[1]} (rank, call) pairs: kernel (c*, K*) == weave_sim.costmodel.choose")
    log(f"dispatch: {DISPATCH[0]}")
    log(f"SUMMARY: {len(FAILURES)} failures in {time.time() - t_start:.0f} s" +
        (": " + "; ".join(FAILURES) if FAILURES else ""))
    return 1 if FAILURES else 0


if __name__ == "__main__":
    sys.exit(main())

"""Randomised layers against the fp32 reference on one GPU: geometry, world size, grid, routing and policy drawn
per case, so that the kernel meets shapes no preset has (H or I of one 64-column step, one expert per rank, top-1,
duplicate experts within a token, every token on one rank's experts, ranks without tokens, spare buffer room), and
in about a third of the cases a shared expert of a random width, its tiles first or last. `--fp8`: the same
draws as FP8 layers (expert_dtype="fp8": every width rounded up to a multiple of 128, the scale blocks), checked
against fp8.moe_reference_fp8 within 3e-2 (6.25e-2 on ranks of fewer than 16 tokens:
virtual_worker.TOL_FP8_FEW).

Each case runs through virtual_worker.run_case (virtual ranks, world 1-8, on this GPU): fresh inputs per rank,
outputs and scratch poisoned with NaN before every call, ||y - y_ref|| / ||y_ref|| <= 1e-2 per rank, and every
weave call's in-kernel (c*, K*) compared with weave_sim.costmodel.choose. Correctness only, no speed.

    python tests/kernel/fuzz_worker.py --cases 40 --seed 1 [--budget-s 300]   # prints one CASE line per case
    python tests/kernel/fuzz_worker.py --seed 1 --only 17                     # replay one case
    python tests/kernel/fuzz_worker.py --seed 1 --fp8 --budget-s 240          # FP8 experts
Exit status 1 on any failure. `draw_case` needs no GPU (tests/kernel/test_fuzz_cases.py checks it on CPU).
"""
from __future__ import annotations

import argparse
import sys
import time

import numpy as np

SMS = 132  # the H200's grid; the worker reads the device's own
DIMS_H = (64, 128, 192, 256, 384, 512, 768, 1024, 1536, 2048, 3072, 4096)
DIMS_I = (64, 128, 192, 256, 384, 512, 768, 1024, 1408, 2048)
BIG_DIMS_H = (2048, 2880, 4096, 5120, 7168)  # --big: the presets' sizes and their neighbours
BIG_DIMS_I = (256, 512, 768, 1408, 1536, 2048, 2880, 6400)
ROUTINGS = ("zipf", "uniform", "duplicates", "hot_rank", "one_expert")
MAX_TOKENS = 4096  # per rank (--big: 8192)
MAX_WEIGHT_ELEMS = 3 << 28  # E x 3 x H x I bf16 elements per case (1.5 GiB)
BIG_WEIGHT_ELEMS = 3 << 31  # --big: 12 GiB (make_weights draws them in fp32 first: 24 GiB for a moment)


def _routing(kind: str, num_experts: int, top_k: int, owner_experts: list[int], zipf_s: float):
    """(num_tokens, seed) -> (ids int32 [n, k], weights float32 [n, k]) for run_case."""
    from weave_kernel.routing import single_expert_routing, skewed_routing

    def route(n: int, seed: int):
        rng = np.random.default_rng(seed)
        if kind == "zipf":
            return skewed_routing(n, num_experts, top_k, seed=seed, zipf_s=zipf_s)
        if kind == "one_expert":
            return single_expert_routing(n, top_k, expert=int(rng.integers(num_experts)), num_experts=num_experts,
                                         seed=seed)
        if kind == "duplicates":  # with replacement: a token may pick one expert more than once
            ids = rng.integers(0, num_experts, size=(n, top_k))
        else:  # uniform over all experts, or over one rank's experts (hot_rank), distinct per token
            pool = np.asarray(owner_experts if kind == "hot_rank" else range(num_experts))
            ids = pool[np.argsort(rng.random((n, len(pool))), axis=1)[:, :top_k]]
        w = rng.random((n, top_k)) + 0.05
        return ids.astype(np.int32), (w / w.sum(1, keepdims=True)).astype(np.float32)

    return route


def _fp8_width(d: int) -> int:
    """A drawn width as an FP8 layer takes it: rounded up to a multiple of 128 (its scale blocks)."""
    return -(-d // 128) * 128


def draw_case(seed: int, index: int, sms: int = SMS, big: bool = False, fp8: bool = False) -> dict:
    """One random layer, deterministic in (seed, index, big, fp8); every geometry check_geometry accepts. big: layers
    of the presets' size (up to 128 experts per rank, H up to 7168, 8192 tokens per rank). fp8: FP8 experts, with H,
    I and the shared width in multiples of 128 (the other fields as drawn for bf16)."""
    rng = np.random.default_rng([seed, index, int(big)])
    max_tokens_cap, max_elems = (2 * MAX_TOKENS, BIG_WEIGHT_ELEMS) if big else (MAX_TOKENS, MAX_WEIGHT_ELEMS)
    world = int(rng.choice([1, 2, 2, 3, 4, 4, 5, 6, 7, 8]))
    max_ctas = sms // world
    ctas = max_ctas if rng.random() < 0.7 else int(rng.integers(max(2, world), max_ctas + 1))
    per_rank = int(rng.choice([16, 32, 64, 128] if big else [1, 2, 3, 4, 6, 8, 16, 32]))
    while world * world * per_rank > 2048 or world * per_rank > 512:  # the kernel's count matrix and tables
        per_rank //= 2
    experts = world * per_rank
    top_k = int(rng.integers(1, min(8, experts) + 1))
    hidden, inter = int(rng.choice(BIG_DIMS_H if big else DIMS_H)), int(rng.choice(BIG_DIMS_I if big else DIMS_I))
    if fp8:
        hidden, inter = _fp8_width(hidden), _fp8_width(inter)
    step = 128 if fp8 else 64
    while experts * 3 * hidden * inter > max_elems:
        hidden = max(step, hidden // (2 * step) * step)  # halved, still a multiple of step
        inter = max(step, inter // (2 * step) * step)
    if rng.random() < 0.1:
        tokens = [0] * world  # nobody routes anything
    else:
        top = max_tokens_cap if big or rng.random() < 0.2 else 700
        tokens = [int(t) for t in np.round(np.exp(rng.uniform(0, np.log(top), size=world))) - 1]
        tokens[int(rng.integers(world))] = int(rng.integers(1, top))  # at least one rank has tokens
    max_tokens = max(max(tokens), 1) + (int(rng.integers(0, 65)) if rng.random() < 0.5 else 0)
    routing = str(rng.choice(ROUTINGS))
    if routing == "hot_rank" and top_k > per_rank:
        routing = "uniform"
    c = lambda: int(rng.integers(1, ctas))  # noqa: E731 - a random comm CTA count on this grid
    pool = ["sequential", "static:1", f"static:{c()}", f"static:{ctas - 1}", "weave", "weave", f"weave:{c()}",
            "weave-nosteal"]
    policies = list(dict.fromkeys(str(p) for p in rng.choice(pool, size=4, replace=False)))
    # a shared expert in about a third of the cases, drawn from a stream of its own (the other fields of a (seed,
    # index) stay what they were before shared experts existed)
    rs = np.random.default_rng([seed, index, int(big), 11])
    shared_inter, shared_order = 0, None
    if rs.random() < 0.35:
        shared_inter = int(rs.choice(BIG_DIMS_I if big else DIMS_I)) * int(rs.choice([1, 1, 2]))
        if fp8:
            shared_inter = _fp8_width(shared_inter)
        while shared_inter > step and 3 * hidden * shared_inter > max_elems // 4:
            shared_inter = max(step, shared_inter // (2 * step) * step)
        shared_order = str(rs.choice(["first", "last"]))
    return dict(seed=seed, index=index, big=big, world=world, ctas_per_rank=ctas, experts=experts, top_k=top_k,
                hidden=hidden, inter=inter, tokens=tokens, max_tokens=max_tokens, routing=routing,
                zipf_s=round(float(rng.uniform(0.3, 2.5)), 2), hot_rank=int(rng.integers(world)),
                placement=str(rng.choice(["contiguous", "contiguous", "round-robin", "shuffled"])),
                dispatch="bulk" if rng.random() < 0.2 else "threads", repeats=int(rng.choice([1, 1, 2])),
                policies=policies, shared_inter=shared_inter, shared_order=shared_order,
                expert_dtype="fp8" if fp8 else "bf16")


def case_placement(case: dict):
    """The case's expert -> rank map: contiguous, round-robin, or "shuffled" (a seeded random map with equal experts
    per rank, what weave_sim's balanced placement produces)."""
    from weave_sim.placement import contiguous, explicit, round_robin

    world, experts = case["world"], case["experts"]
    if case["placement"] == "shuffled":
        rng = np.random.default_rng([case["seed"], case["index"], int(case["big"]), 7])
        return explicit(rng.permutation(np.arange(experts) % world), world)
    return (contiguous if case["placement"] == "contiguous" else round_robin)(experts, world)


def run(case: dict) -> int:
    """Run one case; the number of new failures."""
    import torch
    import virtual_worker as vw
    world, experts = case["world"], case["experts"]
    pl = case_placement(case)
    route = _routing(case["routing"], experts, case["top_k"], list(pl.local_experts(case["hot_rank"])),
                     case["zipf_s"])
    before = len(vw.FAILURES)
    vw.DISPATCH[0] = case["dispatch"]
    vr = vw.run_case(None, f"fuzz {case['seed']}/{case['index']} {case['routing']}", world=world,
                     hidden=case["hidden"], inter=case["inter"], num_experts=experts, top_k=case["top_k"],
                     tokens=case["tokens"], routing=route, placement=pl, policies=case["policies"],
                     repeats=case["repeats"], seed=case["seed"] * 1000 + case["index"],
                     ctas_per_rank=case["ctas_per_rank"], max_tokens=case["max_tokens"],
                     shared_inter=case.get("shared_inter", 0), shared_order=case.get("shared_order"),
                     expert_dtype=case.get("expert_dtype", "bf16"))
    del vr  # frees the ranks' buffers at once (test_virtual_ranks_gpu.py checks that)
    torch.cuda.empty_cache()
    return len(vw.FAILURES) - before


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--cases", type=int, default=40)  # with --budget-s: as many as fit
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--only", type=int, default=None, help="replay case INDEX of --seed")
    ap.add_argument("--budget-s", type=float, default=1e9, help="start no new case after this many seconds")
    ap.add_argument("--big", action="store_true", help="layers of the presets' size (slower: a few seconds a case)")
    ap.add_argument("--fp8", action="store_true", help="FP8 experts (widths in multiples of 128)")
    args = ap.parse_args()
    import torch
    import virtual_worker as vw

    sms = torch.cuda.get_device_properties(torch.cuda.current_device()).multi_processor_count
    t0, done = time.time(), 0
    for i in [args.only] if args.only is not None else range(args.cases):
        if time.time() - t0 > args.budget_s:
            break
        case = draw_case(args.seed, i, sms, args.big, args.fp8)
        vw.log(f"CASE {case}")
        bad = run(case)
        vw.log(f"{'PASS' if not bad else 'FAIL'} case {args.seed}/{i}: {bad} failed calls; replay: python "
               f"tests/kernel/fuzz_worker.py --seed {args.seed} --only {i}{' --big' * args.big}{' --fp8' * args.fp8}")
        done += 1
    vw.log(f"CHOICE AGREEMENT: {vw.CHOICES[0]}/{vw.CHOICES[1]} (rank, call) pairs: kernel (c*, K*) == "
           f"weave_sim.costmodel.choose")
    vw.log(f"SUMMARY: {len(vw.FAILURES)} failures in {done} cases, {time.time() - t0:.0f} s" +
           (": " + "; ".join(vw.FAILURES) if vw.FAILURES else ""))
    return 1 if vw.FAILURES else 0


if __name__ == "__main__":
    sys.exit(main())

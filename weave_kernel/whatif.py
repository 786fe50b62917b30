"""What the simulator predicts for a kernel variant not built yet, on the configurations of a kernel benchmark.

Variants (--variant):
  dedup     dispatch sends each token once per destination GPU instead of once per (token, expert) pair (the
            owner's GEMM0 would gather a pair's row from the token's one copy). The benchmark's routing is rebuilt
            from its seed (as weave_kernel.recount does), the distinct (token, destination) rows replace the pair
            rows in the dispatch streams, and an expert's rows are spread over the whole stream ('token' order: a
            row block waits for tokens from all of it, not for one contiguous piece). Combine stays per pair.
  gemm:S    every GEMM tile S times faster inside the layer (the profile's per-SM rates x S, peak capped by the
            base profile's): what a faster tile would be worth once dispatch, waits and the fixed phases stay.
            With a power model in the profile the faster tile also draws more power (same energy per FLOP).
  push:S    every comm CTA's push rate S times faster (the profile's push curve stretched as the fit's
            push_scale does, the link's plateau kept): what faster dispatch copies would be worth.
  energy:S  the tile's energy per FLOP x S (the power model's w_per_tflops; needs a profile with one, e.g.
            h200-megakernel-power): what a more frugal tile is worth where the board's power cap holds the clock.
  pad:R     a row block's MMAs cost its rows rounded up to R (a divisor of 128) instead of the whole 128-row block:
            what tiles that skip the MMAs of their padding rows would be worth (e.g. pad:64, a partial block of
            <= 64 rows at the profile's gemm.half_tile_cost of a whole tile, 0.5 unless fitted). The kernel
            runs half tiles since sources eb48d782 (layout "expert-packed-half"; pad:64 changes nothing on its
            results). At 0.5 pad:64 predicted 1.04-1.09x; measured 1.02-1.03x, and the profiles fitted to that
            kernel price a half tile at 0.86 (sustained) to 0.98 (bench-style) of a whole one (docs/results.md
            "Half tiles").
  nosteal   weave's split without bubble stealing (policy weave-nosteal, built): the comm CTAs idle after their
            dispatch. A gain above 1 says the simulator expects stealing to cost; its profiles have no stealing
            slowdown at the power cap beyond what a power model's clock gives (docs/kernel.md).
  queue     the dispatch pieces claimed from an atomic ticket by whichever comm CTA is free (one task claim each)
            instead of dealt round-robin (CTA i of C pushes pieces i, i + C, ...): what a balanced dispatch is
            worth where pieces are uneven (engine option piece_deal).
  piece:NS  every dispatch piece's fixed cost (fence, flag, the copy's start and drain) NS ns instead of the
            profile's (fixed_ns.dispatch_piece, else signal): what a dispatch that hides it, e.g. by flagging a
            piece while the next one is copied, would be worth. Measured: python -m weave_kernel.piece_cost.
  fp8:S     FP8 experts (not built): e4m3 weights with 128 x 128 block scales (half the bytes each tile streams),
            dispatch rows in e4m3 with a scale per 128 elements (about half the bytes pushed; combine rows stay
            bf16), and tiles S times the profile's per-SM rate (the chip's peak doubled, FP8's dense peak). S is what
            FP8 tiles would reach at the board's power state: tests/kernel/fp8_probe.py measured 1.29-1.51x for
            cuBLAS's grouped FP8 GEMMs over its bf16 ones where both ran at the 700 W cap (docs/kernel.md, "FP8
            experts: what they would buy"). With a power model the energy per FLOP is divided by S too, so the
            faster tiles draw the power the bf16 ones did: S is taken as the rate at the same power.
  decide:NS weave's choice costing NS ns (the EP=2 profiles say 7808, measured from the kernel's choose records;
            600 before, the paper's figure): "as built" here is
            the kernel before 9caebac, where every SM waited for it; "changed" the kernel since, where only the
            SMs below the cost table's max_comm_sms make it and the others start at once (docs/kernel.md, "The
            choice off the critical path"). static:20 makes no choice (the same on both sides).
Both sides are simulated under the engine's model of the kernel with the same profile, so the ratio is what the
simulator expects the change to gain (its held-out error on the kernel as built is in docs/results.md).

    python -m weave_kernel.whatif docs/results/kernel_bench_B_tma2.json [--variant dedup|gemm:1.2|decide:8000]

CPU only; needs no torch.
"""
from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path

import numpy as np

from weave_sim.costmodel import bound_volumes, lower_bound_ns
from weave_sim.engine import simulate_layer
from weave_sim.jsonfile import read_json
from weave_sim.presets import ModelPreset
from weave_sim.calibrate import scaled_profile
from weave_sim.profile import fp8_profile, load_profile, profile_from_dict  # noqa: F401 (fp8_profile: this module's interface too)
from weave_sim.validate import (bench_results, kernel_options, kernel_sources_warning, profile_for_result,
                                result_fp8, result_placement, result_shared, result_shared_experts)
from weave_sim.workload import workload_from_counts

from .routing import result_routing

POLICIES = ("kernel:static:20", "kernel:weave")


def distinct_dispatch_rows(result: dict, cfg: dict) -> np.ndarray:
    """[G_src, G_dst]: tokens of src with at least one of their top-k experts on dst (the benchmark's routing)."""
    world, n, top_k = result["gpus"], result["tokens_per_gpu"], result["top_k"]
    owner = result_placement(result).owner
    rows = np.zeros((world, world), dtype=np.int64)
    for rank in range(world):
        ids, _ = result_routing(cfg, result, rank)
        needs = np.zeros((n, world), dtype=bool)
        needs[np.repeat(np.arange(n), top_k), owner[ids.ravel()]] = True
        rows[rank] = needs.sum(axis=0)
    return rows


def rescaled(profile, gemm: float = 1.0, push: float = 1.0):
    """`profile` with every per-SM GEMM rate x gemm (the chip's peak left as it is) and every comm CTA's push rate
    x push (calibrate.scaled_profile's push_scale: the curve stretched, the link's plateau kept)."""
    raw = profile.raw
    prof = scaled_profile(raw, gemm, push, raw["fixed_ns"]["count_exchange"] / 1e3)
    prof["gemm"]["peak_tflops"] = raw["gemm"]["peak_tflops"]
    return profile_from_dict(prof, origin=f"{profile.name} x{gemm} GEMM, x{push} push per CTA")


def energy_scaled(profile, factor: float):
    """`profile` with the power model's energy per FLOP x factor."""
    if profile.power is None:
        raise ValueError(f"energy:S needs a profile with a power model; {profile.name} has none "
                         "(use --profile h200-megakernel-power)")
    raw = json.loads(json.dumps(profile.raw))
    raw["power"]["w_per_tflops"] = raw["power"]["w_per_tflops"] * factor
    return profile_from_dict(raw, origin=f"{profile.name} x{factor} energy per FLOP")


def with_fixed_cost(profile, key: str, ns: float):
    """`profile` with one fixed cost (fixed_ns[key]: "decision", "dispatch_piece", ...) set to ns."""
    raw = json.loads(json.dumps(profile.raw))
    raw["fixed_ns"][key] = int(round(ns))
    return profile_from_dict(raw, origin=f"{profile.name}, {key} {int(round(ns))} ns")


def parse_variant(text: str) -> tuple[str, float]:
    if text in ("dedup", "nosteal", "queue"):
        return text, 1.0
    if text.startswith("pad:"):
        r = text.split(":", 1)[1]
        if r.isdigit() and 0 < int(r) <= 128 and 128 % int(r) == 0:
            return "pad", float(r)
        raise ValueError(f"variant {text!r}: pad:R needs R dividing 128 (e.g. pad:64)")
    for kind in ("gemm", "push", "energy", "decide", "piece", "fp8"):
        if text.startswith(kind + ":"):
            try:
                s = float(text.split(":", 1)[1])
            except ValueError:
                s = -1.0
            if kind in ("decide", "piece") and s > 1e9:
                raise ValueError(f"variant {text!r}: a fixed cost of more than 1 s (1e9 ns)")
            if math.isfinite(s) and (s > 0 or (kind == "piece" and s == 0)):
                return kind, s
    raise ValueError(f"unknown variant {text!r}: use 'dedup', 'nosteal', 'queue', 'gemm:S', 'push:S', 'energy:S' or "
                     "'fp8:S' with a finite S > 0 (e.g. gemm:1.2), 'decide:NS' with NS > 0, 'piece:NS' with NS >= 0, "
                     "or 'pad:R'")


def result_workload(result: dict, dispatch_rows=None):
    """The simulator's workload of one benchmark result from its exchanged counts, with its own (pair-based)
    dispatch rows or the ones given (e.g. distinct_dispatch_rows). A result that ran the fused shared expert
    (bench --shared first|last) gets its width (validate.result_shared_experts: "inter_shared" / "inter"); the
    engine computes it under kernel_options(result), which carry the result's "shared"."""
    c = result["counts"]
    model = ModelPreset(result["model"], int(result["hidden"]), int(result["inter"]), int(result["experts"]),
                        int(result["top_k"]), result_shared_experts(result), 1)
    placement = result_placement(result)
    rows = c["dispatch_rows"] if dispatch_rows is None else dispatch_rows
    return workload_from_counts(np.asarray(c["source_expert_pairs"], dtype=np.int64), rows, model, placement,
                                c["tokens_per_gpu"])


def result_bound_ms(result: dict, cfg: dict, bound_profile=None) -> float:
    """The benchmark's lower bound of a result (distinct token rows, profile h200; the shared expert's FLOPs and
    weights included when the result ran it), or the same computed here. A result of FP8 experts gets the FP8 bound
    (e4m3 bytes, FP8's peak: bench's "fp8_lower_bound_ms"), the one its simulated idealisations head for."""
    fp8 = result_fp8(result)
    bound = result.get("fp8_lower_bound_ms" if fp8 else "lower_bound_ms")
    if bound is None:
        h200 = bound_profile or load_profile("h200")
        if fp8:
            h200 = fp8_profile(h200)
        w = result_workload(result, distinct_dispatch_rows(result, cfg))
        vol = bound_volumes([w], h200, shared=result_shared(result) != "off", expert_dtype="fp8" if fp8 else "bf16")
        bound = float(lower_bound_ns(vol, h200).max()) / 1e6
    return float(bound)


def parse_ints(text: str, flag: str) -> list[int]:
    """A flag's comma-separated integers (empty items skipped); ValueError naming the flag otherwise."""
    try:
        return [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise ValueError(f"{flag} must be comma-separated integers, got {text!r}") from None


def warn_other_kernel(data: dict, profile) -> None:
    """On stderr, weave-sim validate's warning when the profile was fitted to other kernel sources than the file's."""
    w = kernel_sources_warning(data, profile)
    if w:
        print(f"warning: {w}", file=sys.stderr)


def results_with_counts(path: Path, tokens: str = "") -> tuple[dict, list[dict]]:
    """A benchmark file and its results at the given tokens per GPU (comma-separated; all if empty); ValueError
    unless there is at least one and every one carries the exchanged counts the simulator needs."""
    data = read_json(path, "kernel benchmark results")
    keep = set(parse_ints(tokens, "--tokens"))
    picked = [r for r in bench_results(data) if not keep or int(r["tokens_per_gpu"]) in keep]
    if not picked or any("counts" not in r for r in picked):
        raise ValueError(f"{path}: no results{' at those token counts' if keep else ''}, or results without the "
                         f"exchanged counts (re-run the benchmark, or add them with python -m weave_kernel.recount)")
    return data, picked


def parse_variants(text: str) -> list[tuple[str, float]]:
    """One variant, or several joined by '+' (e.g. fp8:1.25+push:2), applied in that order to the changed side.
    decide:NS changes both sides and stands alone; no kind twice."""
    steps = [parse_variant(part) for part in text.split("+")]
    kinds = [k for k, _ in steps]
    if len(steps) > 1 and "decide" in kinds:
        raise ValueError(f"variant {text!r}: decide:NS changes the as-built side too, so it cannot be combined")
    if len(set(kinds)) != len(kinds):
        raise ValueError(f"variant {text!r}: each kind at most once")
    return steps


def _apply_variant(kind: str, speedup: float, result: dict, cfg: dict, work, opts: dict, profile):
    """The changed side after one variant: (workload, engine options, profile)."""
    if kind == "dedup":
        return result_workload(result, distinct_dispatch_rows(result, cfg)), {**opts, "dispatch_order": "token"}, profile
    if kind == "pad":
        if "expert_pad_rows" not in opts:
            raise ValueError(f"pad:R models the expert-packed kernel layout; this result ran {opts}")
        return work, {**opts, "expert_pad_rows": int(speedup)}, profile
    if kind == "nosteal":  # the engine policy changes (whatif_result), nothing else
        return work, opts, profile
    if kind == "queue":
        if opts.get("dispatch_order") != "piece":
            raise ValueError(f"queue models the kernel's dispatch pieces; this result ran {opts}")
        return work, {**opts, "piece_deal": "queue"}, profile
    if kind == "piece":
        if opts.get("dispatch_order") != "piece":
            raise ValueError(f"piece:NS models the kernel's dispatch pieces; this result ran {opts}")
        return work, opts, with_fixed_cost(profile, "dispatch_piece", speedup)
    if kind == "gemm":
        return work, opts, rescaled(profile, gemm=speedup)
    if kind == "fp8":
        if opts.get("expert_dtype") == "fp8":
            raise ValueError("fp8:S asks what FP8 experts would change; this result already ran them")
        return work, {**opts, "expert_dtype": "fp8"}, fp8_profile(profile, speedup)
    if kind == "push":
        return work, opts, rescaled(profile, push=speedup)
    return work, opts, energy_scaled(profile, speedup)


def whatif_result(result: dict, profile, cfg: dict, variant: str = "dedup") -> dict:
    steps = parse_variants(variant)
    profile = profile_for_result(result, profile)  # a bench --num-ctas result: that many SMs
    as_built = result_workload(result)
    opts = kernel_options(result)
    kinds = [k for k, _ in steps]
    if kinds == ["decide"]:
        profile = with_fixed_cost(profile, "decision", steps[0][1])  # both sides; only who waits for the decision
        opts = {**opts, "kernel_deciders": "all"}  # differs: every SM (before 9caebac) against the deciding SMs only
        changed, changed_opts, changed_profile = as_built, {**opts, "kernel_deciders": "table"}, profile
    else:
        changed, changed_opts, changed_profile = as_built, opts, profile
        for kind, speedup in steps:
            changed, changed_opts, changed_profile = _apply_variant(kind, speedup, result, cfg, changed,
                                                                    changed_opts, changed_profile)
    out = {"model": result["model"], "tokens_per_gpu": int(result["tokens_per_gpu"]), "variant": variant,
           "measured_ms": {p: result["latency_ms"].get(p.split(":", 1)[1]) for p in POLICIES},
           "dispatch_rows_sent": {"pairs": int(as_built.dispatch_rows_out.sum()),
                                  "distinct": int(changed.dispatch_rows_out.sum())}}
    # the changed side's engine policy (nosteal: the weave split without stealing); results keep POLICIES' names
    engine = {p: p.replace("kernel:weave", "kernel:weave-nosteal") if "nosteal" in kinds else p for p in POLICIES}
    for name, w, o, prof, pol in (("as_built", as_built, opts, profile, dict(zip(POLICIES, POLICIES))),
                                  ("changed", changed, changed_opts, changed_profile, engine)):
        out[name] = {p: simulate_layer(w, prof, pol[p], **o).latency_ns / 1e6 for p in POLICIES}
    out["bound_ms"] = result_bound_ms(result, cfg)
    return out


def _describe(kind: str, factor: float) -> str:
    """A variant in words, for the table's title."""
    return {"dedup": "dispatch de-duplicated per destination GPU", "nosteal": "weave without bubble stealing",
            "queue": "dispatch pieces claimed from a ticket",
            "piece": f"{int(factor)} ns per dispatch piece",
            "gemm": f"GEMM tiles {factor}x faster",
            "energy": f"GEMM energy per FLOP x{factor}", "push": f"push per comm CTA {factor}x faster",
            "pad": f"MMAs of rows rounded up to {int(factor)}",
            "decide": f"the choice ({int(factor)} ns) made by the SMs below max_comm_sms only",
            "fp8": f"FP8 experts (half the weight and dispatch bytes, tiles {factor}x faster; bound: the bf16 layer's)"}[kind]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("bench", type=Path, help="kernel benchmark JSON with counts (python -m weave_kernel.bench)")
    ap.add_argument("--profile", default="h200-megakernel", help="hardware profile (default %(default)s)")
    ap.add_argument("--variant", default="dedup",
                    help="dedup, nosteal (weave's split without stealing), queue (dispatch pieces from a ticket, not "
                         "round-robin), piece:NS (a dispatch piece's fixed cost NS ns), gemm:S (tiles S times faster), push:S (comm "
                         "CTAs S times faster), energy:S (energy per FLOP x S; power profiles), pad:R (a block's MMAs "
                         "cost its rows rounded up to R), fp8:S (FP8 experts, tiles S times faster) or decide:NS (every SM waiting for an NS-ns choice, before "
                         "9caebac, vs the deciding SMs only); several joined by '+' apply in order (fp8:1.25+push:2)")
    ap.add_argument("--tokens", default="", help="only these tokens/GPU, comma-separated")
    ap.add_argument("--out", type=Path, default=None, help="write the rows as JSON")
    args = ap.parse_args(argv)
    try:
        steps = parse_variants(args.variant)
        profile = load_profile(args.profile)
        for kind, factor in steps:
            if kind == "energy":
                energy_scaled(profile, factor)
        data, picked = results_with_counts(args.bench, args.tokens)
    except ValueError as exc:
        ap.error(str(exc))
    warn_other_kernel(data, profile)
    cfg = data.get("config", {})
    try:  # a variant the results cannot take (pad:R on a layout without padding, queue without pieces, ...)
        rows = [whatif_result(r, profile, cfg, args.variant) for r in picked]
    except ValueError as exc:
        ap.error(str(exc))
    what = " + ".join(_describe(kind, factor) for kind, factor in steps)
    built = "every SM waiting for the choice (before 9caebac)" if steps[0][0] == "decide" else "the kernel as built"
    print(f"simulator ({args.profile}): {built} vs {what}")
    print(f"{'model':>17} {'tokens':>6} {'rows sent':>17} {'weave ms':>17} {'gain':>6} {'static:20 ms':>17} "
          f"{'gain':>6} {'weave/bound':>13}")
    for r in rows:
        a, d = r["as_built"], r["changed"]
        sent = f"{r['dispatch_rows_sent']['pairs']}->{r['dispatch_rows_sent']['distinct']}"
        print(f"{r['model']:>17} {r['tokens_per_gpu']:>6} {sent:>17} "
              f"{a['kernel:weave']:>8.3f}->{d['kernel:weave']:<7.3f} {a['kernel:weave'] / d['kernel:weave']:>6.3f} "
              f"{a['kernel:static:20']:>8.3f}->{d['kernel:static:20']:<7.3f} "
              f"{a['kernel:static:20'] / d['kernel:static:20']:>6.3f} "
              f"{r['bound_ms'] / a['kernel:weave']:>6.1%}->{r['bound_ms'] / d['kernel:weave']:<6.1%}")
    gains = [r["as_built"]["kernel:weave"] / r["changed"]["kernel:weave"] for r in rows]
    if gains:
        geo = lambda xs: math.exp(sum(map(math.log, xs)) / len(xs))  # noqa: E731
        vs20 = {side: geo([r[side]["kernel:static:20"] / r[side]["kernel:weave"] for r in rows])
                for side in ("as_built", "changed")}
        print(f"geomean predicted gain of {args.variant} under weave: {geo(gains):.3f}x, under static:20 "
              f"{geo([r['as_built']['kernel:static:20'] / r['changed']['kernel:static:20'] for r in rows]):.3f}x "
              f"over {len(gains)} configurations; weave vs static:20 {vs20['as_built']:.3f}x -> {vs20['changed']:.3f}x")
    if args.out:
        args.out.write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

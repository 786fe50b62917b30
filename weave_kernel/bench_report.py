"""The benchmark's printed tables and summaries, and the weave geomeans stored with its results (bench.py)."""
from __future__ import annotations

import math
import time

import numpy as np

from weave_sim.validate import config_label


def graph_summary(rows: list[dict]) -> str:
    """--cuda-graph ab: geomean t(eager) / t(graph replay) per policy, and the host's time to issue one call."""
    pols = sorted({p for r in rows for p in r.get("graph_speedup", {})})
    lines = ["CUDA graph replay against eager calls, same rounds: geomean t(eager) / t(replay), above 1 = replay faster"]
    for p in pols:
        v = [r["graph_speedup"][p] for r in rows if p in r.get("graph_speedup", {})]
        host = [r["host_us_per_call"][p] for r in rows if p in r.get("host_us_per_call", {})]
        lines.append(f"  {p:<12} {float(np.exp(np.mean(np.log(v)))):.3f}x over {len(v)} configs (range {min(v):.3f}-"
                     f"{max(v):.3f}); host time per eager call {np.median(host):.0f} us (median)")
    return "\n".join(lines)


def ab_summary(rows: list[dict]) -> str:
    """Geomean of t(A) / t(B) per policy over the configurations (above 1: B faster)."""
    pols = sorted({p for r in rows for p in r.get("ab", {})})
    lines = ["interleaved A/B (A = this package's kernel, B = --ab-csrc's, or the same kernel with --ab-cost-profile "
             "or the other --dispatch): "
             "geomean t(A) / t(B), above 1 = B faster"]
    for p in pols:
        v = [r["ab"][p]["a_over_b"] for r in rows if p in r.get("ab", {})]
        worst = max(r["ab"][p]["b_rel_err_vs_reference"] for r in rows if p in r.get("ab", {}))
        lines.append(f"  {p:<12} {float(np.exp(np.mean(np.log(v)))):.3f}x over {len(v)} configs "
                     f"(range {min(v):.3f}-{max(v):.3f}; B's worst rel. error {worst:.1e})")
        vs = [r["ab"][p]["a_over_b_sustained"] for r in rows if "a_over_b_sustained" in r.get("ab", {}).get(p, {})]
        if vs:
            lines.append(f"  {p + ' sust.':<12} {float(np.exp(np.mean(np.log(vs)))):.3f}x over {len(vs)} configs "
                         f"(range {min(vs):.3f}-{max(vs):.3f}; each alone, --ab-sustained)")
    return "\n".join(lines)


def label_width(rows: list[dict]) -> int:
    """Width of the model column: 20, or more for long names (model specs)."""
    return max([20] + [len(config_label(r["model"], r.get("layer"))) + 1 for r in rows])


def format_table(rows: list[dict], header: str) -> str:
    w = label_width(rows)
    lines = [header, f"{'model':<{w}}{'tok/GPU':>8}{'ref ms':>9}{'seq ms':>9}{'best static':>13}{'ms':>8}"
             f"{'x ref':>7}{'x seq':>7}{'LB ms':>8}{'%LB':>6}{'GB/s':>7}{'TF/s':>7}{'err':>9}"]
    for r in rows:
        lat = r["latency_ms"]
        b = r["best_static"]
        lines.append(f"{config_label(r['model'], r.get('layer')):<{w}}{r['tokens_per_gpu']:>8}{lat['reference']:>9.3f}"
                     f"{lat.get('sequential', float('nan')):>9.3f}"
                     f"{b:>13}{lat[b]:>8.3f}{r['speedup_best_static']:>7.2f}{r['speedup_sequential'] or float('nan'):>7.2f}"
                     f"{r['lower_bound_ms']:>8.3f}{100 * r['fraction_of_lower_bound']:>6.1f}"
                     f"{r['nvlink_gbs_per_gpu']:>7.0f}{r['tflops_per_gpu']:>7.0f}{r['max_rel_err_vs_reference']:>9.1e}")
    return "\n".join(lines)


def format_weave_table(rows: list[dict]) -> str:
    """weave vs the best static:C (after the fact, per config) vs static:20 vs the reference."""
    w = label_width(rows)
    lines = [f"{'model':<{w}}{'tok/GPU':>8}{'ref ms':>9}{'best static':>13}{'ms':>8}{'st:20':>8}{'weave':>8}"
             f"{'best weave:C':>14}{'ms':>8}{'w/best':>8}{'w/st20':>8}{'w/ref':>7}{'%LB':>6}  c*,K* per rank (agree)"]
    for r in rows:
        if "weave_vs_best_static" not in r:
            continue
        lat, b, bw = r["latency_ms"], r["best_static"], r.get("best_weave_c")
        ch = r.get("weave_choice", {})
        cks = " ".join(f"{k['c_star']},{k['k_star']}" if k else "?" for k in ch.get("kernel", []))
        s20 = f"{lat['static:20']:>8.3f}" if "static:20" in lat else f"{'-':>8}"
        w20 = f"{r['weave_vs_static20']:>8.2f}" if r.get("weave_vs_static20") else f"{'-':>8}"
        bw_ms = f"{lat[bw]:>8.3f}" if bw else f"{'-':>8}"
        lines.append(f"{config_label(r['model'], r.get('layer')):<{w}}{r['tokens_per_gpu']:>8}{lat['reference']:>9.3f}{b:>13}{lat[b]:>8.3f}{s20}"
                     f"{lat['weave']:>8.3f}{(bw or '-'):>14}{bw_ms}"
                     f"{r['weave_vs_best_static']:>8.2f}{w20}{r['weave_vs_reference']:>7.2f}"
                     f"{100 * r['weave_fraction_of_lower_bound']:>6.1f}  {cks} ({all(ch.get('agrees', [False]))})")
    return "\n".join(lines)


def ratio(v) -> str:
    """A speedup for the summary lines: '1.234x', or 'n/a' where the run lacks the policy it divides by."""
    return f"{v:.3f}x" if v is not None and math.isfinite(v) else "n/a"


def geomean(v) -> float:
    """Geometric mean of the values given (None or 0, a policy the run lacks, left out); NaN when none is left."""
    v = [x for x in v if x]
    return float(np.exp(np.mean(np.log(v)))) if v else float("nan")


def weave_geomeans(rows: list[dict]) -> dict:
    out = {}
    for label, sel in (("all", rows), ("prefill", [r for r in rows if r["tokens_per_gpu"] >= 2048])):
        sel = [r for r in sel if "weave_vs_best_static" in r]
        out[label] = {
            "points": len(sel),
            "weave_vs_best_static": geomean([r["weave_vs_best_static"] for r in sel]),
            "weave_vs_static20": geomean([r["weave_vs_static20"] for r in sel]),
            "weave_vs_reference": geomean([r["weave_vs_reference"] for r in sel]),
            "best_static_vs_reference": geomean([r["speedup_best_static"] for r in sel]),
        }
        # the issue's baseline: one C for every config, chosen after the fact (the C best for the geomean)
        common = set.intersection(*[{p for p in r["latency_ms"] if p.startswith("static:")} for r in sel]) if sel else set()
        per_c = {p: geomean([r["latency_ms"][p] / r["latency_ms"]["weave"] for r in sel]) for p in common}
        if per_c:
            c1 = min(per_c, key=per_c.get)
            out[label].update({"best_single_static": c1, "weave_vs_best_single_static": per_c[c1]})
    lb = [r["weave_fraction_of_lower_bound"] for r in rows if r["tokens_per_gpu"] == 4096 and
          "weave_fraction_of_lower_bound" in r]
    out["weave_fraction_of_lower_bound_4096_mean"] = float(np.mean(lb)) if lb else None
    ns = [r["weave_vs_nosteal"] for r in rows if r.get("weave_vs_nosteal")]
    if ns:
        out["weave_vs_nosteal"] = geomean(ns)
    agree = [a for r in rows for a in r.get("weave_choice", {}).get("agrees", [])]
    out["choice_agreement"] = f"{sum(agree)}/{len(agree)}"
    sustained = sustained_geomeans(rows)
    if sustained:
        out["sustained"] = sustained
    return out


def sustained_geomeans(rows: list[dict]) -> dict | None:
    """weave against the other policies on the sustained times (bench --sustained: each policy back to back, the
    clock a power-capped GPU holds under a stream of layers; docs/power.md), over the results that have them:
    geomeans of t(policy) / t(weave), the worst configuration against its best static:C, and the fraction of the
    lower bound at 4096 tokens. None when no result has sustained times for weave."""
    sel = [r for r in rows if (r.get("sustained_ms") or {}).get("weave")]
    if not sel:
        return None

    def vs(policy):
        return geomean([r["sustained_ms"][policy] / r["sustained_ms"]["weave"] for r in sel
                        if r["sustained_ms"].get(policy)])

    best = [min(t for p, t in r["sustained_ms"].items() if p.startswith("static:")) / r["sustained_ms"]["weave"]
            for r in sel if any(p.startswith("static:") for p in r["sustained_ms"])]
    out = {"points": len(sel), "weave_vs_static20": vs("static:20"), "weave_vs_reference": vs("reference"),
           "weave_vs_best_static": geomean(best), "weave_vs_best_static_worst": min(best) if best else None}
    lb = [r["lower_bound_ms"] / r["sustained_ms"]["weave"] for r in sel
          if r["tokens_per_gpu"] == 4096 and r.get("lower_bound_ms")]
    out["weave_fraction_of_lower_bound_4096_mean"] = float(np.mean(lb)) if lb else None
    return out


def run_header(args, world: int, gpu: str) -> str:
    dtype = ("fp8 experts (e4m3, 128x128 block scales; reference bf16 on the dequantized weights)"
             if getattr(args, "expert_dtype", "bf16") == "fp8" else "bf16")
    return (f"MoE layer latency, {world}x {gpu}, EP={world}, {dtype}, tokens per GPU as listed, routing: "
            f"{args.spec.describe()}, median of {args.repeats} repetitions of {args.calls_per_rep} back-to-back calls after "
            f"{args.warmup} warm-up, policies timed {args.order}, {time.strftime('%Y-%m-%d')}")

"""Markdown tables of docs/results.md from two `weave_kernel.bench` runs of one session:

    python tests/kernel/results_tables.py RUN_A.json RUN_B.json

RUN_A: reference, sequential and a static:C grid (issue 4's table: best static:C per configuration, its
fraction of the lower bound). RUN_B: reference, sequential, static:8/20, weave and a weave:C sweep (issue 5's
table); its `best static` column takes the best static:C of RUN_A for the same configuration (same kernel,
same session, another run) and says so. Geomeans are printed under each table.
"""
from __future__ import annotations

import argparse
import json
import math


def gm(v):
    v = list(v)
    return math.exp(sum(math.log(x) for x in v) / len(v)) if v else float("nan")


def best_static(lat: dict) -> tuple[str, float]:
    st = {p: t for p, t in lat.items() if p.startswith("static:")}
    p = min(st, key=st.get)
    return p, st[p]


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("run_a")
    ap.add_argument("run_b")
    a = ap.parse_args()
    A = json.load(open(a.run_a))["results"]
    B = {(r["model"], r["tokens_per_gpu"]): r for r in json.load(open(a.run_b))["results"]}

    print("| model | tokens/GPU | reference ms | sequential ms | best static:C ms | vs reference | bound ms | % of bound |")
    print("|---|---|---|---|---|---|---|---|")
    sp, frac4096 = [], []
    for r in A:
        L = r["latency_ms"]
        p, t = best_static(L)
        sp.append(L["reference"] / t)
        if r["tokens_per_gpu"] == 4096:
            frac4096.append(r["lower_bound_ms"] / t)
        print(f"| {r['model']} | {r['tokens_per_gpu']} | {L['reference']:.3f} | {L.get('sequential', float('nan')):.3f} "
              f"| {t:.3f} ({p}) | {L['reference'] / t:.2f}x | {r['lower_bound_ms']:.3f} | {100 * r['lower_bound_ms'] / t:.0f}% |")
    print(f"\nbest static:C vs reference, geomean over {len(sp)} points: {gm(sp):.2f}x; "
          f"fraction of the bound at 4096: mean {100 * sum(frac4096) / len(frac4096):.0f}%, "
          f"min {100 * min(frac4096):.0f}%\n")

    print("| model | tokens/GPU | reference ms | static:20 ms | best static:C ms (run A) | weave ms | c* per rank | "
          "best weave:C ms | bound ms | weave % of bound | vs static:20 | vs best static | vs reference |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    g20, gbest, gref, f4096, regret, single = [], [], [], [], [], {}
    for ra in A:
        key = (ra["model"], ra["tokens_per_gpu"])
        if key not in B:
            continue
        r = B[key]
        L = r["latency_ms"]
        p, t = best_static(ra["latency_ms"])
        w = L["weave"]
        sw = {q: v for q, v in L.items() if q.startswith("weave:")}
        q = min(sw, key=sw.get)
        cs = ",".join(str(k["c_star"]) for k in r["weave_choice"]["kernel"])
        g20.append(L["static:20"] / w)
        gbest.append(t / w)
        gref.append(L["reference"] / w)
        regret.append(w / sw[q] - 1)
        for c, v in ra["latency_ms"].items():
            if c.startswith("static:"):
                single.setdefault(c, []).append(v / w)
        if r["tokens_per_gpu"] == 4096:
            f4096.append(r["lower_bound_ms"] / w)
        print(f"| {key[0]} | {key[1]} | {L['reference']:.3f} | {L['static:20']:.3f} | {t:.3f} ({p}) | {w:.3f} | {cs} | "
              f"{sw[q]:.3f} ({q}) | {r['lower_bound_ms']:.3f} | {100 * r['lower_bound_ms'] / w:.0f}% | "
              f"{L['static:20'] / w:.2f}x | {t / w:.2f}x | {L['reference'] / w:.2f}x |")
    best_single = min(single, key=lambda c: gm(single[c]))
    regret.sort()
    print(f"\ngeomeans over {len(g20)} points: weave vs static:20 {gm(g20):.3f}x, vs best static:C per config "
          f"{gm(gbest):.3f}x (never below: {min(gbest) >= 1}; min {min(gbest):.3f}), vs the best single static "
          f"split ({best_single}, run A) {gm(single[best_single]):.3f}x, vs reference {gm(gref):.2f}x; weave at 4096: "
          f"mean {100 * sum(f4096) / len(f4096):.0f}% of the bound; regret of the kernel's c* vs the best weave:C: "
          f"median {100 * regret[len(regret) // 2]:.1f}%, worst {100 * regret[-1]:.1f}%")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

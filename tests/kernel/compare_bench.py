"""Compare two `weave_kernel.bench` JSON files point by point (same model, tokens and policy):

    python tests/kernel/compare_bench.py BEFORE.json AFTER.json [--tokens 4096]

Prints before / after latency per (model, policy) present in both, the after/before ratio, the max relative
error of the new run vs the reference, and the geomean of before / after per policy.
"""
from __future__ import annotations

import argparse
import json
import math


def _points(path: str, tokens: set[int] | None) -> dict:
    doc = json.load(open(path))
    out = {}
    for r in doc.get("results", []):
        if tokens and r["tokens_per_gpu"] not in tokens:
            continue
        out[(r["model"], r["tokens_per_gpu"])] = r
    return out


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("before")
    ap.add_argument("after")
    ap.add_argument("--tokens", default="", help="comma-separated tokens per GPU to keep (default: all)")
    a = ap.parse_args()
    tok = {int(t) for t in a.tokens.split(",") if t} or None
    before, after = _points(a.before, tok), _points(a.after, tok)
    ratios: dict[str, list[float]] = {}
    print(f"{'model':<18}{'tok':>6} {'policy':<11}{'before ms':>10}{'after ms':>10}{'speedup':>9}{'rel err':>9}")
    for key in sorted(set(before) & set(after)):
        b, n = before[key]["latency_ms"], after[key]["latency_ms"]
        errs = after[key].get("rel_err_vs_reference", {})
        for pol in n:
            if pol not in b:
                continue
            s = b[pol] / n[pol]
            if pol != "reference":
                ratios.setdefault(pol, []).append(s)
            err = errs.get(pol)
            print(f"{key[0]:<18}{key[1]:>6} {pol:<11}{b[pol]:>10.3f}{n[pol]:>10.3f}{s:>8.2f}x"
                  f"{'' if err is None else f'{err:>9.1e}'}")
    for pol, v in ratios.items():
        g = math.exp(sum(math.log(x) for x in v) / len(v))
        print(f"geomean before/after {pol:<11}{g:.3f}x over {len(v)} points")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

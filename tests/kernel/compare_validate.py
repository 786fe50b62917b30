"""Two `weave-sim validate` outputs of the same benchmark side by side: median / worst |error|, points over 15%, the
median signed error per policy (+ = predicted slower) and weave's gain over the best static split, predicted
against measured (geomean over configurations).

    python tests/kernel/compare_validate.py BEFORE/validate.json AFTER/validate.json [--labels before,after]
"""
from __future__ import annotations

import argparse
import json
import math
from pathlib import Path


def summary(path: Path) -> dict:
    d = json.loads(Path(path).read_text())
    gains = [(c["gain_predicted"], c["gain_measured"]) for c in d["configs"]
             if c.get("gain_predicted") and c.get("gain_measured")]
    geo = (lambda xs: math.exp(sum(math.log(x) for x in xs) / len(xs))) if gains else None
    return {"summary": d["summary"], "by_policy": d["by_policy"], "profile": d["config"].get("profile"),
            "gain": (geo([g for g, _ in gains]), geo([m for _, m in gains])) if gains else None}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("before", type=Path)
    ap.add_argument("after", type=Path)
    ap.add_argument("--labels", default="before,after")
    a = ap.parse_args(argv)
    runs = [summary(a.before), summary(a.after)]
    labels = a.labels.split(",")
    print(f"{'':10}{'points':>7}{'median':>8}{'worst':>8}{'>15%':>6}  signed median by policy; weave gain pred / meas")
    for lab, r in zip(labels, runs):
        s = r["summary"]
        pol = ", ".join(f"{p} {100 * v['median_error']:+.1f}" for p, v in r["by_policy"].items())
        gain = f"; gain {r['gain'][0]:.3f} / {r['gain'][1]:.3f}" if r["gain"] else ""
        print(f"{lab:10}{s['points']:>7}{100 * s['median_abs_error']:>7.1f}%{100 * s['worst_abs_error']:>7.1f}%"
              f"{s['points_over_15pct']:>6}  {pol}{gain}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

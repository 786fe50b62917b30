"""The pair files of the FP8 tile-factor refit (docs/results.md "Half tiles with the shared expert"), into DIR:
run S8's bf16 / FP8 files without the deepseek models (docs/results/fp8_half/ep1/) and the deepseek configurations
of the later call (docs/results/idle_half/final/), each split into fit (2048, 8192 tokens) and held (4096) parts,
plus fp8_fit.json / fp8_held.json (both calls' FP8 results, tests/kernel/merge_bench.py).

    python docs/results/idle_half/fp8_refit/prep.py DIR
    DIR=DIR bash docs/results/idle_half/fp8_refit/refit.sh PROFILE bench|sustained
    DIR=DIR bash docs/results/idle_half/fp8_refit/held_gain.sh
"""
import json
import subprocess
import sys
from pathlib import Path

out = Path(sys.argv[1])
out.mkdir(parents=True, exist_ok=True)
OLD, NEW = "docs/results/fp8_half/ep1/bench_S8_", "docs/results/idle_half/final/bench_S8_ds_"
DEEPSEEK = {"deepseek-v2", "deepseek-v3"}


def subset(src, dst, keep):
    d = json.load(open(src))
    d["results"] = [r for r in d["results"] if keep(r)]
    for k in ("weave_geomeans", "geomean_speedup_best_static"):
        d.pop(k, None)
    json.dump(d, open(dst, "w"))


for part, tokens in (("fit", {2048, 8192}), ("held", {4096})):
    for dt in ("bf16", "fp8"):
        subset(OLD + dt + ".json", out / f"old_{dt}_{part}.json",
               lambda r: r["model"] not in DEEPSEEK and r["tokens_per_gpu"] in tokens)
        subset(NEW + dt + ".json", out / f"new_{dt}_{part}.json", lambda r: r["tokens_per_gpu"] in tokens)
    subprocess.run([sys.executable, "tests/kernel/merge_bench.py", str(out / f"fp8_{part}.json"),
                    str(out / f"old_fp8_{part}.json"), str(out / f"new_fp8_{part}.json")], check=True)

#!/bin/bash
# One 1x H200 call (about 3 min): does the policy timed before a policy set its time? In the EP=1 run of
# docs/results/order/ (bench --order alternating, seed 4), weave:C on the large models timed 2-12% slower than
# weave, growing with C, i.e. with the distance from the reference in the policy list; alternating rounds give
# every policy the same neighbours both ways. The same set (static:8/20, weave, weave:4/16/32 at 4096 tokens on
# phi-3.5-moe, deepseek-v2 and, as the control without the effect, qwen3-30b-a3b) is timed with --order
# alternating, --order shuffled (a fresh random order each round) and --order policy (each policy back to back
# after 10 warm-up calls: its own steady state), the shuffled run also --sustained 1.5 (each policy alone for 1.5 s,
# forward and backward). Logs and JSON in $OUT.
source tests/kernel/device_env.sh
bash tests/kernel/device_run.sh build 2>&1 | tail -1
B="torchrun --nproc_per_node=1 -m weave_kernel.bench --no-gpu-state --models phi-3.5-moe,deepseek-v2,qwen3-30b-a3b --tokens 4096 --comm 8,20 --weave-comm 4,16,32 --no-sequential --repeats 8"
timeout 120 $B --order alternating --out $OUT/nb_alternating.json > $OUT/nb_alternating.log 2>&1; echo "alternating rc $? [${SECONDS}s]"
timeout 200 $B --order shuffled --sustained 1.5 --out $OUT/nb_shuffled.json > $OUT/nb_shuffled.log 2>&1; echo "shuffled rc $? [${SECONDS}s]"
timeout 120 $B --order policy --warmup 10 --out $OUT/nb_policy.json > $OUT/nb_policy.log 2>&1; echo "policy rc $? [${SECONDS}s]"
python3 - $OUT <<'PY'
import json, sys
out = sys.argv[1]
keys = ["static:8", "static:20", "weave:4", "weave:16", "weave:32"]
print("t / t(weave)            " + " ".join(f"{k:>9}" for k in keys))
for o in ("alternating", "shuffled", "policy"):
    try:
        d = json.load(open(f"{out}/nb_{o}.json"))
    except Exception as e:
        print(o, "missing", e); continue
    for r in d["results"]:
        for tag, L in (("", r["latency_ms"]), ("sust", r.get("sustained_ms") or {})):
            if "weave" in L:
                print(f"{o[:5]:5}{tag:>4} {r['model'][:13]:13}" + " ".join(f"{L[k] / L['weave']:9.3f}" for k in keys))
PY

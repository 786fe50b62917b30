#!/bin/bash
# One 1x H200 call (about 3 min): is weave's bench-style time on deepseek-v3 at 4096 tokens (realistic routing) set
# by the power limiter's transients rather than by the kernel? In routing_ep1_run.sh's runs it timed 8.05-8.41 ms
# bench-style against 7.27-7.34 ms sustained, with the SM clock sampled as low as 735-960 MHz during the bench-style
# timings (docs/results.md "Realistic routing at EP=1 on the current kernel"). The same layers timed under every bench
# --order, with the clock sampled, then each policy back to back (--sustained 0.5). Files in $OUT/transient; a table
# last. Knobs: TRANSIENT_LAYERS (19,57), TRANSIENT_ORDERS (alternating,interleaved,policy,shuffled).
source tests/kernel/device_env.sh
R=$OUT/transient; mkdir -p $R
END=${END_S:-560}
build_tree $R
for o in $(echo ${TRANSIENT_ORDERS:-alternating,interleaved,policy,shuffled} | tr , ' '); do
  timeout $(left 20) torchrun --nproc_per_node=1 -m weave_kernel.bench --models deepseek-v3 --tokens 4096 \
    --synthetic fitted --layers ${TRANSIENT_LAYERS:-19,57} --comm 8,20 --weave-comm= --repeats 5 --order $o \
    $( [ $o = shuffled ] && echo --sustained 0.5 ) --out $R/order_$o.json > $R/order_$o.log 2>&1
  echo "$o rc $? [${SECONDS}s]"
done
echo "== summary (sources $(cat $R/csrc.txt)): ms per policy, SM MHz min / median over the config's timing"
for f in $R/order_*.json; do
  python3 - "$f" <<'PY'
import json, sys
d = json.load(open(sys.argv[1]))
for r in d["results"]:
    g = (r.get("gpu_state") or [{}])[0]
    line = " ".join(f"{p} {v:.3f}" for p, v in r["latency_ms"].items())
    sus = " ".join(f"{p} {v:.3f}" for p, v in (r.get("sustained_ms") or {}).items())
    print(sys.argv[1].rsplit("/", 1)[-1], r.get("layer"), line, f"| MHz {g.get('sm_mhz_min')} / {g.get('sm_mhz_median')}",
          f"| sustained {sus}" if sus else "")
PY
done
echo "done [${SECONDS}s]"

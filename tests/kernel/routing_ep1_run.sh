#!/bin/bash
# One 1x H200 call (about 9 min): the working tree's kernel on the issue's realistic routing at EP=1, held out for the
# shipped EP=1 profiles. Build, gpu_worker --quick, then the benchmark with `--synthetic fitted` (six models x {2048,
# 4096, 8192} x four layers spread over the depth) and GPT-OSS-20B on its recorded trace, each with the reference,
# sequential, static:8, static:20 and weave (the in-kernel choice checked against Python's on every call). Files in
# $OUT/routing (bench JSON and logs); a table last. Knobs: END_S, ROUTING_REPEATS (3), ROUTING_RUNS (trace,fitted),
# ROUTING_TOKENS (2048,4096,8192), ROUTING_MODELS (the six; fitted only), ROUTING_QUICK (1: gpu_worker --quick first;
# 0 skips it), ROUTING_SUSTAINED (seconds: also every policy timed back to back, bench --sustained; unset =
# bench-style only). With ROUTING_SUSTAINED=0.5 the six models take two calls (the first ran 50 of the 72 points in
# its 10 minutes): ROUTING_MODELS=deepseek-v2,deepseek-v3 for the second, tests/kernel/merge_bench.py to join them.
# On the CPU machine afterwards: weave-sim validate FILE --profile h200-megakernel-ep1 (and -power-ep1).
source tests/kernel/device_env.sh
R=$OUT/routing; mkdir -p $R
END=${END_S:-580}
REP=${ROUTING_REPEATS:-3}
build_tree $R
if [ "${ROUTING_QUICK:-1}" = 1 ]; then
  timeout 200 torchrun --nproc_per_node=1 tests/kernel/gpu_worker.py --quick > $R/gpu_worker_quick.log 2>&1
  echo "gpu_worker --quick rc $? [${SECONDS}s]"; grep -E "^FAIL|SUMMARY|AGREEMENT" $R/gpu_worker_quick.log | head -5
fi
TOK=${ROUTING_TOKENS:-2048,4096,8192}
SUS=${ROUTING_SUSTAINED:+--sustained $ROUTING_SUSTAINED}
RUNS=",${ROUTING_RUNS:-trace,fitted},"
run() {  # name, then bench arguments
  local name=$1; shift
  timeout $(left 20) torchrun --nproc_per_node=1 -m weave_kernel.bench --repeats $REP --comm 8,20 --weave-comm= \
    $SUS "$@" --out $R/$name.json > $R/$name.log 2>&1
  echo "$name rc $? [${SECONDS}s]"
}
[[ $RUNS == *,trace,* ]] && run bench_ep1_trace --models gpt-oss-20b --tokens $TOK --routing-trace default
[[ $RUNS == *,fitted,* ]] && run bench_ep1_fitted --models ${ROUTING_MODELS:-$SIX_MODELS} --tokens $TOK --synthetic fitted
echo "== summary (sources $(cat $R/csrc.txt))"
for f in $R/bench_ep1_*.json; do
  python3 - "$f" <<'EOF'
import json, sys
try:
    d = json.load(open(sys.argv[1]))
except (OSError, ValueError) as exc:
    print(sys.argv[1], "unreadable:", exc); raise SystemExit
g = d.get("weave_geomeans", {}).get("all", {})
print(sys.argv[1].rsplit("/", 1)[-1], "complete" if d.get("complete") else "INCOMPLETE",
      {k: (round(v, 4) if isinstance(v, float) else v) for k, v in g.items()},
      "bound@4096", round(d.get("weave_geomeans", {}).get("weave_fraction_of_lower_bound_4096_mean", float("nan")), 4),
      "choice", d.get("weave_geomeans", {}).get("choice_agreement"))
if d.get("weave_geomeans", {}).get("sustained"):
    print("  sustained", {k: (round(v, 4) if isinstance(v, float) else v) for k, v in d["weave_geomeans"]["sustained"].items()})
EOF
done
echo "done [${SECONDS}s]"

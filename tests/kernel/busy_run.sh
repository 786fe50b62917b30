#!/bin/bash
# One 1x H200 call (about 7 min): SMs busy on the current kernel at EP=1, as docs/results/ep1_busy/ measured it on
# a2bd4e86 (one traced weave call per configuration after the benchmark's repetitions, default Zipf routing, the
# same four configurations), counted by `weave-sim timeline-stats --from count_exchange` (busy time the union per
# SM since 2026-12-03); then random layers of the presets' size (fuzz_worker --big, FUZZ_SEED default 40) for the
# rest of the budget. Logs and the stats in $OUT/busy. Knobs: END_S, FUZZ_SEED.
source tests/kernel/device_env.sh
R=$OUT/busy; mkdir -p $R
END=${END_S:-480}
build_tree $R
for mt in deepseek-v2:4096 deepseek-v3:2048 qwen3-30b-a3b:4096 qwen3.5-35b-a3b:2048; do
  m=${mt%:*}; t=${mt#*:}
  timeout 120 torchrun --nproc_per_node=1 -m weave_kernel.bench --models $m --tokens $t --comm 20 --weave-comm= \
    --no-sequential --repeats 3 --trace /tmp/trace_${m}_$t.json --trace-policy weave > $R/bench_${m}_$t.log 2>&1
  echo "bench $m $t rc $? [${SECONDS}s]"
done
python3 -m weave_sim.cli timeline-stats /tmp/trace_*.json --from count_exchange | tee $R/timeline_stats_ep1.txt
timeout $(left 10) python3 tests/kernel/fuzz_worker.py --big --seed ${FUZZ_SEED:-40} --cases 100000 \
  --budget-s $(left 60) > $R/fuzz_big.log 2>&1
echo "fuzz --big seed ${FUZZ_SEED:-40} rc $? [${SECONDS}s]"; grep -E "^FAIL|SUMMARY|AGREEMENT" $R/fuzz_big.log | tail -4
gzip -f $R/fuzz_big.log
echo "done [${SECONDS}s]"

#!/bin/bash
# One 1x H200 call (about 9 min) on the sources as kept after idle_half_run.sh: the idle form in the bf16 kernel with
# the shared expert only (tasks.cuh kIdleHalf). On the tree: gpu_worker --quick, virtual ranks G = 2, 4, fp8_worker
# (device_env.sh quick_tests), random layers (fuzz_worker, shared experts among them) and compute-sanitizer memcheck
# on a few of them; then the configurations
# run S8 (seed 8; docs/results/fp8_half/ep1/) lacked in bf16, deepseek-v2 and deepseek-v3 at 2048, 4096 and 8192
# tokens, in bf16 and in FP8, each format in its own bench process (the instances these use are unchanged since
# S8). Logs in $OUT/idle_half_final. Knobs: END_S.
source tests/kernel/device_env.sh
R=$OUT/idle_half_final; mkdir -p $R
END=${END_S:-540}
build_tree $R
quick_tests $R 2,4
timeout 110 python3 tests/kernel/fuzz_worker.py --seed ${FUZZ_SEED:-35} --cases 100000 --budget-s 90 > $R/fuzz.log 2>&1
echo "fuzz_worker rc $? [${SECONDS}s]"; grep -E "^FAIL|SUMMARY" $R/fuzz.log | tail -3
timeout 90 compute-sanitizer --tool memcheck --report-api-errors no python3 tests/kernel/fuzz_worker.py \
  --seed 36 --cases 4 > $R/memcheck_fuzz.log 2>&1
echo "memcheck (fuzz, 4 cases) rc $? [${SECONDS}s]: $(grep -E 'ERROR SUMMARY' $R/memcheck_fuzz.log | head -1)"
grep -E "^(PASS|FAIL) case" $R/memcheck_fuzz.log | cut -c1-160
for dt in bf16 fp8; do
  timeout $(left 20) torchrun --nproc_per_node=1 -m weave_kernel.bench --repeats 4 --expert-dtype $dt \
    --models deepseek-v2,deepseek-v3 --tokens 2048,4096,8192 --comm 8,20 --weave-comm= --no-sequential --seed 8 \
    --sustained 1.0 --out $R/bench_S8_ds_$dt.json > $R/S8_ds_$dt.log 2>&1
  echo "S8 deepseek $dt rc $? [${SECONDS}s]"; grep -E "^\[" $R/S8_ds_$dt.log | cut -c1-200
done
echo "done [${SECONDS}s]"

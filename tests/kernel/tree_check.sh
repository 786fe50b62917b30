#!/bin/bash
# One 1x H200 call (about 8 min) that checks the working tree's kernel and Python side without timing anything new:
# build_tree, the quick correctness set (device_env.sh quick_tests), compute-sanitizer synccheck and memcheck on
# random layers with a bf16 shared expert whose blocks run half tiles in the idle form (fuzz seed 37, cases 28 and
# 103: shared blocks of 62 / 85 and 166 / 333 rows), random layers for the rest of the budget (FUZZ_SEED, default
# 38), and one short benchmark through bench's own checks (its reference comparison, the in-kernel choice against
# Python's), bf16 and FP8. Logs in $OUT/verify; a table last. Knobs: END_S, FUZZ_SEED.
source tests/kernel/device_env.sh
R=$OUT/verify; mkdir -p $R
END=${END_S:-540}
build_tree $R
quick_tests $R 2,4 | tee $R/quick.txt
for tool in synccheck memcheck; do
  for c in 28 103; do
    timeout 100 compute-sanitizer --tool $tool --report-api-errors no python3 tests/kernel/fuzz_worker.py \
      --seed 37 --only $c > $R/${tool}_37_$c.log 2>&1
    echo "$tool seed 37 case $c rc $? [${SECONDS}s]: $(grep -E 'ERROR SUMMARY' $R/${tool}_37_$c.log | head -1)" \
      | tee -a $R/sanitize.txt
    grep -E "^(PASS|FAIL) case" $R/${tool}_37_$c.log | cut -c1-200
  done
done
for dt in bf16 fp8; do
  timeout 120 torchrun --nproc_per_node=1 -m weave_kernel.bench --repeats 2 --expert-dtype $dt --models \
    qwen3-30b-a3b,deepseek-v2-lite --tokens 2048 --comm 8,20 --weave-comm= --no-sequential --shared last \
    --out $R/bench_$dt.json > $R/bench_$dt.log 2>&1
  echo "bench $dt (shared last) rc $? [${SECONDS}s]" | tee -a $R/bench.txt
  grep -E "^\[|rel|agree" $R/bench_$dt.log | cut -c1-200 | head -8
done
timeout $(left 15) python3 tests/kernel/fuzz_worker.py --seed ${FUZZ_SEED:-38} --cases 100000 \
  --budget-s $(( $(left 40) )) > $R/fuzz.log 2>&1
echo "fuzz seed ${FUZZ_SEED:-38} rc $? [${SECONDS}s]" > $R/fuzz.txt
grep -E "^FAIL|SUMMARY|AGREEMENT" $R/fuzz.log | tail -4 >> $R/fuzz.txt
echo "== summary (sources $(cat $R/csrc.txt))"
cat $R/quick.txt | grep -E "rc |SUMMARY|AGREEMENT"; cat $R/sanitize.txt $R/bench.txt $R/fuzz.txt
echo "done [${SECONDS}s]"

#!/bin/bash
# One 1x H200 call (about 9 min): half tiles by an idle warpgroup (pipeline.cuh with_mma_form, Tiles::kIdleHalf: in a
# block of at most 64 rows the second consumer warpgroup, whose rows are all padding, waits for each stage and hands
# it back without MMAs; the first computes its 64 rows as in a full tile), against the sources in
# tests/kernel/_ab_old_csrc (carried). On the tree: gpu_worker --quick, virtual ranks G = 2, 4, fp8_worker
# (device_env.sh quick_tests), random layers (fuzz_worker, with shared experts) in bf16 and FP8; then bench --ab-csrc
# (A = the tree, B = the old sources) with --ab-sustained 1.0, static:20 and weave: $DTYPE routed experts on the six
# models at 2048 and 4096 tokens, then with the shared expert fused (--shared last) on the four models that have one.
# Logs in $OUT/idle_half. Knobs: DTYPE (bf16), STAGES (tests,routed,shared), END_S.
source tests/kernel/device_env.sh
R=$OUT/idle_half; mkdir -p $R
OLD=$PWD/tests/kernel/_ab_old_csrc
END=${END_S:-565}
DT=${DTYPE:-bf16}
STAGES=${STAGES:-tests,routed,shared}
build_new_and_old $R $OLD || exit 2
if has tests; then
  quick_tests $R 2,4
  timeout 70 python3 tests/kernel/fuzz_worker.py --seed ${FUZZ_SEED:-33} --budget-s 50 > $R/fuzz.log 2>&1
  echo "fuzz_worker rc $? [${SECONDS}s]"; grep -E "^FAIL|SUMMARY" $R/fuzz.log | tail -3
  timeout 50 python3 tests/kernel/fuzz_worker.py --fp8 --seed ${FUZZ_SEED8:-34} --budget-s 30 > $R/fuzz_fp8.log 2>&1
  echo "fuzz_worker --fp8 rc $? [${SECONDS}s]"; grep -E "^FAIL|SUMMARY" $R/fuzz_fp8.log | tail -3
fi
wait; tail -1 $R/build_old.log
if has routed; then
  timeout $(left 110) torchrun --nproc_per_node=1 -m weave_kernel.bench --no-gpu-state --expert-dtype $DT \
    --out $R/bench_ab_${DT}.json --ab-csrc $OLD --models $SIX_MODELS --tokens 2048,4096 \
    --comm 20 --weave-comm= --no-sequential --repeats 4 --ab-sustained 1.0 > $R/bench_ab_${DT}.log 2>&1
  echo "bench A/B $DT rc $? [${SECONDS}s]"; grep -A6 "interleaved A/B" $R/bench_ab_${DT}.log
fi
if has shared; then
  timeout $(left) torchrun --nproc_per_node=1 -m weave_kernel.bench --no-gpu-state --expert-dtype $DT --shared last \
    --out $R/bench_ab_${DT}_shared.json --ab-csrc $OLD \
    --models deepseek-v2-lite,qwen3.5-35b-a3b,deepseek-v2,deepseek-v3 --tokens 2048,4096 \
    --comm 20 --weave-comm= --no-sequential --repeats 4 --ab-sustained 1.0 > $R/bench_ab_${DT}_shared.log 2>&1
  echo "bench A/B $DT shared rc $? [${SECONDS}s]"; grep -A6 "interleaved A/B" $R/bench_ab_${DT}_shared.log
fi
echo "done [${SECONDS}s]"

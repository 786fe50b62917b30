#!/bin/bash
# One 1x H200 call (about 6 min): half tiles in the FP8 instance (wgmma.cuh mma_stage_half_e4m3; a block of at most 64
# rows skips the MMAs of its padding rows, as bf16 blocks have since sources 8bb53198), against the sources before it
# in tests/kernel/_ab_old_csrc (carried; see ab_inproc.sh). On the tree: gpu_worker --quick, virtual ranks G = 2, 4,
# fp8_worker (device_env.sh quick_tests), random FP8 layers (fuzz_worker --fp8) and compute-sanitizer memcheck on a
# few of them; then bench --ab-csrc in FP8 (A = the tree, B = the old sources) with --ab-sustained 1.0 on the six
# models at 2048 and 4096 tokens, static:20 and weave. Logs in $OUT/fp8_half.
source tests/kernel/device_env.sh
R=$OUT/fp8_half; mkdir -p $R
OLD=$PWD/tests/kernel/_ab_old_csrc
build_new_and_old $R $OLD || exit 2
quick_tests $R 2,4
timeout 110 python3 tests/kernel/fuzz_worker.py --fp8 --seed ${FUZZ_SEED:-29} --budget-s 90 > $R/fuzz_fp8.log 2>&1
echo "fuzz_worker --fp8 rc $? [${SECONDS}s]"; grep -E "^FAIL|SUMMARY|summary" $R/fuzz_fp8.log | tail -3
timeout 120 compute-sanitizer --tool memcheck --report-api-errors no python3 tests/kernel/fuzz_worker.py --fp8 \
  --seed 30 --cases 3 > $R/memcheck_fuzz_fp8.log 2>&1
echo "memcheck (fuzz --fp8, 3 cases) rc $? [${SECONDS}s]: $(grep -E 'ERROR SUMMARY' $R/memcheck_fuzz_fp8.log | head -1)"
wait; tail -1 $R/build_old.log
timeout $(( ${END_S:-560} - SECONDS )) torchrun --nproc_per_node=1 -m weave_kernel.bench --no-gpu-state --expert-dtype fp8 \
  --out $R/bench_ab.json --ab-csrc $OLD \
  --models qwen3-30b-a3b,deepseek-v2-lite,qwen3.5-35b-a3b,phi-3.5-moe,deepseek-v2,deepseek-v3 --tokens 2048,4096 \
  --comm 20 --weave-comm= --no-sequential --repeats 4 --ab-sustained 1.0 > $R/bench_ab.log 2>&1
echo "bench A/B rc $? [${SECONDS}s]"; grep -A6 "interleaved A/B" $R/bench_ab.log

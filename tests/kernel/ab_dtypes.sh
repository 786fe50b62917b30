#!/bin/bash
# One 1x H200 call: a kernel change against older sources (tests/kernel/_ab_old_csrc, carried; see ab_inproc.sh), in
# FP8 and in bf16. Builds both (the old one in the background), runs gpu_worker --quick, fp8_worker and
# virtual_worker --quick G = 2, 4 on the working tree, then `bench --ab-csrc` (A = the working tree, B = the old
# sources, alternating calls) once per expert dtype with AB_BENCH_ARGS. Logs in $OUT/ab_dtypes.tgz.
set -o pipefail
source tests/kernel/device_env.sh  # wheels, environment, has()
R=$OUT/ab_dtypes; mkdir -p $R
OLD=$PWD/tests/kernel/_ab_old_csrc
build_new_and_old $R $OLD || exit 2  # device_env.sh
quick_tests $R 2,4  # device_env.sh
wait; tail -1 $R/build_old.log
for dt in ${AB_DTYPES:-fp8 bf16}; do
  timeout ${AB_TIMEOUT:-150} torchrun --nproc_per_node=1 -m weave_kernel.bench --no-gpu-state --out $R/bench_ab_$dt.json \
    --ab-csrc $OLD --expert-dtype $dt ${AB_BENCH_ARGS:---models qwen3-30b-a3b,deepseek-v3 --tokens 64,4096 --comm 8 --weave-comm= --no-sequential --repeats 5} \
    > $R/bench_ab_$dt.log 2>&1; echo "bench A/B $dt rc $? [${SECONDS}s]"
  grep -iE "error" $R/bench_ab_$dt.log | head -3
done
tar czf $OUT/ab_dtypes.tgz -C $OUT ab_dtypes
echo "done [${SECONDS}s]"

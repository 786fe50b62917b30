#!/bin/bash
# One 1x H200 call: a change to the kernel's row copies (dispatch by threads, the reduction) against older sources
# (tests/kernel/_ab_old_csrc, carried; see ab_inproc.sh). Builds both (the old one in the background), runs
# gpu_worker --quick, virtual_worker --quick G = 2, 3, 4 and fp8_worker on the working tree, then dispatch_ab.py on
# two virtual ranks once per version (the copy rate per comm CTA: threads and bulk), then `bench --ab-csrc` at
# EP=1 (the reduction; dispatch has no rows to push there). COPY_MODELS, COPY_TOKENS: dispatch_ab's; AB_BENCH_ARGS:
# the A/B's. Logs in $OUT/copy_ab.tgz. Used for docs/kernel.md "Dispatch without a division per chunk".
set -o pipefail
source tests/kernel/device_env.sh  # wheels, environment, has()
R=$OUT/copy_ab; mkdir -p $R
OLD=$PWD/tests/kernel/_ab_old_csrc
build_new_and_old $R $OLD || exit 2  # device_env.sh
quick_tests $R  # device_env.sh
wait; tail -1 $R/build_old.log
for v in new old; do
  c=$PWD/weave_kernel/csrc; [ $v = old ] && c=$OLD
  timeout 150 python3 tests/kernel/dispatch_ab.py --csrc $c --models ${COPY_MODELS:-qwen3-30b-a3b,deepseek-v2} \
    --tokens ${COPY_TOKENS:-4096} --policies static:8,weave:8 --modes threads,bulk --repeats 5 > $R/dispatch_ab_$v.log 2>&1
  echo "dispatch_ab $v rc $? [${SECONDS}s]"; grep -E "GB/s" $R/dispatch_ab_$v.log | head -8
done
timeout 200 torchrun --nproc_per_node=1 -m weave_kernel.bench --no-gpu-state --out $R/bench_ab.json --ab-csrc $OLD \
  ${AB_BENCH_ARGS:---models qwen3-30b-a3b,deepseek-v2-lite,qwen3.5-35b-a3b,phi-3.5-moe,deepseek-v2,deepseek-v3 --tokens 4096,8192 --comm 8 --weave-comm= --no-sequential --repeats 5} \
  > $R/bench_ab.log 2>&1; echo "bench A/B rc $? [${SECONDS}s]"
grep -A3 "interleaved A/B" $R/bench_ab.log
tar czf $OUT/copy_ab.tgz -C $OUT copy_ab
echo "done [${SECONDS}s]"

#!/bin/bash
# One 1x H200 call (about 4 min): does a policy's place in the benchmark's interleaved rounds bias its time? The same
# set (deepseek-v2 and qwen3-30b-a3b at 4096 tokens; static:8/20, weave, weave:4/16/32) timed with bench --order
# interleaved (a fixed order in every round) and --order alternating (rounds forward and backward in turn), then an
# A/B of the tree against docs/results/order/lag_weave_c.patch (weave:C with stealing given weave's GEMM1 lag rule;
# static:8, which the patch leaves alone, is the A/A control). At EP=1 weave:C
# has no rows to dispatch and its comm CTAs steal at once, so it should time as weave does; under the fixed order
# it measured 1.4-4.6% slower, growing with its place (docs/kernel.md "weave:C slower than weave at EP=1").
# Ran 2026-12-03 (docs/results/order/, docs/kernel.md "weave:C slower than weave at EP=1"). Logs and JSON in $OUT.
source tests/kernel/device_env.sh
bash tests/kernel/device_run.sh build 2>&1 | tail -1
for o in interleaved alternating; do
  timeout 70 torchrun --nproc_per_node=1 -m weave_kernel.bench --no-gpu-state --warm-gpu-s 1 --models deepseek-v2,qwen3-30b-a3b \
    --tokens 4096 --comm 8,20 --weave-comm 4,16,32 --no-sequential --repeats 6 --order $o --out $OUT/order_$o.json \
    > $OUT/order_$o.log 2>&1; echo "$o rc $? [${SECONDS}s]"
done
# the other explanation: weave:C with stealing given weave's GEMM1 lag rule (docs/results/order/lag_weave_c.patch), A/B
# against the tree (A = the tree, B = the patch; static:8 is unchanged by it, so its a/b is an A/A control)
L=/tmp/lag_csrc; rm -rf $L; cp -r weave_kernel/csrc $L && patch -s -d $L -p1 < docs/results/order/lag_weave_c.patch || exit 3
timeout 150 torchrun --nproc_per_node=1 -m weave_kernel.bench --no-gpu-state --warm-gpu-s 1 --models deepseek-v2,qwen3-30b-a3b \
  --tokens 4096,8192 --comm 8 --weave-comm 4,8,16,32 --no-sequential --repeats 6 --ab-csrc $L --out $OUT/lag_ab.json \
  > $OUT/lag_ab.log 2>&1
echo "lag A/B rc $? [${SECONDS}s]"; grep -A8 "interleaved A/B" $OUT/lag_ab.log

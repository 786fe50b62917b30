#!/bin/bash
# One 1x H200 call: a kernel change (the working tree) against older sources (tests/kernel/_ab_old_csrc, carried;
# see ab_inproc.sh). Builds both (the old one in the background); on the working tree gpu_worker --quick,
# virtual_worker --quick G = 2, 3, 4, fp8_worker and compute-sanitizer memcheck of gpu_worker --sanitize (AB_MEMCHECK=0:
# not); then the interleaved `bench --ab-csrc` at EP=1 (AB_BENCH_ARGS; sequential, static:8 and weave at 4096 and
# 8192 tokens by default), and one traced weave call per version at 4096 tokens (trace_tiles.py: the tiles' medians,
# also by the tile before them on the same CTA; TRACE_MODELS name:H:I ...). Logs in $OUT/kernel_ab.tgz. Used for
# docs/kernel.md "GEMM0's outputs by bulk copies under the next tile's MMAs" (the change: docs/results/bulk_h/).
set -o pipefail
source tests/kernel/device_env.sh  # wheels, environment, has()
R=$OUT/kernel_ab; mkdir -p $R
OLD=$PWD/tests/kernel/_ab_old_csrc
END=${END_S:-570}
build_new_and_old $R $OLD || exit 2  # device_env.sh
quick_tests $R  # device_env.sh
if [ "${AB_MEMCHECK:-1}" = 1 ]; then
  timeout 120 compute-sanitizer --tool memcheck --report-api-errors no --target-processes all torchrun --nproc_per_node=1 \
    tests/kernel/gpu_worker.py --sanitize > $R/memcheck.log 2>&1
  echo "memcheck rc $? [${SECONDS}s]: $(grep -E 'ERROR SUMMARY' $R/memcheck.log | head -2 | tr '\n' ' ')"
fi
wait; tail -1 $R/build_old.log
timeout $(left 60) torchrun --nproc_per_node=1 -m weave_kernel.bench --no-gpu-state --out $R/bench_ab.json --ab-csrc $OLD \
  ${AB_BENCH_ARGS:---models qwen3-30b-a3b,deepseek-v2-lite,qwen3.5-35b-a3b,phi-3.5-moe,deepseek-v2,deepseek-v3 --tokens 4096,8192 --comm 8 --weave-comm= --repeats 5} \
  > $R/bench_ab.log 2>&1; echo "bench A/B rc $? [${SECONDS}s]"
grep -A4 "interleaved A/B" $R/bench_ab.log
for v in new old; do
  c=$PWD/weave_kernel/csrc; [ $v = old ] && c=$OLD
  for m in ${TRACE_MODELS:-qwen3-30b-a3b:2048:768}; do
    IFS=: read name H I <<< "$m"
    (( $(left) > 20 )) || break
    WEAVE_KERNEL_CSRC=$c timeout $(left 10) torchrun --nproc_per_node=1 -m weave_kernel.bench --no-gpu-state \
      --models $name --tokens 4096 --comm 8 --weave-comm= --no-sequential --repeats 3 --trace $R/trace_${v}_$name.json \
      --trace-policy weave --out $R/tr_${v}_$name.json > $R/tr_${v}_$name.log 2>&1 || echo "trace $v $name failed"
    python3 tests/kernel/trace_tiles.py $R/trace_${v}_$name.json $H $I 2>&1 | sed "s|$R/||" | head -8
  done
done
tar czf $OUT/kernel_ab.tgz -C $OUT kernel_ab
echo "done [${SECONDS}s]"

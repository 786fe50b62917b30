#!/bin/bash
# One 1x H200 call: do FP8 layers take the same time in `bench` and in `fp8_worker.py --bench`? (docs/kernel.md,
# "SwiGLU by tanh.approx": bench's FP8 layers ran 14-18% faster on the large models.) Both harnesses back to back on
# the same board and models, each recording the SM clock (fp8_worker --gpu-state; bench samples it by default), and
# bench once more with --sustained (every policy back to back for HARNESS_SUSTAINED s: the clock a stream of layers
# holds; HARNESS_WORKER=0 leaves fp8_worker out). Then, with STAGES containing decode, fp8_gaps_run.sh's decode stage for DECODE_MODELS.
# Files: $OUT/harness.tgz (the device tool returns few files).
set -o pipefail
STAGES=${STAGES:-harness}
source tests/kernel/device_env.sh  # wheels, environment, has()
bash tests/kernel/device_run.sh build 2>&1 | tail -3
M=${HARNESS_MODELS:-phi-3.5-moe,deepseek-v2,qwen3-30b-a3b}
T=${HARNESS_TOKENS:-2048,8192}
R=$OUT/harness; mkdir -p $R
if has harness; then
  if [ "${HARNESS_WORKER:-1}" = 1 ]; then  # HARNESS_WORKER=0: bench only (a held-out bf16 / FP8 pair for the fit)
    timeout 240 python3 tests/kernel/fp8_worker.py --bench --skip-tests --gpu-state --models $M --tokens $T --reps 5 \
      > $R/fp8_worker.log 2>&1; echo "fp8_worker rc $? [${SECONDS}s]"
    grep -E "^BENCH|geomean" $R/fp8_worker.log
  fi
  for dt in fp8 bf16; do
    timeout 240 torchrun --nproc_per_node=1 -m weave_kernel.bench --models $M --tokens $T --comm 8 --weave-comm= \
      --no-sequential --repeats 5 --sustained ${HARNESS_SUSTAINED:-1} --expert-dtype $dt --out $R/bench_$dt.json \
      > $R/bench_$dt.log 2>&1; echo "bench $dt rc $? [${SECONDS}s]"
  done
  [ -f $R/fp8_worker.log ] && python3 tests/kernel/harness_table.py $R/fp8_worker.log $R/bench_fp8.json \
    $R/bench_bf16.json 2>&1 | tee $R/table.txt
fi
if has decode; then
  mkdir -p $OUT/dec  # fp8_gaps_run.sh packs (and removes) everything in its $OUT
  OUT=$OUT/dec STAGES=decode DECODE_MODELS=${DECODE_MODELS:-qwen3.5-35b-a3b,phi-3.5-moe,deepseek-v2} \
    bash tests/kernel/fp8_gaps_run.sh 2>&1 | tail -24
fi
tar czf $OUT/harness.tgz -C $OUT harness $(cd $OUT && ls -d dec 2>/dev/null)

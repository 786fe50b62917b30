#!/bin/bash
# One device call: does the GPU slow down over a long benchmark sweep, and does the order in which policies are
# timed change the comparison? Builds the kernel, logs nvidia-smi (SM clock, power, temperature, clock-event
# reasons) every 100 ms, and runs the run-B sweep (six models, 2048-8192 tokens, static:8/20, weave, weave:C)
# twice: policies one after the other (`--order policy`, how runs before 2026-12-01 timed) and interleaved (the
# default now). Writes $OUT/drift_$TAG.tgz. Knobs: DRIFT_GPUS (default: all visible), DRIFT_TAG, DRIFT_REPEATS.
set -o pipefail
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1 OMP_NUM_THREADS=4
export TORCH_EXTENSIONS_DIR=/tmp/weave_ext
R=/tmp/drift; mkdir -p $R
G=${DRIFT_GPUS:-$(nvidia-smi -L | wc -l)}; TAG=${DRIFT_TAG:-${G}gpu}; REP=${DRIFT_REPEATS:-5}
M=qwen3-30b-a3b,deepseek-v2-lite,qwen3.5-35b-a3b,phi-3.5-moe,deepseek-v2,deepseek-v3
python -c "from weave_kernel.build import load_extension; load_extension()" > $R/build.log 2>&1 || { tail -20 $R/build.log; exit 1; }
echo "build done [${SECONDS}s]"
nvidia-smi --query-gpu=timestamp,index,clocks.sm,clocks.mem,power.draw,power.limit,temperature.gpu,clocks_event_reasons.active \
  --format=csv,nounits -lms 100 > $R/nvsmi_$TAG.csv 2>&1 &
SMI=$!
bench() { local name=$1; shift; date +%s.%N > $R/$name.t0
  timeout ${DRIFT_TIMEOUT:-260} torchrun --nproc_per_node=$G -m weave_kernel.bench --repeats $REP "$@" --out $R/$name.json \
    > $R/$name.log 2>&1; echo "$name rc $? [${SECONDS}s]"; date +%s.%N > $R/$name.t1; }
bench B_policy_$TAG --order policy --models $M --tokens 2048,4096,8192 --comm 8,20 --weave-comm 4,8,12,16,24,32
bench B_inter_$TAG --models $M --tokens 2048,4096,8192 --comm 8,20 --weave-comm 4,8,12,16,24,32
kill $SMI
python tests/kernel/drift_report.py $R/nvsmi_$TAG.csv $R/B_policy_$TAG.json $R/B_inter_$TAG.json 2>&1 | tee $R/report.txt
(cd $R && tar czf $OUT/drift_$TAG.tgz .)

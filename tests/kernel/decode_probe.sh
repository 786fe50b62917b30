#!/bin/bash
# Decode on the GPUs at hand (EP = every GPU, default 1): where a small layer's time goes. One device call:
# build, the benchmark at 128-512 tokens per GPU (six models, static:4/8/20, weave), then one traced call per
# model of weave and of static:8 at DECODE_TRACE_TOKENS (default 128) and weave-sim timeline-stats of them, over
# the whole call and from the count exchange on. Everything lands in $OUT/decode_$TAG.tgz. Needs $OUT.
set -o pipefail
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1 OMP_NUM_THREADS=4
export TORCH_EXTENSIONS_DIR=${TORCH_EXTENSIONS_DIR:-/tmp/weave_ext}
TAG=${DECODE_TAG:-dec}; R=/tmp/decode_$TAG; mkdir -p $R
NPROC=${NPROC:-$(n=$(nvidia-smi -L 2>/dev/null | wc -l); (( n > 8 )) && n=8; (( n < 1 )) && n=1; echo $n)}
M=${DECODE_MODELS:-qwen3-30b-a3b,deepseek-v2-lite,qwen3.5-35b-a3b,phi-3.5-moe,deepseek-v2,deepseek-v3}
T=${DECODE_TRACE_TOKENS:-128}
OUT=$R bash tests/kernel/device_run.sh build 2>&1 | tail -3
bench() { local name=$1; shift; timeout ${BENCH_TIMEOUT:-240} torchrun --nproc_per_node=$NPROC -m weave_kernel.bench "$@" \
  --out $R/$name.json > $R/$name.log 2>&1; echo "$name rc $? [${SECONDS}s]"; }
[ -n "${DECODE_NO_GRID:-}" ] || bench bench_decode_$TAG --models $M --tokens ${DECODE_TOKENS:-128,256,512} --comm 4,8,20 \
  --weave-comm= --repeats ${DECODE_REPEATS:-5}
for m in ${M//,/ }; do
  for pol in weave static:8; do
    bench trace_${m}_${pol/:/}_$TAG --models $m --tokens $T --comm 8 --weave-comm= --no-sequential --repeats 2 \
      --warm-gpu-s 0.5 --trace $R/trace_${m}_${pol/:/}_$T.json --trace-policy $pol
  done
done
{ echo "# whole call"; python3 -m weave_sim.cli timeline-stats $R/trace_*_$T.json
  echo; echo "# from the count exchange"; python3 -m weave_sim.cli timeline-stats --from count_exchange $R/trace_*_$T.json; } \
  > $R/timeline_stats_$TAG.txt 2>&1
cat $R/timeline_stats_$TAG.txt | cut -c1-200
tar czf $OUT/decode_$TAG.tgz -C /tmp decode_$TAG

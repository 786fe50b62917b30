#!/bin/bash
# One 1x H200 call (about 8 min): the FP8 instance with half tiles (sources 9acca5f0, PTX-identical to the measured
# 0f660e73; docs/kernel.md "Half tiles in FP8") at scale and held out: random FP8 layers (fuzz_worker --fp8, small
# and of the presets' size), then run S8
# (seed 8, FP8 experts, six models x {2048, 4096, 8192}, static:8/20, weave, the reference; bench-style, rounds
# alternating, then --sustained 1.0), then the same in bf16 in its own process for as long as the call has left (bench
# writes its results after every configuration). Files in $OUT/fp8_half_results. Knobs: END_S (seconds for the
# whole script).
set -o pipefail
source tests/kernel/device_env.sh
R=$OUT/fp8_half_results; mkdir -p $R
END=${END_S:-570}
M=$SIX_MODELS
build_tree $R
timeout 80 python3 tests/kernel/fuzz_worker.py --fp8 --seed 31 --cases 100000 --budget-s 60 > $R/fuzz_fp8_seed31.log 2>&1
echo "fuzz --fp8 rc $? [${SECONDS}s]"; grep -E "^FAIL|SUMMARY" $R/fuzz_fp8_seed31.log | tail -2
timeout 60 python3 tests/kernel/fuzz_worker.py --fp8 --big --seed 32 --cases 100000 --budget-s 40 > $R/fuzz_fp8_big_seed32.log 2>&1
echo "fuzz --fp8 --big rc $? [${SECONDS}s]"; grep -E "^FAIL|SUMMARY" $R/fuzz_fp8_big_seed32.log | tail -2
timeout $(left) torchrun --nproc_per_node=1 -m weave_kernel.bench --repeats 4 --expert-dtype fp8 --models $M \
  --tokens 2048,4096,8192 --comm 8,20 --weave-comm= --no-sequential --seed 8 --sustained 1.0 \
  --out $R/bench_S8_fp8.json > $R/S8_fp8.log 2>&1
echo "S8 fp8 rc $? [${SECONDS}s]"; grep -E "^geomean \(all|fraction of the lower bound|choice ==" $R/S8_fp8.log | cut -c1-220
timeout $(left) torchrun --nproc_per_node=1 -m weave_kernel.bench --repeats 4 --models $M \
  --tokens 2048,4096,8192 --comm 8,20 --weave-comm= --no-sequential --seed 8 --sustained 1.0 \
  --out $R/bench_S8_bf16.json > $R/S8_bf16.log 2>&1
echo "S8 bf16 rc $? [${SECONDS}s]"; grep -E "^geomean \(all|fraction of the lower bound|choice ==" $R/S8_bf16.log | cut -c1-220
echo "done [${SECONDS}s]"

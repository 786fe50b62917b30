#!/bin/bash
# One device-machine session: build once, GPU correctness (all GPUs and 1 rank; virtual ranks for world sizes the
# machine lacks), GEMM probe, benchmark, sanitizer.
# Usage: bash tests/kernel/device_run.sh STAGES   (STAGES: any of build,test2,test1,virtual,fuzz,probe,fp8tile,bench,sanitize,summary;
# they run in that order). Needs $OUT (logs land there). Bench arguments come from $BENCH_ARGS, its JSON goes to
# $BENCH_OUT (default $OUT/kernel_bench.json). SAN_BEFORE_S: run the sanitizer only if fewer seconds than this
# have passed since the script started (default: always).
set -o pipefail
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export TORCH_EXTENSIONS_DIR=${TORCH_EXTENSIONS_DIR:-/tmp/weave_ext} MAX_JOBS=16 PYTHONUNBUFFERED=1
export OMP_NUM_THREADS=4
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}  # the scripts in tests/kernel import weave_kernel from the tree
STAGES=${1:-build,test2,test1,probe,bench}
# ranks for test2 and bench: every GPU of the machine (at most 8), or $NPROC
NPROC=${NPROC:-$(n=$(nvidia-smi -L 2>/dev/null | wc -l); (( n > 8 )) && n=8; (( n < 1 )) && n=1; echo $n)}
BENCH_OUT=${BENCH_OUT:-$OUT/kernel_bench.json}
has() { [[ ",$STAGES," == *",$1,"* ]]; }
date -u; nvidia-smi --query-gpu=name,driver_version,clocks.sm --format=csv,noheader
if has build; then
  /usr/bin/time -f "build %e s" python3 -c "from weave_kernel.build import load_extension; load_extension(False)" 2>&1 | tail -3 | tee $OUT/build.log || exit 1
  so=$(ls $TORCH_EXTENSIONS_DIR/*/weave_moe_ext*.so | head -1)
  echo "SASS: $(cuobjdump -sass $so | grep -c HGMMA) HGMMA, $(cuobjdump -sass $so | grep -c ' HMMA') HMMA" | tee -a $OUT/build.log
fi
if has test2; then
  timeout ${TEST2_TIMEOUT:-400} torchrun --nproc_per_node=$NPROC tests/kernel/gpu_worker.py --trace-dir /tmp > $OUT/test2.log 2>&1; echo "test2 rc $? [${SECONDS}s]"
  echo "test2: $(grep -c '^PASS' $OUT/test2.log) PASS lines, $(grep -c '^FAIL' $OUT/test2.log) FAIL lines"
  grep -E "^FAIL|^  rank|SUMMARY|CHOICE AGREEMENT|weave timeline|Error" $OUT/test2.log | cut -c1-240 | head -20
fi
if has test1; then
  timeout ${TEST1_TIMEOUT:-200} torchrun --nproc_per_node=1 tests/kernel/gpu_worker.py --quick > $OUT/test1.log 2>&1; echo "test1 rc $? [${SECONDS}s]"
  grep -E "^FAIL|SUMMARY|CHOICE AGREEMENT|Error" $OUT/test1.log | cut -c1-200 | tail -8
fi
if has virtual; then  # world sizes 2, 3, 4, 8 as virtual ranks on GPU 0 (correctness only)
  timeout ${VIRTUAL_TIMEOUT:-400} python3 tests/kernel/virtual_worker.py --worlds ${VIRTUAL_WORLDS:-2,3,4,8} > $OUT/virtual.log 2>&1
  echo "virtual rc $? [${SECONDS}s]: $(grep -c '^PASS' $OUT/virtual.log) PASS lines, $(grep -c '^FAIL' $OUT/virtual.log) FAIL lines"
  grep -E "^FAIL|SUMMARY|CHOICE AGREEMENT|Error" $OUT/virtual.log | cut -c1-240 | head -20
fi
if has fuzz; then  # random layers on virtual ranks (fuzz_worker.py); FUZZ_SEED (default: random), FUZZ_BUDGET_S
  seed=${FUZZ_SEED:-$RANDOM}
  timeout ${FUZZ_TIMEOUT:-400} python3 tests/kernel/fuzz_worker.py --cases ${FUZZ_CASES:-100000} --seed $seed \
    --budget-s ${FUZZ_BUDGET_S:-240} > $OUT/fuzz.log 2>&1
  echo "fuzz seed $seed rc $? [${SECONDS}s]: $(grep -c '^PASS case' $OUT/fuzz.log) cases passed, $(grep -c '^FAIL case' $OUT/fuzz.log) failed"
  grep -E "^FAIL|SUMMARY|CHOICE AGREEMENT|Error" $OUT/fuzz.log | cut -c1-240 | head -20
fi
if has fp8tile; then  # tile_limits' FP8 modes against the bf16 tile, sustained at the power cap (docs/kernel.md "FP8 experts")
  nvcc -std=c++17 -gencode=arch=compute_90a,code=sm_90a -O3 -DNDEBUG --expt-relaxed-constexpr -I weave_kernel/csrc \
    tests/kernel/tile_limits.cu -o /tmp/tile_limits > $OUT/fp8tile.log 2>&1 || { echo "fp8tile: build failed"; tail -5 $OUT/fp8tile.log; }
  # FP8TILE_CFGS: "K E rows" configurations separated by | (tile_limits needs rows in multiples of 256: its 2-CTA modes
  # pair row blocks)
  IFS='|' read -ra cfgs <<< "${FP8TILE_CFGS:-4096 4 2048|2048 64 256|7168 32 256}"
  for cfg in "${cfgs[@]}"; do
    echo "== K E rows = $cfg" >> $OUT/fp8tile.log
    TL_SUSTAIN=${FP8TILE_SUSTAIN_S:-4} TL_SUSTAIN_MODES=${FP8TILE_MODES:-7,14,16,17} timeout 200 /tmp/tile_limits $cfg >> $OUT/fp8tile.log 2>&1
    echo "rc $?" >> $OUT/fp8tile.log
  done
  echo "fp8tile [${SECONDS}s]"; grep -E "^== |vs host product|^(7|14|15|16|17) |error|rc [1-9]" $OUT/fp8tile.log | cut -c1-160
fi
if has probe; then
  timeout 200 torchrun --nproc_per_node=1 -m weave_kernel.gemm_probe 2>&1 | grep -v Warning | tee $OUT/probe.log | tail -5
fi
if has bench; then
  timeout ${BENCH_TIMEOUT:-400} torchrun --nproc_per_node=$NPROC -m weave_kernel.bench --out $BENCH_OUT $BENCH_ARGS > $OUT/bench.log 2>&1; echo "bench rc $? [${SECONDS}s]"
  grep -E "Error|error" $OUT/bench.log | head -5
fi
if has sanitize && (( SECONDS < ${SAN_BEFORE_S:-1000000} )); then
  for tool in memcheck racecheck; do
    timeout ${SAN_TIMEOUT:-150} compute-sanitizer --tool $tool --report-api-errors no --target-processes all torchrun --nproc_per_node=1 tests/kernel/gpu_worker.py --sanitize > /tmp/sanitize_$tool.log 2>&1
    echo "sanitize $tool rc $? [${SECONDS}s]" | tee -a $OUT/sanitize.log
    grep -E "ERROR SUMMARY|RACECHECK SUMMARY|SUMMARY|PASS|FAIL|Invalid|Race|access at" /tmp/sanitize_$tool.log | head -40 >> $OUT/sanitize.log
    grep -E "ERROR SUMMARY|RACECHECK SUMMARY|FAIL" /tmp/sanitize_$tool.log | head -3
    (( SECONDS < ${SAN_BEFORE_S:-1000000} )) || break
  done
  # racecheck's blind spot (docs/kernel.md, "Settled"): a correct program it reports after unequal named-barrier
  # counts per warpgroup. Recorded with every sanitizer run, so a hazard in the kernel log can be read against it.
  if nvcc -std=c++17 -arch=sm_90a -o /tmp/racecheck_named_bars tests/kernel/racecheck_named_bars.cu; then
    for pq in "3 3" "5 3"; do
      echo "racecheck repro P Q = $pq: $(compute-sanitizer --tool racecheck /tmp/racecheck_named_bars $pq 2>&1 \
        | grep -E 'PASS|FAIL|RACECHECK SUMMARY' | tr '\n' ' ')" | tee -a $OUT/sanitize.log
    done
  fi
fi
if has summary; then
  echo "== [${SECONDS}s] summary"; grep -E "SUMMARY|CHOICE AGREEMENT" $OUT/test2.log $OUT/test1.log 2>/dev/null
  sed -n '/best weave:C/,$p' $OUT/bench.log | cut -c1-200
fi

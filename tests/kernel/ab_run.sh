#!/bin/bash
# (Kept for the results that name it; new A/Bs: tests/kernel/ab_inproc.sh, which times both versions in one process
# with bench --ab-csrc, on any number of GPUs.)
# One device call that checks a kernel change against an older version of the kernel in the same session:
# build both versions (the old one in the background), the GPU tests on the working tree (2 ranks, and 1 rank
# unless AB_TEST1=0; AB_TEST2=0 skips the 2-rank tests), the same reduced benchmark on the new and on the old kernel, then a summary
# (compare_bench.py old vs new). Needs $OUT. The old sources must be in the working tree before the call (the
# device copy has no .git), e.g. for commit 9c0f8fa:
#   mkdir -p tests/kernel/_ab_old_csrc && for f in $(git ls-files weave_kernel/csrc); do
#     git show 9c0f8fa:$f > tests/kernel/_ab_old_csrc/$(basename $f); done     # git ignores the folder:
#   name it in the device tool's carry list, e.g. carry ["tests/kernel/_ab_old_csrc"]
# Sources the old version lacks are built as empty files. Knobs: AB_BENCH_ARGS (benchmark arguments, both
# versions), END_S (seconds for the whole script), AB_PROBE=1 (GEMM probe of both, after both builds), AB_SANITIZE=1.
# Used for "wgmma serialisation fixed" and "rows packed per expert" in docs/kernel.md.
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1 OMP_NUM_THREADS=4
export TORCH_EXTENSIONS_DIR=/tmp/weave_ext
OLD=${AB_OLD_CSRC:-$PWD/tests/kernel/_ab_old_csrc}
END=${END_S:-280}
BENCH_ARGS=${AB_BENCH_ARGS:---models qwen3-30b-a3b,deepseek-v2-lite,qwen3.5-35b-a3b,phi-3.5-moe,deepseek-v2,deepseek-v3 --tokens 4096 --comm 8,20 --repeats 3}
left() { local r=$((END - SECONDS)); echo $(( r < 5 ? 5 : r )); }
for s in $(python3 -c "from weave_kernel.build import SOURCES; print(*SOURCES)"); do [ -f $OLD/$s ] || : > $OLD/$s; done
( TORCH_EXTENSIONS_DIR=/tmp/ext_old WEAVE_KERNEL_CSRC=$OLD MAX_JOBS=8 timeout 200 \
  python3 -c "from weave_kernel.build import load_extension; load_extension(False)" > $OUT/build_old.log 2>&1
  echo "old build rc $? [${SECONDS}s]" >> $OUT/build_old.log ) &
STAGES=build; [ "${AB_TEST2:-1}" = 1 ] && STAGES=$STAGES,test2; [ "${AB_TEST1:-1}" = 1 ] && STAGES=$STAGES,test1
TEST2_TIMEOUT=150 timeout $(left) bash tests/kernel/device_run.sh $STAGES > $OUT/stage1.log 2>&1
echo "stage1 rc $? [${SECONDS}s]" >> $OUT/stage1.log
wait
if [ "${AB_PROBE:-0}" = 1 ]; then
  timeout 60 torchrun --nproc_per_node=1 -m weave_kernel.gemm_probe > $OUT/probe.log 2>&1
  TORCH_EXTENSIONS_DIR=/tmp/ext_old WEAVE_KERNEL_CSRC=$OLD timeout 60 torchrun --nproc_per_node=1 \
    -m weave_kernel.gemm_probe > $OUT/probe_old.log 2>&1
fi
timeout $(left) torchrun --nproc_per_node=2 -m weave_kernel.bench --out $OUT/bench_new.json $BENCH_ARGS \
  > $OUT/bench_new.log 2>&1; echo "bench new rc $? [${SECONDS}s]" >> $OUT/bench_new.log
TORCH_EXTENSIONS_DIR=/tmp/ext_old WEAVE_KERNEL_CSRC=$OLD timeout $(left) torchrun --nproc_per_node=2 \
  -m weave_kernel.bench --out $OUT/bench_old.json $BENCH_ARGS > $OUT/bench_old.log 2>&1
echo "bench old rc $? [${SECONDS}s]" >> $OUT/bench_old.log
if [ "${AB_SANITIZE:-0}" = 1 ]; then
  SAN_TIMEOUT=$(( $(left) / 2 )) bash tests/kernel/device_run.sh sanitize > $OUT/sanitize_stage.log 2>&1
fi
echo "===== summary [${SECONDS}s]"
grep -hE "^build|SASS|rc |test2:|SUMMARY|CHOICE" $OUT/stage1.log | cut -c1-200
tail -2 $OUT/build_old.log | cut -c1-200
grep -hE "^FAIL|Error" $OUT/stage1.log $OUT/test2.log $OUT/test1.log 2>/dev/null | head -5 | cut -c1-200
grep -hE "^FAIL|Error" $OUT/bench_new.log $OUT/bench_old.log | head -3; tail -qn1 $OUT/bench_new.log $OUT/bench_old.log
[ -f $OUT/sanitize_stage.log ] && grep -hE "SUMMARY|rc " $OUT/sanitize_stage.log
[ -f $OUT/probe.log ] && { echo "--- probe new"; grep -vE "Warning|warn" $OUT/probe.log | tail -4;
  echo "--- probe old"; grep -vE "Warning|warn" $OUT/probe_old.log | tail -4; }
echo "--- bench old (before) vs new (after), same session"
python3 tests/kernel/compare_bench.py $OUT/bench_old.json $OUT/bench_new.json 2>&1 | tail -40

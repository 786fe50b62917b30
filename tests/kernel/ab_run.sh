#!/bin/bash
# One device call that checks a kernel change against an older version of the kernel in the same session:
# build (both versions, the old one in the background), the 2-rank GPU tests on the working tree, the GEMM probe
# of the new and of the old kernel back to back, a reduced benchmark, then a summary (compare_bench.py against
# docs/results/kernel_bench_weave.json). Needs $OUT. The old sources must be in the working tree before the
# call (the device copy has no .git), e.g. for commit 5e54621:
#   mkdir -p tests/kernel/_ab_old_csrc && for f in $(git ls-files weave_kernel/csrc); do
#     git show 5e54621:$f > tests/kernel/_ab_old_csrc/$(basename $f); done     # (delete it afterwards)
# Used for the "wgmma serialisation fixed" section of docs/kernel.md (END_S=280, 72 s of command time).
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1 OMP_NUM_THREADS=4
export TORCH_EXTENSIONS_DIR=/tmp/weave_ext
END=${END_S:-280}
left() { local r=$((END - SECONDS)); echo $(( r < 5 ? 5 : r )); }
( TORCH_EXTENSIONS_DIR=/tmp/ext_old WEAVE_KERNEL_CSRC=${AB_OLD_CSRC:-$PWD/tests/kernel/_ab_old_csrc} MAX_JOBS=8 timeout 150 \
  python3 -c "from weave_kernel.build import load_extension; load_extension(False)" > $OUT/build_old.log 2>&1
  echo "old build rc $? [${SECONDS}s]" >> $OUT/build_old.log ) &
TEST2_TIMEOUT=100 timeout $(left) bash tests/kernel/device_run.sh build,test2 > $OUT/stage1.log 2>&1
echo "stage1 rc $? [${SECONDS}s]" >> $OUT/stage1.log
timeout 60 torchrun --nproc_per_node=1 -m weave_kernel.gemm_probe > $OUT/probe.log 2>&1; echo "probe rc $? [${SECONDS}s]" >> $OUT/probe.log
wait
TORCH_EXTENSIONS_DIR=/tmp/ext_old WEAVE_KERNEL_CSRC=${AB_OLD_CSRC:-$PWD/tests/kernel/_ab_old_csrc} timeout 60 \
  torchrun --nproc_per_node=1 -m weave_kernel.gemm_probe > $OUT/probe_old.log 2>&1; echo "probe_old rc $? [${SECONDS}s]" >> $OUT/probe_old.log
timeout $(left) torchrun --nproc_per_node=2 -m weave_kernel.bench --out $OUT/kernel_bench_fix.json \
  --models qwen3-30b-a3b,deepseek-v2-lite,qwen3.5-35b-a3b,phi-3.5-moe,deepseek-v2,deepseek-v3 \
  --tokens 4096 --comm 8,20 --repeats 3 > $OUT/bench.log 2>&1; echo "bench rc $? [${SECONDS}s]" >> $OUT/bench.log
echo "===== summary [${SECONDS}s]"
grep -hE "^build|SASS|rc |test2:|SUMMARY|CHOICE" $OUT/stage1.log | cut -c1-200
tail -2 $OUT/build_old.log | cut -c1-200
grep -hE "^FAIL|Error" $OUT/stage1.log $OUT/test2.log 2>/dev/null | head -5 | cut -c1-200
grep -hE "^FAIL" $OUT/bench.log | head -3; tail -1 $OUT/bench.log
echo "--- probe NEW"; grep -vE "Warning|warn" $OUT/probe.log | tail -5
echo "--- probe OLD (HEAD)"; grep -vE "Warning|warn" $OUT/probe_old.log | tail -5
echo "--- bench before (docs/results/kernel_bench_weave.json) vs after"
python3 tests/kernel/compare_bench.py docs/results/kernel_bench_weave.json $OUT/kernel_bench_fix.json --tokens 4096 2>&1 | tail -60

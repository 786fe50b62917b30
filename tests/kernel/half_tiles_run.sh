#!/bin/bash
# One 1x H200 call (about 4 min): half tiles, second form (docs/results/half_tiles_power/half_tiles_v2.patch), against
# the tree. The first form lost 8% bench-style because ptxas serialised every wgmma (C7511, register resources);
# the second chooses between two copies of the k loop once per tile and leaves the shared-expert instance without
# half tiles, and compiles without the warning (not run on a GPU yet). The question is the steady state at the power
# cap: the first form, 11% slower per tile, was still 1.5-3.1% faster sustained on three of four qwen3.5-35b-a3b / deepseek-v3 configurations
# (docs/kernel.md "Half tiles at the power cap"). The patched copy is built under its own name; on it gpu_worker
# --quick, virtual ranks G = 2, 4, fp8_worker (device_env.sh quick_tests) and compute-sanitizer memcheck; then bench --ab-csrc (A = the tree, B = the patch)
# with --ab-sustained 1.0 on the six models at 2048 and 4096 tokens. Logs in $OUT/half_tiles.
# Ran on 2026-12-03 (docs/results/half_tiles_power/v2/) and the patch is the kernel since: this script applies to
# the tree of commit be4f920 (sources e47fbc11) only, and stops with "patch failed" on later ones.
source tests/kernel/device_env.sh
R=$OUT/half_tiles; mkdir -p $R
P=/tmp/half_tiles_csrc; rm -rf $P; cp -r weave_kernel/csrc $P
( cd $P && patch -s -p3 < $OLDPWD/docs/results/half_tiles_power/half_tiles_v2.patch ) || { echo "patch failed"; exit 3; }
bash tests/kernel/device_run.sh build 2>&1 | tail -1  # the tree (A)
export WEAVE_KERNEL_CSRC=$P TORCH_EXTENSIONS_DIR=/tmp/weave_ext_half  # the patch (B), its own build dir (build.py)
quick_tests $R 2,4  # device_env.sh: gpu_worker --quick, virtual ranks, fp8_worker (on the patch)
timeout 120 compute-sanitizer --tool memcheck --report-api-errors no --target-processes all torchrun --nproc_per_node=1 \
  tests/kernel/gpu_worker.py --sanitize > $R/memcheck.log 2>&1
echo "memcheck (patch) rc $? [${SECONDS}s]: $(grep -E 'ERROR SUMMARY' $R/memcheck.log | head -1)"
unset WEAVE_KERNEL_CSRC; export TORCH_EXTENSIONS_DIR=/tmp/weave_ext
timeout 300 torchrun --nproc_per_node=1 -m weave_kernel.bench --no-gpu-state --out $R/bench_ab.json --ab-csrc $P \
  --models qwen3-30b-a3b,deepseek-v2-lite,qwen3.5-35b-a3b,phi-3.5-moe,deepseek-v2,deepseek-v3 --tokens 2048,4096 \
  --comm 20 --weave-comm= --no-sequential --repeats 4 --ab-sustained 1.0 > $R/bench_ab.log 2>&1
echo "bench A/B rc $? [${SECONDS}s]"; grep -A5 "interleaved A/B" $R/bench_ab.log

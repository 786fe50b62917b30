#!/bin/bash
# racecheck on the kernel before and after a change, twice each, on the same tiny case (gpu_worker --sanitize),
# after building both and running gpu_worker --quick on the working tree. A hazard that the old sources show too is
# not the change's. Needs $OUT and the old sources in tests/kernel/_ab_old_csrc (how to fill it: ab_inproc.sh).
# Used for docs/kernel.md "The choice off the critical path"; prints one line per run into $OUT/race_ab.txt.
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
( TORCH_EXTENSIONS_DIR=/tmp/ext_old WEAVE_KERNEL_CSRC=$PWD/tests/kernel/_ab_old_csrc python3 -c "from weave_kernel.build import load_extension; load_extension(False)" > /dev/null 2>&1 ) &
bash tests/kernel/device_run.sh build,test1 2>&1 | tail -4
wait
for i in 1 2; do
  for v in new old; do
    if [ $v = old ]; then E="TORCH_EXTENSIONS_DIR=/tmp/ext_old WEAVE_KERNEL_CSRC=$PWD/tests/kernel/_ab_old_csrc"; else E="TORCH_EXTENSIONS_DIR=/tmp/weave_ext"; fi
    env $E timeout 150 compute-sanitizer --tool racecheck --report-api-errors no --target-processes all torchrun --nproc_per_node=1 tests/kernel/gpu_worker.py --sanitize > /tmp/rc_${v}_$i.log 2>&1
    echo "racecheck $v #$i rc $?: $(grep -E 'RACECHECK SUMMARY|^SUMMARY' /tmp/rc_${v}_$i.log | tr '\n' ' ') $(grep -oE 'in [a-z_]+\.cuh:[0-9]+' /tmp/rc_${v}_$i.log | sort | uniq -c | tr '\n' ' ')" | tee -a $OUT/race_ab.txt
  done
done

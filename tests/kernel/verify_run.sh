#!/bin/bash
# One 1x H200 call after a small kernel change whose A/B already ran (ab_dtypes.sh): random layers on virtual ranks
# in bf16 and FP8 for FUZZ_BUDGET_S each (fresh seeds, printed), then compute-sanitizer memcheck and synccheck on
# fp8_worker --virtual-only. Logs in $OUT/verify.tgz.
set -o pipefail
source tests/kernel/device_env.sh  # wheels, environment, has()
R=$OUT/verify; mkdir -p $R
bash tests/kernel/device_run.sh build 2>&1 | tail -2
python3 -c "import weave_kernel.build as b; print('csrc', b.sources_digest())" | tee $R/csrc.txt
for kind in bf16 fp8; do
  seed=${FUZZ_SEED:-$RANDOM}; extra=""; [ $kind = fp8 ] && extra=--fp8
  timeout $(( ${FUZZ_BUDGET_S:-60} + 60 )) python3 tests/kernel/fuzz_worker.py --cases 100000 --seed $seed \
    --budget-s ${FUZZ_BUDGET_S:-60} $extra > $R/fuzz_$kind.log 2>&1
  echo "fuzz $kind seed $seed rc $? [${SECONDS}s]: $(grep -c '^PASS case' $R/fuzz_$kind.log) cases passed, $(grep -c '^FAIL case' $R/fuzz_$kind.log) failed"
  grep -E "^FAIL|SUMMARY|CHOICE AGREEMENT" $R/fuzz_$kind.log | cut -c1-200 | head -5
done
for tool in ${SAN_TOOLS:-memcheck synccheck}; do
  timeout 150 compute-sanitizer --tool $tool --report-api-errors no python3 tests/kernel/fp8_worker.py --virtual-only \
    > $R/${tool}_fp8_virtual.log 2>&1
  echo "$tool rc $? [${SECONDS}s]: $(grep -E 'ERROR SUMMARY|SUMMARY:' $R/${tool}_fp8_virtual.log | tr '\n' ' ')"
done
tar czf $OUT/verify.tgz -C $OUT verify

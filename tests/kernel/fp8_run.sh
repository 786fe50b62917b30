set -o pipefail
source tests/kernel/device_env.sh  # wheels, environment
bash tests/kernel/device_run.sh build,test1 2>&1 | tail -6
so=$(ls $TORCH_EXTENSIONS_DIR/*/weave_moe_ext*.so | head -1)
cuobjdump -sass -fun '_ZN5weave16weave_moe_kernelILb0ELb1EEEvNS_6ParamsE' $so > $OUT/sass_fp8.txt 2>&1
echo "fp8 SASS: $(grep -c HGMMA $OUT/sass_fp8.txt) HGMMA, $(grep -c 'STL' $OUT/sass_fp8.txt) STL, $(grep -c 'LDL' $OUT/sass_fp8.txt) LDL"
awk '/HGMMA/{h=NR} /STL|LDL/{print NR": "$0" (last HGMMA line "h")"}' $OUT/sass_fp8.txt | head -40 > $OUT/sass_fp8_spills.txt
timeout ${FP8_TIMEOUT:-400} python3 tests/kernel/fp8_worker.py $FP8_ARGS > $OUT/fp8.log 2>&1; echo "fp8_worker rc $?"
grep -E "^FAIL|SUMMARY|Error|error" $OUT/fp8.log | head -20
grep -E "^PASS" $OUT/fp8.log | cut -c1-170 | head -40
sed -n '/^model /,$p' $OUT/fp8.log
gzip -f $OUT/sass_fp8.txt

#!/bin/bash
# CPU side of tests/kernel/ep1_refit_run.sh: the shipped EP=1 profiles refitted to a new kernel's runs with their
# shipped commands (docs/results.md "Since these runs: a faster kernel, EP=1 only"; the fits' logs in
# docs/results/decision/fit_ep1.log), the new calibration standing in for the older tile-by-K and concurrency files,
# the new traces for the choice's cost; then the FP8 tile factor amended from the FP8 pairs of before
# (docs/results/fp8_harness/fit_*.txt) and e47fbc11's (final_run.sh F8 / F8BF), and every held-out run validated
# with the shipped and the refitted profiles. The power-model profile is fitted to the seed-0 run and the 66-CTA run
# together (merged by tests/kernel/merge_bench.py into DIR/kernel_bench_ep1_seed0_66ctas_TAG.json): fitted to seed 0
# alone it predicted the 66- and 32-CTA runs 7% fast (docs/results.md "The EP=1 profiles refitted to the current
# kernel"; that first fit is DIR/refit/ of e47, the shipped one DIR/refit_merged/).
# Usage: bash tests/kernel/refit_ep1.sh DIR TAG   (DIR: the unpacked ep1_refit_TAG folder)
# Writes DIR/refit/{h200-megakernel-ep1,h200-megakernel-power-ep1}.json, fit logs, validate_*.txt and summary.txt.
# The two fits run side by side (one worker each): about 20-40 min on the 2-core machine.
set -euo pipefail
DIR=${1:?results folder}; TAG=${2:?tag}
O=$DIR/refit; mkdir -p $O
FIT=$DIR/kernel_bench_ep1_seed0_$TAG.json CAL=$DIR/calib_$TAG.json
[ -f "$FIT" ] && [ -f "$CAL" ] || { echo "need $FIT and $CAL"; exit 2; }
MERGED=$DIR/kernel_bench_ep1_seed0_66ctas_$TAG.json
[ -f "$MERGED" ] || python3 tests/kernel/merge_bench.py $MERGED $FIT $DIR/kernel_bench_ep1_66ctas_seed2_$TAG.json
TRACES=($DIR/traces_$TAG.tgz)  # the traced calls, archived (weave-sim calibrate --decision reads an archive's members)
[ -f "${TRACES[0]}" ] || TRACES=($DIR/traces/trace_*.json)
FP8_PAIRS=(docs/results/fp8_harness/bench_bf16.json:docs/results/fp8_harness/bench_fp8.json
  docs/results/swiglu_tanh/ab/bench_ab_bf16.json:docs/results/swiglu_tanh/ab/bench_ab_fp8.json
  docs/results/swiglu_tanh/ab_prefill/bench_ab_bf16.json:docs/results/swiglu_tanh/ab_prefill/bench_ab_fp8.json
  docs/results/swiglu_tanh/decode/decode_bf16.json:docs/results/swiglu_tanh/decode/decode_fp8.json
  docs/results/fp8/e47/bench_F8bf_1xh200_e47.json:docs/results/fp8/e47/bench_F8_1xh200_e47.json)  # e47fbc11's own pair
fit() {  # name, the fitted run, then the fit's own arguments
  local name=$1 run=$2; shift 2
  weave-sim calibrate --fit $run "$@" --decision "${TRACES[@]}" --name $name --workers 1 -o $O/$name.json
  weave-sim calibrate --amend $O/$name.json --fp8 "${FP8_PAIRS[@]}" --workers 1 -o $O/$name.json
}
fit h200-megakernel-ep1 $FIT --base h200-megakernel-ep2 --gemm-concurrency $CAL \
  --fit-params gemm_scale,fixed_us,barrier_us,conc_exp > $O/fit_h200-megakernel-ep1.log 2>&1 &
fit h200-megakernel-power-ep1 $MERGED --base h200-megakernel-power --gemm-k $CAL \
  --fit-params gemm_scale,fixed_us,barrier_us > $O/fit_h200-megakernel-power-ep1.log 2>&1 &
wait
RUNS=$(ls $DIR/kernel_bench_ep1_*_$TAG.json | grep -v "^$MERGED\$")  # the runs as measured (the merge is not one)
for run in $RUNS; do
  r=$(basename $run .json); r=${r#kernel_bench_}
  for prof in h200-megakernel-ep1 h200-megakernel-power-ep1; do
    weave-sim validate $run --profile $prof --workers 2 --out $O/validate_shipped_${prof}_$r > $O/validate_shipped_${prof}_$r.txt 2>&1
    weave-sim validate $run --profile $O/$prof.json --workers 2 --out $O/validate_refit_${prof}_$r > $O/validate_refit_${prof}_$r.txt 2>&1
  done
done
for run in $RUNS; do
  r=$(basename $run .json); r=${r#kernel_bench_}
  for prof in h200-megakernel-ep1 h200-megakernel-power-ep1; do
    echo "== $r, $prof"
    python3 tests/kernel/compare_validate.py $O/validate_shipped_${prof}_$r/validate.json \
      $O/validate_refit_${prof}_$r/validate.json --labels shipped,refit
  done
done | tee $O/summary.txt

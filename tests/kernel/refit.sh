#!/bin/bash
# CPU side of a results run (after tests/kernel/final_run.sh on the GPU machine): profiles from the new
# measurements, the fit on run A, the held-out validation on run B, the results tables and the EP=4/8
# expectations, all with the same tag. Usage: bash tests/kernel/refit.sh DIR TAG [POWER_JSON]
#   DIR: the unpacked results_TAG.tgz (bench_A_TAG.json, bench_B_TAG.json, optional calib_TAG.json)
#   POWER_JSON: a measurements file with a power block (default: DIR/calib_TAG.json if it has one)
# Writes DIR/refit/: h200-calibrated-TAG.json, h200-megakernel-TAG.json (fixed clock, as the kernel's cost table
# assumes) + -power-TAG.json (the power model without its board-dependent HBM term; with the tiles' fixed cost by K when
# the calibration measured it, gemm_by_k) and, with a decode run, -power-pad-TAG.json (below), validate_*/, tables,
# gap_TAG.txt; with
# DIR/calib_bulk_TAG.json (final_run.sh run D) also h200-calibrated-bulk-TAG.json, the push curve of bulk dispatch;
# with FP8 runs in DIR (runs F8 / F8D: bench_F8*_*.json) each one against its bf16 twin and validated, and the FP8
# tile factor fitted to the pairs (-fp8-TAG.json profiles).
# With traces of weave in DIR (final_run.sh run traces / traces_fitted: trace_*weave_*.json) the profiles charge weave's
# choice what their choose records measured (weave-sim calibrate --decision); else the base profile's figure. The
# default-routing ones (trace_weave_*.json) also give a dispatch piece's fixed cost: refit/piece_cost_TAG.json.
# About 10-20 min on the 2-core CPU machine (the fits are golden-section searches over simulated layers).
set -euo pipefail
DIR=${1:?results folder}; TAG=${2:?tag}; POWER=${3:-}
O=$DIR/refit; mkdir -p $O
A=$DIR/bench_A_$TAG.json; B=$DIR/bench_B_$TAG.json
[ -f "$A" ] && [ -f "$B" ] || { echo "need $A and $B"; exit 2; }
BASE=h200-calibrated
DEC=()
TRACES=$(ls $DIR/trace_*weave_*.json 2>/dev/null || true)
[ -n "$TRACES" ] && DEC=(--decision $TRACES)
if [ -f "$DIR/calib_$TAG.json" ]; then
  weave-sim calibrate "$DIR/calib_$TAG.json" --base h200 --name h200-calibrated-$TAG "${DEC[@]}" -o $O/h200-calibrated-$TAG.json
  BASE=$O/h200-calibrated-$TAG.json
  if [ -z "$POWER" ] && python3 -c "import json,sys; sys.exit(0 if 'power' in json.load(open('$DIR/calib_$TAG.json')) else 1)"; then
    POWER=$DIR/calib_$TAG.json
  fi
fi
POL=sequential,static:4,static:8,static:20,static:48
weave-sim calibrate --fit $A --min-tokens 2048 --base $BASE --no-power --policies $POL --name h200-megakernel-$TAG \
  "${DEC[@]}" -o $O/h200-megakernel-$TAG.json | tail -2
weave-sim validate $B --profile $O/h200-megakernel-$TAG.json --out $O/validate_$TAG | grep -E "^summary|^warning"
# the power-model fit also charges each tile's fixed cost (gemm.k_fixed) when the calibration timed tiles at several K
KFIX=()
if [ -f "$DIR/calib_$TAG.json" ] && python3 -c "import json,sys; sys.exit(0 if 'gemm_by_k' in json.load(open('$DIR/calib_$TAG.json')) else 1)"; then
  KFIX=(--gemm-k "$DIR/calib_$TAG.json")
fi
if [ -n "$POWER" ]; then
  weave-sim calibrate --fit $A --min-tokens 2048 --base $BASE --power $POWER --no-hbm-power --policies $POL \
    "${KFIX[@]}" "${DEC[@]}" --name h200-megakernel-power-$TAG -o $O/h200-megakernel-power-$TAG.json | tail -2
  weave-sim validate $B --profile $O/h200-megakernel-power-$TAG.json --out $O/validate_power_$TAG | grep -E "^summary|^warning"
fi
# with a decode run (final_run.sh run decode: bench_decode_TAG.json) the power profile is also fitted to run A and the
# decode run together, with padding rows' MMAs charged the energy the calibration measured (its zero-row runs,
# power.pad_energy; 0.5 where the power block has none), as the shipped h200-megakernel-power-ep1-pad was at EP=1
# (docs/kernel.md "Padding's energy"): h200-megakernel-power-pad-TAG.json
D=$DIR/bench_decode_$TAG.json
if [ -n "$POWER" ] && [ -f "$D" ]; then
  python3 tests/kernel/merge_bench.py $O/fit_input_A_decode_$TAG.json $A $D
  python3 -c "import json,sys; p=json.load(open(sys.argv[1])); p['power'].setdefault('pad_energy', 0.5); p['name']+='-pad'; \
json.dump(p,open(sys.argv[2],'w'),indent=1)" $O/h200-megakernel-power-$TAG.json $O/base-power-pad-$TAG.json
  # (the merged decode results are below --min-tokens 2048, so no token floor here)
  weave-sim calibrate --fit $O/fit_input_A_decode_$TAG.json --base $O/base-power-pad-$TAG.json --policies $POL \
    "${KFIX[@]}" "${DEC[@]}" --fit-params gemm_scale,fixed_us,barrier_us --name h200-megakernel-power-pad-$TAG \
    -o $O/h200-megakernel-power-pad-$TAG.json | tail -2
  weave-sim validate $B --profile $O/h200-megakernel-power-pad-$TAG.json --out $O/validate_power_pad_$TAG \
    | grep -E "^summary|^warning"
fi
if [ -f "$DIR/calib_bulk_$TAG.json" ]; then
  weave-sim calibrate "$DIR/calib_bulk_$TAG.json" --base h200 --name h200-calibrated-bulk-$TAG \
    -o $O/h200-calibrated-bulk-$TAG.json | tail -1
fi
# a dispatch piece's fixed cost from the default-routing weave traces (docs/calibration.md; recorded, not fitted)
PTR=$(ls $DIR/trace_weave_*.json 2>/dev/null || true)
if [ -n "$PTR" ]; then
  python3 -m weave_kernel.piece_cost $PTR --out $O/piece_cost_$TAG.json | tail -1 || echo "piece_cost failed (see above)"
fi
# FP8 runs (final_run.sh F8 / F8D, with or without their own tag suffix): each against its bf16 twin
# (compare_bench.py: geomean bf16 / FP8 per policy) and held out for the fixed-clock refit (weave-sim validate
# simulates FP8 results with the profile's FP8 tiles, docs/kernel.md "FP8 experts in the layer")
PAIRS=()
for f8 in $DIR/bench_F8_*.json $DIR/bench_F8D_*.json $DIR/bench_F8SH_*.json; do
  [ -f "$f8" ] || continue
  base=$(basename $f8 .json); kind=${base%_*}; sfx=${base#${kind}_}  # bench_F8D_TAG -> bench_F8D, TAG
  bf=$DIR/${kind}bf_$sfx.json
  [ -f "$bf" ] && python3 tests/kernel/compare_bench.py $f8 $bf > $O/${base}_vs_bf16.txt && tail -3 $O/${base}_vs_bf16.txt
  [ -f "$bf" ] && [ "$kind" != bench_F8SH ] && PAIRS+=("$bf:$f8")  # (the fused shared expert: not a pair of the fit)
  weave-sim validate $f8 --profile $O/h200-megakernel-$TAG.json --out $O/validate_$base | grep -E "^summary|^warning"
done
# ... and the refits' FP8 tile factor fitted to those pairs (weave-sim calibrate --fp8, docs/calibration.md): written
# beside them as -fp8 profiles, to compare with the factor the EP=1 profiles carry
if [ ${#PAIRS[@]} -gt 0 ]; then
  for p in h200-megakernel h200-megakernel-power; do
    [ -f $O/$p-$TAG.json ] || continue
    weave-sim calibrate --amend $O/$p-$TAG.json --fp8 "${PAIRS[@]}" --workers 2 -o $O/$p-fp8-$TAG.json \
      > $O/fit_fp8_$p-$TAG.txt 2>&1 && tail -2 $O/fit_fp8_$p-$TAG.txt || echo "FP8 fit of $p failed (see $O/fit_fp8_$p-$TAG.txt)"
  done
fi
python3 tests/kernel/results_tables.py $A $B > $O/tables_$TAG.md
# where run B's distance to the lower bound goes, by the fixed-clock refit (docs/results.md)
python3 -m weave_kernel.gap $B --profile $O/h200-megakernel-$TAG.json --out $O/gap_$TAG.json > $O/gap_$TAG.txt
python3 -m weave_kernel.predict --gpus 2,4,8 --profile $O/h200-megakernel-$TAG.json --weave-grid 8,12,16,20,24,32 \
  --out $O/predict_$TAG.json > $O/predict_$TAG.txt
tail -3 $O/predict_$TAG.txt
echo "wrote $O"

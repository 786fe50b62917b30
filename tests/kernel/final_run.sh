#!/bin/bash
# One device call for a results run: build, GPU tests (2 ranks, 1 rank), compute-sanitizer, then the
# benchmark twice on the same kernel: run A (sequential + a static:C grid: what `weave-sim calibrate --fit`
# fits) and run B (weave with the kernel's default cost profile, a weave:C sweep, static:8/20 and
# sequential: held out for `weave-sim validate`), decode (128 tokens), and per-SM traces of `weave` on three
# models. Everything lands in $OUT/results_$TAG.tgz (the device tool returns at most 8 files). Needs $OUT and the
# carried wheels (.whl; device_env.sh installs them).
# Knobs: FINAL_STAGES (default build,test2,test1,sanitize; add virtual for world sizes 2-8 on GPU 0), FINAL_RUNS,
# FINAL_REPEATS (5), FINAL_TAG (file suffix), FINAL_MODELS (a smaller model list for smoke runs), FINAL_COST_PROFILE
# (run DW: the fitted profile whose factors the bulk table takes; default h200-megakernel, the kernel's default
# table), FINAL_SUSTAINED (seconds; unset = no sustained run), FINAL_CALIB=1
# (also the calibration microbenchmarks, calib_$TAG.json, power block included, on the same boards). The bench
# interleaves policies, records clocks and the kernel sources' fingerprint. On the CPU machine afterwards:
# bash tests/kernel/refit.sh DIR TAG (DIR = the unpacked results_$TAG.tgz).
# The device tool stops a call at 10 min and then returns only what is under $OUT: every step's timeout is capped by
# what is left of END_S (default 570 s, from the script's start), and results_$TAG.tgz is rewritten after each step,
# so a call that runs long keeps what it measured.
set -o pipefail
source tests/kernel/device_env.sh  # the carried wheels (.whl), the environment (the tree on PYTHONPATH), left()
R=${FINAL_RESULTS_DIR:-/tmp/results}; mkdir -p $R; REAL_OUT=$OUT  # (FINAL_RESULTS_DIR: the stubbed test's folder)
TAG=${FINAL_TAG:-final}; REP=${FINAL_REPEATS:-5}
END=${END_S:-570}
cap() { local l; l=$(left 15); echo $(( $1 < l ? $1 : l )); }  # a step's timeout: $1 s, or what is left if less
pack() { (cd $R && tar czf $REAL_OUT/results_$TAG.tgz .); }
# ranks: every GPU of the machine (at most 8), or $NPROC; the tests' "test2" stage uses the same count
export NPROC=${NPROC:-$(n=$(nvidia-smi -L 2>/dev/null | wc -l); (( n > 8 )) && n=8; (( n < 1 )) && n=1; echo $n)}
M=${FINAL_MODELS:-qwen3-30b-a3b,deepseek-v2-lite,qwen3.5-35b-a3b,phi-3.5-moe,deepseek-v2,deepseek-v3}
OUT=$R SAN_TIMEOUT=120 timeout $(cap 560) bash tests/kernel/device_run.sh ${FINAL_STAGES:-build,test2,test1,sanitize} 2>&1 | tee $R/stages.log | tail -12
# FINAL_DISPATCH (e.g. bulk): every benchmark and the calibration dispatch their rows that way (default: threads)
DISP=${FINAL_DISPATCH:+--dispatch $FINAL_DISPATCH}
bench() { local name=$1; shift; timeout $(cap ${BENCH_TIMEOUT:-280}) torchrun --nproc_per_node=$NPROC -m weave_kernel.bench --repeats $REP $DISP "$@" \
  --out $R/$name.json > $R/$name.log 2>&1; echo "$name rc $? [${SECONDS}s]"; pack; }
# FINAL_RUNS: which runs (default A,B,decode,traces; add R, RS, P, F8, F8BF, F8D, F8B, SH, E2E, S, calib, traces_fitted, D and DW). A device call is limited to 10 min, so a
# full set takes several calls, each with its own FINAL_RUNS and tarball (results_$TAG.tgz is overwritten per call:
# vary FINAL_TAG's suffix or fetch it in between).
RUNS=${FINAL_RUNS:-A,B,decode,traces}
want() { [[ ",$RUNS," == *",$1,"* ]]; }
want A && bench bench_A_$TAG --models $M --tokens 2048,4096,8192 --comm 4,8,12,16,20,32,48 --weave-comm= --no-weave
want B && bench bench_B_$TAG --models $M --tokens 2048,4096,8192 --comm 8,20 --weave-comm 4,8,12,16,24,32 --weave-nosteal
# R: realistic per-layer routing (bench --synthetic fitted: the shipped real trace's per-layer skew and token reuse,
# four layers per model) and GPT-OSS-20B on its recorded trace; held out for weave-sim validate like B
want R && bench bench_R_$TAG --models $M --tokens 2048,4096,8192 --synthetic fitted --comm 8,20 --weave-comm 4,8,16
want R && bench bench_Rtrace_$TAG --models gpt-oss-20b --tokens 2048,4096,8192 --routing-trace default --comm 8,20 --weave-comm 4,8,16
# P: run R's set with each configuration's experts placed from its own loads (bench --placement balanced; compare with
# run R: the simulator expects 1.02x at EP=2 and 1.05-1.06x at EP=4/8 for weave and static:20 alike, docs/results.md)
# F8: FP8 experts (bench --expert-dtype fp8) on run B's models, tokens and static:8/20 + weave (the first two-rank
# timing of FP8 dispatch: e4m3 rows and their scales over NVLink), after tests/kernel/fp8_worker.py on one rank (world 1
# and virtual ranks); compare with run B of the same session, or add F8BF: the same set in bf16, in a call of its own
# (both benchmarks and the worker do not fit one 10-minute call)
want F8 && { timeout $(cap 150) python3 tests/kernel/fp8_worker.py > $R/fp8_worker_$TAG.log 2>&1; echo "fp8_worker rc $? [${SECONDS}s]"; }
want F8 && bench bench_F8_$TAG --models $M --tokens 2048,4096,8192 --comm 8,20 --weave-comm= --expert-dtype fp8
want F8BF && bench bench_F8bf_$TAG --models $M --tokens 2048,4096,8192 --comm 8,20 --weave-comm=
# (F8BF also times two decoder stacks with FP8 blocks, a shared expert in the second: weave_kernel.e2e --expert-dtype fp8)
if want F8BF; then
  for m in qwen3-30b-a3b deepseek-v2-lite; do
    sh=""; [ $m != qwen3-30b-a3b ] && sh=--shared
    timeout $(cap 120) torchrun --nproc_per_node=$NPROC -m weave_kernel.e2e --model $m --tokens 4096 --layers 4 $sh \
      --expert-dtype fp8 --out $R/e2e_fp8_${m}_$TAG.json > $R/e2e_fp8_${m}_$TAG.log 2>&1; echo "e2e fp8 $m rc $? [${SECONDS}s]"
  done
fi
# F8D: FP8 at decode sizes (CUDA-graph replays) beside bf16, and FP8 shared experts fused, beside bf16 (EP=1 in
# docs/kernel.md "FP8 experts: decode, shared experts, ...": 1.54x at decode, 1.24-1.65x with shared experts)
want F8D && bench bench_F8D_$TAG --models $M --tokens 64,256,1024 --comm 8,20 --weave-comm= --no-sequential --cuda-graph on --expert-dtype fp8
want F8D && bench bench_F8Dbf_$TAG --models $M --tokens 64,256,1024 --comm 8,20 --weave-comm= --no-sequential --cuda-graph on
want F8D && bench bench_F8SH_$TAG --models deepseek-v2-lite,deepseek-v3 --tokens 2048,4096 --comm 8,20 --weave-comm= --no-sequential \
  --shared first --expert-dtype fp8
want F8D && bench bench_F8SHbf_$TAG --models deepseek-v2-lite,deepseek-v3 --tokens 2048,4096 --comm 8,20 --weave-comm= --no-sequential \
  --shared first
# F8B: FP8 rows by bulk copies against by threads (--ab-dispatch, the same layer timed both ways in alternation; on
# two virtual ranks of one GPU in docs/kernel.md "FP8 rows by bulk copies"), after fp8_worker's bulk cases
want F8B && { timeout $(cap 150) python3 tests/kernel/fp8_worker.py > $R/fp8_worker_bulk_$TAG.log 2>&1; echo "fp8_worker rc $? [${SECONDS}s]"; }
want F8B && bench bench_F8B_$TAG --models $M --tokens 2048,4096,8192 --comm 4,8,20 --weave-comm 8 --ab-dispatch --repeats 3 \
  --expert-dtype fp8
want P && bench bench_P_$TAG --models $M --tokens 2048,4096,8192 --synthetic fitted --comm 8,20 --weave-comm= --placement balanced
want P && bench bench_Ptrace_$TAG --models gpt-oss-20b --tokens 2048,4096,8192 --routing-trace default --comm 8,20 --weave-comm= \
  --placement balanced
# SH: the four models with shared experts, fused into the megakernel (bench --shared last; separate_ms: the same layer
# without it, then the dense FFN), realistic routing as run R; the simulator expects the shared tiles to hide 2-12% of
# their time at EP=2 (docs/engine.md "Shared experts"; EP=1 measured in docs/kernel.md)
want SH && bench bench_SH_$TAG --models deepseek-v2-lite,qwen3.5-35b-a3b,deepseek-v2,deepseek-v3 --tokens 2048,4096,8192 \
  --synthetic fitted --comm 8,20 --weave-comm 4,8,16 --shared last
# E2E: a decoder stack with WeaveMoE blocks, end to end across the ranks (weave_kernel/e2e.py; EP=1 in docs/kernel.md);
# every layer on one MoEMegakernel, and (--separate-kernels) each on its own, timed in the same call
if want E2E; then
  for m in qwen3-30b-a3b deepseek-v2-lite qwen3.5-35b-a3b deepseek-v2; do
    sh=""; [ $m != qwen3-30b-a3b ] && sh=--shared
    timeout $(cap 150) torchrun --nproc_per_node=$NPROC -m weave_kernel.e2e --model $m --tokens 4096 --layers 4 $sh --separate-kernels \
      --out $R/e2e_${m}_$TAG.json > $R/e2e_${m}_$TAG.log 2>&1; echo "e2e $m rc $? [${SECONDS}s]"
  done
fi
# D: dispatch by bulk copies (--ab-dispatch: the same kernel, rows copied by 8 issuing warps' bulk copies, timed in
# alternation with the default all-thread copies; csrc/bulk_copy.cuh), after the 2-rank tests and a sanitizer pass in
# that mode, and the calibration's push curve in that mode (calib_bulk_$TAG.json: the profile a bulk kernel would read)
if want D; then
  timeout $(cap 200) torchrun --nproc_per_node=$NPROC tests/kernel/gpu_worker.py --dispatch bulk > $R/test2_bulk.log 2>&1
  echo "test2 bulk rc $? [${SECONDS}s]: $(grep -E 'SUMMARY|CHOICE AGREEMENT' $R/test2_bulk.log | tr '\n' ' ')"
  timeout $(cap 150) compute-sanitizer --tool memcheck --report-api-errors no --target-processes all torchrun \
    --nproc_per_node=$NPROC tests/kernel/gpu_worker.py --sanitize --dispatch bulk > $R/memcheck_bulk.log 2>&1
  echo "memcheck bulk rc $? [${SECONDS}s]: $(grep -E 'ERROR SUMMARY' $R/memcheck_bulk.log | head -2 | tr '\n' ' ')"
  bench bench_D_$TAG --models $M --tokens 2048,4096,8192 --comm 4,8,20 --weave-comm 8 --ab-dispatch --repeats 3
  for w in 4 12; do  # issuing warps over NVLink (on one GPU 8 and 12 tied, 4 fell short on 4 KB rows)
    bench bench_D${w}_$TAG --models qwen3-30b-a3b,deepseek-v3 --tokens 4096 --comm 4,8 --weave-comm= --no-sequential \
      --dispatch bulk:$w --ab-dispatch --repeats 3
  done
  timeout $(cap ${CALIB_TIMEOUT:-300}) torchrun --nproc_per_node=$NPROC -m weave_kernel.calibrate --dispatch bulk \
    --out $R/calib_bulk_$TAG.json > $R/calib_bulk_$TAG.log 2>&1; echo "calib bulk rc $? [${SECONDS}s]"
fi
# DW: weave with bulk dispatch and a cost table for it: the bulk push curve (calib_bulk_$TAG.json, measured here
# unless run D made it in this call) with the in-layer factors of the kernel's default table applied, not refitted
# (weave-sim calibrate --params-from), then run B's grid in bulk mode with that table (compare with run B).
if want DW; then
  [ -f $R/calib_bulk_$TAG.json ] || { timeout $(cap ${CALIB_TIMEOUT:-300}) torchrun --nproc_per_node=$NPROC -m weave_kernel.calibrate \
    --dispatch bulk --out $R/calib_bulk_$TAG.json > $R/calib_bulk_$TAG.log 2>&1; echo "calib bulk rc $? [${SECONDS}s]"; }
  # (one GPU has no push curve to measure: the calibration then lacks nvlink_push and DW stops here; a table left by
  # an earlier call must not stand in for this one)
  rm -f $R/h200-megakernel-bulk-$TAG.json
  if python3 -m weave_sim.cli calibrate $R/calib_bulk_$TAG.json --base h200 --params-from ${FINAL_COST_PROFILE:-h200-megakernel} \
      --name h200-megakernel-bulk-$TAG -o $R/h200-megakernel-bulk-$TAG.json 2>&1 | tail -1 | cut -c1-250; \
      [ -f $R/h200-megakernel-bulk-$TAG.json ]; then
    DISP="--dispatch bulk" bench bench_DW_$TAG --models $M --tokens 2048,4096,8192 --comm 8,20 --weave-comm 4,8,16 \
      --cost-profile $R/h200-megakernel-bulk-$TAG.json
  else
    echo "DW: no cost profile for bulk dispatch, its run skipped"
  fi
fi
want decode && bench bench_decode_$TAG --models $M --tokens 128 --comm 4,8,20 --weave-comm= --cuda-graph ab  # + CUDA-graph replays
# FINAL_SUSTAINED=S: also reference, sequential, static:8/20 and weave each timed back to back for about S s,
# forward then reverse (bench --sustained; docs/power.md); about 5 min at S=1 (5 min at EP=1 measured)
if [ -n "${FINAL_SUSTAINED:-}" ] || want S; then
  BENCH_TIMEOUT=420 bench bench_S_$TAG --models $M --tokens 2048,4096,8192 --comm 8,20 --weave-comm= --repeats 3 --sustained ${FINAL_SUSTAINED:-1}
fi
# RS: run R's realistic routing with every policy also timed back to back for 0.5 s, the timing to compare on the
# largest layers, whose bench-style times the power limiter's clock dips set (docs/results.md "Realistic routing at
# EP=1 on the current kernel"). On one H200 that took 8-13 s a point (about 800 s for the 72), so the six models
# go in three calls split by FINAL_MODELS (the three small models; phi-3.5-moe,deepseek-v2; deepseek-v3), joined by
# tests/kernel/merge_bench.py
want RS && BENCH_TIMEOUT=${BENCH_TIMEOUT:-500} bench bench_RS_$TAG --models $M --tokens 2048,4096,8192 --synthetic fitted \
  --comm 8,20 --weave-comm= --repeats 3 --sustained 0.5
if [ -n "${FINAL_CALIB:-}" ] || want calib; then
  timeout $(cap ${CALIB_TIMEOUT:-300}) torchrun --nproc_per_node=$NPROC -m weave_kernel.calibrate $DISP --out $R/calib_$TAG.json \
    > $R/calib_$TAG.log 2>&1; echo "calib rc $? [${SECONDS}s]"
fi
want traces && for m in qwen3-30b-a3b deepseek-v2 phi-3.5-moe; do
  bench trace_run_$m --models $m --tokens 4096 --comm 8 --weave-comm= --no-sequential --repeats 3 \
    --trace $R/trace_weave_${m}_4096.json --trace-policy weave > /dev/null
done
# traces_fitted: the same traces on realistic routing (one mid-depth layer of --synthetic fitted) for all six models,
# and their busy shares (the "SMs busy >= 90%" on the routing it is judged on)
if want traces_fitted; then
  for m in ${M//,/ }; do
    L=$(python3 -c "from weave_sim.presets import get_model; print(get_model('$m').num_moe_layers // 2)")
    bench trace_fitted_run_$m --models $m --tokens 4096 --synthetic fitted --layers $L --comm 8 --weave-comm= \
      --no-sequential --repeats 3 --trace $R/trace_fitted_weave_${m}_4096.json --trace-policy weave > /dev/null
  done
  python3 -m weave_sim.cli timeline-stats $R/trace_fitted_weave_*_4096.json --from count_exchange | tee $R/timeline_stats_fitted_$TAG.txt
fi
grep -h "geomean\|fraction of the lower bound" $R/bench_*_$TAG.log | cut -c1-250
pack

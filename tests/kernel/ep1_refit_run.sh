#!/bin/bash
# One 1x H200 call: the measurements the shipped EP=1 profiles are fitted to and checked on, on the working tree's
# kernel (docs/results.md "Since these runs: a faster kernel, EP=1 only" has the commands they were first made
# with): the fit run (seed 0: six models x {2048, 4096, 8192}, static:8/20, weave:2/8, weave, sequential,
# reference), the held-out runs (seed 1 the same without the weave:C sweep; seed 2 on 66 CTAs at {4096, 8192};
# seed 3 on 32 CTAs at 4096), one traced weave call per model at 4096 tokens (the choice's measured cost: weave-sim
# calibrate --decision), and the calibration (calib_TAG.json: the tile's fixed cost by K, the power block).
# Then on the CPU: tests/kernel/refit_ep1.sh DIR TAG.
# Knobs: TAG (file suffix, default ep1), END_S (seconds for the whole script). Everything in $OUT/ep1_refit_TAG.tgz.
set -o pipefail
source tests/kernel/device_env.sh  # wheels, environment
TAG=${TAG:-ep1}; R=$OUT/ep1_refit_$TAG; mkdir -p $R
END=${END_S:-585}
M=$SIX_MODELS
bash tests/kernel/device_run.sh build 2>&1 | tail -2
python3 -c "import weave_kernel.build as b; print(b.sources_digest())" | tee $R/csrc.txt
B="torchrun --nproc_per_node=1 -m weave_kernel.bench --repeats 3"
run() { local name=$1; shift; timeout $(left 20) $B "$@" --out $R/kernel_bench_${name}.json > $R/$name.log 2>&1
  echo "$name rc $? [${SECONDS}s]"; }
run ep1_seed0_$TAG --models $M --tokens 2048,4096,8192 --comm 8,20 --weave-comm 2,8 --seed 0
run ep1_seed1_$TAG --models $M --tokens 2048,4096,8192 --comm 8,20 --weave-comm= --seed 1
run ep1_66ctas_seed2_$TAG --models $M --tokens 4096,8192 --comm 8,20 --weave-comm= --seed 2 --num-ctas 66
run ep1_32ctas_seed3_$TAG --models $M --tokens 4096 --comm 8,20 --weave-comm= --seed 3 --num-ctas 32
mkdir -p $R/traces
for m in ${M//,/ }; do
  (( $(left) > 150 )) || { echo "traces: out of time before $m"; break; }
  timeout 60 $B --models $m --tokens 4096 --comm 8 --weave-comm= --no-sequential --trace $R/traces/trace_$m.json \
    --trace-policy weave --out $R/traces/bench_$m.json > $R/traces/$m.log 2>&1 || echo "trace $m failed"
done
echo "traces [${SECONDS}s]"
timeout $(left 10) torchrun --nproc_per_node=1 -m weave_kernel.calibrate --out $R/calib_$TAG.json > $R/calib_$TAG.log 2>&1
echo "calib rc $? [${SECONDS}s]"; tail -4 $R/calib_$TAG.log | cut -c1-200
grep -h "geomean\|fraction of the lower bound" $R/*.log | cut -c1-200
tar czf $OUT/ep1_refit_$TAG.tgz -C $OUT ep1_refit_$TAG
echo "done [${SECONDS}s]"

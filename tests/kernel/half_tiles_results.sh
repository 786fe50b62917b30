#!/bin/bash
# One 1x H200 call (about 9 min): the EP=1 figures of the kernel with half tiles (sources eb48d782; docs/kernel.md
# "Half tiles at the power cap"), held out from every shipped profile: run B (seed 6, six models x {2048, 4096,
# 8192}, static:4/8/12/20/32, weave:4/16, weave, sequential, the reference; bench-style, rounds alternating) and the
# steady state (seed 7, static:8/20, weave, sequential, the reference; bench-style then --sustained 1.0).
# Then on the CPU: weave-sim validate each file (--timing sustained for the second) against the EP=1 profiles.
# Knobs: END_S (seconds for the whole script, default 585). Files in $OUT/half_tiles_results.
set -o pipefail
source tests/kernel/device_env.sh
R=$OUT/half_tiles_results; mkdir -p $R
END=${END_S:-585}
M=$SIX_MODELS
build_tree $R
B="torchrun --nproc_per_node=1 -m weave_kernel.bench --repeats 4"
run() { local name=$1 reserve=$2; shift 2; timeout $(left $reserve) $B "$@" --out $R/bench_${name}.json > $R/$name.log 2>&1
  echo "$name rc $? [${SECONDS}s]"; grep -E "^geomean \(all|fraction of the lower bound|choice ==" $R/$name.log | cut -c1-220; }
run B_seed6 330 --models $M --tokens 2048,4096,8192 --comm 4,8,12,20,32 --weave-comm 4,16 --seed 6
run S_seed7 0 --models $M --tokens 2048,4096,8192 --comm 8,20 --weave-comm= --seed 7 --sustained 1.0
echo "done [${SECONDS}s]"

#!/bin/bash
# One device call: a kernel change against an older version of the sources, on any number of GPUs (one is
# enough). Builds both (the old one in the background), runs the GPU tests on the working tree (1 rank; all GPUs
# too when there are two or more; virtual ranks with AB_VIRTUAL=1), then the in-process A/B benchmark
# (`bench --ab-csrc`: A = the working tree, B = the old sources, alternating calls), and with AB_TRACE=1 a
# timeline of the first configuration for each version. Needs $OUT. The old sources must be in the working tree
# (the device copy has no .git), e.g. for commit abc1234:
#   mkdir -p tests/kernel/_ab_old_csrc && for f in $(git ls-files weave_kernel/csrc); do
#     git show abc1234:$f > tests/kernel/_ab_old_csrc/$(basename $f); done     # git ignores the folder:
#   name it in the device tool's carry list, e.g. carry ["tests/kernel/_ab_old_csrc"]
# Knobs: AB_BENCH_ARGS (benchmark arguments), AB_TRACE_ARGS (the traced configuration), AB_PRE (a command run
# after the tests, e.g. a microbenchmark of both versions; $AB_OLD names the old folder), END_S (seconds for
# the whole script). Used for "Where the rest goes: instructions fetched cold" in docs/kernel.md.
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1 OMP_NUM_THREADS=4
export TORCH_EXTENSIONS_DIR=${TORCH_EXTENSIONS_DIR:-/tmp/weave_ext}
export AB_OLD=${AB_OLD_CSRC:-$PWD/tests/kernel/_ab_old_csrc}
END=${END_S:-540}
NPROC=${NPROC:-$(n=$(nvidia-smi -L 2>/dev/null | wc -l); (( n > 8 )) && n=8; (( n < 1 )) && n=1; echo $n)}
BENCH_ARGS=${AB_BENCH_ARGS:---models qwen3-30b-a3b,deepseek-v2-lite,qwen3.5-35b-a3b,phi-3.5-moe,deepseek-v2,deepseek-v3 --tokens 128,2048,4096 --comm 8 --weave-comm= --no-sequential --repeats 5}
TRACE_ARGS=${AB_TRACE_ARGS:---models qwen3-30b-a3b --tokens 4096 --comm 8 --weave-comm= --no-sequential --repeats 1 --trace-policy weave}
left() { local r=$((END - SECONDS)); echo $(( r < 5 ? 5 : r )); }
[ -d "$AB_OLD" ] || { echo "no old sources in $AB_OLD"; exit 2; }
for s in $(python3 -c "from weave_kernel.build import SOURCES; print(*SOURCES)"); do [ -f $AB_OLD/$s ] || : > $AB_OLD/$s; done
( TORCH_EXTENSIONS_DIR=/tmp/ext_old WEAVE_KERNEL_CSRC=$AB_OLD MAX_JOBS=8 timeout 240 \
  python3 -c "from weave_kernel.build import load_extension; load_extension(False)" > $OUT/build_old.log 2>&1
  echo "old build rc $? [${SECONDS}s]" >> $OUT/build_old.log ) &
STAGES=build,test1; (( NPROC >= 2 )) && STAGES=build,test2,test1; [ "${AB_VIRTUAL:-0}" = 1 ] && STAGES=$STAGES,virtual
TEST2_TIMEOUT=150 timeout $(left) bash tests/kernel/device_run.sh $STAGES > $OUT/stage1.log 2>&1
echo "stage1 rc $? [${SECONDS}s]" >> $OUT/stage1.log
wait
if [ -n "${AB_PRE:-}" ]; then
  timeout $(( $(left) / 3 )) bash -c "$AB_PRE" > $OUT/pre.log 2>&1; echo "pre rc $? [${SECONDS}s]" >> $OUT/pre.log
fi
timeout $(left) torchrun --nproc_per_node=$NPROC -m weave_kernel.bench --out $OUT/bench_ab.json --ab-csrc $AB_OLD \
  $BENCH_ARGS > $OUT/bench_ab.log 2>&1; echo "bench rc $? [${SECONDS}s]" >> $OUT/bench_ab.log
if [ "${AB_TRACE:-0}" = 1 ]; then
  timeout $(( $(left) / 2 )) torchrun --nproc_per_node=$NPROC -m weave_kernel.bench --out $OUT/trace_new_bench.json \
    --trace $OUT/trace_new.json $TRACE_ARGS > $OUT/trace_new.log 2>&1
  TORCH_EXTENSIONS_DIR=/tmp/ext_old WEAVE_KERNEL_CSRC=$AB_OLD timeout $(left) torchrun --nproc_per_node=$NPROC \
    -m weave_kernel.bench --out $OUT/trace_old_bench.json --trace $OUT/trace_old.json $TRACE_ARGS > $OUT/trace_old.log 2>&1
fi
echo "===== summary [${SECONDS}s]"
grep -hE "^build|SASS|rc |test2:|SUMMARY|CHOICE|virtual" $OUT/stage1.log | cut -c1-200
tail -1 $OUT/build_old.log | cut -c1-200
grep -hE "^FAIL|Error" $OUT/test2.log $OUT/test1.log $OUT/virtual.log 2>/dev/null | head -5 | cut -c1-200
[ -f $OUT/pre.log ] && tail -20 $OUT/pre.log | cut -c1-240
grep -hE "^FAIL|Error" $OUT/bench_ab.log | head -3; tail -1 $OUT/bench_ab.log
sed -n '/interleaved A\/B/,$p' $OUT/bench_ab.log | head -12
for v in new old; do
  [ -f $OUT/trace_$v.json ] && python3 - $OUT/trace_$v.json $v <<'EOF'
import json, statistics, sys
ev = json.load(open(sys.argv[1]))
ev = ev["traceEvents"] if isinstance(ev, dict) else ev
for name in ("choose", "count_exchange"):
    d = [e["dur"] for e in ev if e.get("ph") == "X" and str(e.get("name", "")).startswith(name)]
    if d:
        print(f"trace {sys.argv[2]}: {name} spans over {len(d)} CTAs: median {statistics.median(d):.2f} us, max {max(d):.2f} us")
t0 = min(e["ts"] for e in ev if e.get("ph") == "X")
first = {}
for e in ev:
    if e.get("ph") == "X" and e.get("name") == "gemm0":
        key = (e["pid"], e["tid"])
        first[key] = min(first.get(key, 1e30), e["ts"] - t0)
if first:
    v = sorted(first.values())
    print(f"trace {sys.argv[2]}: first GEMM0 tile starts {v[0]:.1f} us (earliest CTA), {statistics.median(v):.1f} us (median CTA) after the first record")
EOF
done

#!/bin/bash
# One 1x H200 call for FP8 rows dispatched by bulk copies (docs/kernel.md "FP8 rows by bulk copies"), by STAGES:
#   fp8      fp8_worker: every FP8 case, virtual ranks G = 2, 4 by threads / bulk / bulk:4 (bulk bitwise equal to
#            threads) and G = 2 with e4m3 rows of 7168 bytes
#   quick    gpu_worker --quick (bf16 and FP8 at world 1) and virtual_worker --quick G = 2, 4 --dispatch bulk (bf16)
#   sanitize compute-sanitizer memcheck and synccheck on fp8_worker --virtual-only
#   ab       dispatch_ab.py on two virtual ranks, bf16 and FP8, threads / bulk (copy rate and layer time)
#   abk      dispatch_ab per kernel version (tests/kernel/_ab_old_csrc, then the tree's), FP8 and bf16
#   bench    bench --expert-dtype fp8 at EP=1 (its FP8 lower-bound fields, first run on a GPU)
# Always builds first; logs land in $OUT/fp8_bulk.tgz (the device tool returns few files).
set -o pipefail
STAGES=${STAGES:-fp8,quick,sanitize,ab,bench}
source tests/kernel/device_env.sh  # wheels, environment, has()
R=$OUT/fp8_bulk; mkdir -p $R
bash tests/kernel/device_run.sh build 2>&1 | tail -3
python3 -c "import weave_kernel.build as b; print('csrc', b.sources_digest())" | tee $R/csrc.txt
if has fp8; then
  timeout 200 python3 tests/kernel/fp8_worker.py > $R/fp8_worker.log 2>&1
  echo "fp8_worker rc $? [${SECONDS}s]"; grep -E "^FAIL|SUMMARY" $R/fp8_worker.log | head -8; grep -c "bits equal to dispatch by threads: True" $R/fp8_worker.log
fi
if has quick; then
  timeout 240 torchrun --nproc_per_node=1 tests/kernel/gpu_worker.py --quick > $R/gpu_worker_quick.log 2>&1
  echo "gpu_worker --quick rc $? [${SECONDS}s]"; grep -E "^FAIL|SUMMARY|agree" $R/gpu_worker_quick.log | head -5
  timeout 240 python3 tests/kernel/virtual_worker.py --quick --worlds 2,4 --dispatch bulk > $R/virtual_bulk.log 2>&1
  echo "virtual bulk rc $? [${SECONDS}s]"; grep -E "^FAIL|SUMMARY|agree" $R/virtual_bulk.log | head -5
fi
if has sanitize; then
  for tool in memcheck synccheck; do
    timeout 200 compute-sanitizer --tool $tool --report-api-errors no python3 tests/kernel/fp8_worker.py --virtual-only \
      > $R/${tool}_fp8_virtual.log 2>&1
    echo "$tool rc $? [${SECONDS}s]: $(grep -E 'ERROR SUMMARY|SUMMARY:' $R/${tool}_fp8_virtual.log | tr '\n' ' ')"
  done
fi
if has ab; then
  for dt in fp8 bf16; do
    timeout 240 python3 tests/kernel/dispatch_ab.py --expert-dtype $dt --models ${AB_MODELS:-qwen3-30b-a3b,deepseek-v2-lite,deepseek-v3} \
      --policies static:8,weave:8 --modes threads,bulk --repeats 5 > $R/dispatch_ab_$dt.log 2>&1
    echo "dispatch_ab $dt rc $? [${SECONDS}s]"; sed -n '/^dispatch A\/B/,$p' $R/dispatch_ab_$dt.log
  done
fi
# abk: the kernel sources in tests/kernel/_ab_old_csrc against the tree's, dispatch_ab in FP8 (then bf16) per version
if has abk; then
  for dt in fp8 bf16; do
    for v in old new; do
      src=""; [ $v = old ] && src="--csrc tests/kernel/_ab_old_csrc"
      timeout 200 python3 tests/kernel/dispatch_ab.py --expert-dtype $dt $src --models ${AB_MODELS:-qwen3-30b-a3b,deepseek-v2-lite,deepseek-v3} \
        --policies static:8,weave:8 --modes threads,bulk --repeats 5 > $R/dispatch_abk_${dt}_$v.log 2>&1
      echo "dispatch_ab $dt $v rc $? [${SECONDS}s]"; sed -n '/^model /,$p' $R/dispatch_abk_${dt}_$v.log
    done
  done
fi
if has bench; then
  timeout 150 torchrun --nproc_per_node=1 -m weave_kernel.bench --no-gpu-state --models qwen3-30b-a3b,deepseek-v3 \
    --tokens 64,4096 --comm 8 --weave-comm= --no-sequential --repeats 3 --expert-dtype fp8 --out $R/bench_fp8.json \
    > $R/bench_fp8.log 2>&1; echo "bench fp8 rc $? [${SECONDS}s]"
  python3 - $R/bench_fp8.json <<'PY'
import json, sys
d = json.load(open(sys.argv[1]))
for r in d["results"]:
    fr = {p: round(v, 3) for p, v in (r.get("fp8_fraction_of_lower_bound") or {}).items()}
    print(r["model"], r["tokens_per_gpu"], "bf16 bound", round(r["lower_bound_ms"], 3), "fp8 bound",
          r.get("fp8_lower_bound_ms"), "ms", {p: round(v, 3) for p, v in r["latency_ms"].items()}, "of fp8 bound", fr)
PY
fi
tar czf $OUT/fp8_bulk.tgz -C $OUT fp8_bulk && rm -rf $R
echo "done [${SECONDS}s]"

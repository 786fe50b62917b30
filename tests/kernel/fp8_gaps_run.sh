#!/bin/bash
# One 1x H200 call of FP8 measurements (docs/kernel.md "FP8 experts: decode, shared experts, ..."), by STAGES:
#   pytest   the FP8 GPU tests (WeaveMoE's FP8 kernel backend, FP8 checkpoints on the kernel backend)
#   host     host time per eager call, bf16 and FP8 (tests/kernel/host_cost.py)
#   trace    weave's Chrome traces, bf16 and FP8, and the tiles' rates in them (trace_tiles.py); TRACE_TOKENS
#            (default 4096; 64 for decode), TRACE_MODELS (name:H:I, space-separated)
#   decode   bf16 and FP8 at 64 / 256 / 1024 tokens as CUDA-graph replays (DECODE_MODELS)
#   shared   the DeepSeek models with their shared expert fused, bf16 and FP8
#   e2e      a 4-layer deepseek-v2-lite stack with its shared expert, bf16 and FP8 experts
#   f8bench  fp8_worker's bf16 / FP8 / bf16 table at EP=1
# Always builds first; everything lands in $OUT/gaps.tgz (the device tool returns few files).
set -o pipefail
STAGES=${STAGES:-pytest,host,decode,shared,e2e}
source tests/kernel/device_env.sh  # wheels, environment, has()
bash tests/kernel/device_run.sh build 2>&1 | tail -3
if has pytest; then
  timeout 240 python3 -m pytest -q -m gpu tests/kernel/test_module_fp8.py > $OUT/pytest_gpu.log 2>&1
  echo "pytest rc $? [${SECONDS}s]"; tail -2 $OUT/pytest_gpu.log; grep -E "^(FAILED|ERROR)" $OUT/pytest_gpu.log | head
fi
if has host; then
  for dt in bf16 fp8; do
    timeout 60 torchrun --nproc_per_node=1 tests/kernel/host_cost.py --expert-dtype $dt 2>&1 | grep -v Warn | tee $OUT/host_$dt.txt
  done
fi
B="torchrun --nproc_per_node=1 -m weave_kernel.bench --no-gpu-state"
if has trace; then
  for m in ${TRACE_MODELS:-qwen3-30b-a3b:2048:768 qwen3.5-35b-a3b:2048:512 deepseek-v3:7168:2048}; do
    IFS=: read name H I <<< "$m"
    for dt in bf16 fp8; do
      f=trace_${name}_${TRACE_TOKENS:-4096}_$dt
      timeout 120 $B --models $name --tokens ${TRACE_TOKENS:-4096} --comm 8 --weave-comm= --no-sequential --repeats 3 \
        --expert-dtype $dt --trace $OUT/$f.json --trace-policy weave --out $OUT/tr_$f.json > $OUT/tr_$f.log 2>&1 \
        || echo "trace $name $dt failed"
      python3 tests/kernel/trace_tiles.py $OUT/$f.json $H $I 2>&1 | sed "s|$OUT/||"
    done
  done; echo "[${SECONDS}s]"
fi
if has decode; then
  for dt in bf16 fp8; do
    timeout 150 $B --models ${DECODE_MODELS:-qwen3-30b-a3b,deepseek-v2-lite,deepseek-v3} --tokens 64,256,1024 --comm 8 \
      --weave-comm= --no-sequential --repeats 5 --cuda-graph on --expert-dtype $dt --out $OUT/decode_$dt.json \
      > $OUT/decode_$dt.log 2>&1; echo "decode $dt rc $? [${SECONDS}s]"
  done
fi
if has shared; then
  for dt in bf16 fp8; do
    timeout 150 $B --models deepseek-v2-lite,deepseek-v3 --tokens 2048,4096 --comm 8 --weave-comm= --no-sequential \
      --repeats 3 --shared first --expert-dtype $dt --out $OUT/shared_$dt.json > $OUT/shared_$dt.log 2>&1
    echo "shared $dt rc $? [${SECONDS}s]"
  done
fi
if has e2e; then
  for dt in bf16 fp8; do
    timeout 150 torchrun --nproc_per_node=1 -m weave_kernel.e2e --model deepseek-v2-lite --tokens 4096 --layers 4 --shared \
      --expert-dtype $dt --repeats 3 --out $OUT/e2e_$dt.json > $OUT/e2e_$dt.log 2>&1
    echo "e2e $dt rc $? [${SECONDS}s]"; tail -5 $OUT/e2e_$dt.log
  done
fi
if has f8bench; then
  timeout 300 python3 tests/kernel/fp8_worker.py --bench --skip-tests --tokens 2048,4096,8192 --reps 5 > $OUT/fp8_bench.log 2>&1
  echo "f8bench rc $? [${SECONDS}s]"; sed -n '/^model /,$p' $OUT/fp8_bench.log | tail -3
fi
python3 - <<'PY'
import json, os
out = os.environ["OUT"]
for kind in ("decode", "shared"):
    rows = {}
    for dt in ("bf16", "fp8"):
        p = f"{out}/{kind}_{dt}.json"
        if not os.path.exists(p):
            continue
        for r in json.load(open(p)).get("results", []):
            for pol, ms in (r.get("latency_ms") or {}).items():
                rows.setdefault((r["model"], r["tokens_per_gpu"], pol), {})[dt] = ms
            for pol, ms in (r.get("shared_separate_ms") or {}).items():
                rows.setdefault((r["model"], r["tokens_per_gpu"], "sep:" + pol), {})[dt] = ms
    for (m, n, pol), v in sorted(rows.items()):
        if "bf16" in v and "fp8" in v:
            print(f"{kind:6s} {m:18s} {n:5d} {pol:12s} bf16 {v['bf16']:.4f} fp8 {v['fp8']:.4f} ms  {v['bf16'] / v['fp8']:.3f}x")
PY
cd $OUT && tar czf gaps.tgz --remove-files $(ls | grep -v '^gaps.tgz$')

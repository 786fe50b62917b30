#!/bin/bash
# Second 1x H200 call of the FP8 gap session: host time per eager call (bf16 / FP8, the fast input check), the FP8
# GPU tests (kernel backend, FP8 checkpoint on the kernel backend), decode traces (bf16 / FP8, 64 tokens), FP8 shared
# experts' speed, FP8 e2e stacks. Everything lands in $OUT/run2.tgz (one file: the tool returns few files).
set -o pipefail
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
export PYTHONPATH=/tmp/site:$PWD TORCH_EXTENSIONS_DIR=/tmp/weave_ext NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export PYTHONUNBUFFERED=1 OMP_NUM_THREADS=4
D=$OUT/run2; mkdir -p $D
STAGES=${STAGES:-build,host,pytest,dtrace,shared,e2e}
has() { [[ ",$STAGES," == *",$1,"* ]]; }
bash tests/kernel/device_run.sh build 2>&1 | tail -2
if has host; then
  for dt in bf16 fp8; do timeout 60 torchrun --nproc_per_node=1 tests/kernel/host_cost.py --expert-dtype $dt 2>&1 | grep -v Warn | tee $D/host_$dt.txt; done
fi
if has pytest; then
  timeout 240 python3 -m pytest -q -m gpu tests/kernel/test_module_fp8.py > $D/pytest_gpu.log 2>&1
  echo "pytest rc $? [${SECONDS}s]"; tail -2 $D/pytest_gpu.log; grep -E "^(FAILED|ERROR)" $D/pytest_gpu.log | head
fi
B="torchrun --nproc_per_node=1 -m weave_kernel.bench --no-gpu-state"
if has dtrace; then
  for dt in bf16 fp8; do
    timeout 90 $B --models qwen3-30b-a3b,deepseek-v3 --tokens 64 --comm 8 --weave-comm= --no-sequential --repeats 5 --cuda-graph on \
      --expert-dtype $dt --trace $D/trace_decode64_$dt.json --trace-policy weave --out $D/decode64_$dt.json > $D/decode64_$dt.log 2>&1
    echo "dtrace $dt rc $? [${SECONDS}s]"
  done
fi
if has shared; then
  for dt in bf16 fp8; do
    timeout 150 $B --models deepseek-v2-lite,deepseek-v3 --tokens 2048,4096 --comm 8 --weave-comm= --no-sequential \
      --repeats 3 --shared first --expert-dtype $dt --out $D/shared_$dt.json > $D/shared_$dt.log 2>&1; echo "shared $dt rc $? [${SECONDS}s]"
  done
fi
if has e2e; then
  for dt in bf16 fp8; do
    timeout 150 torchrun --nproc_per_node=1 -m weave_kernel.e2e --model deepseek-v2-lite --tokens 4096 --layers 4 --shared --expert-dtype $dt \
      --repeats 3 --out $D/e2e_$dt.json > $D/e2e_$dt.log 2>&1; echo "e2e $dt rc $? [${SECONDS}s]"; tail -5 $D/e2e_$dt.log
  done
fi
python3 - <<'PY'
import json, os
d = os.environ["OUT"] + "/run2"
for kind in ("decode64", "shared"):
    rows = {}
    for dt in ("bf16", "fp8"):
        p = f"{d}/{kind}_{dt}.json"
        if not os.path.exists(p): continue
        for r in json.load(open(p)).get("results", []):
            for pol, ms in (r.get("latency_ms") or {}).items():
                rows.setdefault((r["model"], r["tokens_per_gpu"], pol), {})[dt] = ms
            for pol, ms in (r.get("shared_separate_ms") or {}).items():
                rows.setdefault((r["model"], r["tokens_per_gpu"], "sep:" + pol), {})[dt] = ms
    for (m, n, pol), v in sorted(rows.items()):
        if "bf16" in v and "fp8" in v:
            print(f"{kind:8s} {m:18s} {n:5d} {pol:12s} bf16 {v['bf16']:.4f} fp8 {v['fp8']:.4f} ms  {v['bf16']/v['fp8']:.3f}x")
PY
tar czf $OUT/run2.tgz -C $OUT run2 && rm -rf $D

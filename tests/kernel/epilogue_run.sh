#!/bin/bash
# One 1x H200 call: where a GEMM tile's time goes inside the layer, bf16 against FP8, at decode and prefill sizes.
# Builds a copy of the sources with tests/kernel/epilogue_timing.patch applied (EPI_CSRC, default
# tests/kernel/_ab_old_csrc, carried: `mkdir -p DIR && cp weave_kernel/csrc/* DIR && patch -d DIR -p3 < tests/kernel/epilogue_timing.patch`),
# traces one weave call per (model, tokens, dtype) with bench --trace, and prints tests/kernel/epilogue_stats.py and
# trace_tiles.py for each. EPI_MODELS: name:H:I ...; EPI_TOKENS, EPI_DTYPES: comma lists; EPI_GRIDS: space-separated
# grid sizes (0 = one CTA per SM, the default; e.g. "0 32": also bench --num-ctas 32). Logs in $OUT/epilogue.tgz.
set -o pipefail
source tests/kernel/device_env.sh  # wheels, environment, has()
R=$OUT/epilogue; mkdir -p $R
export WEAVE_KERNEL_CSRC=$(realpath ${EPI_CSRC:-tests/kernel/_ab_old_csrc}) TORCH_EXTENSIONS_DIR=${EPI_EXT_DIR:-/tmp/weave_ext_epi}
grep -c EXPERIMENT $WEAVE_KERNEL_CSRC/*.cuh | tr '\n' ' '; echo
python3 -c "from weave_kernel.build import load_extension; load_extension(False)" > $R/build.log 2>&1 || { echo build failed; tail -20 $R/build.log; }
B="torchrun --nproc_per_node=1 -m weave_kernel.bench --no-gpu-state"
for m in ${EPI_MODELS:-qwen3-30b-a3b:2048:768 deepseek-v3:7168:2048}; do
  IFS=: read name H I <<< "$m"
  for tok in $(echo ${EPI_TOKENS:-64,4096} | tr ',' ' '); do
    for dt in $(echo ${EPI_DTYPES:-bf16,fp8} | tr ',' ' '); do
      for ctas in ${EPI_GRIDS:-0}; do  # 0: one CTA per SM; else bench --num-ctas (fewer SMs share L2, HBM, power)
        f=trace_${name}_${tok}_$dt$([ $ctas = 0 ] || echo _${ctas}ctas)
        timeout 150 $B --models $name --tokens $tok --comm 8 --weave-comm= --no-sequential --repeats 3 --expert-dtype $dt \
          --num-ctas $ctas --trace $R/$f.json --trace-policy weave --out $R/tr_$f.json > $R/tr_$f.log 2>&1 \
          || echo "trace $f failed"
        python3 tests/kernel/epilogue_stats.py $R/$f.json 2>&1 | sed "s|$R/||"
        python3 tests/kernel/trace_tiles.py $R/$f.json $H $I 2>&1 | sed "s|$R/||"
      done
    done
  done
done
echo "[${SECONDS}s]"
tar czf $OUT/epilogue.tgz -C $OUT epilogue

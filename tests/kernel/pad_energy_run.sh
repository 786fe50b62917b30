#!/bin/bash
# One 1x H200 call: what MMAs on padding rows cost in power and time, and the FP8 decode tile, by STAGES:
#   verify  the harness after virtual_worker.rank_experts (fp8_worker, virtual_worker --quick G = 2, 4,
#           dispatch_ab on one model) and the GPU pytest of FP8 layers at random (test_random_fp8_layers)
#   calib   python -m weave_kernel.calibrate (its power block now has the zero-row runs), then what
#           weave_sim.calibrate.power_model makes of them (power.pad_energy)
#   tile    tile_limits: bf16 (mode 7) and FP8 (mode 17) sustained at the MoE shape with 0 / 64 / 128 zero rows
#           per block; then rows 128 per expert (each weight tile read once, as at decode) with 0 and 124 zero
#           rows, modes 7, 14 and 17
# Always builds first; logs land in $OUT/pad_energy.tgz (the device tool returns few files).
set -o pipefail
STAGES=${STAGES:-verify,calib,tile}
source tests/kernel/device_env.sh  # wheels, environment, has()
R=$OUT/pad_energy; mkdir -p $R
nvidia-smi --query-gpu=name,driver_version,uuid --format=csv,noheader | tee $R/gpu.txt
bash tests/kernel/device_run.sh build 2>&1 | tail -3
python3 -c "import weave_kernel.build as b; print('csrc', b.sources_digest())" | tee $R/csrc.txt
if has verify; then
  timeout 200 python3 tests/kernel/fp8_worker.py > $R/fp8_worker.log 2>&1
  echo "fp8_worker rc $? [${SECONDS}s]"; grep -E "^FAIL|SUMMARY" $R/fp8_worker.log | head -5
  timeout 200 python3 tests/kernel/virtual_worker.py --quick --worlds 2,4 > $R/virtual_quick.log 2>&1
  echo "virtual_worker --quick rc $? [${SECONDS}s]"; grep -E "^FAIL|SUMMARY|agree" $R/virtual_quick.log | head -5
  timeout 120 python3 tests/kernel/dispatch_ab.py --expert-dtype fp8 --models qwen3-30b-a3b --policies static:8 \
    --modes threads,bulk --repeats 2 > $R/dispatch_ab_fp8.log 2>&1
  echo "dispatch_ab fp8 rc $? [${SECONDS}s]"; tail -4 $R/dispatch_ab_fp8.log
  timeout 300 python3 -m pytest -q -m gpu tests/kernel/test_virtual_ranks_gpu.py -k fp8 > $R/pytest_random_fp8.log 2>&1
  echo "pytest random fp8 rc $? [${SECONDS}s]"; tail -2 $R/pytest_random_fp8.log
fi
if has calib; then
  timeout 200 python3 -m weave_kernel.calibrate --out $R/calib_pad_1xh200.json > $R/calib.log 2>&1
  echo "calibrate rc $? [${SECONDS}s]"; grep -E "sustained|zero rows|FAILED" $R/calib.log | cut -c1-300
  python3 - $R/calib_pad_1xh200.json <<'PY' 2>&1 | tee $R/pad_energy_fit.txt
import json, sys
from weave_sim.calibrate import power_model
pw = json.load(open(sys.argv[1]))["power"]
print(json.dumps({k: v for k, v in power_model(pw).items() if k != "note"}))
PY
fi
if has tile; then
  nvcc -std=c++17 -gencode=arch=compute_90a,code=sm_90a -O3 -DNDEBUG --expt-relaxed-constexpr -I weave_kernel/csrc \
    tests/kernel/tile_limits.cu -o /tmp/tile_limits > $R/tile_build.log 2>&1 || { echo "tile_limits: build failed"; tail -5 $R/tile_build.log; }
  for z in 0 64 128; do
    TL_ZERO_ROWS=$z TL_SUSTAIN=${TILE_SUSTAIN_S:-3} TL_SUSTAIN_MODES=7,17 timeout 150 /tmp/tile_limits 2048 64 256 \
      > $R/tile_moe_zero$z.log 2>&1; echo "tile moe zero $z rc $? [${SECONDS}s]"
  done
  for z in 0 124; do
    TL_ZERO_ROWS=$z TL_SUSTAIN=${TILE_SUSTAIN_S:-3} TL_SUSTAIN_MODES=7,14,17 timeout 150 /tmp/tile_limits 2048 128 128 \
      > $R/tile_decode_zero$z.log 2>&1; echo "tile decode zero $z rc $? [${SECONDS}s]"
  done
  for f in $R/tile_*zero*.log; do
    echo "== $(basename $f)"; grep -E "differ|host product|^(7|14|17) |TFLOP/s per SM|^warp-specialised, TMA|FP8 e4m3|rescaled acc|error" $f | cut -c1-150
  done
fi
tar czf $OUT/pad_energy.tgz -C $OUT pad_energy
echo "done [${SECONDS}s]"

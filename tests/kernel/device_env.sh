# Sourced by the one-call device scripts (fp8_run.sh, ab_dtypes.sh, copy_ab.sh, ...): the carried wheels (.whl:
# simpy, nvidia-cutlass) into /tmp/site, the environment every stage needs, and has(), true when $STAGES lists $1.
if compgen -G '.whl/*.whl' > /dev/null; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
else
  echo "device_env.sh: no wheels in $PWD/.whl (carry .whl: the device image lacks simpy and nvidia-cutlass)" >&2
fi
export PYTHONPATH=/tmp/site:$PWD TORCH_EXTENSIONS_DIR=/tmp/weave_ext NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export PYTHONUNBUFFERED=1 OMP_NUM_THREADS=4
has() { [[ ",$STAGES," == *",$1,"* ]]; }
# Seconds left of the script's budget $END (each script sets it, e.g. END=${END_S:-585}) after a reserve of $1; at
# least 5, so that a timeout given it still starts the command.
left() { local r=$((END - SECONDS - ${1:-0})); echo $(( r < 5 ? 5 : r )); }
# The six models of the benchmark, in the order the result tables use.
SIX_MODELS=qwen3-30b-a3b,deepseek-v2-lite,qwen3.5-35b-a3b,phi-3.5-moe,deepseek-v2,deepseek-v3
# The working tree's kernel built, and its sources' fingerprint into $1/csrc.txt (a one-call run's record of what ran).
build_tree() {
  bash tests/kernel/device_run.sh build 2>&1 | tail -1
  python3 -c "import weave_kernel.build as b; print(b.sources_digest())" | tee $1/csrc.txt
}
# An A/B's two kernels: the old sources in $2 (an ignored folder carried to the device, e.g. tests/kernel/_ab_old_csrc)
# built in the background into their own module, the working tree's in the foreground; both fingerprints into
# $1/csrc.txt. Call `wait` before the old one is used. Returns 2 if $2 is missing.
build_new_and_old() {
  local R=$1 OLD=$2
  [ -d "$OLD" ] || { echo "no old sources in $OLD"; return 2; }
  for s in $(python3 -c "from weave_kernel.build import SOURCES; print(*SOURCES)"); do [ -f $OLD/$s ] || : > $OLD/$s; done
  ( MAX_JOBS=8 timeout 300 python3 -c "from weave_kernel.build import load_extension; load_extension(False, csrc='$OLD')" \
    > $R/build_old.log 2>&1; echo "old build rc $? [${SECONDS}s]" >> $R/build_old.log ) &
  bash tests/kernel/device_run.sh build 2>&1 | tail -2
  python3 -c "import weave_kernel.build as b; print('new', b.sources_digest(), 'old', b.sources_digest('$OLD'))" | tee $R/csrc.txt
  return 0
}
# The quick correctness set on the working tree's kernel: gpu_worker --quick (one rank), virtual_worker --quick on the
# world sizes $2 (default 2,3,4) and fp8_worker; logs in $1, and a line each with the summary.
quick_tests() {
  local R=$1 W=${2:-2,3,4}
  timeout 200 torchrun --nproc_per_node=1 tests/kernel/gpu_worker.py --quick > $R/gpu_worker_quick.log 2>&1
  echo "gpu_worker --quick rc $? [${SECONDS}s]"; grep -E "^FAIL|SUMMARY|AGREEMENT" $R/gpu_worker_quick.log | head -5
  timeout 200 python3 tests/kernel/virtual_worker.py --quick --worlds $W > $R/virtual_quick.log 2>&1
  echo "virtual_worker --quick rc $? [${SECONDS}s]"; grep -E "^FAIL|SUMMARY|AGREEMENT" $R/virtual_quick.log | head -5
  timeout 150 python3 tests/kernel/fp8_worker.py > $R/fp8_worker.log 2>&1
  echo "fp8_worker rc $? [${SECONDS}s]"; grep -E "^FAIL|SUMMARY" $R/fp8_worker.log | head -5
}

# Sourced by the one-call device scripts (fp8_run.sh, fp8_gaps_run.sh, fp8_bulk_run.sh): the carried wheels (.whl:
# simpy, nvidia-cutlass) into /tmp/site, the environment every stage needs, and has(), true when $STAGES lists $1.
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
export PYTHONPATH=/tmp/site:$PWD TORCH_EXTENSIONS_DIR=/tmp/weave_ext NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export PYTHONUNBUFFERED=1 OMP_NUM_THREADS=4
has() { [[ ",$STAGES," == *",$1,"* ]]; }

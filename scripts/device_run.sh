#!/usr/bin/env bash
# One call on the GPU machine: install (the nvshmem4py wheel from .whl/ when
# carried), the single-GPU benchmark (JSON saved after every measurement),
# the merge across 2 GPUs when there are two (scripts/bench_merge.py),
# then the GPU kernel tests and the NVSHMEM tests (W = visible GPUs, at most
# 2), each with per-test timeouts. Logs and results go under $OUT.
#   run: bash scripts/device_run.sh    (BENCH_ARGS narrows the benchmark)
set -uo pipefail
export NCCL_NVLS_ENABLE=0 NVSHMEM_DISABLE_NVLS=1 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
if ls .whl/*.whl > /dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site
fi
python3 -m pip install -q --no-deps --no-build-isolation -e . > "$OUT/install.log" 2>&1 || { cat "$OUT/install.log"; exit 1; }
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee "$OUT/gpu.txt"
python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)" | tee -a "$OUT/gpu.txt"
timeout "${BENCH_TIMEOUT:-240}" python3 scripts/bench_kernels.py --out "$OUT/bench_kernels.json" ${BENCH_ARGS:-} 2>&1 \
  | grep -v -i warn | tee "$OUT/bench_kernels.log"
if [ "$(nvidia-smi -L | wc -l)" -ge 2 ]; then  # the merge across two GPUs, beside the generic merge
  timeout "${MERGE_TIMEOUT:-240}" torchrun --nproc-per-node 2 scripts/bench_merge.py --out "$OUT/bench_merge.json" \
    2>&1 | grep -v -i warn | tee "$OUT/bench_merge.log"
fi
timeout "${TEST_TIMEOUT:-300}" python3 -m pytest -q -m gpu tests/test_kernels.py tests/test_nvshmem.py \
  -p no:cacheprovider --timeout 200 --tb=short -rs > "$OUT/gpu_tests.log" 2>&1
tail -25 "$OUT/gpu_tests.log"

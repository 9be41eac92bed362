#!/usr/bin/env bash
# One call on the GPU machine: install, GPU tests, interpreter-free kernel
# tests on CUDA, then the benchmarks. Logs and JSON go under $OUT.
#   run: bash scripts/device_run.sh
set -uo pipefail
export NCCL_NVLS_ENABLE=0 NVSHMEM_DISABLE_NVLS=1 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
python3 -m pip install -q --no-deps --no-build-isolation -e . > "$OUT/install.log" 2>&1 || { cat "$OUT/install.log"; exit 1; }
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee "$OUT/gpu.txt"
python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)" | tee -a "$OUT/gpu.txt"
timeout 900 python3 -m pytest -q tests/test_kernels.py -p no:cacheprovider ${TEST_FILTER:+-k "$TEST_FILTER"} 2>&1 | tee "$OUT/gpu_tests.log" | tail -15
timeout 600 python3 scripts/bench_kernels.py --out "$OUT/bench_kernels.json" 2>&1 | tee "$OUT/bench_kernels.log"

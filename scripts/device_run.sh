#!/usr/bin/env bash
# The GPU machine's whole run, or the steps named (default: all but merge-library):
#   kernels  single-GPU benchmark over the score families (scripts/bench_kernels.py: the pack beside torch.topk,
#            the simulated 8-rank merge beside the generic merge; JSON saved after every measurement; about 7 min)
#   merge    the merge across the visible GPUs (W of them, at least 2) beside the generic merge
#            (scripts/bench_merge.py; MERGE_ARGS narrows it)
#   merge-library  the same on fewer shapes, plus the push merge with every peer reached through
#            NVSHMEM's device library, in the same run
#   tests    GPU kernel tests and NVSHMEM tests (W = visible GPUs), per-test timeouts and durations;
#            the launcher tests run when MPICH's mpiexec is there. With an empty Triton cache both files
#            take longer than one 600 s device call on one H200: run them in two calls (TEST_FILES)
#   serving  the serving tests (tests/test_serving_gpu.py) with an empty Triton cache, so their output gives
#            warm-up's compile time and variant count, then examples/serving_indexer.py under torchrun
#   cli      the console script: info, check, bench with its plot, and the demo under torchrun
#   launch   the demo started by MPICH's mpiexec (Hydra, PMI-1): NVSHMEM's PMI bootstrap, then over mpi4py
#   branches the kernel benchmark (BENCH_ARGS, default the pack at three shapes), the select alone at
#            W = 2 to 16 (scripts/bench_select.py; BRANCH_SELECT=0 leaves it out) and a short merge benchmark
#            of this checkout and of each branch staged by scripts/stage_branches.sh (carry .branches; not in
#            the default run)
#   primitives  the latency of Triton's block-wide steps in one program (scripts/bench_primitives.py; not in
#            the default run)
#   first-graphs  a fresh process's first graphs against the same graphs once it has captured more
#            (scripts/bench_first_graphs.py; not in the default run)
#   profile  Nsight Compute over one simulated merge, or what PROFILE_ARGS names (scripts/profile_kernels.py;
#            not in the default run), with each kernel's SASS instruction counts and stall samples
#            (scripts/sass_summary.py)
# Installs first: the nvshmem4py wheel from .whl/, MPICH (the mpich wheel) from .whl/launcher/, when carried.
# Logs and results go under $OUT.
#   run: bash scripts/device_run.sh [kernels] [merge] [merge-library] [tests] [serving] [cli] [launch] [branches]
#        [primitives] [first-graphs] [profile]
#        (BENCH_ARGS narrows the kernel benchmark, MERGE_ARGS the merge one, PROFILE_ARGS the profile, TEST_FILES,
#        TEST_MARK (default gpu; empty: every test of the files, on the GPU), TEST_K (one -k expression, kept whole)
#        and TEST_ARGS (split on spaces) the tests, e.g. TEST_MARK= TEST_K="every_path or pushed_list")
set -uo pipefail
export NCCL_NVLS_ENABLE=0 NVSHMEM_DISABLE_NVLS=1 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 PYTHONUNBUFFERED=1
export NVSHMEM_SYMMETRIC_SIZE=${NVSHMEM_SYMMETRIC_SIZE:-4294967296}  # the merge benchmark keeps 36 workspaces
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
STEPS=${*:-kernels merge tests cli launch}
if ls .whl/*.whl > /dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site
fi
if ls .whl/launcher/mpich-*.whl > /dev/null 2>&1; then  # mpiexec in bin/, libmpi.so.12 (for mpi4py) in lib/
  python3 -m pip install -q --no-index --no-deps --prefix /tmp/mpich .whl/launcher/mpich-*.whl \
    && export PATH=/tmp/mpich/bin:$PATH LD_LIBRARY_PATH=/tmp/mpich/lib:${LD_LIBRARY_PATH:-}
fi
python3 -m pip install -q --no-deps --no-build-isolation -e . > "$OUT/install.log" 2>&1 || { cat "$OUT/install.log"; exit 1; }
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee "$OUT/gpu.txt"
python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)" | tee -a "$OUT/gpu.txt"
GPUS=$(nvidia-smi -L | wc -l)
for step in $STEPS; do
  case $step in
    kernels)
      timeout "${BENCH_TIMEOUT:-560}" python3 scripts/bench_kernels.py --out "$OUT/bench_kernels.json" ${BENCH_ARGS:-} \
        2>&1 | grep -v -i warn | tee "$OUT/bench_kernels.log" ;;
    merge)
      [ "$GPUS" -ge 2 ] && timeout "${MERGE_TIMEOUT:-300}" torchrun --nproc-per-node "$GPUS" scripts/bench_merge.py \
        --out "$OUT/bench_merge.json" ${MERGE_ARGS:-} 2>&1 | grep -v -i warn | tee "$OUT/bench_merge.log" ;;
    merge-library)
      [ "$GPUS" -ge 2 ] && timeout "${MERGE_TIMEOUT:-300}" torchrun --nproc-per-node "$GPUS" scripts/bench_merge.py \
        --library-path --rows 1 64 --widths 16384 65536 --out "$OUT/bench_merge_library.json" 2>&1 \
        | grep -v -i warn | tee "$OUT/bench_merge_library.log" ;;
    tests)
      timeout "${TEST_TIMEOUT:-600}" python3 -m pytest -q -m "${TEST_MARK-gpu}" \
        ${TEST_FILES:-tests/test_kernels.py tests/test_nvshmem.py} ${TEST_K:+-k "$TEST_K"} \
        -p no:cacheprovider --timeout 200 --tb=short -rs --durations 0 ${TEST_ARGS:-} > "$OUT/gpu_tests.log" 2>&1
      tail -25 "$OUT/gpu_tests.log" ;;
    serving)
      { TRITON_CACHE_DIR=$(mktemp -d) timeout 400 python3 -m pytest -q -s tests/test_serving_gpu.py \
          -p no:cacheprovider --timeout 300 --tb=short --durations 0
        timeout 300 torchrun --nproc-per-node "$GPUS" examples/serving_indexer.py
      } 2>&1 | grep -v -i warn | tee "$OUT/serving.log" ;;
    cli)
      { nvshmem-topk info
        # decode batch sizes only: bench times each shape's stages too, and over 1, 64 and 256 rows of 16384
        # and 131072 tokens it outran 180 s after one shape of six (the wide shapes are the kernels step's)
        timeout 300 nvshmem-topk bench --impl triton --device cuda --rows 1 16 64 --widths 16384 \
          --reps 20 --json "$OUT/cli_bench.json" --plot "$OUT/cli_bench.png"
        [ "$GPUS" -ge 2 ] && timeout 120 torchrun --nproc-per-node "$GPUS" -m nvshmem_topk demo
        timeout 240 nvshmem-topk check --impl triton --device cuda --world-sizes 2 8
      } 2>&1 | grep -v -i warn | tee "$OUT/cli.log" ;;
    launch)
      { for bootstrap in pmi mpi; do
          echo "\$ mpiexec -n $GPUS python3 -m nvshmem_topk demo --bootstrap $bootstrap"
          timeout 120 mpiexec -n $GPUS python3 -m nvshmem_topk demo --bootstrap $bootstrap
        done
      } 2>&1 | grep -v -i warn | tee "$OUT/launch.log" ;;
    branches)  # each branch staged by scripts/stage_branches.sh, beside this checkout, with this checkout's scripts
      mkdir -p /tmp/branches
      for tree in . .branches/*/; do
        [ -d "$tree" ] || continue
        name=$([ "$tree" = . ] && echo checkout || basename "$tree")
        path=$([ "$tree" = . ] && echo "${PYTHONPATH:-}" || echo "$PWD/$tree:${PYTHONPATH:-}")
        echo "## $name"
        PYTHONPATH=$path timeout "${BENCH_TIMEOUT:-240}" python3 scripts/bench_kernels.py \
          --out "/tmp/branches/$name.json" ${BENCH_ARGS:---skip-merge --shapes 64x16384 8x131072 64x131072}
        [ "${BRANCH_SELECT:-1}" = 1 ] && PYTHONPATH=$path timeout 150 python3 scripts/bench_select.py
        [ "$GPUS" -ge 2 ] && PYTHONPATH=$path timeout "${MERGE_TIMEOUT:-300}" torchrun --nproc-per-node "$GPUS" \
          scripts/bench_merge.py --rows 1 64 --widths 16384 65536 --iters 100 --out "/tmp/branches/${name}_merge.json"
      done 2>&1 | grep -v -i warn | tee "$OUT/branches.log"
      tar czf "$OUT/branches.tgz" -C /tmp/branches . ;;
    primitives)
      timeout 300 python3 scripts/bench_primitives.py 2>&1 | grep -v -i warn | tee "$OUT/primitives.log" ;;
    first-graphs)
      timeout 200 python3 scripts/bench_first_graphs.py 2>&1 | grep -v -i warn | tee "$OUT/first_graphs.log" ;;
    profile)  # --clock-control none: leave the GPU's clocks as they are
      { timeout 300 ncu --clock-control none --profile-from-start off --set full --import-source yes \
          -o "$OUT/kernels" -f python3 scripts/profile_kernels.py ${PROFILE_ARGS:-}
        timeout 120 ncu --import "$OUT/kernels.ncu-rep" --print-summary per-kernel
        timeout 120 ncu --import "$OUT/kernels.ncu-rep" --page details --csv > "$OUT/profile_details.csv"
        mkdir -p /tmp/sass  # per-instruction SASS counts and stall samples, one kernel each (scripts/sass_summary.py)
        for kernel in estimate filter finish row select rescue; do
          timeout 60 ncu --import "$OUT/kernels.ncu-rep" --page source --print-source sass --csv -k "regex:$kernel" \
            -c 1 > "/tmp/sass/$kernel.csv" && python3 scripts/sass_summary.py "/tmp/sass/$kernel.csv"
        done
        tar czf "$OUT/profile_sass.tgz" -C /tmp/sass .
      } 2>&1 | grep -v -i warn | tee "$OUT/profile.log" | tail -60 ;;
    *) echo "unknown step $step (kernels, merge, merge-library, tests, serving, cli, launch, branches, primitives," \
            "first-graphs, profile)"; exit 2 ;;
  esac
done

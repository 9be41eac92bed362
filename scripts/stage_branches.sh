#!/usr/bin/env bash
# Stage branches for the GPU machine's `branches` step (scripts/device_run.sh):
# each branch's package, laid out as the install lays it out (nvshmem_topk
# with its kernels/ inside), under .branches/<branch>/. Git ignores the folder;
# the device call carries it (carry: [".branches", ".whl"]).
#   bash scripts/stage_branches.sh BRANCH [BRANCH...]
set -euo pipefail
cd "$(dirname "$0")/.."
rm -rf .branches
for branch in "$@"; do
  dir=.branches/${branch//\//_}
  mkdir -p "$dir"
  git archive "$branch" nvshmem_topk | tar -x -C "$dir"
  git archive --prefix=nvshmem_topk/ "$branch" kernels | tar -x -C "$dir"
done
ls .branches

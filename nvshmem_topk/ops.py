"""torch custom ops for the merge, so it traces into torch.compile graphs
(fullgraph) and CUDA graphs without a break.

A workspace is not a tensor, so the ops take its integer ``handle``
(``DcpTopkWorkspace.handle``); the op mutates ``ids_out`` (declared) and the
workspace's own buffers, which no compiled graph sees.

    torch.ops.nvshmem_topk.merge(logits, row_ends, ids_out, workspace.handle, sorted)
    torch.ops.nvshmem_topk.simulate_merge(logits, row_ends, topk, local_topk, impl, interleave, sorted)
"""

from __future__ import annotations

import torch

from . import api
from .workspace import workspace_by_handle


@torch.library.custom_op("nvshmem_topk::merge", mutates_args=("ids_out",))
def merge(logits: torch.Tensor, row_ends: torch.Tensor, ids_out: torch.Tensor, handle: int,
          sorted: bool) -> None:
    """``dcp_topk_merge`` on the workspace with this handle."""
    api.dcp_topk_merge(logits, row_ends, ids_out, workspace=workspace_by_handle(handle), sorted=sorted)


@merge.register_fake
def _(logits, row_ends, ids_out, handle, sorted):
    return None


@torch.library.custom_op("nvshmem_topk::simulate_merge", mutates_args=())
def simulate_merge(logits: torch.Tensor, row_ends: torch.Tensor, topk: int, local_topk: int, impl: str,
                   interleave: int, sorted: bool) -> torch.Tensor:
    """``simulate_dcp_topk_merge``; ``local_topk`` 0 means the default."""
    return api.simulate_dcp_topk_merge(logits, row_ends, topk=topk, local_topk=local_topk or None,
                                       impl=impl, interleave=interleave, sorted=sorted)


@simulate_merge.register_fake
def _(logits, row_ends, topk, local_topk, impl, interleave, sorted):
    return logits.new_empty((logits.shape[0], logits.shape[1], topk), dtype=torch.int32)

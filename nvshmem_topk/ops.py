"""torch custom ops for the merge, so it traces into torch.compile graphs
(fullgraph) and CUDA graphs without a break.

A workspace is not a tensor, so the ops take its integer ``handle``
(``DcpTopkWorkspace.handle``); the op mutates ``ids_out`` (declared) and the
workspace's own buffers, which no compiled graph sees.

    torch.ops.nvshmem_topk.merge(logits, row_ends, ids_out, workspace.handle, sorted, row_starts)
    torch.ops.nvshmem_topk.merge_rows(logits, row_ends, req_id, block_table, rows_out, valid_out, ids_out, packed,
                                      workspace.handle, block_size, stride_rows, sorted, row_starts)
    torch.ops.nvshmem_topk.simulate_merge(logits, row_ends, topk, local_topk, impl, interleave, sorted, row_starts,
                                          score_dtype)

The public functions (``dcp_topk_merge``, ``dcp_topk_merge_rows``,
``simulate_dcp_topk_merge`` and the indexer's) call these ops themselves
while torch.compile traces them, so compiled model code can call the
public API; the ops check their arguments when they run.
"""

from __future__ import annotations

from typing import Optional

import torch

from . import api
from .workspace import workspace_by_handle


@torch.library.custom_op("nvshmem_topk::merge", mutates_args=("ids_out",))
def merge(logits: torch.Tensor, row_ends: torch.Tensor, ids_out: torch.Tensor, handle: int,
          sorted: bool, row_starts: Optional[torch.Tensor] = None) -> None:
    """``dcp_topk_merge`` on the workspace with this handle."""
    api.dcp_topk_merge(logits, row_ends, ids_out, workspace=workspace_by_handle(handle), sorted=sorted,
                       row_starts=row_starts)


@merge.register_fake
def _(logits, row_ends, ids_out, handle, sorted, row_starts=None):
    return None


@torch.library.custom_op("nvshmem_topk::merge_rows", mutates_args=("rows_out", "valid_out", "ids_out"))
def merge_rows(logits: torch.Tensor, row_ends: torch.Tensor, req_id: torch.Tensor, block_table: torch.Tensor,
               rows_out: torch.Tensor, valid_out: torch.Tensor, ids_out: Optional[torch.Tensor],
               packed: Optional[torch.Tensor], handle: int, block_size: int, stride_rows: int, sorted: bool,
               row_starts: Optional[torch.Tensor] = None) -> None:
    """``dcp_topk_merge_rows`` on the workspace with this handle."""
    api.dcp_topk_merge_rows(logits=logits, row_ends=row_ends, workspace=workspace_by_handle(handle), req_id=req_id,
                            block_table=block_table, block_size=block_size, stride_rows=stride_rows,
                            rows_out=rows_out, valid_out=valid_out, ids_out=ids_out, packed=packed, sorted=sorted,
                            row_starts=row_starts)


@merge_rows.register_fake
def _(logits, row_ends, req_id, block_table, rows_out, valid_out, ids_out, packed, handle, block_size, stride_rows,
      sorted, row_starts=None):
    return None


@torch.library.custom_op("nvshmem_topk::simulate_merge", mutates_args=())
def simulate_merge(logits: torch.Tensor, row_ends: torch.Tensor, topk: int, local_topk: int, impl: str,
                   interleave: int, sorted: bool, row_starts: Optional[torch.Tensor] = None,
                   score_dtype: Optional[torch.dtype] = None) -> torch.Tensor:
    """``simulate_dcp_topk_merge``; ``local_topk`` 0 and ``impl`` "" mean the defaults."""
    return api.simulate_dcp_topk_merge(logits, row_ends, topk=topk, local_topk=local_topk or None,
                                       impl=impl or None, interleave=interleave, sorted=sorted, row_starts=row_starts,
                                       score_dtype=score_dtype)


@simulate_merge.register_fake
def _(logits, row_ends, topk, local_topk, impl, interleave, sorted, row_starts=None, score_dtype=None):
    return logits.new_empty((logits.shape[0], logits.shape[1], topk), dtype=torch.int32)

"""What a serving engine's sparse-attention indexer holds: the merge with the
call shape engines already use, one workspace per micro-batch that can be in
flight, and a warm-up to run before CUDA-graph capture.

    # model construction, on every rank of the DCP group
    indexer = DcpTopkIndexer(group, max_rows=256, topk=2048, max_local_len=131072,
                             micro_batches=2)
    indexer.warmup()                       # compiles every kernel variant; before capture
    # every layer, every decode step
    indexer.dcp_topk_merge(logits, row_ends, topk_indices, micro_batch=ub)
    # shutdown
    indexer.destroy()
"""

from __future__ import annotations

import torch

from . import api
from . import format as fmt
from .groups.base import DcpGroup
from .protocol import backend


class DcpTopkIndexer:
    """The exact DCP top-K merge as an indexer hook.

    group: this rank's DCP group (a subset of the world is fine, e.g. the DCP
    ranks inside a TP group); micro_batches: merges that can be in flight at
    once (each gets its own workspace). Other arguments as for
    ``init_dcp_topk_merge``."""

    def __init__(self, group: DcpGroup, *, max_rows: int, topk: int, max_local_len: int,
                 local_topk: int | None = None, micro_batches: int = 1, interleave: int = 1,
                 impl: str | None = None, exchange: str = "push", timeout_s: float = 5.0,
                 pdl: bool | None = None, score_dtype: torch.dtype | None = None) -> None:
        if not isinstance(micro_batches, int) or micro_batches < 1:
            raise ValueError(f"micro_batches must be a positive int, got {micro_batches!r}")
        self.group = group
        self.workspaces = [
            api.init_dcp_topk_merge(group, max_rows=max_rows, topk=topk, max_local_len=max_local_len,
                                    local_topk=local_topk, interleave=interleave, impl=impl,
                                    exchange=exchange, timeout_s=timeout_s, pdl=pdl, score_dtype=score_dtype)
            for _ in range(micro_batches)
        ]
        self.topk = topk
        self.local_topk = self.workspaces[0].local_topk
        self.max_rows = max_rows
        self.max_local_len = max_local_len

    def _workspace(self, micro_batch: int, local_topk: int | None):
        if local_topk is not None and fmt.round_up_to_warp(local_topk) != self.local_topk:
            raise ValueError(f"local_topk={local_topk} differs from this indexer's N={self.local_topk}")
        if not 0 <= micro_batch < len(self.workspaces):
            raise ValueError(f"micro_batch must be in [0, {len(self.workspaces)}), got {micro_batch}")
        return self.workspaces[micro_batch]

    def dcp_topk_merge(self, logits: torch.Tensor, row_ends: torch.Tensor, topk_indices: torch.Tensor,
                       local_topk: int | None = None, *, micro_batch: int = 0, sorted: bool = False,
                       row_starts: torch.Tensor | None = None) -> None:
        """logits [T, S] bf16 or fp16 (fp32 with ``score_dtype=torch.float32``),
        row_ends (and row_starts) [T] int32 or int64 -> topk_indices [T, K]
        int32 global ids, -1 padded (collective over the DCP group)."""
        api.dcp_topk_merge(logits, row_ends, topk_indices, workspace=self._workspace(micro_batch, local_topk),
                           sorted=sorted, row_starts=row_starts)

    def dcp_topk_merge_rows(self, *, logits: torch.Tensor, row_ends: torch.Tensor, req_id: torch.Tensor,
                            block_table: torch.Tensor, block_size: int, stride_rows: int,
                            rows_out: torch.Tensor, valid_out: torch.Tensor,
                            ids_out: torch.Tensor | None = None, packed: torch.Tensor | None = None,
                            local_topk: int | None = None, micro_batch: int = 0, sorted: bool = False,
                            row_starts: torch.Tensor | None = None) -> None:
        """This rank's physical KV rows of the merge (see ``RowsOutput``)."""
        api.dcp_topk_merge_rows(logits=logits, row_ends=row_ends,
                                workspace=self._workspace(micro_batch, local_topk), req_id=req_id,
                                block_table=block_table, block_size=block_size, stride_rows=stride_rows,
                                rows_out=rows_out, valid_out=valid_out, ids_out=ids_out, packed=packed,
                                sorted=sorted, row_starts=row_starts)

    def warmup(self, *, rows: bool | None = None, sorted: bool | None = None,
               processes: int | None = None) -> None:
        """Compiles every kernel variant the indexer can launch, before graph
        capture: a merge on every workspace for each of the pack's width
        classes and each output form (``rows``: physical rows or ids,
        ``sorted``; None: both). Nothing else is a compile-time fact: any
        row width up to max_local_len and any batch size up to max_rows
        then run without compiling, for bf16 logits (fp32 when the indexer
        ranks the fp32 order) whose rows lie at a stride of a multiple of 16
        elements, int32 row ends and no row
        starts (as engines pass them at decode; another stride or dtype, or
        row starts, compile at their first merge). On GPUs the
        merges first run compile-only, their variants compiled at once by
        ``processes`` forked processes (default one per CPU; 0: in this
        process, one after another, for a process that must not fork), then
        for real. Collective."""
        forms = [(r, s) for r in (False, True) if rows in (None, r) for s in (False, True) if sorted in (None, s)]
        if self.workspaces[0].impl == "triton" and self.group.device.type == "cuda":
            from .kernels import launch

            # Compile-only merges run the host side only (a collective exchange's copy into the local
            # gather buffer at the coming epoch), which the merges below repeat in stream order.
            with launch.compile_only(processes):
                self._merge_every_variant(forms)
        self._merge_every_variant(forms)

    def _merge_every_variant(self, forms: list[tuple[bool, bool]]) -> None:
        device, num_rows = self.group.device, self.max_rows
        dtype = torch.float32 if self.workspaces[0].score_bits == 32 else torch.bfloat16  # what engines pass
        for width in backend(self.workspaces[0].impl).compiled_widths(self.max_local_len):
            stride = -(-width // 16) * 16
            logits = torch.zeros((num_rows, stride), dtype=dtype, device=device)[:, :width]
            row_ends = torch.full((num_rows,), width, dtype=torch.int32, device=device)
            ids = torch.empty((num_rows, self.topk), dtype=torch.int32, device=device)
            for (emit_rows, by_key), ws in ((form, ws) for form in forms for ws in self.workspaces):
                if emit_rows:
                    api.dcp_topk_merge_rows(
                        logits=logits, row_ends=row_ends, workspace=ws,
                        req_id=torch.zeros((num_rows,), dtype=torch.int32, device=device),
                        block_table=torch.zeros((1, 1), dtype=torch.int32, device=device), block_size=1,
                        stride_rows=1, rows_out=torch.empty_like(ids),
                        valid_out=torch.empty((num_rows,), dtype=torch.int32, device=device),
                        ids_out=ids, sorted=by_key)
                else:
                    api.dcp_topk_merge(logits, row_ends, ids, workspace=ws, sorted=by_key)

    def destroy(self) -> None:
        for ws in self.workspaces:
            ws.destroy()

"""Public entry points: validate every argument, then dispatch.

Nothing here runs a kernel before the arguments have been checked; every
error names what was expected and what came."""

from __future__ import annotations

import torch

from . import _checks as checks
from . import format as fmt
from . import protocol
from .groups.base import DcpGroup
from .protocol import Outputs, RowsOutput, backend, resolve_impl
from .groups.simulated import SimulatedGroup
from .workspace import DcpTopkWorkspace


def init_dcp_topk_merge(
    group: DcpGroup, *, max_rows: int, topk: int, max_local_len: int, local_topk: int | None = None,
    interleave: int = 1, impl: str | None = None, exchange: str = "push", timeout_s: float = 5.0, pdl=None,
    score_dtype: torch.dtype | None = None,
) -> DcpTopkWorkspace:
    """Build this rank's workspace (collective over ``group``; before any
    merge and before CUDA-graph capture).

    max_rows: most rows (T) of one merge; topk: K; max_local_len: the
    largest local length any row_ends will declare (sets the bit planes, at
    most 2^20); local_topk: N, default ``default_local_topk(K, W)``, rounded
    up to a multiple of 32 (``ws.local_topk``); interleave: I, tokens per
    rank in a run; impl: "triton" (default on CUDA) or "reference" (default
    on CPU); exchange: how round-1 rows travel, "push" (Triton stores into
    every peer's buffer, bounded waits; the default and the fastest
    measured), "all_gather" (NCCL) or "fcollect" (NVSHMEM's, NvshmemGroup
    only; its wait is unbounded); timeout_s: bound of every wait; pdl:
    launch each kernel as a programmatic dependent of the one before
    (default: on GPUs); score_dtype: None ranks scores in their own bf16 or
    fp16 order (fp32 logits rounded to bf16 first), or torch.float32 in the
    exact fp32 order of any float logits."""
    local_topk, impl = checks.check_settings(group, max_rows=max_rows, topk=topk, local_topk=local_topk,
                                             max_local_len=max_local_len, interleave=interleave, impl=impl,
                                             exchange=exchange, timeout_s=timeout_s)
    return DcpTopkWorkspace(group, max_rows=max_rows, topk=topk, local_topk=local_topk, max_local_len=max_local_len,
                            interleave=interleave, impl=impl, exchange=exchange, timeout_s=float(timeout_s),
                            pdl=checks.check_pdl(pdl, group.device), score_bits=fmt.score_bits_of(score_dtype))


def dcp_topk_pack(
    logits: torch.Tensor, row_ends: torch.Tensor, *, local_topk: int, max_local_len: int,
    out: torch.Tensor | None = None, impl: str | None = None, pdl: bool | None = None,
    row_starts: torch.Tensor | None = None, score_dtype: torch.dtype | None = None,
) -> torch.Tensor:
    """This rank's round-1 rows: the local top-N by (score desc, local id
    asc) of ``logits`` [T, S] (bf16 or fp16; fp32 is rounded to bf16, or
    ranked exactly with ``score_dtype=torch.float32``) from
    ``row_starts[t]`` (default 0) to ``min(row_ends[t], S, max_local_len)``,
    NaN excluded, packed by ascending local id into int32
    [T, packed_row_words(N, P, score_bits)] (0 = empty slot)."""
    checks.check_int("local_topk", local_topk, fmt.WARP, None, fmt.WARP)
    rows, out, starts, pdl, score_bits = checks.check_pack(logits, row_ends, row_starts, local_topk, max_local_len,
                                                           out, pdl, score_dtype)
    backend(resolve_impl(impl, logits.device)).pack(logits[:rows], row_ends[:rows], out, local_topk=local_topk,
                                                    max_local_len=max_local_len, row_starts=starts, pdl=pdl,
                                                    score_bits=score_bits)
    return out


def dcp_topk_pack_indices(
    logits: torch.Tensor, local_idx: torch.Tensor, row_ends: torch.Tensor, *, max_local_len: int,
    out: torch.Tensor | None = None, impl: str | None = None, pdl: bool | None = None,
    row_starts: torch.Tensor | None = None, score_dtype: torch.dtype | None = None,
) -> torch.Tensor:
    """Pack a caller's local top-N ``local_idx`` [T, N] int32 (-1 padded, N
    a multiple of 32) in its order; ids outside [row_starts (default 0),
    min(row_ends, S, max_local_len)) and NaN scores become empty slots. The
    ids must be a top-N by score (in the order ``score_dtype`` names, as in
    ``dcp_topk_pack``) for the merge to be exact
    (``assert_packed_merge_contract``)."""
    checks.check_tensor("local_idx", local_idx, torch.int32, 2, logits.device)
    checks.check_int("local_idx.shape[1]", local_idx.shape[1], fmt.WARP, None, fmt.WARP)
    rows, out, starts, pdl, score_bits = checks.check_pack(logits, row_ends, row_starts, local_idx.shape[1],
                                                           max_local_len, out, pdl, score_dtype)
    if local_idx.shape[0] != rows:
        raise ValueError(f"local_idx must have {rows} rows, got {tuple(local_idx.shape)}")
    backend(resolve_impl(impl, logits.device)).pack_indices(logits, local_idx, row_ends[:rows], out,
                                                            max_local_len=max_local_len, row_starts=starts, pdl=pdl,
                                                            score_bits=score_bits)
    return out


def dcp_topk_exchange(packed: torch.Tensor, *, workspace: DcpTopkWorkspace) -> None:
    """Push this rank's round-1 rows [T, words] into every rank's gather
    buffer (this call's epoch parity) and release their flags."""
    protocol.exchange(checks.check_exchange(packed, workspace), packed)


def dcp_topk_select(
    logits: torch.Tensor, row_ends: torch.Tensor, *, workspace: DcpTopkWorkspace, num_rows: int,
    ids_out: torch.Tensor | None = None, rows: RowsOutput | None = None, sorted: bool = False,
    row_starts: torch.Tensor | None = None,
) -> None:
    """Round 1 on this rank: wait for every rank's rows of this epoch, select
    the top-K of the W*N candidates into ``ids_out`` [T, K] int32 (-1
    padded) and/or ``rows``, record the saturation state and, if this rank
    is saturated on a row, push its local top-K (those at or above kappa's
    score) to every rank. Never waits for a rescue.
    ``logits``/``row_ends``/``row_starts`` are this rank's (re-read when
    saturated)."""
    ws, out = checks.check_stage(workspace, logits, row_ends, num_rows, ids_out, rows, sorted, row_starts)
    backend(ws.impl).select(ws, logits, row_ends, num_rows, out, row_starts)


def dcp_topk_rescue(
    logits: torch.Tensor, row_ends: torch.Tensor, *, workspace: DcpTopkWorkspace, num_rows: int,
    ids_out: torch.Tensor | None = None, rows: RowsOutput | None = None, sorted: bool = False,
) -> None:
    """Round 2 on this rank: for rows with saturated ranks, wait for their
    pushed lists and overwrite the outputs; then close the epoch."""
    ws, out = checks.check_stage(workspace, logits, row_ends, num_rows, ids_out, rows, sorted)
    backend(ws.impl).rescue(ws, logits, row_ends, num_rows, out)


def dcp_topk_merge(
    logits: torch.Tensor, row_ends: torch.Tensor, topk_indices: torch.Tensor, *,
    workspace: DcpTopkWorkspace, sorted: bool = False, row_starts: torch.Tensor | None = None,
) -> None:
    """Exact global top-K ids of this rank's ``logits`` [T, S] (bf16 or
    fp16; fp32 is rounded to bf16 unless the workspace ranks the exact fp32
    order), its tokens ``row_starts[t] <= l < row_ends[t]`` valid (each [T]
    int32 or int64; no starts: 0), over the DCP group into ``topk_indices``
    [T, K] int32 (global ids, -1 padded; ``sorted`` gives descending score,
    then ascending id). Collective: every rank calls every merge, in stream
    order."""
    if torch.compiler.is_compiling():  # traced as the custom op, which checks its arguments when it runs
        torch.ops.nvshmem_topk.merge(logits, row_ends, topk_indices, workspace.handle, sorted, row_starts)
        return
    ws, rows = checks.check_merge(workspace, logits, row_ends, row_starts)
    out = checks.check_outputs(ws, rows, topk_indices, None, sorted)
    protocol.run_merge([ws], [logits], [row_ends], [out], rows, row_starts=[row_starts])


def dcp_topk_merge_rows(
    *, logits: torch.Tensor, row_ends: torch.Tensor, workspace: DcpTopkWorkspace,
    req_id: torch.Tensor, block_table: torch.Tensor, block_size: int, stride_rows: int,
    rows_out: torch.Tensor, valid_out: torch.Tensor, ids_out: torch.Tensor | None = None,
    packed: torch.Tensor | None = None, sorted: bool = False, row_starts: torch.Tensor | None = None,
) -> None:
    """The merge straight to this rank's physical KV rows (see
    ``RowsOutput``); ``ids_out`` [T, K] optionally gets the global ids.
    ``packed`` [T, words] int32 replaces the pack with a caller's round-1
    rows (``dcp_topk_pack_indices``); logits and the row bounds are still
    needed (a saturated rank re-reads its row)."""
    if torch.compiler.is_compiling():
        torch.ops.nvshmem_topk.merge_rows(logits, row_ends, req_id, block_table, rows_out, valid_out, ids_out, packed,
                                          workspace.handle, block_size, stride_rows, sorted, row_starts)
        return
    ws, rows = checks.check_merge(workspace, logits, row_ends, row_starts)
    spec = RowsOutput(req_id, block_table, block_size, stride_rows, rows_out, valid_out)
    out = checks.check_outputs(ws, rows, ids_out, spec, sorted)
    protocol.run_merge([ws], [logits], [row_ends], [out], rows, checks.check_packed(ws, rows, packed), [row_starts])


def simulate_dcp_topk_merge(
    logits: torch.Tensor, row_ends: torch.Tensor, *, topk: int, local_topk: int | None = None,
    impl: str | None = None, interleave: int = 1, sorted: bool = False, row_starts: torch.Tensor | None = None,
    score_dtype: torch.dtype | None = None,
) -> torch.Tensor:
    """The whole merge over W virtual ranks in this process.

    logits: [W, T, S] bf16 or fp16 (or fp32; ``score_dtype`` as in
    ``init_dcp_topk_merge``), ``logits[r, t, l]`` scores
    rank r's local token l; row_ends and row_starts (optional): [W, T]
    int32 or int64, rank r's tokens row_starts[r, t] <= l < row_ends[r, t]
    valid. Returns int32 [W, T, topk]: rank r's ids (the same on every
    rank), -1 padded. ``impl``: by default the Triton kernels on CUDA, the
    reference on CPU."""
    if torch.compiler.is_compiling():
        return torch.ops.nvshmem_topk.simulate_merge(logits, row_ends, topk, local_topk or 0, impl or "", interleave,
                                                     sorted, row_starts, score_dtype)
    local_topk = checks.check_simulated(logits, row_ends, topk, local_topk, row_starts)
    world_size, rows, width = logits.shape
    out = torch.full((world_size, max(rows, 1), topk), -1, dtype=torch.int32, device=logits.device)
    if rows == 0:
        return out[:, :0]
    group = SimulatedGroup(world_size, logits.device)
    try:
        workspaces = [init_dcp_topk_merge(g, max_rows=rows, topk=topk, local_topk=local_topk, interleave=interleave,
                                          max_local_len=max(width, 1), impl=impl, score_dtype=score_dtype)
                      for g in group.ranks]
        protocol.run_merge(workspaces, list(logits), list(row_ends), [Outputs(o, None, bool(sorted)) for o in out],
                           rows, row_starts=list(row_starts) if row_starts is not None else None)
    finally:
        group.destroy()
    return out

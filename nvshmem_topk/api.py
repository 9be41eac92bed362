"""Public entry points: validate every argument, then dispatch.

Nothing here runs a kernel before the arguments have been checked; every
error names what was expected and what came."""

from __future__ import annotations

import torch

from . import format as fmt
from ._backends import Outputs, RowsOutput, backend, resolve_impl
from .groups.base import DcpGroup
from .groups.simulated import SimulatedGroup
from .workspace import DcpTopkWorkspace

_LOGIT_DTYPES = (torch.bfloat16, torch.float32)
EXCHANGES = ("push", "all_gather", "fcollect")


# ------------------------------------------------------------ validation


def _check_int(name: str, value, low: int, high: int | None = None, multiple: int = 1) -> None:
    if not isinstance(value, int) or isinstance(value, bool):
        raise TypeError(f"{name} must be an int, got {type(value).__name__}")
    if value < low or (high is not None and value > high) or value % multiple:
        bound = f"in [{low}, {high}]" if high is not None else f">= {low}"
        also = f" and a multiple of {multiple}" if multiple > 1 else ""
        raise ValueError(f"{name} must be {bound}{also}, got {value}")


def _check_sizes(topk: int, local_topk: int, world_size: int) -> None:
    _check_int("topk", topk, fmt.MIN_TOPK, fmt.MAX_TOPK, fmt.WARP)
    _check_int("local_topk", local_topk, fmt.WARP, None, fmt.WARP)
    _check_int("world_size", world_size, 1, fmt.MAX_WORLD_SIZE)


def _check_tensor(name: str, t, dtypes, dim: int, device: torch.device | None = None) -> None:
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    dtypes = dtypes if isinstance(dtypes, tuple) else (dtypes,)
    if t.dtype not in dtypes:
        want = " or ".join(str(d) for d in dtypes)
        raise TypeError(f"{name} must be {want}, got {t.dtype}")
    if t.dim() != dim:
        raise ValueError(f"{name} must have {dim} dimensions, got shape {tuple(t.shape)}")
    if t.dim() and t.shape[-1] > 1 and t.stride(-1) != 1:
        raise ValueError(f"{name} must have stride(-1) == 1, got strides {t.stride()}")
    if device is not None and t.device != device:
        raise ValueError(f"{name} must be on {device}, got {t.device}")


def _check_logits(logits, row_ends, rows: int | None = None, device=None) -> int:
    """Checks [T, S] logits and [>= T] row_ends; returns T."""
    _check_tensor("logits", logits, _LOGIT_DTYPES, 2, device)
    rows = logits.shape[0] if rows is None else rows
    if logits.shape[0] < rows:
        raise ValueError(f"logits must have >= {rows} rows, got shape {tuple(logits.shape)}")
    _check_tensor("row_ends", row_ends, torch.int32, 1, logits.device)
    if row_ends.shape[0] < rows:
        raise ValueError(f"row_ends must have >= {rows} entries, got {row_ends.shape[0]}")
    return rows


def _check_out(name: str, t, shape: tuple[int, int], device, at_least_cols: bool = False) -> None:
    _check_tensor(name, t, torch.int32, len(shape), device)
    ok = t.shape[0] == shape[0] and (t.shape[1] >= shape[1] if at_least_cols else t.shape[1:] == shape[1:])
    if not ok:
        cols = f">= {shape[1]}" if at_least_cols else ", ".join(str(s) for s in shape[1:])
        raise ValueError(f"{name} must be [{shape[0]}, {cols}], got {tuple(t.shape)}")


def _check_rows(rows: RowsOutput, num_rows: int, topk: int, device) -> None:
    _check_tensor("req_id", rows.req_id, torch.int32, 1, device)
    if rows.req_id.shape[0] < num_rows:
        raise ValueError(f"req_id must have >= {num_rows} entries, got {rows.req_id.shape[0]}")
    _check_tensor("block_table", rows.block_table, torch.int32, 2, device)
    _check_int("block_size", rows.block_size, 1)
    _check_int("stride_rows", rows.stride_rows, 1)
    _check_out("rows_out", rows.rows_out, (num_rows, topk), device, at_least_cols=True)
    _check_tensor("valid_out", rows.valid_out, torch.int32, 1, device)
    if rows.valid_out.shape[0] != num_rows:
        raise ValueError(f"valid_out must be [{num_rows}], got {tuple(rows.valid_out.shape)}")


def _check_workspace(workspace) -> DcpTopkWorkspace:
    if workspace is None:
        raise RuntimeError(
            "the DCP top-k merge needs its workspace: build one with "
            "init_dcp_topk_merge(group, max_rows=..., topk=..., max_local_len=...) "
            "on every rank before the first merge, and pass it as workspace="
        )
    if not isinstance(workspace, DcpTopkWorkspace):
        raise TypeError(f"workspace must be a DcpTopkWorkspace, got {type(workspace).__name__}")
    workspace.check()
    return workspace


def _check_fits(ws: DcpTopkWorkspace, rows: int) -> None:
    if rows > ws.max_rows:
        raise ValueError(f"{rows} rows exceed the workspace's max_rows={ws.max_rows}")


# ------------------------------------------------------------ workspace


def init_dcp_topk_merge(
    group: DcpGroup, *, max_rows: int, topk: int, max_local_len: int, local_topk: int | None = None,
    interleave: int = 1, impl: str | None = None, exchange: str = "push", timeout_s: float = 5.0,
) -> DcpTopkWorkspace:
    """Build this rank's workspace (collective over ``group``; before any
    merge and before CUDA-graph capture).

    max_rows: most rows (T) of one merge; topk: K; max_local_len: the
    largest local length any row_ends will declare (sets the bit planes,
    at most 2^20); local_topk: N, default ``default_local_topk(K, W)``;
    interleave: I, tokens per rank in a run; impl: "triton" (default on
    CUDA) or "reference" (default on CPU); exchange: how round-1 rows travel,
    "push" (Triton stores into every peer's buffer, bounded waits; the
    default and the fastest measured), "all_gather" (NCCL) or "fcollect"
    (NVSHMEM's, NvshmemGroup only; its wait is unbounded); timeout_s: bound
    of every wait."""
    if not isinstance(group, DcpGroup):
        raise TypeError(f"group must implement DcpGroup, got {type(group).__name__}")
    world_size = group.world_size
    local_topk = fmt.default_local_topk(topk, world_size) if local_topk is None else local_topk
    _check_sizes(topk, local_topk, world_size)
    _check_int("max_rows", max_rows, 1)
    _check_int("max_local_len", max_local_len, 1, fmt.MAX_LOCAL_LEN)
    _check_int("interleave", interleave, 1)
    if not timeout_s > 0:
        raise ValueError(f"timeout_s must be > 0, got {timeout_s}")
    if exchange not in EXCHANGES:
        raise ValueError(f"exchange must be one of {EXCHANGES}, got {exchange!r}")
    if exchange not in group.exchanges:
        raise ValueError(f"exchange={exchange!r} is not one that {type(group).__name__} runs: {group.exchanges}")
    impl = resolve_impl(impl, group.device)
    if group.library_peers and impl != "triton":
        raise ValueError(f"peers reached through NVSHMEM's device library need impl='triton', got {impl!r}")
    return DcpTopkWorkspace(
        group, max_rows=max_rows, topk=topk, local_topk=local_topk, max_local_len=max_local_len,
        interleave=interleave, impl=impl, exchange=exchange, timeout_s=float(timeout_s),
    )


# ---------------------------------------------------------------- stages


def dcp_topk_pack(
    logits: torch.Tensor, row_ends: torch.Tensor, *, local_topk: int, max_local_len: int,
    out: torch.Tensor | None = None, impl: str | None = None,
) -> torch.Tensor:
    """This rank's round-1 rows: the local top-N by (score desc, local id
    asc) of ``logits`` [T, S] (bf16; fp32 is rounded to bf16) below
    ``min(row_ends[t], S, max_local_len)``, NaN excluded, packed by ascending
    local id into int32 [T, packed_row_words(N, P)] (0 = empty slot)."""
    rows = _check_logits(logits, row_ends)
    _check_int("local_topk", local_topk, fmt.WARP, None, fmt.WARP)
    _check_int("max_local_len", max_local_len, 1, fmt.MAX_LOCAL_LEN)
    words = fmt.packed_row_words(local_topk, fmt.num_planes(max_local_len))
    out = torch.empty((rows, words), dtype=torch.int32, device=logits.device) if out is None else out
    _check_out("out", out, (rows, words), logits.device)
    backend(resolve_impl(impl, logits.device)).pack(
        logits[:rows], row_ends[:rows], out, local_topk=local_topk, max_local_len=max_local_len
    )
    return out


def dcp_topk_pack_indices(
    logits: torch.Tensor, local_idx: torch.Tensor, row_ends: torch.Tensor, *, max_local_len: int,
    out: torch.Tensor | None = None, impl: str | None = None,
) -> torch.Tensor:
    """Pack a caller's local top-N ``local_idx`` [T, N] int32 (-1 padded, N
    a multiple of 32) in its order; ids outside [0, min(row_ends, S,
    max_local_len)) and NaN scores become empty slots. The ids must be a
    top-N by score for the merge to be exact (``assert_packed_merge_contract``)."""
    rows = _check_logits(logits, row_ends)
    _check_tensor("local_idx", local_idx, torch.int32, 2, logits.device)
    if local_idx.shape[0] != rows:
        raise ValueError(f"local_idx must have {rows} rows, got {tuple(local_idx.shape)}")
    _check_int("local_idx.shape[1]", local_idx.shape[1], fmt.WARP, None, fmt.WARP)
    _check_int("max_local_len", max_local_len, 1, fmt.MAX_LOCAL_LEN)
    words = fmt.packed_row_words(local_idx.shape[1], fmt.num_planes(max_local_len))
    out = torch.empty((rows, words), dtype=torch.int32, device=logits.device) if out is None else out
    _check_out("out", out, (rows, words), logits.device)
    backend(resolve_impl(impl, logits.device)).pack_indices(
        logits, local_idx, row_ends[:rows], out, max_local_len=max_local_len
    )
    return out


def dcp_topk_exchange(packed: torch.Tensor, *, workspace: DcpTopkWorkspace) -> None:
    """Push this rank's round-1 rows [T, words] into every rank's gather
    buffer (this call's epoch parity) and release their flags."""
    _check_tensor("packed", packed, torch.int32, 2)
    ws = _check_workspace(workspace)
    _check_fits(ws, packed.shape[0])
    _check_out("packed", packed, (packed.shape[0], ws.row_words), ws.device)
    _exchange(ws, backend(ws.impl), packed)


def _outputs(ws, rows: int, ids_out, rows_out: RowsOutput | None, sorted: bool) -> Outputs:
    if ids_out is None and rows_out is None:
        raise ValueError("give ids_out, rows (or both): the merge has nowhere to write")
    if ids_out is not None:
        _check_out("ids_out", ids_out, (rows, ws.topk), ws.device)
    if rows_out is not None:
        if not isinstance(rows_out, RowsOutput):
            raise TypeError(f"rows must be a RowsOutput, got {type(rows_out).__name__}")
        _check_rows(rows_out, rows, ws.topk, ws.device)
    return Outputs(ids_out, rows_out, bool(sorted))


def dcp_topk_select(
    logits: torch.Tensor, row_ends: torch.Tensor, *, workspace: DcpTopkWorkspace, num_rows: int,
    ids_out: torch.Tensor | None = None, rows: RowsOutput | None = None, sorted: bool = False,
) -> None:
    """Round 1 on this rank: wait for every rank's rows of this epoch, select
    the top-K of the W*N candidates into ``ids_out`` [T, K] int32 (-1
    padded) and/or ``rows``, record the saturation state and, if this rank
    is saturated on a row, push its local top-K to every rank. Never waits
    for a rescue. ``logits``/``row_ends`` are this rank's (re-read when
    saturated)."""
    ws = _check_workspace(workspace)
    _check_fits(ws, num_rows)
    _check_logits(logits, row_ends, num_rows, ws.device)
    out = _outputs(ws, num_rows, ids_out, rows, sorted)
    backend(ws.impl).select(ws, logits, row_ends, num_rows, out)


def dcp_topk_rescue(
    logits: torch.Tensor, row_ends: torch.Tensor, *, workspace: DcpTopkWorkspace, num_rows: int,
    ids_out: torch.Tensor | None = None, rows: RowsOutput | None = None, sorted: bool = False,
) -> None:
    """Round 2 on this rank: for rows with saturated ranks, wait for their
    pushed lists and overwrite the outputs; then close the epoch."""
    ws = _check_workspace(workspace)
    _check_fits(ws, num_rows)
    _check_logits(logits, row_ends, num_rows, ws.device)
    out = _outputs(ws, num_rows, ids_out, rows, sorted)
    backend(ws.impl).rescue(ws, logits, row_ends, num_rows, out)


# ----------------------------------------------------------------- merge


def _exchange(ws: DcpTopkWorkspace, impl, packed: torch.Tensor) -> None:
    """Round-1 rows of every rank into this rank's gather buffer (this
    epoch's parity) and its flags raised: by push, or by a collective
    (NCCL all-gather, NVSHMEM fcollect) whose result is copied in."""
    rows = packed.shape[0]
    if ws.exchange == "fcollect" or ws.library_peers:  # they read symmetric memory
        staged = ws.staging.local[:rows]
        if packed.data_ptr() != staged.data_ptr():
            staged.copy_(packed)
        packed = staged
    if ws.exchange == "push":
        impl.push_rows(ws, packed)
        return
    epochs = ws.epochs[:rows] + 1
    index = torch.arange(rows, device=ws.device)
    if ws.exchange == "fcollect":
        gathered = ws.collect_dst.local[: ws.world_size * packed.numel()].view(ws.world_size, rows, ws.row_words)
        ws.group.fcollect(gathered, packed)
    else:
        try:
            gathered = ws.group.all_gather(packed, ws.timeout_s)
        except TimeoutError:
            ws.record_timeout(0, -1, -1)
            ws.check()
    ws.gather.local[(epochs & 1).long(), :, index] = gathered.transpose(0, 1)
    ws.flags.local[0, :, :rows] = epochs


def _run_merge(workspaces, logits, row_ends, outputs, rows: int, packed=None) -> None:
    """pack -> exchange -> select -> rescue of ``rows`` rows, each stage for
    every rank given before the next stage starts (one rank on a real group;
    all virtual ranks on a simulated one)."""
    impls = [backend(ws.impl) for ws in workspaces]
    for r, (ws, impl) in enumerate(zip(workspaces, impls)):
        mine = packed[r] if packed is not None else None
        if mine is None:  # fcollect and device-library puts read symmetric memory: pack straight into it
            mine = ws.staging.local[:rows]
            if ws.exchange == "push" and not ws.library_peers:  # the pack pushes its rows itself
                impl.pack_and_push(ws, logits[r][:rows], row_ends[r][:rows], mine)
                continue
            impl.pack(logits[r][:rows], row_ends[r][:rows], mine, local_topk=ws.local_topk,
                      max_local_len=ws.max_local_len)
        _exchange(ws, impl, mine)
    for r, (ws, impl) in enumerate(zip(workspaces, impls)):
        impl.select(ws, logits[r], row_ends[r], rows, outputs[r])
    for r, (ws, impl) in enumerate(zip(workspaces, impls)):
        impl.rescue(ws, logits[r], row_ends[r], rows, outputs[r])
    for ws in workspaces:
        ws.check()


def _single_rank(ws: DcpTopkWorkspace) -> None:
    if ws.group.shares_process and ws.world_size > 1:
        raise ValueError(
            "this workspace belongs to a simulated group whose ranks share one process: "
            "a per-rank merge would wait for ranks that run later in program order. Use "
            "simulate_dcp_topk_merge, or drive the stages (pack, exchange, select, rescue) "
            "rank by rank"
        )


def dcp_topk_merge(
    logits: torch.Tensor, row_ends: torch.Tensor, topk_indices: torch.Tensor, *,
    workspace: DcpTopkWorkspace, sorted: bool = False,
) -> None:
    """Exact global top-K ids of this rank's ``logits`` [T, S] bf16 and
    ``row_ends`` [T] int32 over the DCP group into ``topk_indices`` [T, K]
    int32 (global ids, -1 padded; ``sorted`` gives descending score, then
    ascending id). Collective: every rank calls every merge, in stream order."""
    ws = _check_workspace(workspace)
    rows = _check_logits(logits, row_ends, None, ws.device)
    _check_fits(ws, rows)
    _single_rank(ws)
    out = _outputs(ws, rows, topk_indices, None, sorted)
    _run_merge([ws], [logits], [row_ends], [out], rows)


def dcp_topk_merge_rows(
    *, logits: torch.Tensor, row_ends: torch.Tensor, workspace: DcpTopkWorkspace,
    req_id: torch.Tensor, block_table: torch.Tensor, block_size: int, stride_rows: int,
    rows_out: torch.Tensor, valid_out: torch.Tensor, ids_out: torch.Tensor | None = None,
    packed: torch.Tensor | None = None, sorted: bool = False,
) -> None:
    """The merge straight to this rank's physical KV rows (see
    ``RowsOutput``); ``ids_out`` [T, K] optionally gets the global ids.
    ``packed`` [T, words] int32 replaces the pack with a caller's round-1
    rows (``dcp_topk_pack_indices``); logits and row_ends are still needed
    (a saturated rank re-reads its row)."""
    ws = _check_workspace(workspace)
    rows = _check_logits(logits, row_ends, None, ws.device)
    _check_fits(ws, rows)
    _single_rank(ws)
    spec = RowsOutput(req_id, block_table, block_size, stride_rows, rows_out, valid_out)
    out = _outputs(ws, rows, ids_out, spec, sorted)
    if packed is not None:
        _check_out("packed", packed, (rows, ws.row_words), ws.device)
        packed = [packed]
    _run_merge([ws], [logits], [row_ends], [out], rows, packed)


def simulate_dcp_topk_merge(
    logits: torch.Tensor, row_ends: torch.Tensor, *, topk: int, local_topk: int | None = None,
    impl: str = "reference", interleave: int = 1, sorted: bool = False,
) -> torch.Tensor:
    """The whole merge over W virtual ranks in this process.

    logits: [W, T, S] bf16 (or fp32), ``logits[r, t, l]`` scores rank r's
    local token l; row_ends: [W, T] int32. Returns int32 [W, T, topk]: rank
    r's ids (the same on every rank), -1 padded."""
    _check_tensor("logits", logits, _LOGIT_DTYPES, 3)
    world_size, rows, width = logits.shape
    _check_tensor("row_ends", row_ends, torch.int32, 2, logits.device)
    if tuple(row_ends.shape) != (world_size, rows):
        raise ValueError(f"row_ends must be [{world_size}, {rows}], got {tuple(row_ends.shape)}")
    local_topk = fmt.default_local_topk(topk, world_size) if local_topk is None else local_topk
    _check_sizes(topk, local_topk, world_size)
    if width > fmt.MAX_LOCAL_LEN:
        raise ValueError(f"logits.shape[2] must be <= {fmt.MAX_LOCAL_LEN}, got {width}")
    out = torch.full((world_size, max(rows, 1), topk), -1, dtype=torch.int32, device=logits.device)
    if rows == 0:
        return out[:, :0]
    group = SimulatedGroup(world_size, logits.device)
    try:
        workspaces = [
            init_dcp_topk_merge(g, max_rows=rows, topk=topk, local_topk=local_topk,
                                max_local_len=max(width, 1), interleave=interleave, impl=impl)
            for g in group.ranks
        ]
        outputs = [Outputs(out[r], None, bool(sorted)) for r in range(world_size)]
        _run_merge(workspaces, list(logits), list(row_ends), outputs, rows)
    finally:
        group.destroy()
    return out

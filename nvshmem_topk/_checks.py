"""Argument checks of the public entry points: each raises TypeError or
ValueError naming what was expected and what came, before any kernel runs."""

from __future__ import annotations

import torch

from . import format as fmt
from .groups.base import DcpGroup
from .protocol import EXCHANGES, Outputs, RowsOutput, resolve_impl
from .workspace import DcpTopkWorkspace

LOGIT_DTYPES = (torch.bfloat16, torch.float16, torch.float32)
END_DTYPES = (torch.int32, torch.int64)


def check_int(name: str, value, low: int, high: int | None = None, multiple: int = 1) -> None:
    if not isinstance(value, int) or isinstance(value, bool):
        raise TypeError(f"{name} must be an int, got {type(value).__name__}")
    if value < low or (high is not None and value > high) or value % multiple:
        bound = f"in [{low}, {high}]" if high is not None else f">= {low}"
        also = f" and a multiple of {multiple}" if multiple > 1 else ""
        raise ValueError(f"{name} must be {bound}{also}, got {value}")


def check_sizes(topk: int, local_topk: int, world_size: int) -> int:
    """K, N and W; returns N as the kernels take it (rounded up to 32)."""
    check_int("topk", topk, fmt.MIN_TOPK, fmt.MAX_TOPK)
    check_int("local_topk", local_topk, 1, None)
    check_int("world_size", world_size, 1, fmt.MAX_WORLD_SIZE)
    return fmt.round_up_to_warp(local_topk)


def check_tensor(name: str, t, dtypes, dim: int, device: torch.device | None = None) -> None:
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


def _row_bounds(row_ends, row_starts) -> list[tuple[str, object]]:
    """(name, tensor) of the row ends and, when given, the row starts."""
    return [("row_ends", row_ends)] + ([("row_starts", row_starts)] if row_starts is not None else [])


def check_logits(logits, row_ends, rows: int | None = None, device=None, row_starts=None) -> int:
    """Checks [T, S] logits and [>= T] row_ends (and row_starts, if given);
    returns T."""
    check_tensor("logits", logits, LOGIT_DTYPES, 2, device)
    rows = logits.shape[0] if rows is None else rows
    if logits.shape[0] < rows:
        raise ValueError(f"logits must have >= {rows} rows, got shape {tuple(logits.shape)}")
    for name, bounds in _row_bounds(row_ends, row_starts):
        check_tensor(name, bounds, END_DTYPES, 1, logits.device)
        if bounds.shape[0] < rows:
            raise ValueError(f"{name} must have >= {rows} entries, got {bounds.shape[0]}")
    return rows


def check_out(name: str, t, shape: tuple[int, int], device, at_least_cols: bool = False) -> None:
    """An int32 output of ``shape`` (``at_least_cols``: that many columns or
    more, at any row stride); otherwise its rows must be contiguous, as the
    kernels write row r at r times the row's length."""
    check_tensor(name, t, torch.int32, len(shape), device)
    ok = t.shape[0] == shape[0] and (t.shape[1] >= shape[1] if at_least_cols else t.shape[1:] == shape[1:])
    if not ok:
        cols = f">= {shape[1]}" if at_least_cols else ", ".join(str(s) for s in shape[1:])
        raise ValueError(f"{name} must be [{shape[0]}, {cols}], got {tuple(t.shape)}")
    if not at_least_cols and t.dim() == 2 and t.shape[0] > 1 and t.stride(0) != t.shape[1]:
        raise ValueError(f"{name} must have contiguous rows (stride(0) == {t.shape[1]}), got strides {t.stride()}")


def packed_out(out, rows: int, words: int, device) -> torch.Tensor:
    """A stage's int32 [rows, words] output: ``out`` checked, or a new one."""
    out = torch.empty((rows, words), dtype=torch.int32, device=device) if out is None else out
    check_out("out", out, (rows, words), device)
    return out


def check_pack(logits, row_ends, row_starts, candidates: int, max_local_len: int, out, pdl, score_dtype):
    """A pack stage's arguments (``candidates``: N, its packed row's
    candidates): (rows, out, row_starts cut to the rows, pdl, score_bits),
    ``out`` [rows, packed_row_words(N, P, score_bits)] checked or new."""
    rows = check_logits(logits, row_ends, row_starts=row_starts)
    check_int("max_local_len", max_local_len, 1, fmt.MAX_LOCAL_LEN)
    score_bits = fmt.score_bits_of(score_dtype)
    out = packed_out(out, rows, fmt.packed_row_words(candidates, fmt.num_planes(max_local_len), score_bits),
                     logits.device)
    starts = row_starts[:rows] if row_starts is not None else None
    return rows, out, starts, check_pdl(pdl, out.device), score_bits


def check_rows(rows: RowsOutput, num_rows: int, topk: int, device) -> None:
    check_tensor("req_id", rows.req_id, torch.int32, 1, device)
    if rows.req_id.shape[0] < num_rows:
        raise ValueError(f"req_id must have >= {num_rows} entries, got {rows.req_id.shape[0]}")
    check_tensor("block_table", rows.block_table, torch.int32, 2, device)
    check_int("block_size", rows.block_size, 1)
    check_int("stride_rows", rows.stride_rows, 1)
    check_out("rows_out", rows.rows_out, (num_rows, topk), device, at_least_cols=True)
    check_tensor("valid_out", rows.valid_out, torch.int32, 1, device)
    if rows.valid_out.shape[0] != num_rows:
        raise ValueError(f"valid_out must be [{num_rows}], got {tuple(rows.valid_out.shape)}")


def check_workspace(workspace) -> DcpTopkWorkspace:
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


def check_exchange(packed, workspace) -> DcpTopkWorkspace:
    """``dcp_topk_exchange``'s arguments: int32 [T, words] round-1 rows that
    fit the workspace; returns the workspace."""
    check_tensor("packed", packed, torch.int32, 2)
    ws = check_workspace(workspace)
    check_fits(ws, packed.shape[0])
    check_out("packed", packed, (packed.shape[0], ws.row_words), ws.device)
    return ws


def check_packed(ws: DcpTopkWorkspace, rows: int, packed) -> list | None:
    """A merge's round-1 rows given by the caller (int32 [rows, words]), as
    the coordinator takes them (one a rank), or None."""
    if packed is None:
        return None
    check_out("packed", packed, (rows, ws.row_words), ws.device)
    return [packed]


def check_fits(ws: DcpTopkWorkspace, rows: int) -> None:
    if rows > ws.max_rows:
        raise ValueError(f"{rows} rows exceed the workspace's max_rows={ws.max_rows}")


def check_outputs(ws, rows: int, ids_out, rows_out: RowsOutput | None, sorted: bool) -> Outputs:
    if ids_out is None and rows_out is None:
        raise ValueError("give ids_out, rows (or both): the merge has nowhere to write")
    if ids_out is not None:
        check_out("ids_out", ids_out, (rows, ws.topk), ws.device)
    if rows_out is not None:
        if not isinstance(rows_out, RowsOutput):
            raise TypeError(f"rows must be a RowsOutput, got {type(rows_out).__name__}")
        check_rows(rows_out, rows, ws.topk, ws.device)
    return Outputs(ids_out, rows_out, bool(sorted))


def check_single_rank(ws: DcpTopkWorkspace) -> None:
    if ws.group.shares_process and ws.world_size > 1:
        raise ValueError(
            "this workspace belongs to a simulated group whose ranks share one process: "
            "a per-rank merge would wait for ranks that run later in program order. Use "
            "simulate_dcp_topk_merge, or drive the stages (pack, exchange, select, rescue) "
            "rank by rank"
        )


def check_pdl(pdl, device: torch.device) -> bool:
    """``pdl`` with its default: on for GPUs (the interpreter has none)."""
    if pdl is None:
        return device.type == "cuda"
    if not isinstance(pdl, bool) or (pdl and device.type != "cuda"):
        raise ValueError(f"pdl must be None, False, or True on a CUDA device; got {pdl!r} on {device}")
    return pdl


def check_settings(group, *, max_rows, topk, local_topk, max_local_len, interleave, impl, exchange,
                   timeout_s) -> tuple[int, str]:
    """A workspace's settings; returns (N, impl) with their defaults."""
    if not isinstance(group, DcpGroup):
        raise TypeError(f"group must implement DcpGroup, got {type(group).__name__}")
    local_topk = fmt.default_local_topk(topk, group.world_size) if local_topk is None else local_topk
    local_topk = check_sizes(topk, local_topk, group.world_size)
    check_int("max_rows", max_rows, 1)
    check_int("max_local_len", max_local_len, 1, fmt.MAX_LOCAL_LEN)
    check_int("interleave", interleave, 1)
    if not timeout_s > 0:
        raise ValueError(f"timeout_s must be > 0, got {timeout_s}")
    if exchange not in EXCHANGES:
        raise ValueError(f"exchange must be one of {EXCHANGES}, got {exchange!r}")
    if exchange not in group.exchanges:
        raise ValueError(f"exchange={exchange!r} is not one that {type(group).__name__} runs: {group.exchanges}")
    impl = resolve_impl(impl, group.device)
    if group.library_peers and impl != "triton":
        raise ValueError(f"peers reached through NVSHMEM's device library need impl='triton', got {impl!r}")
    return local_topk, impl


def check_stage(workspace, logits, row_ends, num_rows: int, ids_out, rows, sorted,
                row_starts=None) -> tuple[DcpTopkWorkspace, Outputs]:
    """A select's or rescue's arguments; returns (workspace, outputs)."""
    ws = check_workspace(workspace)
    check_fits(ws, num_rows)
    check_logits(logits, row_ends, num_rows, ws.device, row_starts)
    return ws, check_outputs(ws, num_rows, ids_out, rows, sorted)


def check_merge(workspace, logits, row_ends, row_starts=None) -> tuple[DcpTopkWorkspace, int]:
    """A one-rank merge's workspace and inputs; returns (workspace, T)."""
    ws = check_workspace(workspace)
    rows = check_logits(logits, row_ends, None, ws.device, row_starts)
    check_fits(ws, rows)
    check_single_rank(ws)
    return ws, rows


def check_simulated(logits, row_ends, topk: int, local_topk: int | None, row_starts=None) -> int:
    """A simulated merge's [W, T, S] inputs and sizes; returns N."""
    check_tensor("logits", logits, LOGIT_DTYPES, 3)
    world_size, rows, width = logits.shape
    for name, bounds in _row_bounds(row_ends, row_starts):
        check_tensor(name, bounds, END_DTYPES, 2, logits.device)
        if tuple(bounds.shape) != (world_size, rows):
            raise ValueError(f"{name} must be [{world_size}, {rows}], got {tuple(bounds.shape)}")
    local_topk = fmt.default_local_topk(topk, world_size) if local_topk is None else local_topk
    local_topk = check_sizes(topk, local_topk, world_size)
    if width > fmt.MAX_LOCAL_LEN:
        raise ValueError(f"logits.shape[2] must be <= {fmt.MAX_LOCAL_LEN}, got {width}")
    return local_topk

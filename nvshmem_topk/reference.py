"""Eager reference of every stage of the exact merge, in plain torch.

This is the readable oracle: vectorised over rows, runs on CPU or GPU,
never imports the kernels. The Triton kernels must reproduce each stage bit
for bit (tests compare them stage by stage). Layout facts come from
``format``; the protocol (epochs, flags, peers) from ``docs/design.md``.

Orders that the kernels reproduce:
- a packed row lists its candidates by ascending local id, empty slots last
  (``pack``), or in the caller's order with dropped slots left empty
  (``pack_indices``);
- selected keys are listed in candidate order: rank by rank, each rank's
  words in slot order (round 1); in the rescue, the unsaturated ranks'
  round-1 words >= kappa in that order, then the saturated ranks' pushed
  lists, rank by rank.
"""

from __future__ import annotations

import time

import torch

from . import format as fmt

_INT64_MAX = torch.iinfo(torch.int64).max


# ------------------------------------------------------------------ pack


def row_window(row_starts: torch.Tensor | None, row_ends: torch.Tensor, limit: int):
    """(start, end) [T] int64 of each row's valid local tokens [start, end):
    the ends clamped to [0, limit], the starts (0 when None) to [0, end]."""
    end = row_ends.long().clamp(0, limit)
    start = torch.zeros_like(end) if row_starts is None else torch.minimum(row_starts.long().clamp(min=0), end)
    return start, end


def local_topk_indices(
    logits: torch.Tensor, row_ends: torch.Tensor, k: int, max_local_len: int,
    row_starts: torch.Tensor | None = None, floor: torch.Tensor | None = None, score_bits: int = 16,
) -> torch.Tensor:
    """Local top-``k`` by (score desc, local id asc).

    logits: [T, S] bf16 or fp16 (or fp32: rounded to bf16 with 16-bit
    ``score_bits``, exact with 32); row_ends and row_starts: [T] int32 or
    int64 (no starts: 0). Token l of row t is valid iff row_starts[t] <= l
    < min(row_ends[t], S, max_local_len), its score is not NaN and its
    ord16 (ord32) is at least floor[t] ([T] int, None: 0).
    Returns [T, k] int64 local ids in ascending order, then -1 (rows with
    fewer than k valid tokens)."""
    rows, width = logits.shape
    local = torch.arange(width, device=logits.device)
    start, end = row_window(row_starts, row_ends, min(width, max_local_len))
    score, scored = fmt.score_order(logits, score_bits)
    valid = (local >= start[:, None]) & (local < end[:, None]) & scored
    if floor is not None:
        valid &= score >= floor[:, None]
    keys = torch.where(valid, fmt.local_key(score, local), 0)
    top, idx = keys.topk(min(k, width), dim=1)
    idx = torch.where(top > 0, idx, width).sort(dim=1).values
    out = torch.full((rows, k), -1, dtype=torch.int64, device=logits.device)
    out[:, : idx.shape[1]] = torch.where(idx < width, idx, -1)
    return out


def pack_indices(
    logits: torch.Tensor, local_idx: torch.Tensor, row_ends: torch.Tensor, max_local_len: int,
    row_starts: torch.Tensor | None = None, score_bits: int = 16,
) -> torch.Tensor:
    """Pack given local ids (``[T, n]``, any int dtype, -1 padded) of the
    scores ``logits`` ``[T, S]`` into int32 ``[T, packed_row_words(n, P,
    score_bits)]``, P = ``num_planes(max_local_len)``. Slot j keeps
    candidate j; an id outside [row_starts[t], min(row_ends[t], S,
    max_local_len)) or with a NaN score is an empty (0) slot."""
    width = logits.shape[1]
    idx = local_idx.long()
    start, end = row_window(row_starts, row_ends, min(width, max_local_len))
    inside = (idx >= start[:, None]) & (idx < end[:, None])
    # One padding column: rows of width 0 still have an index 0 to gather.
    at = torch.where(inside, idx, 0)
    score, scored = (torch.nn.functional.pad(v, (0, 1)).gather(1, at) for v in fmt.score_order(logits, score_bits))
    present = inside & scored
    words = torch.where(present, fmt.make_words(score, idx, score_bits), 0)
    low = torch.where(present, score & 0xFFFF, 0) if score_bits == 32 else None
    return fmt.pack_rows(words, torch.where(present, idx, 0), fmt.num_planes(max_local_len), low)


def pack(
    logits: torch.Tensor, row_ends: torch.Tensor, local_topk: int, max_local_len: int,
    row_starts: torch.Tensor | None = None, floor: torch.Tensor | None = None, score_bits: int = 16,
) -> torch.Tensor:
    """Round-1 packed rows ``[T, packed_row_words(N, P, score_bits)]``
    int32: the local top-N in ascending local id order, empty slots (0)
    last. With ``local_topk = format.list_len(K)`` and ``floor =
    format.list_floor`` this is the list a saturated rank pushes."""
    idx = local_topk_indices(logits, row_ends, local_topk, max_local_len, row_starts, floor, score_bits)
    return pack_indices(logits, idx, row_ends, max_local_len, row_starts, score_bits)


# ---------------------------------------------------------------- select


def decode_keys(
    packed: torch.Tensor, owner, *, num_candidates: int, world_size: int, interleave: int,
    max_local_len: int, score_bits: int = 16,
) -> torch.Tensor:
    """Packed rows ``[..., words]`` of rank(s) ``owner`` (an int or a tensor
    broadcasting against ``[..., n]``) -> int64 keys ``[..., n]``, 0 = empty."""
    order, local, present = fmt.unpack_rows(packed, num_candidates, fmt.num_planes(max_local_len), score_bits)
    gid = fmt.global_id(local, owner, world_size, interleave)
    gid_bits = fmt.global_id_bits(world_size, interleave, max_local_len)
    return fmt.make_keys(order, gid, present, gid_bits)


def top_keys(keys: torch.Tensor, topk: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The ``topk`` largest non-zero keys of each row of ``keys`` ``[T, C]``
    (unique int64), listed in candidate order, 0 padded: ``[T, topk]``; and
    kappa ``[T]``, the topk-th largest key (0 when fewer exist)."""
    rows, count = keys.shape
    k = min(topk, count)
    kth = keys.topk(k, dim=1).values[:, k - 1]
    kappa = kth if k == topk else torch.zeros_like(kth)
    chosen = (keys >= kappa[:, None]) & (keys != 0)
    order = torch.sort((~chosen).to(torch.uint8), dim=1, stable=True).indices[:, :k]
    picked = torch.where(chosen.gather(1, order), keys.gather(1, order), 0)
    out = torch.zeros((rows, topk), dtype=torch.int64, device=keys.device)
    out[:, :k] = picked
    return out, kappa


def round1_keys(
    gathered: torch.Tensor, *, local_topk: int, world_size: int, interleave: int, max_local_len: int,
    score_bits: int = 16,
) -> torch.Tensor:
    """Gathered round-1 rows ``[W, T, words]`` -> keys ``[T, W, N]``."""
    owner = torch.arange(world_size, device=gathered.device)[:, None, None]
    keys = decode_keys(
        gathered, owner, num_candidates=local_topk, world_size=world_size,
        interleave=interleave, max_local_len=max_local_len, score_bits=score_bits,
    )
    return keys.transpose(0, 1)


def select(
    gathered: torch.Tensor, *, topk: int, local_topk: int, world_size: int, interleave: int,
    max_local_len: int, score_bits: int = 16,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Round-1 select of the gathered rows ``[W, T, words]`` int32.

    Returns the selected keys ``[T, K]`` int64 (candidate order, 0 padded)
    and the saturation state (``format.sat_word``): rank q is saturated
    iff it sent N words and its smallest sent key >= kappa."""
    keys = round1_keys(
        gathered, local_topk=local_topk, world_size=world_size, interleave=interleave,
        max_local_len=max_local_len, score_bits=score_bits,
    )
    selected, kappa = top_keys(keys.flatten(1), topk)
    present = keys != 0
    full = present.sum(-1) == local_topk
    smallest = torch.where(present, keys, _INT64_MAX).min(-1).values
    saturated = full & (smallest >= kappa[:, None])
    bit = torch.ones(1, dtype=torch.int64, device=keys.device) << torch.arange(
        world_size, device=keys.device
    )
    return selected, fmt.sat_word((saturated.long() * bit).sum(-1), kappa, score_bits)


def rescue_slot(mask: torch.Tensor, rank) -> torch.Tensor:
    """Receive slot of ``rank``'s pushed list: popcount(mask & ((1 << rank) - 1))."""
    below = mask & ((torch.ones_like(mask) << rank) - 1)
    return sum((below >> b) & 1 for b in range(fmt.MAX_WORLD_SIZE))


def rescue(
    gathered: torch.Tensor, sat: torch.Tensor, received: torch.Tensor, *, topk: int,
    local_topk: int, world_size: int, interleave: int, max_local_len: int, score_bits: int = 16,
) -> torch.Tensor:
    """Second round: the top-K over {round-1 words of unsaturated ranks with
    key >= kappa} U {the pushed lists of saturated ranks}, in that order.

    gathered: [W, T, words] int32 round-1 rows; sat: the rows' saturation
    states (``format.sat_word``); received: [T, K // N,
    packed_row_words(L, P, score_bits)] int32 pushed lists, L =
    ``format.list_len(K)`` (slot ``rescue_slot(mask, q)`` holds rank q's).
    Returns selected keys [T, K] int64 in candidate order; meaningful for
    rows with a mask."""
    mask, kappa = fmt.sat_mask(sat, score_bits), fmt.sat_kappa(sat, score_bits)
    keys = round1_keys(
        gathered, local_topk=local_topk, world_size=world_size, interleave=interleave,
        max_local_len=max_local_len, score_bits=score_bits,
    )
    ranks = torch.arange(world_size, device=sat.device)
    saturated = ((mask[:, None] >> ranks) & 1).bool()
    slot = rescue_slot(mask[:, None], ranks).clamp(max=max(received.shape[1] - 1, 0))
    rows = torch.arange(sat.shape[0], device=sat.device)[:, None]
    listed = fmt.list_len(topk)
    pushed = decode_keys(
        received[rows, slot], ranks[None, :, None], num_candidates=listed, world_size=world_size,
        interleave=interleave, max_local_len=max_local_len, score_bits=score_bits,
    ) if received.shape[1] else torch.zeros(keys.shape[:2] + (listed,), dtype=torch.int64, device=keys.device)
    seen = torch.where(~saturated[..., None] & (keys >= kappa[:, None, None]), keys, 0)
    pushed = torch.where(saturated[..., None], pushed, 0)
    selected, _ = top_keys(torch.cat([seen.flatten(1), pushed.flatten(1)], dim=1), topk)
    return selected


# --------------------------------------------------------------- outputs


def ids_from_keys(selected: torch.Tensor, gid_bits: int, sorted: bool) -> torch.Tensor:
    """Selected keys [T, K] -> global ids [T, K] int32, -1 padded;
    ``sorted`` lists them by descending key."""
    if sorted:
        selected = selected.sort(dim=1, descending=True).values
    return fmt.key_to_global_id(selected, gid_bits).to(torch.int32)


def owned_rows(
    ids: torch.Tensor, *, rank: int, world_size: int, interleave: int, req_id: torch.Tensor,
    block_table: torch.Tensor, block_size: int, stride_rows: int,
) -> tuple[torch.Tensor, torch.Tensor]:
    """The selected tokens ``rank`` owns as physical KV rows
    ``block_table[req_id[t], l // B] * stride_rows + l % B``, in the order of
    ``ids`` ([T, K] int32, -1 padded), compacted to the front, -1 after;
    and their count [T] int32. A block index past the table, or a request id
    outside it, drops the token."""
    ids = ids.long()
    owner, local = fmt.owner_and_local(ids, world_size, interleave)
    block = local // block_size
    num_reqs, num_blocks = block_table.shape
    req = req_id[: ids.shape[0]].long()[:, None]
    keep = (ids >= 0) & (owner == rank) & (block < num_blocks) & (req >= 0) & (req < num_reqs)
    entry = block_table[req.clamp(0, num_reqs - 1), block.clamp(0, num_blocks - 1)].long()
    phys = entry * stride_rows + local % block_size
    order = torch.sort((~keep).to(torch.uint8), dim=1, stable=True).indices
    rows = torch.where(keep.gather(1, order), phys.gather(1, order), -1)
    return rows.to(torch.int32), keep.sum(1).to(torch.int32)


# ---------------------------------------------------- protocol (one rank)


def wait_flags(flags: torch.Tensor, need: torch.Tensor, epochs: torch.Tensor, timeout_s: float):
    """Bounded wait until ``flags[q, t] >= epochs[t]`` wherever ``need[q, t]``
    (``flags`` [W, T] int32). Returns None, or (row, rank, epoch) of a flag
    still missing when ``timeout_s`` has passed."""
    deadline = time.monotonic() + timeout_s
    while True:
        missing = need & (flags < epochs[None, :])
        if not bool(missing.any()):
            return None
        if time.monotonic() > deadline:
            rank, row = (int(v) for v in missing.nonzero()[0])
            return row, rank, int(epochs[row])
        time.sleep(1e-4)

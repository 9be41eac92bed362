"""Select (round 1) and rescue (round 2): one program per row.

Select: wait for every rank's round-1 row of this epoch, decode the W*N
keys, find the K-th key (kappa) exactly, emit ids / owned rows in candidate
order and store the saturation state. A saturated rank's list, its local
top-K at or above kappa's score, is built and pushed by the select itself
on rows of at most ``pack.SHORT_ROWS`` tokens (``pack.pushed_list``), else
afterwards by ``pack.select_local``, spread over the row.
Rescue: rows with an empty mask cost one load; the others wait for the
saturated ranks' lists and select again over {unsaturated words >= kappa}
U {pushed lists}, starting from the keys that the select kept. Both emit
through ``keys.emit_selected``, so equal candidate sets give bit-identical
outputs; sorted outputs are written by ``order_kernel`` after each of
them. Bit-identical to
``reference.select`` / ``reference.rescue`` and the reference protocol."""

from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from .keys import (TIE_TILE, decode_keys, emit_selected, key_gid, kth_largest, load_sat, owner_and_local, packed_words,
                   power_of_2, radix_boundary, radix_digit_histogram, store_sat, write_outputs)
from .exchange import call_epoch, gather_slot
from .launch import Launch
from .pack import Publish, align_down, pushed_list, short_row
from .sync import after_prior_kernel, record_timeout, wait_flags_at_least


@triton.jit
def _wait_all(flags_ptr, need_mask, row, epoch, max_rows, max_spins, status_ptr, WORLD: tl.constexpr,
              WORLD_P2: tl.constexpr):
    """Wait for flags_ptr[q * max_rows + row] >= epoch for every q in
    need_mask; on a timeout record the lowest rank not seen."""
    q = tl.arange(0, WORLD_P2)
    needed = (q < WORLD) & (((need_mask >> q) & 1) != 0)
    seen = wait_flags_at_least(flags_ptr + q * max_rows + row, needed, epoch, max_spins, status_ptr)
    late = tl.min(tl.where(seen, WORLD, q), axis=0)
    ok = late == WORLD
    if not ok:
        record_timeout(status_ptr, row.to(tl.int32), late, epoch)
    return ok


@triton.jit
def _round1_keys(gather_ptr, row, epoch, max_rows, N: tl.constexpr, PLANES: tl.constexpr, WORLD: tl.constexpr,
                 WORLD_P2: tl.constexpr, INTERLEAVE: tl.constexpr, GID_BITS: tl.constexpr, SCORE_BITS: tl.constexpr):
    """Every rank's round-1 keys of ``row`` as one tile [WORLD_P2, N
    rounded up to a power of 2] (0 = empty), rank q's in row q."""
    words: tl.constexpr = packed_words(N, PLANES, SCORE_BITS)
    slot = tl.arange(0, power_of_2(N))[None, :]
    owner = tl.arange(0, WORLD_P2)[:, None]
    return decode_keys(gather_ptr + gather_slot(row, epoch, max_rows, owner, words, WORLD), slot, owner,
                       (owner < WORLD) & (slot < N), N, PLANES, WORLD, INTERLEAVE, GID_BITS, SCORE_BITS)


# The sizes of the rows output are kernel arguments of their own, never
# specialised on (a block table's shape changes with the batch), so that no
# batch compiles a variant of its own; Triton specialises inside tuples.
OUTPUT_SIZES = ["table_stride", "num_reqs", "num_blocks", "block_size", "stride_rows", "rows_stride"]


@triton.jit(do_not_specialize=OUTPUT_SIZES + ["width_limit"])
def select_kernel(outputs, table_stride, num_reqs, num_blocks, block_size, stride_rows, rows_stride, width_limit,
                  waits, state, lists, TOPK: tl.constexpr, N: tl.constexpr, PLANES: tl.constexpr,
                  WORLD: tl.constexpr, INTERLEAVE: tl.constexpr, GID_BITS: tl.constexpr, EMIT_IDS: tl.constexpr,
                  EMIT_ROWS: tl.constexpr, SORTED: tl.constexpr, LIST_ROW: tl.constexpr,
                  LIST_ALIGN_DOWN: tl.constexpr, LIBRARY_PEERS: tl.constexpr, PDL: tl.constexpr,
                  SCORE_BITS: tl.constexpr):
    """``outputs`` and the sizes after it: as ``output_args`` builds them;
    ``waits``: (flags_ptr, status_ptr, max_spins), the bounded wait's flags
    and record; ``state``: as ``state_args`` builds it; SCORE_BITS: the
    words' (``format.SCORE_BITS``). LIST_ROW > 0: rows of at most LIST_ROW
    tokens, whose pushed lists this program builds and pushes where it finds
    this rank saturated (``pack.pushed_list``; ``lists``: (recv_ptr, rows,
    peers) as it takes them, ``width_limit`` the call's width,
    LIST_ALIGN_DOWN its ALIGN_DOWN); 0: a pipeline of ``pack`` does, after
    the select."""
    after_prior_kernel(PDL)
    sizes = (table_stride, num_reqs, num_blocks, block_size, stride_rows, rows_stride)
    flags_ptr, status_ptr, max_spins = waits
    sat_ptr, selected_ptr, ties_ptr, gather_ptr, epochs_ptr, max_rows, rank = state
    world_p2: tl.constexpr = power_of_2(WORLD)
    row = tl.program_id(0).to(tl.int64)
    epoch = call_epoch(epochs_ptr, row)
    if _wait_all(flags_ptr, (1 << WORLD) - 1, row, epoch, max_rows, max_spins, status_ptr, WORLD, world_p2):
        sender = tl.arange(0, world_p2)
        keys = _round1_keys(gather_ptr, row, epoch, max_rows, N, PLANES, WORLD, world_p2, INTERLEAVE, GID_BITS,
                            SCORE_BITS)
        kappa, selected = kth_largest(keys, TOPK, SCORE_BITS + GID_BITS, ties_ptr + row * TIE_TILE)
        # Saturated: all N words sent and the smallest >= kappa, that is all
        # N selected (empty slots and those past N never are): a count that
        # the emit also makes, in place of a minimum over the same tile.
        taken = tl.sum(((keys >= kappa) & (keys != 0)).to(tl.int32), axis=1)
        saturated = (taken == N) & (sender < WORLD)
        mask = tl.sum(tl.where(saturated, tl.full((world_p2,), 1, tl.int64) << sender, 0), axis=0)
        emit_selected(keys, kappa, selected, row, outputs, sizes, rank, selected_ptr + row * rescue_keys(TOPK),
                      mask != 0, TOPK, WORLD, INTERLEAVE, GID_BITS, EMIT_IDS, EMIT_ROWS, SORTED)
        store_sat(sat_ptr, row, mask, kappa, SCORE_BITS)
        if LIST_ROW > 0:
            if ((mask >> rank) & 1) != 0:
                recv_ptr, rows, peers = lists
                floor = kappa >> GID_BITS  # ``format.list_floor``
                if SCORE_BITS == 16:
                    floor = floor.to(tl.int32)
                pushed_list(recv_ptr, row, rows, width_limit, peers, mask, floor, rank, list_len(TOPK), PLANES,
                            list_slots(TOPK, N), LIST_ROW, LIST_ALIGN_DOWN, WORLD, LIBRARY_PEERS, SCORE_BITS)


@triton.jit
def _rescue_tile(q, start, row, epoch, mask, kappa, gather_ptr, recv_ptr, max_rows,
                 TILE: tl.constexpr, LIST: tl.constexpr, N: tl.constexpr, PLANES: tl.constexpr,
                 SLOTS: tl.constexpr, WORLD: tl.constexpr, INTERLEAVE: tl.constexpr,
                 GID_BITS: tl.constexpr, SCORE_BITS: tl.constexpr):
    """Candidates [start, start + TILE) of rank q in the rescue: its pushed
    list when it was saturated, else its round-1 words >= kappa."""
    slot = start + tl.arange(0, TILE)
    saturated = ((mask >> q) & 1) != 0
    words: tl.constexpr = packed_words(N, PLANES, SCORE_BITS)
    seen_row = gather_ptr + gather_slot(row, epoch, max_rows, q, words, WORLD)
    seen = decode_keys(seen_row, slot, q, (slot < N) & ~saturated, N, PLANES, WORLD, INTERLEAVE, GID_BITS,
                       SCORE_BITS)
    below = mask & ((1 << q) - 1)
    rank_slot = tl.zeros((), dtype=tl.int64)
    for b in tl.static_range(WORLD):
        rank_slot += (below >> b) & 1
    pushed_row = recv_ptr + (row * SLOTS + rank_slot) * packed_words(LIST, PLANES, SCORE_BITS)
    pushed = decode_keys(pushed_row, slot, q, (slot < LIST) & saturated, LIST, PLANES, WORLD, INTERLEAVE,
                         GID_BITS, SCORE_BITS)
    return tl.where(saturated, pushed, tl.where(seen >= kappa, seen, 0))


@triton.jit
def _lowest_rank(mask, WORLD: tl.constexpr):
    """The lowest rank in a non-zero ``mask``."""
    rank = tl.full((), WORLD - 1, tl.int32)
    for q in tl.static_range(WORLD - 1, -1, -1):
        rank = tl.where(((mask >> q) & 1) != 0, q, rank)
    return rank


@triton.jit
def _append_lists(dest, row, mask, recv_ptr, ROOM: tl.constexpr, LIST: tl.constexpr, PLANES: tl.constexpr,
                  SLOTS: tl.constexpr, WORLD: tl.constexpr, INTERLEAVE: tl.constexpr, GID_BITS: tl.constexpr,
                  SCORE_BITS: tl.constexpr):
    """The saturated ranks' pushed lists as keys, rank by rank, into
    ``dest`` (at most ROOM of them); returns how many keys they hold. A
    list's words are a prefix of its slots (a packed row puts its empty
    slots last), so each is stored where the last ended, with no scan."""
    list_words: tl.constexpr = packed_words(LIST, PLANES, SCORE_BITS)
    slot = tl.arange(0, power_of_2(LIST))
    listed = tl.zeros((), dtype=tl.int32)
    received = tl.zeros((), dtype=tl.int64)  # receive slot: the saturated ranks below
    for q in range(WORLD):
        if ((mask >> q) & 1) != 0:
            keys = decode_keys(recv_ptr + (row * SLOTS + received) * list_words, slot, q, slot < LIST, LIST, PLANES,
                               WORLD, INTERLEAVE, GID_BITS, SCORE_BITS)
            tl.store(dest + listed + slot, keys, mask=(keys != 0) & (listed + slot < ROOM))
            listed += tl.sum((keys != 0).to(tl.int32), axis=0)
            received += 1
    return listed


@triton.jit(do_not_specialize=OUTPUT_SIZES)
def rescue_kernel(outputs, table_stride, num_reqs, num_blocks, block_size, stride_rows, rows_stride, waits, state,
                  recv_ptr, TOPK: tl.constexpr, N: tl.constexpr, PLANES: tl.constexpr, WORLD: tl.constexpr,
                  INTERLEAVE: tl.constexpr, GID_BITS: tl.constexpr, EMIT_IDS: tl.constexpr, EMIT_ROWS: tl.constexpr,
                  SORTED: tl.constexpr, PDL: tl.constexpr, SCORE_BITS: tl.constexpr):
    """Rows with saturated ranks. The select left its keys >= kappa in
    candidate order in the row's ``selected_ptr`` ([T, rescue_keys(TOPK)]
    int64 scratch, in ``state``; TOPK rounded up to a power of 2 of them,
    zeros after): the unsaturated ranks' round-1 words >= kappa are those
    not owned by a saturated rank. With one saturated rank its list is read
    where it was received; with more, the lists are appended in the row's
    second half. When they fit half the scratch row, all are selected in
    registers as the select does (its ``kth_largest`` and emit). Longer
    lists (many saturated ranks): the candidates are streamed in tiles
    instead, a radix select summed over the tiles finds the K-th key, and
    the selected keys are compacted."""
    after_prior_kernel(PDL)
    sizes = (table_stride, num_reqs, num_blocks, block_size, stride_rows, rows_stride)
    flags_ptr, status_ptr, max_spins = waits
    sat_ptr, selected_ptr, ties_ptr, gather_ptr, epochs_ptr, max_rows, rank = state
    LIST: tl.constexpr = list_len(TOPK)
    SLOTS: tl.constexpr = list_slots(TOPK, N)
    TILE: tl.constexpr = RESCUE_TILE
    row = tl.program_id(0).to(tl.int64)
    epoch = call_epoch(epochs_ptr, row)
    mask, kappa = load_sat(sat_ptr, row, SCORE_BITS)
    ok = True
    if mask != 0:
        ok = _wait_all(flags_ptr + WORLD * max_rows, mask, row, epoch, max_rows, max_spins, status_ptr, WORLD,
                       power_of_2(WORLD))
        if ok:
            selected_row = selected_ptr + row * rescue_keys(TOPK)
            width: tl.constexpr = power_of_2(TOPK)
            half: tl.constexpr = rescue_keys(TOPK) // 2  # the tile [2, half]: the select's keys, then the lists
            part = tl.arange(0, 2)[:, None]
            slot = tl.arange(0, half)[None, :] + 0 * part
            if (mask & (mask - 1)) == 0:  # one list (the usual case): read where it was received
                listed = tl.full((), LIST, tl.int32)
                lists = decode_keys(recv_ptr + row * SLOTS * packed_words(LIST, PLANES, SCORE_BITS), slot,
                                    _lowest_rank(mask, WORLD), (part == 1) & (slot < LIST), LIST, PLANES, WORLD,
                                    INTERLEAVE, GID_BITS, SCORE_BITS)
            else:
                listed = _append_lists(selected_row + half, row, mask, recv_ptr, half, LIST, PLANES, SLOTS, WORLD,
                                       INTERLEAVE, GID_BITS, SCORE_BITS)
                tl.debug_barrier()  # the block's stores are seen by all its threads
                lists = tl.load(selected_row + half + slot, mask=(part == 1) & (slot < listed), other=0)
            if listed <= half:
                keys = tl.load(selected_row + slot, mask=(part == 0) & (slot < width), other=0)
                # The select's keys of a saturated rank are in its list too.
                owner, _ = owner_and_local(key_gid(keys, GID_BITS), WORLD, INTERLEAVE)
                keys = tl.where(((mask >> owner) & 1) != 0, 0, keys) | lists
                # Every candidate's level reaches kappa's (the lists' floor is its score).
                kth, selected = kth_largest(keys, TOPK, SCORE_BITS + GID_BITS, ties_ptr + row * TIE_TILE,
                                            (kappa >> (SCORE_BITS + GID_BITS - 15)).to(tl.int32))
            else:
                kth = _streamed_kth(row, epoch, mask, kappa, gather_ptr, recv_ptr, max_rows, TILE, TOPK, LIST, N,
                                    PLANES, SLOTS, WORLD, INTERLEAVE, GID_BITS, SCORE_BITS)
                selected = tl.zeros((), dtype=tl.int32)
                for pushed in tl.static_range(2):  # candidate order: the round-1 words, then the lists
                    for q in range(WORLD):
                        if ((mask >> q) & 1) == pushed:
                            for start in range(0, max(N, LIST), TILE):
                                tile = _rescue_tile(q, start, row, epoch, mask, kappa, gather_ptr, recv_ptr,
                                                    max_rows, TILE, LIST, N, PLANES, SLOTS, WORLD, INTERLEAVE,
                                                    GID_BITS, SCORE_BITS)
                                take = ((tile >= kth) & (tile != 0)).to(tl.int32)
                                tl.store(selected_row + selected + tl.cumsum(take, axis=0) - take, tile,
                                         mask=take != 0)
                                selected += tl.sum(take, axis=0)
                tl.debug_barrier()
                keys = tl.load(selected_row + part * half + slot, mask=part * half + slot < selected, other=0)
                kth = tl.full((), 1, tl.int64)  # every key left is selected
            if SORTED:
                tl.debug_barrier()  # every thread has read the keys before they are overwritten
            emit_selected(keys, kth, selected, row, outputs, sizes, rank, selected_row, False, TOPK, WORLD,
                          INTERLEAVE, GID_BITS, EMIT_IDS, EMIT_ROWS, SORTED)
    if ok:
        tl.store(epochs_ptr + row, epoch)


@triton.jit
def _streamed_kth(row, epoch, mask, kappa, gather_ptr, recv_ptr, max_rows, TILE: tl.constexpr, TOPK: tl.constexpr,
                  LIST: tl.constexpr, N: tl.constexpr, PLANES: tl.constexpr, SLOTS: tl.constexpr,
                  WORLD: tl.constexpr, INTERLEAVE: tl.constexpr, GID_BITS: tl.constexpr, SCORE_BITS: tl.constexpr):
    """The K-th key of the rescue's candidates, by a radix select over the
    tiles streamed rank by rank (8-bit digits from the key's top)."""
    top: tl.constexpr = (SCORE_BITS + GID_BITS + 7) // 8 * 8
    prefix = tl.zeros((), dtype=tl.int64)
    need = tl.full((), TOPK, tl.int32)  # loop-carried values keep one type
    for d in range(top // 8):
        shift = top - 8 - 8 * d
        hist = tl.zeros((256,), dtype=tl.int32)
        for q in range(WORLD):
            for start in range(0, max(N, LIST), TILE):
                tile = _rescue_tile(q, start, row, epoch, mask, kappa, gather_ptr, recv_ptr, max_rows, TILE, LIST,
                                    N, PLANES, SLOTS, WORLD, INTERLEAVE, GID_BITS, SCORE_BITS)
                hist += radix_digit_histogram(tile, prefix, shift)
        chosen, above, _ = radix_boundary(hist, need)
        need -= above
        prefix |= chosen.to(tl.int64) << shift
    return prefix


@triton.jit(do_not_specialize=OUTPUT_SIZES + ["rescued_only"])
def order_kernel(outputs, table_stride, num_reqs, num_blocks, block_size, stride_rows, rows_stride, sat_ptr,
                 status_ptr, selected_ptr, rescued_only, rank, TOPK: tl.constexpr, KEYS: tl.constexpr,
                 WORLD: tl.constexpr, INTERLEAVE: tl.constexpr, GID_BITS: tl.constexpr, EMIT_IDS: tl.constexpr,
                 EMIT_ROWS: tl.constexpr, PDL: tl.constexpr, SCORE_BITS: tl.constexpr):
    """Sorted outputs: the keys that the select (or, with ``rescued_only``,
    the rescue, on rows with saturated ranks) left in the row's scratch
    (``selected_ptr``, [T, KEYS] int64: TOPK rounded up to a power of 2 of
    them, zeros after the last), by descending key, written as the emit
    writes them. Nothing once a wait has expired (``status_ptr``): the
    stage that waited wrote no keys."""
    after_prior_kernel(PDL)
    sizes = (table_stride, num_reqs, num_blocks, block_size, stride_rows, rows_stride)
    row = tl.program_id(0).to(tl.int64)
    todo = tl.load(status_ptr) == 0
    if rescued_only:
        todo = todo & (load_sat(sat_ptr, row, SCORE_BITS)[0] != 0)
    if todo:
        slot = tl.arange(0, power_of_2(TOPK))[None, :]
        keys = tl.sort(tl.load(selected_ptr + row * KEYS + slot), dim=1, descending=True)
        chosen = keys != 0
        count = tl.sum(tl.sum(chosen.to(tl.int32), axis=1), axis=0)
        write_outputs(key_gid(keys, GID_BITS), chosen, slot, count, row, outputs, sizes, rank, TOPK, WORLD,
                      INTERLEAVE, EMIT_IDS, EMIT_ROWS)


def output_args(ids, rows, fallback) -> tuple:
    """The select's and rescue's first arguments: the optional outputs'
    pointers (unused ones point at ``fallback`` and are never touched:
    EMIT_* are compile-time), then the rows output's OUTPUT_SIZES."""
    if rows is None:
        return (ids if ids is not None else fallback, fallback, fallback, fallback, fallback), 0, 0, 0, 1, 1, 0
    table = rows.block_table
    return ((ids if ids is not None else fallback, rows.rows_out, rows.valid_out, rows.req_id, table),
            table.stride(0), table.shape[0], table.shape[1], rows.block_size, rows.stride_rows,
            rows.rows_out.stride(0))


SELECT_WARPS = 8


def _emits(ids, rows, sorted) -> dict:
    """What the select and the rescue write: the outputs given, or, sorted,
    only the chosen keys, for ``order_kernel`` (so the two forms share one
    variant)."""
    return dict(EMIT_IDS=ids is not None and not sorted, EMIT_ROWS=rows is not None and not sorted, SORTED=sorted)


def state_args(sat, selected, ties, gather, epochs, max_rows, rank) -> tuple:
    """The select's and the rescue's buffers, one tuple argument: saturation
    states, the scratch of their keys (``rescue_keys``) and of the k-th
    key's ties (TIE_TILE), the gather buffer and the rows' epochs."""
    return sat, selected, ties, gather, epochs, max_rows, rank


@dataclass(frozen=True)
class ShortLists:
    """A saturated rank's pushed lists, built by the select itself on rows
    of at most ``pack.SHORT_ROWS`` tokens (``pack.pushed_list``): this
    rank's ``logits`` [T, S], their windows, the receive buffer ``recv``
    and where the lists go (``pack.Publish``, with list slots)."""

    logits: torch.Tensor
    row_starts: torch.Tensor | None
    row_ends: torch.Tensor
    recv: torch.Tensor
    publish: Publish
    max_local_len: int


def select_launch(*, num_rows, ids, rows, sorted, sat, status, gather, flags, epochs, ties, selected, max_rows, rank,
                  world_size, topk, local_topk, planes, interleave, gid_bits, max_spins, pdl, score_bits=16,
                  lists: ShortLists | None = None, **_) -> Launch:
    """Round 1's select: ids and/or rows of every row and its saturation
    state, and with ``lists`` the pushed lists where this rank is saturated
    (else ``pack.select_local`` builds them afterwards). ties: int64
    [>= T, TIE_TILE] and selected: int64 [>= T, rescue_keys(K)] scratch
    (the select sorts through it, and leaves its keys there for the rescue
    on rows with saturated ranks)."""
    width, list_args, list_row, list_align_down, library_peers = 0, None, 0, False, 0
    if lists is not None:
        pub = lists.publish
        width = min(lists.logits.shape[1], lists.max_local_len)
        list_row = short_row(lists.max_local_len)
        list_align_down = align_down(lists.logits, lists.max_local_len)
        list_args = (lists.recv, (lists.logits, lists.row_starts, lists.row_ends, lists.logits.stride(0)),
                     (pub.epochs, pub.epochs, pub.peer_ptrs, pub.flag_ptrs, pub.pes, pub.max_rows))
        library_peers = pub.library_peers
    return Launch(select_kernel, (num_rows,),
                  (*output_args(ids, rows, epochs), width, (flags, status, max_spins),
                   state_args(sat, selected, ties, gather, epochs, max_rows, rank), list_args),
                  dict(TOPK=topk, N=local_topk, PLANES=planes, WORLD=world_size, INTERLEAVE=interleave,
                       GID_BITS=gid_bits, **_emits(ids, rows, sorted), LIST_ROW=list_row,
                       LIST_ALIGN_DOWN=list_align_down, LIBRARY_PEERS=library_peers, PDL=pdl,
                       SCORE_BITS=score_bits), SELECT_WARPS)


RESCUE_TILE = tl.constexpr(1024)


@triton.constexpr_function
def rescue_keys(topk):
    """Candidates the rescue selects in registers: the select's keys (K
    rounded up to a power of 2 slots), then the lists; one list fits."""
    return max(4096, power_of_2(2 * topk))


@triton.constexpr_function
def list_len(topk):
    """``format.list_len`` in kernels (which cannot call it; tests hold the
    two equal): K rounded up to a multiple of 32."""
    return (topk + 31) // 32 * 32


@triton.constexpr_function
def list_slots(topk, local_topk):
    """Receive slots a row (``format.rescue_slots``, K // N), at least one:
    a workspace that has none still indexes as one."""
    return max(topk // local_topk, 1)


def rescue_launch(*, num_rows, ids, rows, sorted, sat, status, gather, flags, epochs, ties, selected, recv,
                  max_rows, rank, world_size, topk, local_topk, planes, interleave, gid_bits,
                  max_spins, pdl, score_bits=16, **_) -> Launch:
    """Round 2's rescue. ties: int64 [>= T, TIE_TILE] and selected: int64
    [>= T, rescue_keys(K)] scratch; recv: the receive buffer."""
    return Launch(rescue_kernel, (num_rows,),
                  (*output_args(ids, rows, epochs), (flags, status, max_spins),
                   state_args(sat, selected, ties, gather, epochs, max_rows, rank), recv),
                  dict(TOPK=topk, N=local_topk, PLANES=planes, WORLD=world_size, INTERLEAVE=interleave,
                       GID_BITS=gid_bits, **_emits(ids, rows, sorted), PDL=pdl, SCORE_BITS=score_bits),
                  min(16, rescue_keys(topk) // 256))


def order_launch(*, num_rows, ids, rows, sat, status, selected, rescued_only, rank, world_size, topk, interleave,
                 gid_bits, pdl, score_bits=16, **_) -> Launch:
    """The sorted form's writes after the select (``rescued_only`` False)
    and after the rescue (True); the arguments as the select's (the others
    of theirs are ignored)."""
    width = power_of_2(topk)
    return Launch(order_kernel, (num_rows,),
                  (*output_args(ids, rows, status), sat, status, selected, int(rescued_only), rank),
                  dict(TOPK=topk, KEYS=rescue_keys(topk), WORLD=world_size, INTERLEAVE=interleave, GID_BITS=gid_bits,
                       EMIT_IDS=ids is not None, EMIT_ROWS=rows is not None, PDL=pdl, SCORE_BITS=score_bits),
                  min(16, max(4, width // 128)))


def select(**kw) -> None:
    if kw["num_rows"]:
        select_launch(**kw)()
        if kw["sorted"]:
            order_launch(**kw, rescued_only=False)()


def rescue(**kw) -> None:
    if kw["num_rows"]:
        rescue_launch(**kw)()
        if kw["sorted"]:
            order_launch(**kw, rescued_only=True)()

"""Local top-n: a rank's n best tokens of each row, by (score desc, local id
asc), written as a packed row (candidates by ascending local id, empty slots
last). The same kernels serve the pack (n = N, round 1) and a saturated
rank's pushed list (n = K, after the select), and cost about the same whatever
the scores (short rows skip a few counts where their n best lie near the top).

A call at most SHORT_ROWS tokens wide (a 128K context over 8 ranks) takes
one kernel, a program per row (``row_kernel``): the row in registers, its
threshold from counts, one a bit between its highest score and a count
near it, then one ordered compaction.
Scores in exact fp32 order (32-bit words) take it too, with sixteen counts
more, on the boundary level's low halves.

Wider calls take the three kernels of the spread pipeline (``spread.py``:
estimate, filter, finish), where no program walks a
row (32-bit scores are sampled and filtered by their top halves). Whatever
the kernel, the output is ``reference.pack``'s, bit for bit."""

from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from . import spread
from .estimate import estimate_kernel
from .filter import filter_kernel
from .finish import finish_kernel
from .keys import (NO_SCORE32, folded32, is_nan_bits, low_halves, low_halves_at, ord16, packed_word, packed_words,
                   score_bits)
from .launch import Launch
from .rows import (above_and_ties32, any_width, kept_of_row, kept_slots, line_positions, list_floor, list_slot,
                   load_tokens, publish_row, row_target, row_threshold, row_threshold32, row_window, token_ord16,
                   word_score, zero_row_from)
from .sync import after_prior_kernel

SHORT_ROWS = 16384  # calls this wide or narrower: a program a row (``row_kernel``); at most 2^14 (its scan)
ROW_WARPS = 16  # 32 tokens a thread: the merge's fastest on the H200 (docs/performance.md)


@any_width
def row_kernel(out_ptr, rows, width_limit, peers, N: tl.constexpr, PLANES: tl.constexpr, SLOTS: tl.constexpr,
               LIST: tl.constexpr, KAPPA_SHIFT: tl.constexpr, ROW: tl.constexpr, ALIGN_DOWN: tl.constexpr,
               WORLD: tl.constexpr, LIBRARY_PEERS: tl.constexpr, PDL: tl.constexpr, SCORE_BITS: tl.constexpr):
    """The whole local top-N of a short row (ROW tokens, a power of 2 up to
    SHORT_ROWS) in one program (``row_top_n``). A pushed list's row is read
    before the prior kernel ends (the scores were written before the pack,
    two kernels back); the pack's after it, as the prior kernel may have
    written them. ALIGN_DOWN: as ``row_scores`` takes it."""
    logits_ptr, row_starts_ptr, row_ends_ptr, sat_ptr, logits_stride, scratch_stride, rank = rows
    words: tl.constexpr = packed_words(N, PLANES, SCORE_BITS)
    row = tl.program_id(0).to(tl.int64)
    row_ptr = logits_ptr + row * logits_stride
    if LIST:
        scores, lead = row_scores(row_ptr, width_limit, ROW, ALIGN_DOWN, SCORE_BITS)
    after_prior_kernel(PDL)
    if not LIST:
        scores, lead = row_scores(row_ptr, width_limit, ROW, ALIGN_DOWN, SCORE_BITS)
    active, offset = row_target(row, sat_ptr, rank, words, SLOTS, LIST, SCORE_BITS)
    if active:
        start, end = row_window(row_starts_ptr, row_ends_ptr, row, width_limit)
        floor = None
        if LIST:
            floor = list_floor(sat_ptr, row, KAPPA_SHIFT, SCORE_BITS)
        row_top_n(out_ptr + offset, scores, lead, start, end, width_limit, floor, N, PLANES, ROW, SCORE_BITS)
        publish_row(out_ptr, offset, row, peers, rank, words, WORLD, LIST, LIBRARY_PEERS)


@triton.jit
def row_lines(ROW: tl.constexpr, SCORE_BITS: tl.constexpr):
    """(local, second): the local ids of a short row's first part as lines
    of adjacent tokens, one thread's each (16 bytes of bf16 or of fp32
    logits: 8 or 4 tokens), and where the second part starts (32-bit
    scores hold the row in two parts; 16-bit ones in one, ROW)."""
    second: tl.constexpr = ROW // (SCORE_BITS // 16)
    line: tl.constexpr = 128 // SCORE_BITS
    return tl.arange(0, second // line)[:, None] * line + tl.arange(0, line)[None, :], second


@triton.jit
def row_scores(row_ptr, width_limit, ROW: tl.constexpr, ALIGN_DOWN: tl.constexpr, SCORE_BITS: tl.constexpr):
    """(scores, lead): a short row's scores (``row_lines``; two parts with
    32-bit scores), NaN outside the call's width, read before the row's
    window is known (its bounds are loads too), one unmasked vector load a
    line when the call is ROW tokens wide. Line i holds the tokens from
    8i - lead on (4i - lead with 32-bit scores). lead is 0 unless
    ALIGN_DOWN: rows Triton cannot prove 16-byte aligned (``align_down``)
    are read from the 16-byte boundary at or below their first token, so
    that a thread still holds a line of adjacent tokens (Triton lays such
    a row out a token a thread, through shared memory)."""
    local, second = row_lines(ROW, SCORE_BITS)
    lead = 0
    inside = local < width_limit
    whole = width_limit >= ROW
    if ALIGN_DOWN:  # ROW has room for the width and the lead: never whole
        lead = (row_ptr.to(tl.int64) % 16).to(tl.int32) // (row_ptr.dtype.element_ty.primitive_bitwidth // 8)
        row_ptr = tl.multiple_of(row_ptr - lead, 16)
        inside = (local - lead >= 0) & (local - lead < width_limit)
        whole = False
    scores = load_tokens(row_ptr + local, inside, whole)
    if SCORE_BITS == 32:
        scores = (scores, load_tokens(row_ptr + local + second, local + second - lead < width_limit, whole))
    return scores, lead


@triton.jit
def row_top_n(out_row, scores, lead, start, end, width_limit, floor, N: tl.constexpr, PLANES: tl.constexpr,
              ROW: tl.constexpr, SCORE_BITS: tl.constexpr):
    """The packed top-N of the valid tokens [start, end) of a short row
    (``scores`` and ``lead``: as ``row_scores`` reads them) into
    ``out_row``: the row held in registers, its threshold by
    ``rows.row_threshold`` (counts, whatever the scores; 32-bit scores,
    ``rows.row_threshold32``), then one scan in token order
    (``line_positions``) of ``above_and_ties`` places the kept ones; the
    rest of the packed row is zeroed (no id reaches 2^16: every plane bit
    is 0). 32-bit scores are held as two
    parts of the row, each placed in turn: at once, their compaction's
    addresses and values outgrow the registers. ``floor``: None, or a
    pushed list's (``list_floor``: only tokens at or above it are listed)."""
    local, second = row_lines(ROW, SCORE_BITS)
    ids = local - lead
    if SCORE_BITS == 32:
        inside = (ids >= start) & (ids < end)
        inside2 = (ids + second >= start) & (ids + second < end)
        _row_top_n32(out_row, scores, (inside, inside2), ids, floor, N, PLANES, second)
    else:
        _row_top_n16(out_row, scores, start, end, width_limit, ids, floor, N, PLANES)


@triton.jit
def _row_top_n16(out_row, x, start, end, width_limit, ids, floor, N: tl.constexpr, PLANES: tl.constexpr):
    """``row_top_n`` by the 16-bit order of the scores ``x`` (their token
    ``ids``; [start, end) their window, within [0, width_limit))."""
    score = token_ord16(x)
    if (start > 0) | (end < width_limit):  # tokens outside the call's width are NaN already: 0
        score = tl.where((ids >= start) & (ids < end), score, 0)
    if floor is not None:
        # A pushed list holds only tokens at or above kappa's level: when
        # at most N are, they are the list, and no count picks them.
        score = tl.where(score >= floor, score, 0)
        above = tl.sum(tl.sum((score != 0).to(tl.int32), axis=1), axis=0)
        threshold = tl.zeros((), dtype=tl.int32)  # every valid token is above it
        if above > N:
            threshold, above = row_threshold(score, N, floor)
    else:
        threshold, above = row_threshold(score, N, 0)
    slot, keep, kept = kept_of_row(score, threshold, above, N)
    tl.store(out_row + slot, packed_word(score, ids), mask=keep)
    zero_row_from(out_row, kept, packed_words(N, PLANES, 16), 1024)


@triton.jit
def _row_top_n32(out_row, xs, insides, ids, floor, N: tl.constexpr, PLANES: tl.constexpr, SECOND: tl.constexpr):
    """``row_top_n`` by the fp32 order of the scores, the row in two parts
    (``xs``, ``insides``: each part's scores and window; ``ids``: the first
    part's token ids, the second part's SECOND further): the words hold
    the orders' top halves, the low halves follow them. ``floor``: an
    ord32 (int64), or None."""
    order = tl.where(insides[0], folded32(xs[0]), NO_SCORE32)
    order2 = tl.where(insides[1], folded32(xs[1]), NO_SCORE32)
    if floor is not None:
        folded = (floor - 0x80000000).to(tl.int32)
        order = tl.where(order >= folded, order, NO_SCORE32)
        order2 = tl.where(order2 >= folded, order2, NO_SCORE32)
        above = tl.sum(tl.sum((order != NO_SCORE32).to(tl.int32) + (order2 != NO_SCORE32).to(tl.int32), axis=1),
                       axis=0)
        threshold = tl.full((), NO_SCORE32, tl.int32)  # every valid token is above it
        if above > N:
            threshold, above = row_threshold32(order, order2, N, folded)
    else:
        threshold, above = row_threshold32(order, order2, N, NO_SCORE32)
    found = (threshold != NO_SCORE32).to(tl.int32)
    counts = above_and_ties32(order, threshold)
    first = tl.sum(tl.sum(counts, axis=1), axis=0)  # both fields, the first part's: where the second's start
    _store_part32(out_row, order, ids, counts, line_positions(counts), found, above, N, PLANES)
    counts = above_and_ties32(order2, threshold)
    kept = _store_part32(out_row, order2, ids + SECOND, counts, first + line_positions(counts), found, above, N,
                         PLANES)
    zero_row_from(out_row, kept, low_halves_at(N, PLANES), 1024)
    zero_row_from(low_halves(out_row, N, PLANES), kept, N, 1024)


@triton.jit
def pushed_list(recv_ptr, row, rows, width_limit, peers, mask, floor, rank, N: tl.constexpr, PLANES: tl.constexpr,
                SLOTS: tl.constexpr, ROW: tl.constexpr, ALIGN_DOWN: tl.constexpr, WORLD: tl.constexpr,
                LIBRARY_PEERS: tl.constexpr, SCORE_BITS: tl.constexpr):
    """A saturated rank's pushed list of a short ``row``, built where the
    select found the rank saturated (``mask``, its ``floor``: kappa's score,
    ``list_floor``): the top-N of its tokens at or above the floor, into
    its receive slot (``row_target``) here and on every peer, the row's
    rescue flag raised there. ``rows``: (logits_ptr, row_starts_ptr,
    row_ends_ptr, logits_stride); ``peers``: as the pack's kernels take
    them; ALIGN_DOWN: as ``row_scores`` takes it."""
    logits_ptr, row_starts_ptr, row_ends_ptr, logits_stride = rows
    words: tl.constexpr = packed_words(N, PLANES, SCORE_BITS)
    offset = (row * SLOTS + list_slot(mask, rank)) * words
    scores, lead = row_scores(logits_ptr + row * logits_stride, width_limit, ROW, ALIGN_DOWN, SCORE_BITS)
    start, end = row_window(row_starts_ptr, row_ends_ptr, row, width_limit)
    row_top_n(recv_ptr + offset, scores, lead, start, end, width_limit, floor, N, PLANES, ROW, SCORE_BITS)
    publish_row(recv_ptr, offset, row, peers, rank, words, WORLD, True, LIBRARY_PEERS)


@triton.jit
def _store_part32(out_row, order, ids, counts, before, found, above, N: tl.constexpr, PLANES: tl.constexpr):
    """One part's kept tokens (``kept_slots`` of its ``counts``, ``before``
    them the scan's, the earlier parts' included): their words, then their
    low halves as int16 (two candidates share a word). Returns the row's
    kept count."""
    slot, keep, kept = kept_slots(counts, before, found, above, N)
    tl.store(out_row + slot, packed_word(word_score(order, 32), ids), mask=keep)
    tl.store(low_halves(out_row, N, PLANES) + slot, order.to(tl.int16), mask=keep)  # its low 16 bits
    return kept


# ---------------------------------------------------------------- launcher


@dataclass(frozen=True)
class Publish:
    """Where finished rows go besides ``out``: every peer (all of them by
    address, or ``library_peers`` through NVSHMEM's device library, pushed
    lists only). ``list_slots`` > 0 selects a saturated rank's pushed lists
    (rows gated by ``sat``, written into receive slots) instead of round-1
    rows. ``peer_ptrs`` / ``flag_ptrs``: int64 [W] addresses of the peers'
    gather (or receive) buffers and flags; ``epochs``: int32 [>= T]."""

    epochs: torch.Tensor
    peer_ptrs: torch.Tensor
    flag_ptrs: torch.Tensor
    pes: torch.Tensor
    max_rows: int
    rank: int
    world_size: int
    sat: torch.Tensor | None = None
    list_slots: int = 0
    gid_bits: int = 0
    library_peers: int = 0


def short_row(max_local_len: int) -> int:
    """Tokens ``row_kernel`` holds a row (its ROW) in a workspace of rows up
    to ``max_local_len`` tokens, for calls at most SHORT_ROWS wide."""
    return max(triton.next_power_of_2(min(max_local_len, SHORT_ROWS)), 1024)


def align_down(logits: torch.Tensor, max_local_len: int) -> bool:
    """Whether the short-row kernels read each row of ``logits`` [T, S]
    from the 16-byte boundary at or below it (``row_scores``' ALIGN_DOWN):
    where Triton cannot prove the rows 16-byte aligned (it specialises a
    row stride on its divisibility by 16 tokens, a base on 16 bytes) and
    ROW has room for the call's width and the tokens before a row. Rows
    it can prove aligned (the serving warm-up's) never take it."""
    provable = logits.stride(0) % 16 == 0 and logits.data_ptr() % 16 == 0
    width = min(logits.shape[1], max_local_len) + 16 // logits.element_size() - 1
    return not provable and width <= short_row(max_local_len)


def _planes(words: int, n: int, score_bits: int) -> int:
    return (words - packed_words(n, 0, score_bits)) // (n // 32)


def pipeline(out, logits, row_starts, row_ends, *, n: int, max_local_len: int, scratch, arrivals,
             publish: Publish | None = None, pdl: bool = False, score_bits: int = 16) -> list[Launch]:
    """The launches of ``select_local``: one (``row_kernel``) for calls at
    most SHORT_ROWS wide, else the three of the spread pipeline, each
    compiled for the widest call of its class; none for no rows."""
    rows, width = logits.shape
    if rows == 0:
        return []
    limit = min(width, max_local_len)
    words = out.shape[-1]
    pub = publish or Publish(row_ends, row_ends, row_ends, row_ends, 0, 0, 0)  # no peers: never read (WORLD = 0)
    listing = pub.list_slots > 0
    rows_arg = (logits, row_starts, row_ends, pub.sat if listing else row_ends, logits.stride(0), scratch.stride(0),
                pub.rank)
    peers_arg = (arrivals, pub.epochs, pub.peer_ptrs, pub.flag_ptrs, pub.pes, pub.max_rows)
    target = dict(N=n, PLANES=_planes(words, n, score_bits), SLOTS=max(pub.list_slots, 1), LIST=listing,
                  KAPPA_SHIFT=pub.gid_bits if listing else 0, PDL=pdl, SCORE_BITS=score_bits)
    peers = dict(WORLD=pub.world_size, LIBRARY_PEERS=pub.library_peers)
    if limit <= SHORT_ROWS:
        return [Launch(row_kernel, (rows,), (out, rows_arg, limit, peers_arg),
                       dict(target, ROW=short_row(max_local_len), ALIGN_DOWN=align_down(logits, max_local_len),
                            **peers), ROW_WARPS)]
    if score_bits == 32:
        pairs = logits.dtype == torch.float32  # the scores' top halves paired
    else:
        pairs = logits.dtype == torch.bfloat16 and logits.stride(0) % 2 == 0 and logits.data_ptr() % 4 == 0
    return _spread_launches(out, scratch, rows_arg, peers_arg, limit, n=n, max_local_len=max_local_len, pairs=pairs,
                            target=target, peers=peers)


def _spread_launches(out, scratch, rows_arg, peers_arg, limit: int, *, n: int, max_local_len: int, pairs: bool,
                     target: dict, peers: dict) -> list[Launch]:
    """The spread pipeline's three launches (``spread.py``) over
    ``rows_arg``'s rows (``target`` holds SCORE_BITS), each compiled for
    rows of up to ``max_local_len`` tokens; ``pairs``: rows read two tokens
    a word (bf16; fp32 with 32-bit scores)."""
    rows = rows_arg[0].shape[0]
    words = out.shape[-1]
    listing, pdl, score_bits = target["LIST"], target["PDL"], target["SCORE_BITS"]
    p = spread.plan(n, max_local_len, score_bits)
    blocks = triton.cdiv(max(limit, 1), spread.BLOCK.value)
    spans = triton.cdiv(blocks, p.span)
    return [
        Launch(estimate_kernel, (rows,), (out, scratch, rows_arg, limit),
               dict(N=n, WORDS=words, SLOTS=target["SLOTS"], LIST=listing, GROUPS=p.groups, ROOM=p.room, PDL=pdl,
                    SCORE_BITS=score_bits), spread.ESTIMATE_WARPS),
        Launch(filter_kernel, (blocks, rows), (scratch, rows_arg, limit),
               dict(REGION=p.region, REGIONS_AT=p.regions_at, LOWS_AT=p.lows_at, LIST=listing,
                    PAIRS=pairs, PDL=pdl, SCORE_BITS=score_bits), spread.FILTER_WARPS,
               spread.FILTER32_REGISTERS if score_bits == 32 else None),
        Launch(finish_kernel, (rows, spans), (out, scratch, rows_arg, limit, peers_arg),
               dict(target, REGION=p.region, BLOCKS_P2=p.blocks_p2, SPANS_KEPT_AT=p.spans_kept_at,
                    REGIONS_AT=p.regions_at, LOWS_AT=p.lows_at, ROOM=p.room, SPAN=p.span, **peers),
               max(spread.SPAN_WARPS, p.room // 512)),
    ]


def select_local(out, logits, row_starts, row_ends, *, n: int, max_local_len: int, scratch, arrivals,
                 publish: Publish | None = None, pdl: bool = False, score_bits: int = 16) -> None:
    """The packed local top-``n`` of every row of ``logits`` [T, S] (bf16,
    fp16 or fp32, stride(1) == 1; tokens row_starts[t] <= l < row_ends[t]
    valid, each [T] int32 or int64; row_starts None: 0), ranked by their
    ``score_bits`` order (``format.score_order``), into ``out``: int32
    [T, words] (round 1), or, for pushed lists, the receive buffer
    [max_rows, slots, words] (rows where this rank is saturated only);
    words = ``format.packed_row_words(n, P, score_bits)``.
    scratch: int32 [>= T, scratch_words(n, max_local_len)] and
    arrivals: int32 [>= T], zero between calls (the kernels leave them so),
    are the spread pipeline's (arrivals read only where it publishes rows;
    calls at most SHORT_ROWS wide read neither). pdl: launch each kernel as a
    programmatic dependent of the one before it (GPUs only)."""
    for launch in pipeline(out, logits, row_starts, row_ends, n=n, max_local_len=max_local_len, scratch=scratch,
                           arrivals=arrivals, publish=publish, pdl=pdl, score_bits=score_bits):
        launch()


def scratch_words(n: int, max_local_len: int, score_bits: int = 16) -> int:
    """Scratch words a row of ``select_local``'s calls needs: the spread
    pipeline's, or one (no call reads it) when every call is at most
    SHORT_ROWS wide."""
    return spread.plan(n, max_local_len, score_bits).scratch_words if max_local_len > SHORT_ROWS else 1


def scratch_for(rows: int, n: int, max_local_len: int, device, *, publishing: bool = True, score_bits: int = 16
                ) -> tuple[torch.Tensor, torch.Tensor]:
    """(scratch, arrivals) for ``select_local`` over ``rows`` rows. Only
    rows published to peers count arrivals: without (``publishing`` False)
    the scratch stands in for them and nothing is zeroed, a kernel less."""
    scratch = torch.empty((rows, scratch_words(n, max_local_len, score_bits)), dtype=torch.int32, device=device)
    return scratch, torch.zeros(rows, dtype=torch.int32, device=device) if publishing else scratch


def pack(out, logits, row_starts, row_ends, *, local_topk: int, max_local_len: int, push: Publish | None = None,
         scratch=None, pdl: bool = False, score_bits: int = 16) -> None:
    """Round 1: out int32 [T, packed_row_words(N, P, score_bits)] (P read
    off its width). ``push``,
    when given (every peer reached by address), also pushes each finished
    row to every peer's gather buffer and raises its flag. ``scratch``:
    (scratch, arrivals) as ``scratch_for`` makes them."""
    scratch, arrivals = scratch or scratch_for(logits.shape[0], local_topk, max_local_len, out.device,
                                               publishing=push is not None, score_bits=score_bits)
    select_local(out, logits, row_starts, row_ends, n=local_topk, max_local_len=max_local_len, scratch=scratch,
                 arrivals=arrivals, publish=push, pdl=pdl, score_bits=score_bits)


@any_width
def pack_indices_kernel(out_ptr, logits_ptr, idx_ptr, row_starts_ptr, row_ends_ptr, logits_stride, idx_stride,
                        width_limit, N: tl.constexpr, PLANES: tl.constexpr, GROUPS: tl.constexpr,
                        PDL: tl.constexpr, SCORE_BITS: tl.constexpr):
    """Slot j of the output keeps candidate j of ``idx``; 32 slots a group,
    GROUPS groups per step, so each plane word is built in registers."""
    after_prior_kernel(PDL)
    row = tl.program_id(0).to(tl.int64)
    out_row = out_ptr + row * packed_words(N, PLANES, SCORE_BITS)
    start, end = row_window(row_starts_ptr, row_ends_ptr, row, width_limit)
    lane = tl.arange(0, 32)
    for g0 in tl.range(0, N // 32, GROUPS):
        group = g0 + tl.arange(0, GROUPS)
        slot = group[:, None] * 32 + lane[None, :]
        in_range = (group < N // 32)[:, None] & (lane >= 0)[None, :]
        local = tl.load(idx_ptr + row * idx_stride + slot, mask=in_range, other=-1)
        inside = (local >= start) & (local < end)
        ptrs = logits_ptr + row * logits_stride + tl.where(inside, local, 0)
        if SCORE_BITS == 32:
            order = folded32(tl.load(ptrs, mask=inside, other=float("nan")))
            present = order != NO_SCORE32
            score = word_score(order, 32)
            low = tl.where(present, order, 0).to(tl.int16)
            tl.store(low_halves(out_row, N, PLANES) + slot, low, mask=in_range)
        else:
            bits = score_bits(ptrs, inside)
            present = inside & ~is_nan_bits(bits)
            score = ord16(bits)
        tl.store(out_row + slot, tl.where(present, packed_word(score, local), 0), mask=in_range)
        for p in tl.static_range(PLANES):
            bit = tl.where(present, (local >> (16 + p)) & 1, 0)
            plane = tl.sum((bit << lane[None, :]).to(tl.int64), axis=1).to(tl.int32)
            tl.store(out_row + N + p * (N // 32) + group, plane, mask=group < N // 32)


def pack_indices_launch(out, logits, local_idx, row_starts, row_ends, *, max_local_len: int,
                        pdl: bool = False, score_bits: int = 16) -> Launch:
    rows, width = logits.shape
    n = local_idx.shape[1]
    return Launch(pack_indices_kernel, (rows,),
                  (out, logits, local_idx, row_starts, row_ends, logits.stride(0), local_idx.stride(0),
                   min(width, max_local_len)),
                  dict(N=n, PLANES=_planes(out.shape[1], n, score_bits), GROUPS=8, PDL=pdl, SCORE_BITS=score_bits), 4)


def pack_indices(out, logits, local_idx, row_starts, row_ends, *, max_local_len: int, pdl: bool = False,
                 score_bits: int = 16) -> None:
    if logits.shape[0]:
        pack_indices_launch(out, logits, local_idx, row_starts, row_ends, max_local_len=max_local_len, pdl=pdl,
                            score_bits=score_bits)()

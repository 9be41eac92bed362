"""The spread pipeline's third kernel (``spread.py``), a program per span
of blocks on a [rows, spans] grid: every program settles the row from the
filter's summed counts the same way (``_settle``) and takes its part:
listed (the first span selects the candidates in registers), exact (each
block with tokens to keep writes them at its place) or radix
(``radix.py``). Precondition: the filter of every block of the row ended
(the prior kernel). The last program to finish a row publishes it (pushes
it to every peer and raises its flags); a pushed list is first trimmed to
its tokens at or above kappa's score. The row written is
``reference.pack``'s, bit for bit."""

import triton
import triton.language as tl

from .filter import below_candidates
from .keys import NO_SCORE32, packed_words
from .rows import (above_and_ties, above_and_ties32, any_width, bisected_threshold, bisected_threshold32, fp32_order,
                   kept_slots, list_floor, publish_row, row_lows, row_target, row_window, store_words, trim_list,
                   word_score)
from .radix import compact_spans, lists_threshold, span_threshold, write_span
from .spread import (BLOCK, COUNT_FIELDS, EXACT, FLOOR, HEADER, LISTED, MODE, PROBE, RADIX, RADIX_ARRIVALS,
                     region_lows_at, region_token, write_block)
from .sync import after_prior_kernel, last_to_arrive


@triton.jit
def _span_target(sat_ptr, rank, WORDS: tl.constexpr, SLOTS: tl.constexpr, LIST: tl.constexpr,
                 SCORE_BITS: tl.constexpr):
    """(span, row, spans, active, offset) of a program of a [rows, spans]
    grid (``row_target`` gives the last two): every row's first span is
    dispatched before any row's second, so that the rows settled by their
    first span alone start at once."""
    row = tl.program_id(0).to(tl.int64)
    active, offset = row_target(row, sat_ptr, rank, WORDS, SLOTS, LIST, SCORE_BITS)
    return tl.program_id(1), row, tl.num_programs(1), active, offset



@triton.jit
def _settle(scratch, blocks, N: tl.constexpr, ROOM: tl.constexpr, BLOCKS_P2: tl.constexpr, SCORE_BITS: tl.constexpr):
    """How the row is settled (LISTED, EXACT, RADIX), from the blocks'
    counts; the candidates of each block; and, for an EXACT row, the
    threshold (a ``token_order``), how many of its ties are taken, and each
    block's tokens above it and tied with it. 32-bit scores settle on the
    probe only when its tokens are all one fp32 value: then their order is
    exactly the probe's."""
    b = tl.arange(0, BLOCKS_P2)
    inside = b < blocks
    counts = scratch + HEADER + b * COUNT_FIELDS
    valid = tl.load(counts, mask=inside, other=0)
    listed = tl.load(counts + 1, mask=inside, other=0)
    reach = tl.load(counts + 2, mask=inside, other=0)
    above = tl.load(counts + 3, mask=inside, other=0)
    all_valid = tl.sum(valid, axis=0)
    all_listed = tl.sum(listed, axis=0)
    all_above = tl.sum(above, axis=0)
    on_list = (all_listed <= ROOM) & ((all_listed >= N) | (all_listed == all_valid))
    tie = (all_above < N) & (tl.sum(reach, axis=0) >= N)
    probe = tl.load(scratch + PROBE)
    if SCORE_BITS == 32:
        highest = tl.max(tl.load(counts + 4, mask=inside, other=-1), axis=0)
        lowest = 0xFFFF - tl.max(tl.load(counts + 5, mask=inside, other=-1), axis=0)
        tie = tie & (highest == lowest)
        threshold = tl.where(tie, fp32_order(probe, highest), NO_SCORE32)
    else:
        threshold = tl.where(tie, probe, 0)  # 0: every valid token is taken
    # The candidates when they hold the top n (no second read of the row),
    # then the threshold known (a tie, or every valid token).
    exact = tie | (all_valid <= N)
    mode = tl.where(on_list, LISTED, tl.where(exact, EXACT, RADIX))
    greater = tl.where(tie, above, valid)
    equal = tl.where(tie, reach - above, 0)
    return mode, listed, threshold, tl.where(tie, N - all_above, 0), greater, equal


@triton.jit
def _copy_region(out_row, lows, regions, region_lows, block, count, offset, N: tl.constexpr, PLANES: tl.constexpr,
                 REGION: tl.constexpr):
    """A block's first ``count`` candidate words (and low halves), read from
    its region (in order), into slots ``offset`` on of a packed row."""
    first = block * REGION
    for start in tl.static_range(0, REGION, 1024):
        i = start + tl.arange(0, 1024)
        copied = i < count
        local, order = region_token(tl.load(regions + first + i, mask=copied, other=0), block, region_lows, first + i,
                                     copied)
        store_words(out_row, offset + i, order, local, copied, N, PLANES, lows)


@triton.jit
def _write_counted_span(out_row, lows, regions, region_lows, logits_ptr, row, logits_stride, span, blocks, window,
                        threshold, quota, counts, N: tl.constexpr, PLANES: tl.constexpr, BLOCKS_P2: tl.constexpr,
                        REGION: tl.constexpr, SPAN: tl.constexpr, SCORE_BITS: tl.constexpr):
    """``write_span`` where the filter's counts place every block: ``counts``
    = (kept, equal, copied), each block's kept tokens, threshold ties and
    whether its kept tokens are just its candidates, all in its region
    ([BLOCKS_P2] each). Blocks with none to keep read nothing; a copied
    block's words come from its region, not from its logits."""
    kept, equal, copied = counts
    b = tl.arange(0, BLOCKS_P2)
    offset = tl.sum(tl.where(b < span * SPAN, kept, 0), axis=0)
    ties_before = tl.sum(tl.where(b < span * SPAN, equal, 0), axis=0)
    for j in range(SPAN):
        block = span * SPAN + j
        if block < blocks:
            mine = b == block
            count = tl.sum(tl.where(mine, kept, 0), axis=0)
            if count > 0:
                if tl.sum(tl.where(mine, copied, 0), axis=0) != 0:
                    _copy_region(out_row, lows, regions, region_lows, block, count, offset, N, PLANES, REGION)
                else:
                    write_block(out_row, lows, logits_ptr, row, logits_stride, block, window, threshold,
                                 tl.maximum(quota - ties_before, 0), offset, N, PLANES, SCORE_BITS)
            offset += count
            ties_before += tl.sum(tl.where(mine, equal, 0), axis=0)


@triton.jit
def _candidates(regions, region_lows, slot, total, counts, ends, BLOCKS_P2: tl.constexpr, REGION: tl.constexpr):
    """(local id, order) of candidates ``slot`` (in ascending local id; past
    ``total``, empty) of a row whose blocks wrote their candidates' words
    to their regions: a binary search over the blocks' inclusive ends
    (``ends``, held in registers with the ``counts``) finds the block of
    each slot, the first whose end is past it."""
    block = tl.zeros(slot.shape, dtype=tl.int32)
    for k in tl.static_range(20):  # halving steps BLOCKS_P2 / 2, ..., 1 (compile-time)
        if (BLOCKS_P2 >> (k + 1)) > 0:
            probe = block + (BLOCKS_P2 >> (k + 1))
            block = tl.where(tl.gather(ends, probe - 1, 0) <= slot, probe, block)
    start = tl.gather(ends, block, 0) - tl.gather(counts, block, 0)
    valid = slot < total
    index = block.to(tl.int64) * REGION + slot - start
    return region_token(tl.load(regions + index, mask=valid, other=0), block, region_lows, index, valid)


@triton.jit
def _select_listed(out_row, lows, regions, region_lows, listed, floor, N: tl.constexpr, PLANES: tl.constexpr,
                   BLOCKS_P2: tl.constexpr, REGION: tl.constexpr, ROOM: tl.constexpr, SCORE_BITS: tl.constexpr):
    """The packed top-N of a row's candidates (at most ROOM, in ascending
    local id, filtered at ``floor``), held at once: their threshold by
    ``bisected_threshold`` between the floor's bound and their highest
    score, the same counts whatever the scores, then one compaction.
    32-bit scores: ``bisected_threshold32``, the candidates held in two
    halves, each compacted in turn (as the short rows' kernel does)."""
    ends = tl.cumsum(listed, axis=0)
    total = tl.sum(listed, axis=0)
    if SCORE_BITS == 32:
        slot = tl.arange(0, ROOM // 2)
        local, order = _candidates(regions, region_lows, slot, total, listed, ends, BLOCKS_P2, REGION)
        local_2, order_2 = _candidates(regions, region_lows, ROOM // 2 + slot, total, listed, ends, BLOCKS_P2,
                                       REGION)
        lowest = tl.where(total >= N, fp32_order(below_candidates(floor), 0), NO_SCORE32)
        highest = word_score(tl.max(tl.maximum(order, order_2), axis=0), 32)
        threshold, above = bisected_threshold32(order, order_2, N, lowest, highest)
        found = (threshold != NO_SCORE32).to(tl.int32)
        counts = above_and_ties32(order, threshold)
        first = tl.sum(counts, axis=0)  # both fields: where the second half's start
        slot, keep, _ = kept_slots(counts, tl.cumsum(counts, axis=0) - counts, found, above, N)
        store_words(out_row, slot, order, local, keep, N, PLANES, lows)
        counts = above_and_ties32(order_2, threshold)
        slot, keep, _ = kept_slots(counts, first + tl.cumsum(counts, axis=0) - counts, found, above, N)
        store_words(out_row, slot, order_2, local_2, keep, N, PLANES, lows)
    else:
        local, score = _candidates(regions, None, tl.arange(0, ROOM), total, listed, ends, BLOCKS_P2, REGION)
        lowest = tl.where(total >= N, below_candidates(floor), 0)  # fewer: every one is kept
        threshold, above = bisected_threshold(score, N, lowest, tl.max(score, axis=0))
        counts = above_and_ties(score, threshold)
        slot, keep, _ = kept_slots(counts, tl.cumsum(counts, axis=0) - counts, threshold, above, N)
        store_words(out_row, slot, score, local, keep, N, PLANES)


@triton.jit
def _publish(out_ptr, offset, row, peers, sat_ptr, rank, N: tl.constexpr, PLANES: tl.constexpr,
             WORLD: tl.constexpr, LIST: tl.constexpr, KAPPA_SHIFT: tl.constexpr, LIBRARY_PEERS: tl.constexpr,
             SCORE_BITS: tl.constexpr):
    """``publish_row`` of a finished row; a pushed list first loses its
    tokens below kappa's score (``trim_list``: the pipeline selects from
    the whole row, the row kernel from the tokens at or above it)."""
    if LIST:
        trim_list(out_ptr + offset, list_floor(sat_ptr, row, KAPPA_SHIFT, SCORE_BITS), N, PLANES,
                  row_lows(out_ptr + offset, N, PLANES, SCORE_BITS))
    publish_row(out_ptr, offset, row, peers, rank, packed_words(N, PLANES, SCORE_BITS), WORLD, LIST, LIBRARY_PEERS)


@triton.jit
def _publish_when_last(out_ptr, offset, row, spans, peers, sat_ptr, rank, N: tl.constexpr, PLANES: tl.constexpr,
                       WORLD: tl.constexpr, LIST: tl.constexpr, KAPPA_SHIFT: tl.constexpr,
                       LIBRARY_PEERS: tl.constexpr, SCORE_BITS: tl.constexpr):
    """``_publish`` by the last of the row's ``spans`` programs to finish it."""
    if WORLD > 0:
        if last_to_arrive(peers[0] + row, spans):
            _publish(out_ptr, offset, row, peers, sat_ptr, rank, N, PLANES, WORLD, LIST, KAPPA_SHIFT, LIBRARY_PEERS,
                     SCORE_BITS)


@any_width
def finish_kernel(out_ptr, scratch_ptr, rows, width_limit, peers, N: tl.constexpr, PLANES: tl.constexpr,
                  SLOTS: tl.constexpr, LIST: tl.constexpr, KAPPA_SHIFT: tl.constexpr, REGION: tl.constexpr,
                  BLOCKS_P2: tl.constexpr, SPANS_KEPT_AT: tl.constexpr, REGIONS_AT: tl.constexpr,
                  LOWS_AT: tl.constexpr, ROOM: tl.constexpr, SPAN: tl.constexpr,
                  WORLD: tl.constexpr, LIBRARY_PEERS: tl.constexpr, PDL: tl.constexpr, SCORE_BITS: tl.constexpr):
    """Settles the row from the filter's counts: the first span selects from
    the candidates, every block with tokens to keep writes them, or every
    span takes its own top-N and the last to arrive the row's (the radix
    steps). ``peers``:
    (arrivals_ptr, epochs_ptr, peer_ptrs, flag_ptrs, pes_ptr, max_rows),
    where finished rows go (``Publish``)."""
    logits_ptr, row_starts_ptr, row_ends_ptr, sat_ptr, logits_stride, scratch_stride, rank = rows
    after_prior_kernel(PDL)
    words: tl.constexpr = packed_words(N, PLANES, SCORE_BITS)
    span, row, spans, active, offset = _span_target(sat_ptr, rank, words, SLOTS, LIST, SCORE_BITS)
    if active:
        scratch = scratch_ptr + row * scratch_stride
        lows = row_lows(out_ptr + offset, N, PLANES, SCORE_BITS)
        region_lows = region_lows_at(scratch, LOWS_AT, SCORE_BITS)
        window = row_window(row_starts_ptr, row_ends_ptr, row, width_limit)
        blocks = tl.cdiv(tl.maximum(width_limit, 1), BLOCK)
        floor = tl.load(scratch + FLOOR)  # read beside the counts: the first span's select waits for both
        mode, listed, threshold, quota, greater, equal = _settle(scratch, blocks, N, ROOM, BLOCKS_P2, SCORE_BITS)
        if span == 0:
            tl.store(scratch + MODE, mode)
        if mode == LISTED:
            if span == 0:
                # a tile twice the candidates costs twice the instructions: most rows fit half the room
                if tl.sum(listed, axis=0) <= ROOM // 2:
                    _select_listed(out_ptr + offset, lows, scratch + REGIONS_AT, region_lows, listed, floor, N,
                                   PLANES, BLOCKS_P2, REGION, ROOM // 2, SCORE_BITS)
                else:
                    _select_listed(out_ptr + offset, lows, scratch + REGIONS_AT, region_lows, listed, floor, N,
                                   PLANES, BLOCKS_P2, REGION, ROOM, SCORE_BITS)
                _publish(out_ptr, offset, row, peers, sat_ptr, rank, N, PLANES, WORLD, LIST, KAPPA_SHIFT,
                         LIBRARY_PEERS, SCORE_BITS)
        elif mode == EXACT:
            b = tl.arange(0, BLOCKS_P2)
            take = tl.minimum(tl.maximum(quota - (tl.cumsum(equal, axis=0) - equal), 0), equal)
            kept = greater + take
            # Candidates and the tokens above the threshold are both threshold
            # sets of the words' scores: as many of each, they are the same
            # tokens (32-bit scores tie only as one fp32 value).
            copied = ((take == 0) & (listed == greater) & (listed <= REGION)).to(tl.int32)
            mine = (b >= span * SPAN) & (b < span * SPAN + SPAN)
            if tl.sum(tl.where(mine, kept, 0), axis=0) > 0:  # spans with nothing to keep read nothing
                _write_counted_span(out_ptr + offset, lows, scratch + REGIONS_AT, region_lows, logits_ptr, row,
                                    logits_stride, span, blocks, window, threshold, quota, (kept, equal, copied), N,
                                    PLANES, BLOCKS_P2, REGION, SPAN, SCORE_BITS)
            _publish_when_last(out_ptr, offset, row, spans, peers, sat_ptr, rank, N, PLANES, WORLD, LIST,
                               KAPPA_SHIFT, LIBRARY_PEERS, SCORE_BITS)
        else:
            own = span * SPAN * REGION  # the span's own top-N, in its first block's region
            own_lows = region_lows + own if SCORE_BITS == 32 else None
            threshold, quota = span_threshold(logits_ptr, row, logits_stride, span, blocks, window, N, SPAN,
                                               SCORE_BITS)
            start = tl.zeros((), dtype=tl.int32)
            end = write_span(scratch + REGIONS_AT + own, own_lows, logits_ptr, row, logits_stride, span, blocks,
                              window, threshold, quota, start, start, N, 0, SPAN, SCORE_BITS)
            tl.store(scratch + SPANS_KEPT_AT + span, end)
            if last_to_arrive(scratch + RADIX_ARRIVALS, spans):
                threshold, quota = lists_threshold(scratch + REGIONS_AT, region_lows, scratch + SPANS_KEPT_AT, spans,
                                                    N, REGION, SPAN, SCORE_BITS)
                compact_spans(out_ptr + offset, lows, scratch + REGIONS_AT, region_lows, scratch + SPANS_KEPT_AT,
                               spans, threshold, quota, N, PLANES, REGION, SPAN, SCORE_BITS)
                _publish(out_ptr, offset, row, peers, sat_ptr, rank, N, PLANES, WORLD, LIST, KAPPA_SHIFT,
                         LIBRARY_PEERS, SCORE_BITS)


"""The finish's radix steps (``finish.py``), for rows the sample misled
(the counts are exact, the floor was not): each span of blocks takes its
own top-n by histograms of a byte of its scores each (``span_threshold``,
its blocks re-read from L2 for each) and writes it to its first block's
region (``write_span``); the last span to arrive takes the row's threshold
from histograms of those lists (``lists_threshold``) and compacts the
words above it and its first ties into the row (``compact_spans``). A
span's top-n is a superset of its share of the row's whatever the other
spans hold, so the lists hold the row's top-n."""

import triton
import triton.language as tl

from .keys import flat_positions, power_of_2, radix_boundary, radix_digit_histogram
from .rows import above_and_ties, above_and_ties32, no_order, store_words, token_order
from .spread import BLOCK, block_tokens, region_token, write_block


@triton.jit
def write_span(out_row, lows, logits_ptr, row, logits_stride, span, blocks, window, threshold, quota, offset,
                ties_before, N: tl.constexpr, PLANES: tl.constexpr, SPAN: tl.constexpr, SCORE_BITS: tl.constexpr):
    """The span's blocks' kept tokens, in order, from slot ``offset``; the
    row's first ``quota`` threshold ties are kept, ``ties_before`` of them
    lie before the span; each block's counts come from its own read.
    Returns the slot after the last written."""
    for j in range(SPAN):
        block = span * SPAN + j
        if block < blocks:
            written, ties = write_block(out_row, lows, logits_ptr, row, logits_stride, block, window, threshold,
                                         tl.maximum(quota - ties_before, 0), offset, N, PLANES, SCORE_BITS)
            offset += written
            ties_before += ties
    return offset



@triton.constexpr_function
def _lists_a_tile(n):
    """Spans' own top-n lists a tile of about 2048 words holds."""
    return max(1, 2048 // triton.next_power_of_2(n))


@triton.jit
def _span_lists(regions, region_lows, kept_ptr, first, spans, N: tl.constexpr, REGION: tl.constexpr,
                SPAN: tl.constexpr):
    """(local ids, orders, inside) of the own top-N lists of spans
    ``first`` on, ``_lists_a_tile(N)`` of them as [spans, N rounded up to a
    power of 2], each in its first block's region (``kept_ptr``: their
    sizes); orders outside the lists are ``no_order``'s. Read from L2: other
    programs wrote them."""
    i = tl.arange(0, power_of_2(N))[None, :]
    s = first + tl.arange(0, _lists_a_tile(N))[:, None]
    count = tl.load(kept_ptr + s, mask=s < spans, other=0, cache_modifier=".cg")
    inside = i < count
    index = (s * SPAN).to(tl.int64) * REGION + i
    word = tl.load(regions + index, mask=inside, other=0, cache_modifier=".cg")
    local, order = region_token(word, s * SPAN, region_lows, index, inside)
    return local, order, inside


@triton.jit
def compact_spans(out_row, lows, regions, region_lows, kept_ptr, spans, threshold, quota, N: tl.constexpr,
                   PLANES: tl.constexpr, REGION: tl.constexpr, SPAN: tl.constexpr, SCORE_BITS: tl.constexpr):
    """The row's top-N from its spans' own top-N lists (``_span_lists``):
    the words above ``threshold`` (a ``token_order``) and its first
    ``quota`` ties, in span order, into the packed row; as many spans at
    once as fill a tile."""
    offset = tl.zeros((), dtype=tl.int32)
    ties_before = tl.zeros((), dtype=tl.int32)
    first = 0
    while first < spans:  # a while loop: the bound is a run-time scalar
        local, order, _ = _span_lists(regions, region_lows, kept_ptr, first, spans, N, REGION, SPAN)
        if SCORE_BITS == 32:
            counts = above_and_ties32(order, threshold)
        else:
            counts = above_and_ties(order, threshold)
        before = flat_positions(counts)
        keep = ((counts & 0xFFFF) != 0) | ((counts > 0xFFFF) & (ties_before + (before >> 16) < quota))
        keep_i = keep.to(tl.int32)
        store_words(out_row, offset + flat_positions(keep_i), order, local, keep, N, PLANES, lows)
        offset += tl.sum(tl.sum(keep_i, axis=1), axis=0)
        ties_before += tl.sum(tl.sum(counts >> 16, axis=1), axis=0)
        first += _lists_a_tile(N)


@triton.jit
def span_threshold(logits_ptr, row, logits_stride, span, blocks, window, N: tl.constexpr, SPAN: tl.constexpr,
                    SCORE_BITS: tl.constexpr):
    """(threshold, quota) of the span's own top-N: a ``token_order`` and how
    many of its ties its top-N keeps, lowest id first, from a histogram of
    a byte of its orders each (two with 16-bit scores, four with 32-bit
    ones), each from a read of its blocks (from L2), from the top;
    ``no_order`` when it holds at most N valid tokens (all are its list).
    The bytes are those of ``_unsigned_order``, 0 for NaN."""
    threshold = tl.full((), no_order(SCORE_BITS), tl.int32)
    need = tl.full((), N, tl.int32)
    prefix = tl.zeros((), dtype=tl.int32)
    for k in tl.static_range(SCORE_BITS // 8):
        shift = SCORE_BITS - 8 - 8 * k  # compile-time
        if need > 0:  # 0 once a byte found fewer than N: the span keeps every valid token
            digits = tl.zeros((256,), dtype=tl.int32)
            for j in range(SPAN):
                block = span * SPAN + j
                if block < blocks:
                    x = block_tokens(logits_ptr, row, logits_stride, block, window)[0]
                    bits = tl.reshape(_unsigned_order(token_order(x, SCORE_BITS), SCORE_BITS), (BLOCK,))
                    match = bits != 0
                    if k > 0:
                        match = match & ((bits >> (shift + 8)) == (prefix >> (shift + 8)))
                    digits += tl.histogram((bits >> shift) & 0xFF, 256, mask=match)
            bucket, above, _ = radix_boundary(digits, need)
            prefix = prefix | (tl.maximum(bucket, 0) << shift)
            need = tl.where(bucket < 0, 0, need - above)
    if need > 0:
        threshold = prefix ^ no_order(SCORE_BITS)
    return threshold, need


@triton.jit
def _unsigned_order(order, SCORE_BITS: tl.constexpr):
    """A ``token_order`` as ord16 or ord32 (the latter's bits in an int32),
    0 for NaN: the order of its bytes, from the top, is the score's."""
    return order ^ no_order(SCORE_BITS)


@triton.jit
def lists_threshold(regions, region_lows, kept_ptr, spans, N: tl.constexpr, REGION: tl.constexpr,
                     SPAN: tl.constexpr, SCORE_BITS: tl.constexpr):
    """(threshold, quota) of the spans' own top-N lists together, by a
    histogram of a byte of their orders each (``_unsigned_order``), from
    the top: their N-th largest order, and how many of its ties the row
    keeps (``no_order`` when they hold at most N: every one is kept). The
    lists hold the row's top-N (each span's share of it is its own top
    tokens), and all else in them lies below it: this is the row's
    threshold, and its ties in the lists are the row's first ones."""
    threshold = tl.full((), no_order(SCORE_BITS), tl.int32)
    need = tl.full((), N, tl.int32)
    total = tl.zeros((), dtype=tl.int32)
    s = 0
    while s < spans:  # a while loop: the bound is a run-time scalar
        total += tl.load(kept_ptr + s, cache_modifier=".cg")
        s += 1
    if total > N:
        prefix = tl.zeros((), dtype=tl.int64)  # the threshold's unsigned order, a byte at a time
        for k in tl.static_range(SCORE_BITS // 8):
            digits = tl.zeros((256,), dtype=tl.int32)
            first = 0
            while first < spans:
                order = _span_lists(regions, region_lows, kept_ptr, first, spans, N, REGION, SPAN)[1]
                keys = _unsigned_order(order, SCORE_BITS).to(tl.int64) & 0xFFFFFFFF  # 0 outside the lists
                digits += radix_digit_histogram(tl.reshape(keys, (keys.numel,), can_reorder=True), prefix,
                                                SCORE_BITS - 8 - 8 * k)
                first += _lists_a_tile(N)
            bucket, above, _ = radix_boundary(digits, need)
            prefix |= bucket.to(tl.int64) << (SCORE_BITS - 8 - 8 * k)
            need -= above
        threshold = prefix.to(tl.int32) ^ no_order(SCORE_BITS)
    return threshold, need


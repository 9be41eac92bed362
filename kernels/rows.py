"""What the kernels of the local top-n share: a row's scores, window and
output slot, the counts that find a threshold whatever the scores, the
ordered compaction that keeps the tokens above it and its first ties, and
the push of a finished row to every peer. The kernels are ``pack``'s
(a program per short row) and ``spread``'s (wider rows); ``pack``
dispatches between them."""

import triton
import triton.language as tl

from .exchange import call_epoch, peer_flags, push_list, push_row
from .keys import (LOW_BITS, MAX_PEERS, NO_SCORE32, folded32, is_nan_bits, load_sat, low_halves, ord16, packed_word,
                   power_of_2, score16_bits)


# Kernels that take the call's row width never specialise on it (Triton
# would on its divisibility), so that one variant serves every width.
any_width = triton.jit(do_not_specialize=["width_limit"])


# ------------------------------------------------------------------ scores


@triton.jit
def token_ord16(x):
    """ord16 of the scores ``x`` (bf16 or fp16, or fp32 rounded to bf16), 0
    for NaN: below every valid score."""
    bits = score16_bits(x)
    return tl.where(is_nan_bits(bits), 0, ord16(bits))


@triton.jit
def token_order(x, SCORE_BITS: tl.constexpr):
    """The order the kernels rank the scores ``x`` by: ``token_ord16`` (0
    for NaN), or with 32-bit scores ``keys.folded32`` (NO_SCORE32 for NaN).
    Either way the invalid value is below every valid one (``no_order``)."""
    if SCORE_BITS == 32:
        order = folded32(x)
    else:
        order = token_ord16(x)
    return order


@triton.constexpr_function
def no_order(score_bits):
    """``token_order`` of NaN: below every score."""
    return NO_SCORE32 if score_bits == 32 else 0


@triton.jit
def word_score(order, SCORE_BITS: tl.constexpr):
    """The ord16 a packed word holds of a ``token_order``: the order itself,
    or the top half of the fp32 order (its ord16 of the fp32 cut to bf16);
    0 for NaN either way."""
    if SCORE_BITS == 32:
        order = (order >> 16) + 0x8000
    return order


@triton.jit
def fp32_order(score, low):
    """The fp32 order (``token_order``) of a word's score and its low half
    (its 16 bits as a non-negative int): ``word_score``'s inverse
    (NO_SCORE32 for score 0 and low half 0)."""
    return ((score - 0x8000) << 16) | low


@triton.jit
def row_lows(row_ptr, N: tl.constexpr, PLANES: tl.constexpr, SCORE_BITS: tl.constexpr):
    """A packed row's low halves (``keys.low_halves``) with 32-bit scores;
    None (nothing to write) with 16-bit ones."""
    if SCORE_BITS == 32:
        lows = low_halves(row_ptr, N, PLANES)
    else:
        lows = None
    return lows


@triton.jit
def load_tokens(ptrs, inside, whole):
    """The scores at ``ptrs``, NaN where not ``inside``: when ``whole``
    (every token is inside; a constant or a run-time flag), one unmasked
    load that Triton vectorises, 16 bytes a thread instead of one token."""
    if whole:
        x = tl.load(ptrs)
    else:
        x = tl.load(ptrs, mask=inside, other=float("nan"))
    return x


@triton.jit
def row_window(row_starts_ptr, row_ends_ptr, row, width_limit):
    """(start, end): row ``row``'s valid tokens [start, end) (row starts and
    ends int32 or int64; no starts, None: 0), clamped to [0, width_limit],
    as int32."""
    end = tl.minimum(tl.maximum(tl.load(row_ends_ptr + row), 0), width_limit).to(tl.int32)
    if row_starts_ptr is None:  # compile-time: rows given no starts read none
        start = tl.zeros((), dtype=tl.int32)
    else:
        start = tl.minimum(tl.maximum(tl.load(row_starts_ptr + row), 0), end).to(tl.int32)
    return start, end


@triton.jit
def row_target(row, sat_ptr, rank, WORDS: tl.constexpr, SLOTS: tl.constexpr, LIST: tl.constexpr,
               SCORE_BITS: tl.constexpr = 16):
    """(active, offset): whether this rank selects ``row`` and the word
    offset of its output row. Round 1: every row, row by row. A pushed list
    (LIST): rows where this rank is saturated, in its slot of the receive
    buffer (``list_slot``)."""
    if LIST:
        mask, _ = load_sat(sat_ptr, row, SCORE_BITS)
        return ((mask >> rank) & 1) != 0, (row * SLOTS + list_slot(mask, rank)) * WORDS
    else:
        return True, row * WORDS


@triton.jit
def list_slot(mask, rank):
    """A saturated rank's receive slot of a row whose saturated ranks are
    ``mask``: popcount(mask & ((1 << rank) - 1)), int64."""
    slot = tl.zeros((), dtype=tl.int64)
    for q in tl.static_range(MAX_PEERS):
        slot += tl.where(q < rank, (mask >> q) & 1, 0)
    return slot


@triton.jit
def list_floor(sat_ptr, row, KAPPA_SHIFT: tl.constexpr, SCORE_BITS: tl.constexpr = 16):
    """The lowest ord16 (int32; with 32-bit scores ord32, int64) a pushed
    list of ``row`` holds: kappa's score (``format.list_floor``)."""
    _, kappa = load_sat(sat_ptr, row, SCORE_BITS)
    floor = kappa >> KAPPA_SHIFT
    if SCORE_BITS == 16:
        floor = floor.to(tl.int32)
    return floor


# ----------------------------------------------- thresholds and compaction


@triton.jit
def line_positions(flags):
    """Exclusive prefix count, in token order, of [lines, width] counts (a
    line: adjacent tokens that one thread holds): a line is summed in the
    thread, one scan runs over the lines."""
    per_line = tl.sum(flags, axis=1)
    return (tl.cumsum(per_line, axis=0) - per_line)[:, None] + tl.cumsum(flags, axis=1) - flags


@triton.jit
def _least_and_count(least, count, least_2, count_2):
    """The combine of (least score, how many hold it)."""
    low = tl.minimum(least, least_2)
    return low, tl.where(least == low, count, 0) + tl.where(least_2 == low, count_2, 0)


NEAR_SCORES = tl.constexpr(511)  # the near count's reach below the highest score (``bisected_threshold``'s NEAR)


@triton.jit
def _pairs_reaching(pairs, candidate):
    """How many of the scores held two levels to an int32 (``pairs``) are at
    or above the even ord16 ``candidate``: level + 0x8000 - candidate / 2
    sets a 16-bit field's top bit iff level >= candidate / 2, and never
    carries out of it."""
    reached = ((pairs + (0x8000 - (candidate >> 1)) * 0x10001) >> 15) & 0x10001  # bit 31 lands on 16
    fields = tl.sum(reached, axis=0)  # each field at most ROW / 2
    return (fields & 0xFFFF) + (fields >> 16)


@triton.jit
def bisected_threshold(score, need, lowest, highest, DISTINCT: tl.constexpr = False, NEAR: tl.constexpr = 0):
    """(t, above): the largest ord16 t with at least ``need`` of the ``score``s
    (any shape, 0 for invalid tokens) >= t, 0 when fewer are valid; and how
    many are above t, the count of the last bit that failed (its candidate
    was t + 1: the bits below it were all set), so that no reduction counts
    them again. One count a bit, from the top: a histogram pass
    (tl.histogram takes a warp ballot per bit of the bin, and more to
    combine them) costs several times as much. Every valid score lies in
    [``lowest``, ``highest``], and when ``lowest`` > 0 at least ``need`` are
    valid, so a bit whose answer the bounds give is not counted. The first
    fifteen compare levels (the score without its last bit: even candidates)
    two to an int32, a 16-bit field each: level + 0x8000 - c sets the
    field's top bit iff level >= c, and never carries out of it; the last
    compares whole scores. DISTINCT (scores that seldom tie, such as the
    low halves of fp32 scores that share a top half): when a count with two
    or more bits left finds exactly ``need`` scores at or above its
    candidate, t is the least of them, and one reduction (the least and how
    many hold it) ends the search; such scores part there after a few bits.
    Tied scores (bf16's) seldom part exactly: the check would cost them
    more than it saves. NEAR (``highest`` then the scores' highest): one
    count first, at the even score at most NEAR below ``highest``; where
    ``need`` reach it, it is the new ``lowest``, else ``highest`` is just
    below it (the count: how many are above that), so that the bits the
    bounds give go uncounted: with NEAR = 511, eleven counts more at most
    (the ten bits below 2^10 and one above) where the ``need`` best lie
    that near the top, as they do on most rows."""
    level = tl.reshape(score >> 1, (score.numel // 2, 2), can_reorder=True)  # counts need no order
    even, odd = tl.split(level)
    pairs = even | (odd << 16)
    score = tl.reshape(score, (score.numel,), can_reorder=True)
    threshold = tl.zeros((), dtype=tl.int32)
    above = tl.zeros((), dtype=tl.int32)  # no bit failed: none is above t
    parted = tl.zeros((), dtype=tl.int32)  # 1: exactly need scores reach ``threshold``
    above_highest = tl.zeros((), dtype=tl.int32)  # how many scores are above ``highest``
    if NEAR > 0:
        lowest, highest = tl.zeros((), dtype=tl.int32) + lowest, tl.zeros((), dtype=tl.int32) + highest  # may move
        near = tl.maximum(highest - NEAR, 0) & ~1
        if near > lowest:
            reached = _pairs_reaching(pairs, near)
            if reached >= need:
                lowest = near
            else:
                highest = near - 1
                above_highest = reached
    for bit in tl.static_range(15, -1, -1):
        if parted == 0:
            candidate = threshold | (1 << bit)
            if candidate <= lowest:
                threshold = candidate
            elif candidate <= highest:
                if bit > 0:
                    reached = _pairs_reaching(pairs, candidate)
                else:
                    reached = tl.sum((score >= candidate).to(tl.int32), axis=0)
                if reached >= need:
                    threshold = candidate
                    if DISTINCT and bit >= 2:
                        parted = (reached == need).to(tl.int32)
                else:
                    above = reached
            else:
                # No score reaches the candidate but those above the highest,
                # and unless it is highest + 1 a later bit fails: t + 1 is
                # the last failed candidate, and t <= highest.
                above = above_highest
    if DISTINCT and parted != 0:
        reaching = score >= threshold
        threshold, ties = tl.reduce((tl.where(reaching, score, 0x10000), reaching.to(tl.int32)), 0,
                                    _least_and_count)
        above = need - ties
    return threshold, above


@triton.jit
def row_threshold(score, need, lowest):
    """``bisected_threshold`` of a whole row's ord16 ``score`` (any shape),
    bounded by its highest score and the near count (NEAR_SCORES): one
    reduction and one count that spare most rows five or more of the
    sixteen counts."""
    return bisected_threshold(score, need, lowest, tl.max(score), NEAR=NEAR_SCORES)


@triton.jit
def bisected_threshold32(order, order2, need, lowest, highest=0xFFFF, NEAR: tl.constexpr = 0):
    """``bisected_threshold`` of 32-bit scores (``keys.folded32``; NO_SCORE32
    for invalid tokens), held as two tensors of one shape: (t, above), the
    largest order t with at least ``need`` orders >= t (NO_SCORE32 when
    fewer are valid: every valid one is above it) and how many are above
    it. ``bisected_threshold``'s counts on the top halves (an ord16 each;
    ``lowest``: a folded order every valid token reaches, with at least
    ``need`` valid when it is above NO_SCORE32; ``highest``: an ord16 no
    top half passes, with NEAR the highest top half), then on the low
    halves of the tokens in the boundary's top half."""
    top = tl.join(word_score(order, 32), word_score(order2, 32))  # ord16 of the fp32 cut to bf16, 0 for NaN
    top_t, above = bisected_threshold(top, need, word_score(lowest, 32), highest, NEAR=NEAR)
    threshold = tl.full((), NO_SCORE32, tl.int32)
    if top_t != 0:
        # A low half of 0 is counted as if invalid, as a threshold of 0 needs.
        low = tl.join(order & 0xFFFF, order2 & 0xFFFF)
        low_t, low_above = bisected_threshold(tl.where(top == top_t, low, 0), need - above, 0, 0xFFFF, True)
        threshold = fp32_order(top_t, low_t)
        above += low_above
    return threshold, above


@triton.jit
def row_threshold32(order, order2, need, lowest):
    """``row_threshold`` of a row of 32-bit scores held in two parts
    (``bisected_threshold32``): the near count on the top halves, below
    the highest."""
    highest = word_score(tl.maximum(tl.max(order), tl.max(order2)), 32)
    return bisected_threshold32(order, order2, need, lowest, highest, NEAR_SCORES)


@triton.jit
def above_and_ties(score, threshold):
    """Per token (ord16 ``score``, 0 if invalid), two counts in one int32:
    1 if above ``threshold``, 1 << 16 if tied with it (none for threshold 0:
    every valid token is above it)."""
    return (score > threshold).to(tl.int32) | (((score == threshold) & (threshold != 0)).to(tl.int32) << 16)


@triton.jit
def above_and_ties32(order, threshold):
    """``above_and_ties`` of 32-bit scores against ``bisected_threshold32``'s
    threshold (none for NO_SCORE32: every valid token is above it)."""
    tie = (order == threshold) & (threshold != NO_SCORE32)
    return (order > threshold).to(tl.int32) | (tie.to(tl.int32) << 16)


@triton.jit
def kept_slots(counts, before, threshold, above, N: tl.constexpr):
    """(slot, keep, kept): where each token goes in the packed row and
    whether it is kept, and how many are, from ``above_and_ties`` per token
    (at most 2^15 - 1 tokens), their exclusive scan in token order, the
    threshold and how many are above it (``bisected_threshold``). Every
    token above the threshold is kept, and its ties, lowest id first, up to
    N in all: at least N are at or above a threshold > 0."""
    ties_before = before >> 16
    ties_taken = tl.where(threshold > 0, N - above, 0)
    keep = ((counts & 0xFFFF) != 0) | ((counts > 0xFFFF) & (ties_before < ties_taken))
    return (before & 0xFFFF) + tl.minimum(ties_before, ties_taken), keep, above + ties_taken


@triton.jit
def kept_of_row(score, threshold, above, N: tl.constexpr):
    """(slot, keep, kept) of a row held as [lines, line] ``score``s (0 for
    invalid tokens) whose ``bisected_threshold`` is (threshold, above): one
    scan in token order of ``above_and_ties`` places the kept tokens
    (``kept_slots``)."""
    counts = above_and_ties(score, threshold)
    return kept_slots(counts, line_positions(counts), threshold, above, N)


@triton.jit
def store_words(out_row, pos, order, local, keep, N: tl.constexpr, PLANES: tl.constexpr, lows=None):
    """The kept tokens' words into slots ``pos`` of a zeroed packed row, and
    their id bits above 16 into the planes (tokens written by different
    threads, or programs, may share a plane word). ``order``: ord16, or
    with ``lows`` (where the low halves go: int16 in a packed row, int32 in
    the pack's scratch) the fp32 order
    (``token_order``)."""
    if lows is None:
        score = order
    else:
        score = word_score(order, 32)
        tl.store(lows + pos, order.to(tl.int16), mask=keep)
    tl.store(out_row + pos, packed_word(score, local), mask=keep)
    for p in tl.static_range(PLANES):
        bit = (local >> (16 + p)) & 1
        tl.atomic_or(out_row + N + p * (N // 32) + pos // 32, bit << (pos % 32), mask=keep & (bit != 0),
                     sem="relaxed")


@triton.jit
def zero_row_from(out_row, first, WORDS: tl.constexpr, CHUNK: tl.constexpr):
    """Zeros into elements [first, WORDS) of ``out_row`` (words of a packed
    row, or its low halves)."""
    for start in tl.range(0, WORDS, CHUNK):
        offs = start + tl.arange(0, CHUNK)
        tl.store(out_row + offs, tl.zeros((CHUNK,), dtype=out_row.dtype.element_ty),
                 mask=(offs >= first) & (offs < WORDS))


@triton.jit
def trim_list(out_row, floor, N: tl.constexpr, PLANES: tl.constexpr, lows=None):
    """Drops the words of a finished packed row (N candidates, PLANES
    planes) whose ord16 is below ``floor``, the others compacted in order:
    the top-N of the whole row becomes the top-N of its tokens at or above
    the floor (every one of those is in it when fewer than N are). With
    ``lows`` (the row's low halves, 32-bit scores) the floor is an ord32
    (int64) and the low halves move with their words."""
    tl.debug_barrier()  # the whole row is written before any thread reads it
    slot = tl.arange(0, power_of_2(N))
    inside = slot < N
    word = tl.load(out_row + slot, mask=inside, other=0, cache_modifier=".cg")  # from L2: other programs wrote it
    score = (word >> LOW_BITS) & 0xFFFF
    if lows is None:
        keep = (word != 0) & (score >= floor)
    else:
        low = tl.load(lows + slot, mask=inside, other=0, cache_modifier=".cg")
        keep = (word != 0) & (((score.to(tl.int64) << 16) | (low.to(tl.int64) & 0xFFFF)) >= floor)
    kept = tl.sum(keep.to(tl.int32), axis=0)
    if kept < tl.sum((word != 0).to(tl.int32), axis=0):
        pos = tl.cumsum(keep.to(tl.int32), axis=0) - keep.to(tl.int32)
        high = tl.zeros_like(word)  # the local id's bits above 16, plane p at bit p
        for p in tl.static_range(PLANES):
            plane = tl.load(out_row + N + p * (N // 32) + slot // 32, mask=inside, other=0, cache_modifier=".cg")
            high |= ((plane >> (slot % 32)) & 1) << p
        tl.debug_barrier()  # every thread has read the row
        tl.store(out_row + pos, word, mask=keep)  # kept words land at or before their slot
        tl.store(out_row + slot, tl.zeros_like(word), mask=inside & (slot >= kept))
        if lows is not None:
            tl.store(lows + pos, low, mask=keep)
            tl.store(lows + slot, tl.zeros_like(low), mask=inside & (slot >= kept))
        for p in tl.static_range(PLANES):
            tl.store(out_row + N + p * (N // 32) + slot, tl.zeros_like(word), mask=slot < N // 32)
        tl.debug_barrier()  # the planes are zero before their bits are set again
        for p in tl.static_range(PLANES):
            bit = (high >> p) & 1
            tl.atomic_or(out_row + N + p * (N // 32) + pos // 32, bit << (pos % 32), mask=keep & (bit != 0),
                         sem="relaxed")


# -------------------------------------------------------------- publishing


@triton.jit
def publish_row(out_ptr, offset, row, peers, rank, WORDS: tl.constexpr, WORLD: tl.constexpr, LIST: tl.constexpr,
                LIBRARY_PEERS: tl.constexpr):
    """A finished row to every peer, then its flag raised there (WORLD > 0):
    round 1's into the gather buffers, a pushed list into the receive
    slots. Without peers (the pack alone) nothing. ``peers``: as the
    kernels take them."""
    if WORLD > 0:
        _, epochs_ptr, peer_ptrs, flag_ptrs, pes_ptr, max_rows = peers
        # Loaded before the barrier: their latency overlaps it and the
        # row's reload, and the release does not wait for them.
        epoch = call_epoch(epochs_ptr, row)
        flags = peer_flags(flag_ptrs, WORLD, LIBRARY_PEERS)
        tl.debug_barrier()  # the whole row, plane bits included, is written before any thread reads it
        if LIST:
            push_list(out_ptr + offset, offset, row, rank, epoch, peer_ptrs, flag_ptrs, flags, pes_ptr, max_rows,
                      WORDS, WORLD, LIBRARY_PEERS, 1024)
        else:
            push_row(out_ptr + offset, row, epoch, peer_ptrs, flags, max_rows, rank, WORDS, WORLD, 1024)

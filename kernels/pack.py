"""Local top-n: a rank's n best tokens of each row, by (score desc, local id
asc), written as a packed row (candidates by ascending local id, empty slots
last). The same kernels serve the pack (n = N, round 1) and a saturated
rank's pushed list (n = K, after the select), and cost about the same whatever
the scores.

A call at most SHORT_ROWS tokens wide (a 128K context over 8 ranks) takes
one kernel, a program per row (``row_kernel``): the row in registers, its
threshold from sixteen counts, one a bit, then one ordered compaction.

Wider calls take a pipeline of five kernels in which only the estimate is
a program per row, and it reads a sample; every step that reads the row is
spread over its blocks of BLOCK tokens, so no program walks a row:

1. estimate (a program per row): the row's n-th score is expected at rank r
   of a sample of groups of 8 adjacent tokens spread over the row. The
   ``floor`` is the sample's score at rank r_lo, four standard deviations of
   r further down, the ``probe`` its score at rank r; when many sampled
   tokens tie on the floor's score, that score is the probe and the floor
   moves above it. A row of at most ROOM tokens needs no estimate: every
   valid token is a candidate. Zeroes the output row.
2. filter (a program per block): each block counts its valid tokens, those
   >= floor (the candidates), >= probe and > probe, and writes its
   candidates' words, in order, to its region of the scratch.
3. finish (a program per span of up to MAX_SPAN blocks) settles each row from the
   counts summed over its blocks, the same way in every program:
   - listed: n <= candidates <= ROOM, or every valid token is one. The first
     span's program selects from them in registers, a count a bit.
   - exact: the probe is the threshold (fewer than n above it, n at or
     above it), or every valid token is taken. Each block with tokens to
     keep writes them at its place in the row, from the earlier counts:
     copied from its region when they are its candidates, else re-read.
   - radix: neither (the sample misled). Each span histograms the high byte
     of its scores.
4. radix_low (radix rows only): each span histograms the low byte of its
   scores in the high byte's boundary bucket.
5. radix_write (radix rows only): the threshold is exact; each span writes
   its kept tokens.
A row that several spans write is published (pushed to every peer, its flag
raised) by the last span to finish it. Whatever the path, the output is
``reference.pack``'s, bit for bit: the estimate decides how much work is
done, never what is written."""

import math
from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from .exchange import call_epoch, push_list, push_row
from .keys import (MAX_PEERS, MIN_VALID, NEAR_BINS, SAT_MASK_SHIFT, score16_bits, is_nan_bits, near_bin, ord16,
                   packed_word, radix_boundary, score_bits)
from .launch import Launch
from .sync import after_prior_kernel, last_to_arrive

BLOCK = tl.constexpr(4096)  # tokens a filter program reads; a power of two up to 2^16 (words carry 16 id bits)
FILTER_WARPS = 4
SPANS = 8  # finish and radix programs per row, about: each covers a span of 1 to MAX_SPAN blocks
MAX_SPAN = 4
SPAN_WARPS = 8
ESTIMATE_WARPS = 8
MAX_GROUPS = 512  # the estimate samples at most 8 * MAX_GROUPS tokens
SAMPLE_RANK = tl.constexpr(256)  # the sample is sized to hold about this many of the row's top-n
MAX_ROOM = 8192  # candidates the finish holds in registers (16 a thread at its widest)
SHORT_ROWS = 16384  # calls this wide or narrower: a program a row (``row_kernel``); at most 2^14 (its scan)
ROW_WARPS = 16  # 32 tokens a thread: the merge's fastest on the H200 (docs/performance.md)
SIGMAS = tl.constexpr(4)  # the estimate's margin, in standard deviations of the sample's count

# Scratch of a row (int32): the estimate's floor and probe and the row's
# settling, then per block its four counts, per span its two histograms
# (radix rows), and per block its region (candidate words).
FLOOR, PROBE, MODE, HEADER = tl.constexpr(0), tl.constexpr(1), tl.constexpr(2), tl.constexpr(4)
COUNT_FIELDS = tl.constexpr(4)  # valid tokens, candidates, >= probe, > probe
LISTED, EXACT, RADIX = tl.constexpr(0), tl.constexpr(1), tl.constexpr(2)  # how a row is settled


@dataclass(frozen=True)
class Plan:
    """The compile-time shape of one pipeline: n selected from rows of up to
    ``max_local_len`` tokens. ``room``: the most candidates a row is
    selected from (held in registers at once); ``groups``: most groups of 8
    the estimate samples; ``blocks_p2``: blocks of the longest row, rounded
    up to a power of two (spans too)."""

    n: int
    room: int
    groups: int
    blocks_p2: int

    @property
    def span(self) -> int:
        """Blocks a finish or radix program covers: about SPANS programs a
        row, so that an exact row's writes are spread even when it is short."""
        return min(MAX_SPAN, max(1, self.blocks_p2 // SPANS))

    @property
    def region(self) -> int:
        return min(BLOCK.value, self.room)

    @property
    def histograms_at(self) -> int:
        """Where a row's per-span histogram pairs (2 x 256 words) start."""
        return HEADER.value + self.blocks_p2 * COUNT_FIELDS.value

    @property
    def regions_at(self) -> int:
        """Where a row's per-block candidate regions (``region`` words) start."""
        return self.histograms_at + self.blocks_p2 * 512

    @property
    def scratch_words(self) -> int:
        return self.regions_at + self.blocks_p2 * self.region


def _margin(rank: float) -> float:
    """The sample rank of the floor: SIGMAS standard deviations (the variance
    doubled, for tokens that come in correlated groups) below ``rank``, as
    the estimate computes it."""
    return rank + SIGMAS.value * math.sqrt(2 * rank) + SIGMAS.value


def expected_candidates(n: int, rank: float) -> float:
    """A row's candidates, SIGMAS standard deviations above their expected
    count n r_lo / r (the sample's r_lo-th score standing for the n-th)."""
    floor_rank = _margin(rank)
    return n * (floor_rank + SIGMAS.value * math.sqrt(floor_rank)) / rank


def plan(n: int, max_local_len: int) -> Plan:
    """Enough groups that about SAMPLE_RANK sampled tokens fall in the
    longest row's top-n (at most MAX_GROUPS), and room for twice its
    candidates with four standard deviations to spare: a row's count of them
    is about n r_lo / r, the sample's r_lo-th score standing for the n-th."""
    groups = min(MAX_GROUPS, max(64, triton.next_power_of_2(math.ceil(SAMPLE_RANK.value * max_local_len / (8 * n)))))
    rank = max(1.0, min(SAMPLE_RANK.value, n * 8 * groups / max_local_len))
    room = min(max(512, 2 * triton.next_power_of_2(math.ceil(expected_candidates(n, rank)))), MAX_ROOM)
    blocks_p2 = triton.next_power_of_2(triton.cdiv(max_local_len, BLOCK.value))
    return Plan(n=n, room=room, groups=groups, blocks_p2=blocks_p2)


# Kernels that take the call's row width never specialise on it (Triton
# would on its divisibility), so that one variant serves every width.
_any_width = triton.jit(do_not_specialize=["width_limit"])


# ------------------------------------------------------------------ scores


@triton.jit
def _order(x):
    """ord16 of the scores ``x`` (bf16 or fp16, or fp32 rounded to bf16), 0
    for NaN: below every valid score."""
    bits = score16_bits(x)
    return tl.where(is_nan_bits(bits), 0, ord16(bits))


@triton.jit
def _load_tokens(ptrs, inside, WHOLE: tl.constexpr):
    """The scores at ``ptrs``, NaN where not ``inside`` (all are when WHOLE,
    so that the load is unmasked and vectorised)."""
    if WHOLE:
        x = tl.load(ptrs)
    else:
        x = tl.load(ptrs, mask=inside, other=float("nan"))
    return x


@triton.jit
def _block_tokens(logits_ptr, row, logits_stride, block, window):
    """(scores, local ids) of a block, as [BLOCK / 8, 8], NaN outside the
    row's valid tokens ``window`` = (start, end): a thread loads 8 adjacent
    tokens at once (16 bytes of bf16), unmasked when the block is wholly
    inside."""
    start, end = window
    local = block * BLOCK + tl.arange(0, BLOCK // 8)[:, None] * 8 + tl.arange(0, 8)[None, :]
    ptrs = logits_ptr + row * logits_stride + local
    if (block * BLOCK >= start) & ((block + 1) * BLOCK <= end):
        x = _load_tokens(ptrs, local < end, True)
    else:
        x = _load_tokens(ptrs, (local >= start) & (local < end), False)
    return x, local


@triton.jit
def _row_window(row_starts_ptr, row_ends_ptr, row, width_limit):
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
def _target(row, sat_ptr, rank, WORDS: tl.constexpr, SLOTS: tl.constexpr, LIST: tl.constexpr):
    """(active, offset): whether this rank selects ``row`` and the word
    offset of its output row. Round 1: every row, row by row. A pushed list
    (LIST): rows where this rank is saturated, in its slot of the receive
    buffer, popcount(mask & ((1 << rank) - 1))."""
    if LIST:
        mask = tl.load(sat_ptr + row) >> SAT_MASK_SHIFT
        slot = tl.zeros((), dtype=tl.int64)
        for q in tl.static_range(MAX_PEERS):
            slot += tl.where(q < rank, (mask >> q) & 1, 0)
        return ((mask >> rank) & 1) != 0, (row * SLOTS + slot) * WORDS
    else:
        return True, row * WORDS


@triton.jit
def _span_target(sat_ptr, rank, WORDS: tl.constexpr, SLOTS: tl.constexpr, LIST: tl.constexpr):
    """(span, row, spans, active, offset) of a program of a [spans, rows]
    grid (``_target`` gives the last two)."""
    row = tl.program_id(1).to(tl.int64)
    active, offset = _target(row, sat_ptr, rank, WORDS, SLOTS, LIST)
    return tl.program_id(0), row, tl.num_programs(0), active, offset


# -------------------------------------------------- thresholds in registers


@triton.jit
def _histogram(score, counted, high_byte, SELECT_LOW: tl.constexpr):
    """256-bin histogram of the high byte of the counted scores (or, with
    SELECT_LOW, of the low byte of those whose high byte is ``high_byte``)."""
    if SELECT_LOW:
        counted = counted & ((score >> 8) == high_byte)
        digit = score & 0xFF
    else:
        digit = score >> 8
    return tl.histogram(digit, 256, mask=counted)


@triton.jit
def _store_words(out_row, pos, score, local, keep, N: tl.constexpr, PLANES: tl.constexpr):
    """The kept tokens' words into slots ``pos`` of a zeroed packed row, and
    their id bits above 16 into the planes (tokens written by different
    threads, or programs, may share a plane word)."""
    tl.store(out_row + pos, packed_word(score, local), mask=keep)
    for p in tl.static_range(PLANES):
        bit = (local >> (16 + p)) & 1
        tl.atomic_or(out_row + N + p * (N // 32) + pos // 32, bit << (pos % 32), mask=keep & (bit != 0),
                     sem="relaxed")




@triton.jit
def _above_and_ties(score, threshold):
    """Per token (ord16 ``score``, 0 if invalid), two counts in one int32:
    1 if above ``threshold``, 1 << 16 if tied with it (none for threshold 0:
    every valid token is above it)."""
    return (score > threshold).to(tl.int32) | (((score == threshold) & (threshold != 0)).to(tl.int32) << 16)


@triton.jit
def _kept_slots(counts, before, totals, N: tl.constexpr):
    """(slot, keep, kept): where each token goes in the packed row and
    whether it is kept, and how many are, from ``_above_and_ties`` per token
    (at most 2^15 - 1 tokens), their exclusive scan in token order and
    their totals. Every token above the threshold is kept, and its ties,
    lowest id first, up to N in all."""
    ties_before = before >> 16
    ties_taken = tl.minimum(N - (totals & 0xFFFF), totals >> 16)
    keep = ((counts & 0xFFFF) != 0) | ((counts > 0xFFFF) & (ties_before < ties_taken))
    return (before & 0xFFFF) + tl.minimum(ties_before, ties_taken), keep, (totals & 0xFFFF) + ties_taken


@triton.jit
def _zero_row_from(out_row, first, WORDS: tl.constexpr, CHUNK: tl.constexpr):
    """Zeros into words [first, WORDS) of a packed row."""
    for start in tl.range(0, WORDS, CHUNK):
        offs = start + tl.arange(0, CHUNK)
        tl.store(out_row + offs, tl.zeros((CHUNK,), dtype=tl.int32), mask=(offs >= first) & (offs < WORDS))


# ----------------------------------------------------------------- estimate


@triton.jit
def _sampled_estimate(in_row, start, end, N: tl.constexpr, GROUPS: tl.constexpr):
    """(probe, floor) of a row's valid tokens [start, end), from groups of 8
    adjacent tokens spread evenly over them (from ``start`` rounded down to
    8, so that every group is 16-byte aligned; tokens before it count
    nothing), enough that about SAMPLE_RANK sampled tokens are
    expected in its top N (at most GROUPS). The row's N-th score is expected
    at rank r of the sample; the floor is the lowest score of the bin that
    holds rank r_lo = r + 4 sqrt(2 r) + 4 (four standard deviations, the
    variance doubled for tokens that come in correlated groups). The sample
    is ranked by one histogram of each score's level below the top level,
    levels of 2 scores; of 32, then 512, only when rank r_lo falls past
    NEAR_BINS - 1 levels (heavy tails, a few outliers, a tie far below a few
    scores). When the floor's bin's highest score, or the one just below it,
    holds more sampled tokens than r_lo + 16 (ties: few levels, zeros,
    masked tails), it is the probe and the floor moves above it; otherwise
    the probe is the r-th score where more than 8 sampled tokens share its
    level, else none."""
    base = start // 8 * 8
    length = end - base
    groups = tl.minimum((SAMPLE_RANK * length + 8 * N - 1) // (8 * N), tl.minimum(length // 8, GROUPS))
    g = tl.arange(0, GROUPS)
    # Groups past ``groups`` re-read the last one (every 16-byte load stays
    # inside the row, unmasked) and count nothing.
    first = base + (tl.minimum(g, groups - 1).to(tl.int64) * length) // groups // 8 * 8
    local = first[:, None] + tl.arange(0, 8)[None, :]
    score = _order(tl.load(in_row + local))
    score = tl.reshape(tl.where((g < groups)[:, None] & (local >= start), score, 0), (GROUPS * 8,),
                       can_reorder=True)
    valid = score != 0
    r = tl.maximum((N * 8 * groups + length - 1) // length, 1).to(tl.int32)
    r_lo = r + tl.ceil(tl.sqrt(2.0 * r.to(tl.float32)) * SIGMAS).to(tl.int32) + SIGMAS
    top = tl.max(tl.where(valid, score >> 1, 0), axis=0)
    hist = tl.histogram(near_bin(top, score >> 1), NEAR_BINS, mask=valid)
    bucket, above, in_level = radix_boundary(hist, r)
    low_bucket, _, _ = radix_boundary(hist, r_lo)  # the same histogram ranks both: not near_boundary
    shift = tl.full((), 1, tl.int32)
    low_top = top
    for coarser in tl.static_range(2):
        if low_bucket == 0:
            shift += 4
            low_top = top >> (shift - 1)  # the top level's group: shifts keep the maximum
            low_bucket, _, _ = radix_boundary(tl.histogram(near_bin(low_top, score >> shift), NEAR_BINS, mask=valid),
                                              r_lo)
    floor_level = low_top - (NEAR_BINS - 1) + low_bucket
    most = tl.max(tl.where(valid & ((score >> shift) == floor_level), score, 0), axis=0)
    upper = (top - (NEAR_BINS - 1) + bucket) * 2 + 1
    counts = tl.sum((valid & (score == upper)).to(tl.int64) | ((valid & (score == most)).to(tl.int64) << 16)
                    | ((valid & (score == most - 1)).to(tl.int64) << 32), axis=0)
    probe = tl.where(r - above <= (counts & 0xFFFF).to(tl.int32), upper, upper - 1)
    probe = tl.where((bucket > 0) & (in_level > 8), probe, 0)
    floor = tl.where(low_bucket >= 0, floor_level << shift, 0)
    at_most = ((counts >> 16) & 0xFFFF).to(tl.int32)
    below_most = (counts >> 32).to(tl.int32)
    if (low_bucket >= 0) & (tl.maximum(at_most, below_most) > r_lo + 16):
        probe = tl.where(at_most >= below_most, most, most - 1)
        floor = (probe + 2) & ~1  # even: the pairs compare levels
    return probe, floor


@_any_width
def estimate_kernel(out_ptr, scratch_ptr, rows, width_limit, N: tl.constexpr, WORDS: tl.constexpr, SLOTS: tl.constexpr,
                    LIST: tl.constexpr, GROUPS: tl.constexpr, ROOM: tl.constexpr, PDL: tl.constexpr):
    """The row's floor and probe into its scratch; its output row zeroed.
    ``rows``: (logits_ptr, row_starts_ptr, row_ends_ptr, sat_ptr,
    logits_stride, scratch_stride, rank; row_starts_ptr may be None) and
    ``width_limit`` (the call's width, at most max_local_len), the same in
    every kernel of the pipeline."""
    logits_ptr, row_starts_ptr, row_ends_ptr, sat_ptr, logits_stride, scratch_stride, rank = rows
    after_prior_kernel(PDL)
    row = tl.program_id(0).to(tl.int64)
    active, offset = _target(row, sat_ptr, rank, WORDS, SLOTS, LIST)
    if active:
        _zero_row_from(out_ptr + offset, 0, WORDS, 1024)
        scratch = scratch_ptr + row * scratch_stride
        start, end = _row_window(row_starts_ptr, row_ends_ptr, row, width_limit)
        probe = tl.zeros((), dtype=tl.int32)
        floor = tl.zeros((), dtype=tl.int32)
        if end - start > ROOM:  # fewer: every valid token is a candidate
            probe, floor = _sampled_estimate(logits_ptr + row * logits_stride, start, end, N, GROUPS)
        tl.store(scratch + FLOOR, tl.maximum(floor, MIN_VALID))
        tl.store(scratch + PROBE, probe)


# ------------------------------------------------------------------- filter


@triton.jit
def _score_floor(floor):
    """The float f with {non-NaN x : x >= f} = {x : ord16(x) >= floor}, up
    to a monotone widening that keeps it a threshold set (-0 >= +0 is true,
    and a NaN pattern widens to an infinity): all the candidates need."""
    bits = tl.where(floor >= 0x8000, floor & 0x7FFF, ~floor & 0xFFFF)
    f = (bits << 16).to(tl.float32, bitcast=True)
    return tl.where(is_nan_bits(bits), tl.where(floor >= 0x8000, float("inf"), float("-inf")), f)


@triton.jit
def _line_positions(flags):
    """Exclusive prefix count, in token order, of [lines, 8] counts (a
    line: 8 adjacent tokens): a thread's 8 tokens are summed in place, one
    scan runs over the lines."""
    per_line = tl.sum(flags, axis=1)
    return (tl.cumsum(per_line, axis=0) - per_line)[:, None] + tl.cumsum(flags, axis=1) - flags


@triton.jit
def _filter_block(scratch, x, local, block, REGION: tl.constexpr, REGIONS_AT: tl.constexpr):
    """The block's counts, and its first REGION candidates' words in order.
    bf16 is compared as a float with the floor (a few instructions a token:
    candidates need only be a threshold set that holds the top-n), the
    probe exactly as ord16 through the sign-folded integer of the bits, and
    only when there is one."""
    if x.dtype == tl.bfloat16:
        # Widened on the bits (a bf16 is the high half of its fp32): exact for
        # subnormals too, which the interpreter's bf16 conversion is not.
        half = x.to(tl.int16, bitcast=True).to(tl.int32)
        wide = (half << 16).to(tl.float32, bitcast=True)
        valid = wide == wide
        candidate = wide >= _score_floor(tl.load(scratch + FLOOR))
    else:
        bits = score16_bits(x)
        half = tl.where(bits >= 0x8000, bits - 0x10000, bits)  # as int16, sign extended
        valid = ~is_nan_bits(bits)
        candidate = valid & (ord16(bits) >= tl.load(scratch + FLOOR))
    folded = half ^ ((half >> 15) & 0x7FFF)  # ord16 - 0x8000 for valid scores
    flag = candidate.to(tl.int32)
    pos = _line_positions(flag)
    tl.store(scratch + REGIONS_AT + block * REGION + pos,
             packed_word(folded + 0x8000, local), mask=candidate & (pos < REGION))
    first = tl.sum(tl.sum(valid.to(tl.int32) | (flag << 16), axis=1), axis=0)  # two counts a sum (each < 2^16)
    counts = scratch + HEADER + block * COUNT_FIELDS
    tl.store(counts, first & 0xFFFF)
    tl.store(counts + 1, first >> 16)
    probe = tl.load(scratch + PROBE)
    second = tl.zeros((), dtype=tl.int32)
    if probe != 0:
        reach = valid & (folded >= probe - 0x8000)
        above = valid & (folded > probe - 0x8000)
        second = tl.sum(tl.sum(reach.to(tl.int32) | (above.to(tl.int32) << 16), axis=1), axis=0)
    tl.store(counts + 2, second & 0xFFFF)
    tl.store(counts + 3, second >> 16)


@triton.jit
def _pair_orders(pair):
    """ord16 of both tokens of int32 pairs of bf16 bits (the even token in
    the low half), in place: each half xor 0xFFFF when negative, else xor
    0x8000 (NaN patterns land above +inf or below -inf)."""
    return pair ^ (((pair >> 15) & 0x10001) * 0x7FFF) ^ -0x7FFF8000  # -0x7FFF8000: 0x80008000


HALF = tl.constexpr(BLOCK.value // 2)  # tokens a filter program filters at once (its registers scale with it)


@triton.jit
def _half_pairs(row_ptr, block, half, start, end):
    """(int32 pairs of tokens, their word ids) of half a block of a bf16
    row, as [HALF / 8, 4]: a thread loads 4 words (8 adjacent tokens) at
    once; NaN outside the valid tokens [start, end). A row that ends inside
    a pair has its last token read alone, so that nothing past it is read
    (a pair that starts before ``start`` is read whole: it lies inside the
    row). Needs an even row stride and a 4-byte aligned base."""
    w = block * (BLOCK // 2) + half * (HALF // 2) + tl.arange(0, HALF // 8)[:, None] * 4 + tl.arange(0, 4)[None, :]
    ptrs = row_ptr.to(tl.pointer_type(tl.int32)) + w
    if (block * BLOCK >= start) & ((block + 1) * BLOCK <= end):
        pair = tl.load(ptrs)
    else:
        pair = tl.load(ptrs, mask=(2 * w + 1 < end) & (2 * w + 1 >= start), other=0x7FC07FC0)
        lone = tl.load(row_ptr + 2 * w, mask=(2 * w + 1 == end) & (2 * w >= start),
                       other=float("nan")).to(tl.int16, bitcast=True).to(tl.int32)
        pair = tl.where(2 * w + 1 == end, (lone & 0xFFFF) | 0x7FC00000, pair)
        pair = tl.where(2 * w < start, (pair & -0x10000) | 0x7FC0, pair)  # the low half, the even token: before start
    return pair, w


@triton.jit
def _block_pairs(row_ptr, block, window):
    """Both halves of a block (``_half_pairs``), loaded at once; ``window``:
    the row's valid tokens (start, end)."""
    start, end = window
    pair_0, w_0 = _half_pairs(row_ptr, block, 0, start, end)
    pair_1, w_1 = _half_pairs(row_ptr, block, 1, start, end)
    return pair_0, w_0, pair_1, w_1


@triton.jit
def _filter_half(region, pair, w, kept, level_floor, probe, REGION: tl.constexpr):
    """One half block of ``_filter_pairs``: its candidates' words from slot
    ``kept`` of the region; returns (kept, first counts, second counts)
    with the half's added. Both tokens of a word at once: its two ord16
    (``_pair_orders``); a half is NaN iff its magnitude bits pass 0x7F80
    (adding 0x7F sets the half's top bit, and never carries out of it); a
    candidate iff its level (ord16 >> 1) reaches the floor's, in the same
    way (``level_floor``: (0x8000 - (floor >> 1)) in each half)."""
    order = _pair_orders(pair)
    nan = (pair & 0x7FFF7FFF) + 0x007F007F
    take = (((order >> 1) & 0x7FFF7FFF) + level_floor) & ~nan & -0x7FFF8000  # bits 15, 31: even, odd taken
    take_even = (take >> 15) & 1
    taken = take_even + ((take >> 31) & 1)
    valid = 2 - ((nan >> 15) & 1) - ((nan >> 31) & 1)
    first = tl.sum(tl.sum(valid | (taken << 16), axis=1), axis=0)  # two counts a sum (each < 2^16)
    pos = kept + _line_positions(taken)
    keep_even = take_even != 0
    keep_odd = take < 0
    if REGION < BLOCK:  # a block with more candidates than its region keeps its first
        keep_even = keep_even & (pos < REGION)
        keep_odd = keep_odd & (pos + take_even < REGION)
    id_even = 0xFFFF - ((2 * w) & 0xFFFF)
    tl.store(region + pos, (order << 16) | id_even, mask=keep_even)
    tl.store(region + pos + take_even, (order & -0x10000) | (id_even - 1), mask=keep_odd)
    second = tl.zeros((), dtype=tl.int32)
    if probe != 0:
        # each token's ord16; NaN: 0, never counted
        score_even = tl.where((nan & 0x8000) == 0, order & 0xFFFF, 0)
        score_odd = tl.where((nan & -0x80000000) == 0, (order >> 16) & 0xFFFF, 0)
        reach = (score_even >= probe).to(tl.int32) + (score_odd >= probe).to(tl.int32)
        above = (score_even > probe).to(tl.int32) + (score_odd > probe).to(tl.int32)
        second = tl.sum(tl.sum(reach | (above << 16), axis=1), axis=0)
    return kept + (first >> 16), first, second


@triton.jit
def _filter_pairs(scratch, pairs, block, REGION: tl.constexpr, REGIONS_AT: tl.constexpr):
    """``_filter_block`` over a block of bf16 read as int32 pairs of tokens
    (``_half_pairs``), both tokens of a word at once (``_filter_half``), the
    scans over pairs, half a block at a time (each half loaded before either
    is filtered). The floor is compared on levels: the candidates are the
    valid tokens of ord16 >= floor rounded down to even (the estimate's
    floors are even but for MIN_VALID, and every valid token reaches that)."""
    first_pair, first_w, second_pair, second_w = pairs
    level_floor = (0x8000 - (tl.load(scratch + FLOOR) >> 1)) * 0x10001
    probe = tl.load(scratch + PROBE)
    region = scratch + REGIONS_AT + block * REGION
    kept, first, second = _filter_half(region, first_pair, first_w, 0, level_floor, probe, REGION)
    kept, first_2, second_2 = _filter_half(region, second_pair, second_w, kept, level_floor, probe, REGION)
    first += first_2
    second += second_2
    counts = scratch + HEADER + block * COUNT_FIELDS
    tl.store(counts, first & 0xFFFF)
    tl.store(counts + 1, first >> 16)
    tl.store(counts + 2, second & 0xFFFF)
    tl.store(counts + 3, second >> 16)


@_any_width
def filter_kernel(scratch_ptr, rows, width_limit, REGION: tl.constexpr, REGIONS_AT: tl.constexpr, LIST: tl.constexpr,
                  PAIRS: tl.constexpr, PDL: tl.constexpr):
    """One read of the block: its counts and its candidates' words, in
    order, to its region (the first REGION of them: a block with more has
    more candidates than any row that is settled from them). PAIRS: bf16
    rows read two tokens a word (``_filter_pairs``)."""
    logits_ptr, row_starts_ptr, row_ends_ptr, sat_ptr, logits_stride, scratch_stride, rank = rows
    block = tl.program_id(0)
    row = tl.program_id(1).to(tl.int64)
    scratch = scratch_ptr + row * scratch_stride
    window = _row_window(row_starts_ptr, row_ends_ptr, row, width_limit)
    if LIST:  # only the saturated rows, known once the select has run
        after_prior_kernel(PDL)
        if _target(row, sat_ptr, rank, 1, 1, LIST)[0]:
            if PAIRS:
                _filter_pairs(scratch, _block_pairs(logits_ptr + row * logits_stride, block, window), block, REGION,
                              REGIONS_AT)
            else:
                x, local = _block_tokens(logits_ptr, row, logits_stride, block, window)
                _filter_block(scratch, x, local, block, REGION, REGIONS_AT)
    elif PAIRS:
        # The logits and row ends were written before the estimate, which
        # waited for them before this kernel could launch: the block is read
        # while the estimate still runs, and only its floor waits for it.
        pairs = _block_pairs(logits_ptr + row * logits_stride, block, window)
        after_prior_kernel(PDL)
        _filter_pairs(scratch, pairs, block, REGION, REGIONS_AT)
    else:
        x, local = _block_tokens(logits_ptr, row, logits_stride, block, window)
        after_prior_kernel(PDL)
        _filter_block(scratch, x, local, block, REGION, REGIONS_AT)


# ------------------------------------------------------------------- settle


@triton.jit
def _settle(scratch, blocks, N: tl.constexpr, ROOM: tl.constexpr, BLOCKS_P2: tl.constexpr):
    """How the row is settled (LISTED, EXACT, RADIX), from the blocks'
    counts; the candidates of each block; and, for an EXACT row, the
    threshold, how many of its ties are taken, and each block's tokens above
    it and tied with it."""
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
    # The candidates when they hold the top n (no second read of the row),
    # then the threshold known (a tie, or every valid token).
    exact = tie | (all_valid <= N)
    mode = tl.where(on_list, LISTED, tl.where(exact, EXACT, RADIX))
    threshold = tl.where(tie, tl.load(scratch + PROBE), 0)  # 0: every valid token is taken
    greater = tl.where(tie, above, valid)
    equal = tl.where(tie, reach - above, 0)
    return mode, listed, threshold, tl.where(tie, N - all_above, 0), greater, equal


@triton.jit
def _write_block(out_row, logits_ptr, row, logits_stride, block, window, threshold, take, offset,
                 N: tl.constexpr, PLANES: tl.constexpr):
    """The block's tokens above the threshold and its first ``take``
    threshold ties, in order, into the packed row from slot ``offset``.
    Returns (tokens written, threshold ties seen). ``window``: the row's
    valid tokens (start, end)."""
    x, local = _block_tokens(logits_ptr, row, logits_stride, block, window)
    score = _order(x)
    valid = score != 0
    tie = valid & (score == threshold)
    ties = tl.sum(tl.sum(tie.to(tl.int32), axis=1), axis=0)
    keep = valid & (score > threshold)
    if take >= ties:
        keep = keep | tie
    elif take > 0:  # the block holds the row's last kept tie
        keep = keep | (tie & (_line_positions(tie.to(tl.int32)) < take))
    keep_i = keep.to(tl.int32)
    _store_words(out_row, offset + _line_positions(keep_i), score, local, keep, N, PLANES)
    return tl.sum(tl.sum(keep_i, axis=1), axis=0), ties


@triton.jit
def _write_span(out_row, logits_ptr, row, logits_stride, span, blocks, window, threshold, quota, offset, ties_before,
                N: tl.constexpr, PLANES: tl.constexpr, SPAN: tl.constexpr):
    """The span's blocks' kept tokens, in order, from slot ``offset``; the
    row's first ``quota`` threshold ties are kept, ``ties_before`` of them
    lie before the span; each block's counts come from its own read."""
    for j in range(SPAN):
        block = span * SPAN + j
        if block < blocks:
            written, ties = _write_block(out_row, logits_ptr, row, logits_stride, block, window, threshold,
                                         tl.maximum(quota - ties_before, 0), offset, N, PLANES)
            offset += written
            ties_before += ties


@triton.jit
def _copy_region(out_row, region, block, count, offset, N: tl.constexpr, PLANES: tl.constexpr,
                 REGION: tl.constexpr):
    """A block's first ``count`` candidate words, read from its region (in
    order), into slots ``offset`` on of a packed row."""
    for start in tl.static_range(0, REGION, 1024):
        i = start + tl.arange(0, 1024)
        word = tl.load(region + i, mask=i < count, other=0)
        local = ((block * BLOCK) & ~0xFFFF) | (0xFFFF - (word & 0xFFFF))  # a block never straddles 2^16
        _store_words(out_row, offset + i, (word >> 16) & 0xFFFF, local, i < count, N, PLANES)


@triton.jit
def _write_counted_span(out_row, regions, logits_ptr, row, logits_stride, span, blocks, window, threshold, quota,
                        counts, N: tl.constexpr, PLANES: tl.constexpr, BLOCKS_P2: tl.constexpr,
                        REGION: tl.constexpr, SPAN: tl.constexpr):
    """``_write_span`` where the filter's counts place every block: ``counts``
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
                    _copy_region(out_row, regions + block * REGION, block, count, offset, N, PLANES, REGION)
                else:
                    _write_block(out_row, logits_ptr, row, logits_stride, block, window, threshold,
                                 tl.maximum(quota - ties_before, 0), offset, N, PLANES)
            offset += count
            ties_before += tl.sum(tl.where(mine, equal, 0), axis=0)


@triton.jit
def _candidates(regions, slot, total, counts, ends, BLOCKS_P2: tl.constexpr, REGION: tl.constexpr):
    """(local id, ord16 score, valid) of candidates ``slot`` (in ascending
    local id) of a row whose blocks wrote their candidates' words to their
    regions: a binary search over the blocks' inclusive ends (``ends``, held
    in registers with the ``counts``) finds the block of each slot, the first
    whose end is past it. A word holds the id's low 16 bits; the block gives
    the others (a block never straddles 2^16)."""
    block = tl.zeros(slot.shape, dtype=tl.int32)
    for k in tl.static_range(20):  # halving steps BLOCKS_P2 / 2, ..., 1 (compile-time)
        if (BLOCKS_P2 >> (k + 1)) > 0:
            probe = block + (BLOCKS_P2 >> (k + 1))
            block = tl.where(tl.gather(ends, probe - 1, 0) <= slot, probe, block)
    start = tl.gather(ends, block, 0) - tl.gather(counts, block, 0)
    valid = slot < total
    word = tl.load(regions + block.to(tl.int64) * REGION + slot - start, mask=valid, other=0)
    local = ((block * BLOCK) & ~0xFFFF) | (0xFFFF - (word & 0xFFFF))
    return local, (word >> 16) & 0xFFFF, valid


@triton.jit
def _select_listed(out_row, regions, listed, N: tl.constexpr, PLANES: tl.constexpr, BLOCKS_P2: tl.constexpr,
                   REGION: tl.constexpr, ROOM: tl.constexpr):
    """The packed top-N of a row's candidates (at most ROOM, in ascending
    local id), held at once: their threshold by ``_bisected_threshold``
    between their lowest and highest scores, the same counts whatever the
    scores, then one compaction."""
    ends = tl.cumsum(listed, axis=0)
    total = tl.sum(listed, axis=0)
    local, score, valid = _candidates(regions, tl.arange(0, ROOM), total, listed, ends, BLOCKS_P2, REGION)
    lowest = tl.where(total >= N, tl.min(tl.where(valid, score, 0xFFFF), axis=0), 0)  # fewer: every one is kept
    counts = _above_and_ties(score, _bisected_threshold(score, N, lowest, tl.max(score, axis=0)))
    slot, keep, _ = _kept_slots(counts, tl.cumsum(counts, axis=0) - counts, tl.sum(counts, axis=0), N)
    _store_words(out_row, slot, score, local, keep, N, PLANES)


@triton.jit
def _publish(out_ptr, offset, row, peers, rank, WORDS: tl.constexpr, WORLD: tl.constexpr, LIST: tl.constexpr,
             LIBRARY_PEERS: tl.constexpr):
    """A finished row to every peer, then its flag raised there (WORLD > 0):
    round 1's into the gather buffers, a pushed list into the receive
    slots. Without peers (the pack alone) nothing. ``peers``: as the
    kernels take them."""
    if WORLD > 0:
        _, epochs_ptr, peer_ptrs, flag_ptrs, pes_ptr, max_rows = peers
        tl.debug_barrier()  # the whole row, plane bits included, is written before any thread reads it
        epoch = call_epoch(epochs_ptr, row)
        if LIST:
            push_list(out_ptr + offset, offset, row, rank, epoch, peer_ptrs, flag_ptrs, pes_ptr, max_rows, WORDS, WORLD,
                      LIBRARY_PEERS, 1024)
        else:
            push_row(out_ptr + offset, row, epoch, peer_ptrs, flag_ptrs, max_rows, rank, WORDS, WORLD, 1024)


@triton.jit
def _publish_when_last(out_ptr, offset, row, spans, peers, rank, WORDS: tl.constexpr, WORLD: tl.constexpr,
                       LIST: tl.constexpr, LIBRARY_PEERS: tl.constexpr):
    """``_publish`` by the last of the row's ``spans`` programs to finish it."""
    if WORLD > 0:
        if last_to_arrive(peers[0] + row, spans):
            _publish(out_ptr, offset, row, peers, rank, WORDS, WORLD, LIST, LIBRARY_PEERS)


@_any_width
def finish_kernel(out_ptr, scratch_ptr, rows, width_limit, peers, N: tl.constexpr, PLANES: tl.constexpr,
                  SLOTS: tl.constexpr, LIST: tl.constexpr, REGION: tl.constexpr, BLOCKS_P2: tl.constexpr,
                  HISTOGRAMS_AT: tl.constexpr, REGIONS_AT: tl.constexpr, ROOM: tl.constexpr, SPAN: tl.constexpr,
                  WORLD: tl.constexpr, LIBRARY_PEERS: tl.constexpr, PDL: tl.constexpr):
    """Settles the row from the filter's counts: the first span selects from
    the candidates, every block with tokens to keep writes them, or every
    span histograms its high bytes for the radix steps. ``peers``:
    (arrivals_ptr, epochs_ptr, peer_ptrs, flag_ptrs, pes_ptr, max_rows),
    where finished rows go (``Publish``)."""
    logits_ptr, row_starts_ptr, row_ends_ptr, sat_ptr, logits_stride, scratch_stride, rank = rows
    after_prior_kernel(PDL)
    words: tl.constexpr = N + PLANES * (N // 32)
    span, row, spans, active, offset = _span_target(sat_ptr, rank, words, SLOTS, LIST)
    if active:
        scratch = scratch_ptr + row * scratch_stride
        window = _row_window(row_starts_ptr, row_ends_ptr, row, width_limit)
        blocks = tl.cdiv(tl.maximum(width_limit, 1), BLOCK)
        mode, listed, threshold, quota, greater, equal = _settle(scratch, blocks, N, ROOM, BLOCKS_P2)
        if span == 0:
            tl.store(scratch + MODE, mode)
        if mode == LISTED:
            if span == 0:
                _select_listed(out_ptr + offset, scratch + REGIONS_AT, listed, N, PLANES, BLOCKS_P2, REGION, ROOM)
                _publish(out_ptr, offset, row, peers, rank, words, WORLD, LIST, LIBRARY_PEERS)
        elif mode == EXACT:
            b = tl.arange(0, BLOCKS_P2)
            take = tl.minimum(tl.maximum(quota - (tl.cumsum(equal, axis=0) - equal), 0), equal)
            kept = greater + take
            # Candidates and the tokens above the threshold are both threshold
            # sets of ord16: as many of each, they are the same tokens.
            copied = ((take == 0) & (listed == greater) & (listed <= REGION)).to(tl.int32)
            mine = (b >= span * SPAN) & (b < span * SPAN + SPAN)
            if tl.sum(tl.where(mine, kept, 0), axis=0) > 0:  # spans with nothing to keep read nothing
                _write_counted_span(out_ptr + offset, scratch + REGIONS_AT, logits_ptr, row, logits_stride, span,
                                    blocks, window, threshold, quota, (kept, equal, copied), N, PLANES, BLOCKS_P2,
                                    REGION, SPAN)
            _publish_when_last(out_ptr, offset, row, spans, peers, rank, words, WORLD, LIST, LIBRARY_PEERS)
        else:
            _span_histogram(scratch + HISTOGRAMS_AT, logits_ptr, row, logits_stride, span, blocks, window, 0, 0,
                            False, SPAN)


# -------------------------------------------------------------------- radix


@triton.jit
def _span_histogram(histograms, logits_ptr, row, logits_stride, span, blocks, window, high, AT: tl.constexpr,
                    SELECT_LOW: tl.constexpr, SPAN: tl.constexpr):
    """The span's histogram of the high byte of its scores (or, with
    SELECT_LOW, of the low byte of those whose high byte is ``high``), to
    word AT of the span's pair of histograms."""
    hist = tl.zeros((256,), dtype=tl.int32)
    for j in range(SPAN):
        block = span * SPAN + j
        if block < blocks:
            x, _ = _block_tokens(logits_ptr, row, logits_stride, block, window)
            score = tl.reshape(_order(x), (BLOCK,))
            hist += _histogram(score, score != 0, high, SELECT_LOW)
    tl.store(histograms + span * 512 + AT + tl.arange(0, 256), hist)


@triton.jit
def _summed(histograms, spans, AT: tl.constexpr):
    """The spans' 256-bin histograms at word AT of each pair, summed."""
    total = tl.zeros((256,), dtype=tl.int32)
    s = 0
    while s < spans:  # a while loop: the bound is a run-time scalar
        total += tl.load(histograms + s * 512 + AT + tl.arange(0, 256))
        s += 1
    return total


@_any_width
def radix_low_kernel(scratch_ptr, rows, width_limit, N: tl.constexpr, LIST: tl.constexpr, HISTOGRAMS_AT: tl.constexpr,
                     SPAN: tl.constexpr, PDL: tl.constexpr):
    """Radix rows: the boundary bucket of the high byte over the row, then
    the span's histogram of the low byte inside it."""
    logits_ptr, row_starts_ptr, row_ends_ptr, sat_ptr, logits_stride, scratch_stride, rank = rows
    after_prior_kernel(PDL)
    span = tl.program_id(0)
    row = tl.program_id(1).to(tl.int64)
    if _target(row, sat_ptr, rank, 1, 1, LIST)[0]:
        scratch = scratch_ptr + row * scratch_stride
        if tl.load(scratch + MODE) == RADIX:
            histograms = scratch + HISTOGRAMS_AT
            high, _, _ = radix_boundary(_summed(histograms, tl.num_programs(0), 0), N)
            _span_histogram(histograms, logits_ptr, row, logits_stride, span,
                            tl.cdiv(tl.maximum(width_limit, 1), BLOCK),
                            _row_window(row_starts_ptr, row_ends_ptr, row, width_limit), high, 256, True, SPAN)


@_any_width
def radix_write_kernel(out_ptr, scratch_ptr, rows, width_limit, peers, N: tl.constexpr, PLANES: tl.constexpr,
                       SLOTS: tl.constexpr, LIST: tl.constexpr, HISTOGRAMS_AT: tl.constexpr, SPAN: tl.constexpr,
                       WORLD: tl.constexpr, LIBRARY_PEERS: tl.constexpr, PDL: tl.constexpr):
    """Radix rows: the threshold from the two byte histograms, each span's
    tokens above it and tied with it from its own, then its kept tokens."""
    logits_ptr, row_starts_ptr, row_ends_ptr, sat_ptr, logits_stride, scratch_stride, rank = rows
    after_prior_kernel(PDL)
    words: tl.constexpr = N + PLANES * (N // 32)
    span, row, spans, active, offset = _span_target(sat_ptr, rank, words, SLOTS, LIST)
    if active:
        scratch = scratch_ptr + row * scratch_stride
        if tl.load(scratch + MODE) == RADIX:
            histograms = scratch + HISTOGRAMS_AT
            high, above_high, _ = radix_boundary(_summed(histograms, spans, 0), N)
            low, above_low, _ = radix_boundary(_summed(histograms, spans, 256), N - above_high)
            quota = N - above_high - above_low
            digit = tl.arange(0, 256)
            start = tl.zeros((), dtype=tl.int32)
            ties_before = tl.zeros((), dtype=tl.int32)
            s = 0
            while s < span:
                high_hist = tl.load(histograms + s * 512 + digit)
                low_hist = tl.load(histograms + s * 512 + 256 + digit)
                equal = tl.sum(tl.where(digit == low, low_hist, 0), axis=0)
                start += (tl.sum(tl.where(digit > high, high_hist, 0), axis=0)
                          + tl.sum(tl.where(digit > low, low_hist, 0), axis=0)
                          + tl.minimum(tl.maximum(quota - ties_before, 0), equal))
                ties_before += equal
                s += 1
            _write_span(out_ptr + offset, logits_ptr, row, logits_stride, span,
                        tl.cdiv(tl.maximum(width_limit, 1), BLOCK),
                        _row_window(row_starts_ptr, row_ends_ptr, row, width_limit), high * 256 + low, quota, start,
                        ties_before, N, PLANES, SPAN)
            _publish_when_last(out_ptr, offset, row, spans, peers, rank, words, WORLD, LIST, LIBRARY_PEERS)


# --------------------------------------------------------------- short rows


@triton.jit
def _bisected_threshold(score, need, lowest, highest):
    """The largest ord16 t with at least ``need`` of the ``score``s (any
    shape, 0 for invalid tokens) >= t; 0 when fewer are valid. One count a bit,
    from the top: a histogram pass (tl.histogram takes a warp ballot per bit
    of the bin, and more to combine them) costs several times as much. Every
    valid score lies in [``lowest``, ``highest``], and when ``lowest`` > 0 at
    least ``need`` are valid, so a bit whose answer the bounds give is not
    counted. The first fifteen compare levels (the score without its last
    bit: even candidates) two to an int32, a 16-bit field each: level +
    0x8000 - c sets the field's top bit iff level >= c, and never carries out
    of it; the last compares whole scores."""
    level = tl.reshape(score >> 1, (score.numel // 2, 2), can_reorder=True)  # counts need no order
    even, odd = tl.split(level)
    pairs = even | (odd << 16)
    score = tl.reshape(score, (score.numel,), can_reorder=True)
    threshold = tl.zeros((), dtype=tl.int32)
    for bit in tl.static_range(15, -1, -1):
        candidate = threshold | (1 << bit)
        if candidate <= lowest:
            threshold = candidate
        elif candidate <= highest:
            if bit > 0:
                reached = ((pairs + (0x8000 - (candidate >> 1)) * 0x10001) >> 15) & 0x10001  # bit 31 lands on 16
                fields = tl.sum(reached, axis=0)  # each field at most ROW / 2
                reached = (fields & 0xFFFF) + (fields >> 16)
            else:
                reached = tl.sum((score >= candidate).to(tl.int32), axis=0)
            if reached >= need:
                threshold = candidate
    return threshold


@_any_width
def row_kernel(out_ptr, rows, width_limit, peers, N: tl.constexpr, PLANES: tl.constexpr, SLOTS: tl.constexpr,
               LIST: tl.constexpr, ROW: tl.constexpr,
               WORLD: tl.constexpr, LIBRARY_PEERS: tl.constexpr, PDL: tl.constexpr):
    """The whole local top-N of a short row (ROW tokens, a power of 2 up to
    SHORT_ROWS) in one program: the row held in registers as lines of 8
    adjacent tokens, its threshold by ``_bisected_threshold`` (the same
    counts for any scores), then one scan in token order
    (``_line_positions``) of ``_above_and_ties`` places the kept ones; the
    rest of the packed row is zeroed (no id reaches 2^16: every plane bit is
    0)."""
    logits_ptr, row_starts_ptr, row_ends_ptr, sat_ptr, logits_stride, scratch_stride, rank = rows
    after_prior_kernel(PDL)
    words: tl.constexpr = N + PLANES * (N // 32)
    row = tl.program_id(0).to(tl.int64)
    active, offset = _target(row, sat_ptr, rank, words, SLOTS, LIST)
    if active:
        start, end = _row_window(row_starts_ptr, row_ends_ptr, row, width_limit)
        local = tl.arange(0, ROW // 8)[:, None] * 8 + tl.arange(0, 8)[None, :]  # 8 adjacent tokens a thread
        inside = (local >= start) & (local < end)
        score = _order(tl.load(logits_ptr + row * logits_stride + local, mask=inside, other=float("nan")))
        counts = _above_and_ties(score, _bisected_threshold(score, N, 0, 0xFFFF))
        slot, keep, kept = _kept_slots(counts, _line_positions(counts), tl.sum(tl.sum(counts, axis=1), axis=0), N)
        out_row = out_ptr + offset
        tl.store(out_row + slot, packed_word(score, local), mask=keep)
        _zero_row_from(out_row, kept, words, 1024)
        _publish(out_ptr, offset, row, peers, rank, words, WORLD, LIST, LIBRARY_PEERS)


# ----------------------------------------------------------------- launcher


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
    library_peers: int = 0


def _planes(words: int, n: int) -> int:
    return (words - n) // (n // 32)


def pipeline(out, logits, row_starts, row_ends, *, n: int, max_local_len: int, scratch, arrivals,
             publish: Publish | None = None, pdl: bool = False) -> list[Launch]:
    """The launches of ``select_local``: one (``row_kernel``) for calls at
    most SHORT_ROWS wide, else the five of the spread pipeline, each
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
    target = dict(N=n, PLANES=_planes(words, n), SLOTS=max(pub.list_slots, 1), LIST=listing, PDL=pdl)
    peers = dict(WORLD=pub.world_size, LIBRARY_PEERS=pub.library_peers)
    if limit <= SHORT_ROWS:
        row = max(triton.next_power_of_2(min(max_local_len, SHORT_ROWS)), 1024)
        return [Launch(row_kernel, (rows,), (out, rows_arg, limit, peers_arg),
                       dict(target, ROW=row, **peers), ROW_WARPS)]
    p = plan(n, max_local_len)
    blocks = triton.cdiv(max(limit, 1), BLOCK.value)
    spans = triton.cdiv(blocks, p.span)
    pairs = logits.dtype == torch.bfloat16 and logits.stride(0) % 2 == 0 and logits.data_ptr() % 4 == 0
    return [
        Launch(estimate_kernel, (rows,), (out, scratch, rows_arg, limit),
               dict(N=n, WORDS=words, SLOTS=target["SLOTS"], LIST=listing, GROUPS=p.groups, ROOM=p.room, PDL=pdl),
               ESTIMATE_WARPS),
        Launch(filter_kernel, (blocks, rows), (scratch, rows_arg, limit),
               dict(REGION=p.region, REGIONS_AT=p.regions_at, LIST=listing, PAIRS=pairs, PDL=pdl), FILTER_WARPS),
        Launch(finish_kernel, (spans, rows), (out, scratch, rows_arg, limit, peers_arg),
               dict(target, REGION=p.region, BLOCKS_P2=p.blocks_p2, HISTOGRAMS_AT=p.histograms_at,
                    REGIONS_AT=p.regions_at, ROOM=p.room, SPAN=p.span, **peers), max(SPAN_WARPS, p.room // 512)),
        Launch(radix_low_kernel, (spans, rows), (scratch, rows_arg, limit),
               dict(N=n, LIST=listing, HISTOGRAMS_AT=p.histograms_at, SPAN=p.span, PDL=pdl), SPAN_WARPS),
        Launch(radix_write_kernel, (spans, rows), (out, scratch, rows_arg, limit, peers_arg),
               dict(target, HISTOGRAMS_AT=p.histograms_at, SPAN=p.span, **peers), SPAN_WARPS),
    ]


def select_local(out, logits, row_starts, row_ends, *, n: int, max_local_len: int, scratch, arrivals,
                 publish: Publish | None = None, pdl: bool = False) -> None:
    """The packed local top-``n`` of every row of ``logits`` [T, S] (bf16,
    fp16 or fp32, stride(1) == 1; tokens row_starts[t] <= l < row_ends[t]
    valid, each [T] int32 or int64; row_starts None: 0) into ``out``: int32
    [T, n + P*n/32] (round 1), or, for pushed lists, the receive buffer
    [max_rows, slots, n + P*n/32] (rows where this rank is saturated only).
    scratch: int32 [>= T, scratch_words(n, max_local_len)] and
    arrivals: int32 [>= T], zero between calls (the kernels leave them so),
    are the spread pipeline's (arrivals read only where it publishes rows;
    calls at most SHORT_ROWS wide read neither). pdl: launch each kernel as a
    programmatic dependent of the one before it (GPUs only)."""
    for launch in pipeline(out, logits, row_starts, row_ends, n=n, max_local_len=max_local_len, scratch=scratch,
                           arrivals=arrivals, publish=publish, pdl=pdl):
        launch()


def scratch_words(n: int, max_local_len: int) -> int:
    """Scratch words a row of ``select_local``'s calls needs: the spread
    pipeline's, or one (no call reads it) when every call is at most
    SHORT_ROWS wide."""
    return plan(n, max_local_len).scratch_words if max_local_len > SHORT_ROWS else 1


def scratch_for(rows: int, n: int, max_local_len: int, device, *, publishing: bool = True
                ) -> tuple[torch.Tensor, torch.Tensor]:
    """(scratch, arrivals) for ``select_local`` over ``rows`` rows. Only
    rows published to peers count arrivals: without (``publishing`` False)
    the scratch stands in for them and nothing is zeroed, a kernel less."""
    scratch = torch.empty((rows, scratch_words(n, max_local_len)), dtype=torch.int32, device=device)
    return scratch, torch.zeros(rows, dtype=torch.int32, device=device) if publishing else scratch


def pack(out, logits, row_starts, row_ends, *, local_topk: int, max_local_len: int, push: Publish | None = None,
         scratch=None, pdl: bool = False) -> None:
    """Round 1: out int32 [T, N + P*N/32] (P read off its width). ``push``,
    when given (every peer reached by address), also pushes each finished
    row to every peer's gather buffer and raises its flag. ``scratch``:
    (scratch, arrivals) as ``scratch_for`` makes them."""
    scratch, arrivals = scratch or scratch_for(logits.shape[0], local_topk, max_local_len, out.device,
                                               publishing=push is not None)
    select_local(out, logits, row_starts, row_ends, n=local_topk, max_local_len=max_local_len, scratch=scratch,
                 arrivals=arrivals, publish=push, pdl=pdl)


@_any_width
def pack_indices_kernel(out_ptr, logits_ptr, idx_ptr, row_starts_ptr, row_ends_ptr, logits_stride, idx_stride,
                        width_limit, N: tl.constexpr, PLANES: tl.constexpr, GROUPS: tl.constexpr,
                        PDL: tl.constexpr):
    """Slot j of the output keeps candidate j of ``idx``; 32 slots a group,
    GROUPS groups per step, so each plane word is built in registers."""
    after_prior_kernel(PDL)
    row = tl.program_id(0).to(tl.int64)
    words: tl.constexpr = N + PLANES * (N // 32)
    start, end = _row_window(row_starts_ptr, row_ends_ptr, row, width_limit)
    out_row = out_ptr + row * words
    lane = tl.arange(0, 32)
    for g0 in tl.range(0, N // 32, GROUPS):
        group = g0 + tl.arange(0, GROUPS)
        slot = group[:, None] * 32 + lane[None, :]
        in_range = (group < N // 32)[:, None] & (lane >= 0)[None, :]
        local = tl.load(idx_ptr + row * idx_stride + slot, mask=in_range, other=-1)
        inside = (local >= start) & (local < end)
        bits = score_bits(logits_ptr + row * logits_stride + tl.where(inside, local, 0), inside)
        present = inside & ~is_nan_bits(bits)
        tl.store(out_row + slot, tl.where(present, packed_word(ord16(bits), local), 0), mask=in_range)
        for p in tl.static_range(PLANES):
            bit = tl.where(present, (local >> (16 + p)) & 1, 0)
            plane = tl.sum((bit << lane[None, :]).to(tl.int64), axis=1).to(tl.int32)
            tl.store(out_row + N + p * (N // 32) + group, plane, mask=group < N // 32)


def pack_indices_launch(out, logits, local_idx, row_starts, row_ends, *, max_local_len: int,
                        pdl: bool = False) -> Launch:
    rows, width = logits.shape
    n = local_idx.shape[1]
    return Launch(pack_indices_kernel, (rows,),
                  (out, logits, local_idx, row_starts, row_ends, logits.stride(0), local_idx.stride(0),
                   min(width, max_local_len)),
                  dict(N=n, PLANES=_planes(out.shape[1], n), GROUPS=8, PDL=pdl), 4)


def pack_indices(out, logits, local_idx, row_starts, row_ends, *, max_local_len: int, pdl: bool = False) -> None:
    if logits.shape[0]:
        pack_indices_launch(out, logits, local_idx, row_starts, row_ends, max_local_len=max_local_len, pdl=pdl)()

"""The local top-n of calls wider than ``pack.SHORT_ROWS``: three kernels,
in which only the estimate is a program per row, and it reads a sample;
every step that reads the row is spread over its blocks of BLOCK tokens,
so no program walks a row:

1. estimate (a program per row): the row's n-th score is expected at rank r
   of a sample of groups of GROUP adjacent tokens spread over the row. The
   ``floor`` is the sample's score at rank r_lo, four standard deviations of
   r further down, the ``probe`` its score at rank r; when many sampled
   tokens tie on the floor's score, that score is the probe and the floor
   moves above it. A row of at most ROOM tokens needs no estimate: every
   valid token is a candidate. Zeroes the output row.
2. filter (a program per block): each block counts its valid tokens, those
   >= floor (the candidates), >= probe and > probe, and writes its
   candidates' words, in order, to its region of the scratch.
3. finish (a program per span of up to MAX_SPAN blocks) settles each row
   from the counts summed over its blocks, the same way in every program:
   - listed: n <= candidates <= ROOM, or every valid token is one. The first
     span's program selects from them in registers, a count a bit.
   - exact: the probe is the threshold (fewer than n above it, n at or
     above it), or every valid token is taken. Each block with tokens to
     keep writes them at its place in the row, from the earlier counts:
     copied from its region when they are its candidates, else re-read.
   - radix: neither (the sample misled). Each span takes its own top-n, a
     superset of its share of the row's, by histograms of a byte of its
     scores each (its blocks re-read from L2 for each) and writes it to its
     region; the last span to arrive takes the row's threshold from
     histograms of those lists and compacts them into the row.
A row that several spans write is published (pushed to every peer, its flag
raised) by the last span to finish it. Whatever the path, the output is
``reference.pack``'s, bit for bit: the estimate decides how much work is
done, never what is written.

Scores in exact fp32 order (32-bit words) take the same steps on their
words' scores (the fp32 order's top halves), with three differences: the
candidates' low halves go to the scratch beside their words, and the
listed select counts them too (``bisected_threshold32``); a probed tie is
exact only when its tokens are all one fp32 value (the filter bounds their
low halves); and the radix steps take four bytes, not two."""


import math
from dataclasses import dataclass

import triton
import triton.language as tl

from .keys import (MIN_VALID, NO_SCORE32, flat_positions, folded32, is_nan_bits, near_bin, ord16, packed_word,
                   packed_words, power_of_2, radix_boundary, radix_digit_histogram, score16_bits)
from .launch import Launch
from .rows import (any_width, bisected_threshold, bisected_threshold32, above_and_ties, above_and_ties32, fp32_order,
                   kept_slots, line_positions, load_tokens, list_floor, no_order, publish_row, row_lows, row_target,
                   row_window, store_words, token_order, trim_list, word_score, zero_row_from)
from .sync import after_prior_kernel, last_to_arrive

BLOCK = tl.constexpr(4096)  # tokens a filter program reads; a power of two up to 2^16 (words carry 16 id bits)
FILTER_WARPS = 4
FILTER32_REGISTERS = 128  # the 32-bit filter's cap: fp32 pairs take 148 uncapped, three programs an SM, not four
SPANS = 8  # finish programs per row, about: each covers a span of 1 to MAX_SPAN blocks
MAX_SPAN = 4
SPAN_WARPS = 8
ESTIMATE_WARPS = 8
GROUP = tl.constexpr(4)  # adjacent tokens a sampled group (one 8-byte load of bf16): the fewer tokens a group,
# the more independent values a smooth row's sample holds
MAX_GROUPS = 4096 // GROUP.value  # the estimate samples at most 4096 tokens
SAMPLE_RANK = tl.constexpr(256)  # the sample is sized to hold about this many of the row's top-n
MAX_ROOM = 8192  # candidates the finish holds in registers (16 a thread at its widest)
SIGMAS = tl.constexpr(4)  # the estimate's margin, in standard deviations of the sample's count
SAMPLE_BINS = tl.constexpr(128)  # the estimate's fine histogram: its cost grows with its bins, its reach too
COARSE_BINS = tl.constexpr(64)  # its coarser levels' (of 32 scores they reach 16 binades; of 2048, every score)



# Scratch of a row (int32): the estimate's floor and probe, how the finish
# settled the row (LISTED, EXACT, RADIX: what the tests read to know which
# path a row took) and the radix spans' arrivals, then per block its counts,
# per span the size of its own top-n (radix rows), per block its region
# (candidate words; a radix span's top-n in its first), and with 32-bit
# scores the regions' low halves (int32, slot for slot: a low half's store
# then shares its word's address; readers take the low 16 bits).
FLOOR, PROBE, MODE, RADIX_ARRIVALS, HEADER = (tl.constexpr(0), tl.constexpr(1), tl.constexpr(2), tl.constexpr(3),
                                              tl.constexpr(4))
# valid tokens, candidates, >= probe, > probe; with 32-bit scores, the
# highest low half at the probe's score and 0xFFFF less the lowest (-1: none)
COUNT_FIELDS = tl.constexpr(6)
LISTED, EXACT, RADIX = tl.constexpr(0), tl.constexpr(1), tl.constexpr(2)  # how a row is settled


@dataclass(frozen=True)
class Plan:
    """The compile-time shape of one pipeline: n selected from rows of up to
    ``max_local_len`` tokens. ``room``: the most candidates a row is
    selected from (held in registers at once); ``groups``: most groups of
    GROUP tokens the estimate samples; ``blocks_p2``: blocks of the longest
    row, rounded up to a power of two (spans too); ``score_bits``: 16, or
    32 (the regions' low halves follow them)."""

    n: int
    room: int
    groups: int
    blocks_p2: int
    score_bits: int = 16

    @property
    def span(self) -> int:
        """Blocks a finish program covers: about SPANS programs a
        row, so that an exact row's writes are spread even when it is short."""
        return min(MAX_SPAN, max(1, self.blocks_p2 // SPANS))

    @property
    def region(self) -> int:
        return min(BLOCK.value, self.room)

    @property
    def spans_kept_at(self) -> int:
        """Where a radix row's per-span sizes of their own top-n start."""
        return HEADER.value + self.blocks_p2 * COUNT_FIELDS.value

    @property
    def regions_at(self) -> int:
        """Where a row's per-block candidate regions (``region`` words) start."""
        return self.spans_kept_at + self.blocks_p2

    @property
    def lows_at(self) -> int:
        """Where the regions' low halves start (32-bit scores)."""
        return self.regions_at + self.blocks_p2 * self.region

    @property
    def scratch_words(self) -> int:
        return self.lows_at + (self.blocks_p2 * self.region if self.score_bits == 32 else 0)


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


def plan(n: int, max_local_len: int, score_bits: int = 16) -> Plan:
    """Enough groups that about SAMPLE_RANK sampled tokens fall in the
    longest row's top-n (at most MAX_GROUPS), and room for twice its
    candidates with four standard deviations to spare: a row's count of them
    is about n r_lo / r, the sample's r_lo-th score standing for the n-th."""
    wanted = math.ceil(SAMPLE_RANK.value * max_local_len / (GROUP.value * n))
    groups = min(MAX_GROUPS, max(64, triton.next_power_of_2(wanted)))
    rank = max(1.0, min(SAMPLE_RANK.value, n * GROUP.value * groups / max_local_len))
    room = min(max(512, 2 * triton.next_power_of_2(math.ceil(expected_candidates(n, rank)))), MAX_ROOM)
    blocks_p2 = triton.next_power_of_2(triton.cdiv(max_local_len, BLOCK.value))
    return Plan(n=n, room=room, groups=groups, blocks_p2=blocks_p2, score_bits=score_bits)


# ------------------------------------------------------------------ blocks


@triton.jit
def _block_tokens(logits_ptr, row, logits_stride, block, window):
    """(scores, local ids) of a block, as [BLOCK / 8, 8], NaN outside the
    row's valid tokens ``window`` = (start, end): a thread loads 8 adjacent
    tokens at once (16 bytes of bf16), unmasked when the block is wholly
    inside."""
    start, end = window
    local = block * BLOCK + tl.arange(0, BLOCK // 8)[:, None] * 8 + tl.arange(0, 8)[None, :]
    ptrs = logits_ptr + row * logits_stride + local
    whole = (block * BLOCK >= start) & ((block + 1) * BLOCK <= end)
    return load_tokens(ptrs, (local >= start) & (local < end), whole), local


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


# ---------------------------------------------------------------- estimate


@triton.jit
def _sample_boundaries(hist, r, r_lo):
    """``radix_boundary(hist, r)`` and ``radix_boundary(hist, r_lo)``'s
    bucket and count in it, from one scan and one reduction of a histogram
    of at most 2^13 sampled tokens (r <= r_lo): five fields of an int64,
    the buckets that reach r and r_lo (at most 256 each, bits 0-8 and
    9-17), the count above the first (bits 18-31), in its bucket (bits
    32-45) and in the second's (bits 46-59)."""
    at_or_above = tl.cumsum(hist, axis=0, reverse=True)
    reaching = at_or_above >= r
    last = reaching & (at_or_above - hist < r)
    reaching_lo = at_or_above >= r_lo
    last_lo = reaching_lo & (at_or_above - hist < r_lo)
    fields = tl.sum(reaching.to(tl.int64) | (reaching_lo.to(tl.int64) << 9)
                    | (tl.where(reaching, 0, hist).to(tl.int64) << 18) | (tl.where(last, hist, 0).to(tl.int64) << 32)
                    | (tl.where(last_lo, hist, 0).to(tl.int64) << 46), axis=0)
    return ((fields & 0x1FF).to(tl.int32) - 1, ((fields >> 18) & 0x3FFF).to(tl.int32),
            ((fields >> 32) & 0x3FFF).to(tl.int32), ((fields >> 9) & 0x1FF).to(tl.int32) - 1,
            (fields >> 46).to(tl.int32))


@triton.jit
def _lowest_and_below(lowest, counts, below, lowest_2, counts_2, below_2):
    """The combine of (lowest score, how many hold it | valid tokens << 16,
    highest level): a reduction that counts the minimum as it finds it."""
    low = tl.minimum(lowest, lowest_2)
    at_low = tl.where(lowest == low, counts & 0xFFFF, 0) + tl.where(lowest_2 == low, counts_2 & 0xFFFF, 0)
    return low, ((counts + counts_2) & ~0xFFFF) | at_low, tl.maximum(below, below_2)


@triton.jit
def _sampled_estimate(in_row, start, end, N: tl.constexpr, GROUPS: tl.constexpr, SCORE_BITS: tl.constexpr):
    """(probe, floor) of a row's valid tokens [start, end), ranked by their
    words' scores (``word_score``), from groups of GROUP adjacent tokens
    spread evenly over them (from ``start`` rounded
    down to GROUP, so that every group is one aligned load; tokens before it
    count nothing), enough that about SAMPLE_RANK sampled tokens are
    expected in its top N (at most GROUPS). The row's N-th score is expected
    at rank r of the sample; the floor is the lowest score of the bin that
    holds rank r_lo = r + 4 sqrt(2 r) + 4 (four standard deviations, the
    variance doubled for tokens that come in correlated groups). The sample
    is ranked by one histogram of each score's level below the top level,
    levels of 2 scores, built only when a count of the sampled tokens within
    SAMPLE_BINS - 2 levels of the top finds rank r_lo there. When it falls
    past them (heavy tails, a few outliers, a tie far below a few scores;
    the r-th score is then not probed), the lowest
    sampled score is asked first whether it holds rank r_lo with more than
    r_lo + 16 tokens (zeros below a few positives, a masked tail); if not,
    COARSE_BINS levels of 32, then of 2048 scores rank it, counted down
    from the highest level past the fine ones (an outlier at the top would
    leave rank r_lo past them too). When the floor's bin's highest score,
    or the one just below it, holds more sampled tokens than r_lo + 16
    (ties: few levels, zeros, masked tails), it is the probe and the floor
    moves above it; otherwise the probe is the r-th score where more than
    8 sampled tokens share its level, else none. Single scores are counted
    only in a bin that can hold such a tie: most rows count none."""
    base = start // GROUP * GROUP
    length = end - base
    groups = tl.minimum((SAMPLE_RANK * length + GROUP * N - 1) // (GROUP * N), tl.minimum(length // GROUP, GROUPS))
    g = tl.arange(0, GROUPS)
    # Group g starts near g * length / groups, in 16-bit fixed point: one
    # division a row, not one (int64, in software) a group. Groups past
    # ``groups`` re-read the last one (every load stays inside the row,
    # unmasked) and count nothing.
    step = (length.to(tl.int64) << 16) // groups
    first = base + ((tl.minimum(g, groups - 1).to(tl.int64) * step) >> 16) // GROUP * GROUP
    local = first[:, None] + tl.arange(0, GROUP)[None, :]
    score = word_score(token_order(tl.load(in_row + local), SCORE_BITS), SCORE_BITS)
    score = tl.reshape(tl.where((g < groups)[:, None] & (local >= start), score, 0), (GROUPS * GROUP,),
                       can_reorder=True)
    valid = score != 0
    r = tl.maximum((N * GROUP * groups + length - 1) // length, 1).to(tl.int32)
    r_lo = r + tl.ceil(tl.sqrt(2.0 * r.to(tl.float32)) * SIGMAS).to(tl.int32) + SIGMAS
    top = tl.max(tl.where(valid, score >> 1, 0), axis=0)
    bucket = tl.full((), -1, tl.int32)
    above = tl.zeros((), dtype=tl.int32)
    in_level = tl.zeros((), dtype=tl.int32)
    low_bucket = tl.zeros((), dtype=tl.int32)  # rank r_lo past the fine levels, unless they hold it
    in_low_bucket = tl.zeros((), dtype=tl.int32)
    # The histogram's bins above 0 (levels within SAMPLE_BINS - 2 of the top) are counted first: one reduction,
    # where the histogram of a row whose rank r_lo lies past them would cost several.
    if tl.sum((valid & ((score >> 1) > top - (SAMPLE_BINS - 1))).to(tl.int32), axis=0) >= r_lo:
        hist = tl.histogram(near_bin(top, score >> 1, SAMPLE_BINS), SAMPLE_BINS, mask=valid)
        bucket, above, in_level, low_bucket, in_low_bucket = _sample_boundaries(hist, r, r_lo)
    bottom = tl.zeros((), dtype=tl.int32)
    below = top
    if low_bucket == 0:  # rank r_lo lies past the fine levels: is it a tie at the lowest score (zeros, -inf)?
        # If not, the coarser levels count down from the highest level past the fine ones (from an outlier at
        # the top, rank r_lo could lie past them too). One reduction finds both.
        lowest, counts, below = tl.reduce(
            (tl.where(valid, score, 0xFFFF), valid.to(tl.int32) * 0x10001,
             tl.where(valid & ((score >> 1) <= top - (SAMPLE_BINS - 1)), score >> 1, 0)), 0, _lowest_and_below)
        at_lowest = counts & 0xFFFF
        bottom = tl.where(((counts >> 16) - at_lowest < r_lo) & (at_lowest > r_lo + 16), lowest, 0)
    if bottom != 0:
        probe = bottom
        floor = (bottom + 2) & ~1  # even: the pairs compare levels
    else:
        shift = tl.full((), 1, tl.int32)
        floor_level = top - (SAMPLE_BINS - 1) + low_bucket
        for coarser in tl.static_range(2):
            if low_bucket == 0:
                shift += 4 + 2 * coarser  # levels of 32 scores, then of 2048: the whole range
                low_top = below >> (shift - 1)  # the anchor level's group: shifts keep the maximum
                low_bucket, _, in_low_bucket = radix_boundary(
                    tl.histogram(near_bin(low_top, score >> shift, COARSE_BINS), COARSE_BINS, mask=valid), r_lo)
                floor_level = low_top - (COARSE_BINS - 1) + low_bucket
        floor = tl.where(low_bucket >= 0, floor_level << shift, 0)
        probe = tl.zeros((), dtype=tl.int32)
        # Single scores are counted only in a bin that holds enough sampled
        # tokens for a tie.
        if (low_bucket >= 0) & (in_low_bucket > r_lo + 16):  # the floor's bin: its highest score or the one below
            if shift == 1:  # a level of two scores, both counted by the histogram: one count parts them
                upper = floor_level * 2 + 1
                counts = tl.sum((valid & (score == upper)).to(tl.int32)
                                | ((valid & (score == upper - 2)).to(tl.int32) << 16), axis=0)
                at_upper = counts & 0xFFFF
                most = tl.where(at_upper > 0, upper, upper - 1)
                at_most = tl.where(at_upper > 0, at_upper, in_low_bucket)
                below_most = tl.where(at_upper > 0, in_low_bucket - at_upper, counts >> 16)
            else:
                most = tl.max(tl.where(valid & ((score >> shift) == floor_level), score, 0), axis=0)
                counts = tl.sum((valid & (score == most)).to(tl.int32)
                                | ((valid & (score == most - 1)).to(tl.int32) << 16), axis=0)
                at_most = counts & 0xFFFF
                below_most = counts >> 16
            if tl.maximum(at_most, below_most) > r_lo + 16:
                probe = tl.where(at_most >= below_most, most, most - 1)
                floor = (probe + 2) & ~1
        if (probe == 0) & (bucket > 0) & (in_level > 8):  # else the r-th score: its level's upper or lower score
            upper = (top - (SAMPLE_BINS - 1) + bucket) * 2 + 1
            probe = tl.where(r - above <= tl.sum((valid & (score == upper)).to(tl.int32), axis=0), upper, upper - 1)
    return probe, floor


@any_width
def estimate_kernel(out_ptr, scratch_ptr, rows, width_limit, N: tl.constexpr, WORDS: tl.constexpr, SLOTS: tl.constexpr,
                    LIST: tl.constexpr, GROUPS: tl.constexpr, ROOM: tl.constexpr, PDL: tl.constexpr,
                    SCORE_BITS: tl.constexpr):
    """The row's floor and probe into its scratch; its output row zeroed.
    ``rows``: (logits_ptr, row_starts_ptr, row_ends_ptr, sat_ptr,
    logits_stride, scratch_stride, rank; row_starts_ptr may be None) and
    ``width_limit`` (the call's width, at most max_local_len), the same in
    every kernel of the pipeline."""
    logits_ptr, row_starts_ptr, row_ends_ptr, sat_ptr, logits_stride, scratch_stride, rank = rows
    after_prior_kernel(PDL)
    row = tl.program_id(0).to(tl.int64)
    active, offset = row_target(row, sat_ptr, rank, WORDS, SLOTS, LIST, SCORE_BITS)
    if active:
        zero_row_from(out_ptr + offset, 0, WORDS, 1024)
        scratch = scratch_ptr + row * scratch_stride
        start, end = row_window(row_starts_ptr, row_ends_ptr, row, width_limit)
        probe = tl.zeros((), dtype=tl.int32)
        floor = tl.zeros((), dtype=tl.int32)
        if end - start > ROOM:  # fewer: every valid token is a candidate
            probe, floor = _sampled_estimate(logits_ptr + row * logits_stride, start, end, N, GROUPS, SCORE_BITS)
        tl.store(scratch + FLOOR, tl.maximum(floor, MIN_VALID))
        tl.store(scratch + PROBE, probe)
        tl.store(scratch + RADIX_ARRIVALS, 0)


# ------------------------------------------------------------------ filter


@triton.jit
def _score_floor(floor):
    """The float f with {non-NaN x : x >= f} = {x : ord16(x) >= floor}, up
    to a monotone widening that keeps it a threshold set (-0 >= +0 is true,
    and a NaN pattern widens to an infinity): all the candidates need."""
    bits = tl.where(floor >= 0x8000, floor & 0x7FFF, ~floor & 0xFFFF)
    f = (bits << 16).to(tl.float32, bitcast=True)
    return tl.where(is_nan_bits(bits), tl.where(floor >= 0x8000, float("inf"), float("-inf")), f)


@triton.jit
def _below_candidates(floor):
    """An ord16 at most every candidate's, whichever filter listed them at
    ``floor``: the pairs compare levels (the floor rounded down to even);
    the float compare takes -0 at a floor of +0, and +inf at a NaN floor."""
    return tl.maximum(tl.minimum(floor - 1, 0xFF80) & ~1, MIN_VALID)


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
    pos = line_positions(flag)
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


PART = tl.constexpr(BLOCK.value // 4)  # tokens a step of the 32-bit filter takes: its registers scale with it


@triton.jit
def _part_ids(block, part):
    """The local ids of part ``part`` of a block, as [PART / 4, 4]: a line
    of 4 fp32 is one 16-byte load, one thread's, so the sums and scans over
    a line stay in the thread, and the scan over lines needs no layout
    conversion through shared memory."""
    return block * BLOCK + part * PART + tl.arange(0, PART // 4)[:, None] * 4 + tl.arange(0, 4)[None, :]


@triton.jit
def _part_tokens(row_ptr, block, part, window):
    """The scores of part ``part`` of a block (``_part_ids``), NaN outside
    the row's valid tokens ``window`` = (start, end)."""
    start, end = window
    local = _part_ids(block, part)
    whole = (block * BLOCK >= start) & ((block + 1) * BLOCK <= end)
    return load_tokens(row_ptr + local, (local >= start) & (local < end), whole)


@triton.jit
def _block_parts(row_ptr, block, window):
    """A block's four parts' scores (``_part_tokens``), loaded at once."""
    return (_part_tokens(row_ptr, block, 0, window), _part_tokens(row_ptr, block, 1, window),
            _part_tokens(row_ptr, block, 2, window), _part_tokens(row_ptr, block, 3, window))


@triton.jit
def _filter_block32(scratch, parts, block, REGION: tl.constexpr, REGIONS_AT: tl.constexpr, LOWS_AT: tl.constexpr):
    """``_filter_block`` of 32-bit scores of bf16 or fp16 logits (fp32
    logits take ``_filter_pairs``; ``parts``: ``_block_parts``), a part a
    step: candidates by their words' scores (the fp32 order's top
    halves), their low halves beside their words; the probe's counts, and
    the highest and lowest low half of its tokens (its ties are exact only
    when they are all one fp32 value)."""
    floor = tl.load(scratch + FLOOR) - 0x8000  # folded, as the orders' top halves are
    probe = tl.load(scratch + PROBE)
    region = scratch + REGIONS_AT + block * REGION
    lows = _region_lows(scratch, LOWS_AT, 32) + block * REGION
    first = tl.zeros((), dtype=tl.int32)  # valid tokens | candidates << 16 (each < 2^16)
    second = tl.zeros((), dtype=tl.int32)  # >= probe | > probe << 16
    highest = tl.full((), -1, tl.int32)  # the probe's tokens' highest low half, and 0xFFFF less their lowest
    lowest = tl.full((), -1, tl.int32)
    for part in tl.static_range(len(parts)):
        local = _part_ids(block, part)
        order = folded32(parts[part])
        valid = order != NO_SCORE32
        folded = order >> 16  # the word's score less 0x8000
        candidate = valid & (folded >= floor)
        flag = candidate.to(tl.int32)
        pos = (first >> 16) + line_positions(flag)
        listed = candidate & (pos < REGION)
        tl.store(region + pos, packed_word(folded + 0x8000, local), mask=listed)
        tl.store(lows + pos, order, mask=listed)
        first += tl.sum(tl.sum(valid.to(tl.int32) | (flag << 16), axis=1), axis=0)
        if probe != 0:
            reach = valid & (folded >= probe - 0x8000)
            above = valid & (folded > probe - 0x8000)
            second += tl.sum(tl.sum(reach.to(tl.int32) | (above.to(tl.int32) << 16), axis=1), axis=0)
            low = tl.where(reach & ~above, order & 0xFFFF, -1)
            highest = tl.maximum(highest, tl.max(tl.max(low, axis=1), axis=0))
            lowest = tl.maximum(lowest, tl.max(tl.max(tl.where(low >= 0, 0xFFFF - low, -1), axis=1), axis=0))
    counts = scratch + HEADER + block * COUNT_FIELDS
    tl.store(counts, first & 0xFFFF)
    tl.store(counts + 1, first >> 16)
    tl.store(counts + 2, second & 0xFFFF)
    tl.store(counts + 3, second >> 16)
    tl.store(counts + 4, highest)
    tl.store(counts + 5, lowest)


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
def _half_ids32(block, half):
    """The local ids of half a block of an fp32 row, as [HALF / 4, 4]: a
    thread loads 4 tokens, 16 bytes, at once."""
    return block * BLOCK + half * HALF + tl.arange(0, HALF // 4)[:, None] * 4 + tl.arange(0, 4)[None, :]


@triton.jit
def _half_bits32(row_ptr, block, half, start, end):
    """The fp32 bits (int32) of half a block of an fp32 row
    (``_half_ids32``), NaN outside the valid tokens [start, end)."""
    t = _half_ids32(block, half)
    whole = (block * BLOCK >= start) & ((block + 1) * BLOCK <= end)
    return load_tokens(row_ptr + t, (t >= start) & (t < end), whole).to(tl.int32, bitcast=True)


@triton.jit
def _half_keys32(bits, block, half):
    """``_half_pairs`` of an fp32 row, keyed from its bits
    (``_half_bits32``), as [HALF / 4, 2]: (int32 pairs of the top halves of
    the tokens' fp32 orders, the words' scores, and pairs of their low
    halves, both 0 for NaN, as ``_pair_keys`` keys; word ids; 1 for each
    NaN token, [HALF / 4, 4])."""
    nan = (bits & 0x7FFFFFFF) > 0x7F800000
    # ``keys.folded32`` ^ NO_SCORE32 (ord32, NaN at 0), written out: through folded32 the fp32 filter
    # compiles to 32 to 64 more instructions (sm_90), which the pushed lists' filter runs after its wait
    order = tl.where(nan, 0, bits ^ ((bits >> 31) | -0x80000000))
    even, odd = tl.split(tl.reshape(order, (HALF // 4, 2, 2)))  # adjacent tokens, in the thread
    keys = ((even >> 16) & 0xFFFF) | (odd & -0x10000)
    low = (even & 0xFFFF) | (odd << 16)
    w = tl.split(tl.reshape(_half_ids32(block, half), (HALF // 4, 2, 2)))[0] >> 1
    return keys, low, w, nan.to(tl.int32)


@triton.jit
def _pair_keys(pair):
    """(both tokens' ord16, 0 for a NaN; 1 in bit 0 or 16 for a NaN token)
    of int32 pairs of bf16 bits (``_pair_orders``): a half is NaN iff its
    magnitude bits pass 0x7F80 (adding 0x7F sets the half's top bit, and
    never carries out of it). At 0 a NaN lies below every floor and probe
    (each at least MIN_VALID)."""
    nan = (((pair & 0x7FFF7FFF) + 0x007F007F) >> 15) & 0x10001
    return _pair_orders(pair) & ~(nan * 0xFFFF), nan


@triton.jit
def _block_pairs(row_ptr, block, window, SCORE_BITS: tl.constexpr):
    """Both halves of a block, loaded at once, and what of them needs no
    floor: (the block's valid tokens, then (keys, word ids) of each half
    (``_half_pairs``, ``_pair_keys``), or with 32-bit scores (keys, low
    halves, word ids) of each (``_half_keys32``)); ``window``: the row's
    valid tokens (start, end). The filter calls it before it waits for the
    estimate, so that this work overlaps it."""
    start, end = window
    if SCORE_BITS == 32:
        # Both halves' loads are issued before either is keyed: keyed one after the other, the 128-register
        # cap let ptxas issue the second half's loads only after the first's data arrived (two round trips).
        bits = _half_bits32(row_ptr, block, 0, start, end)
        bits_2 = _half_bits32(row_ptr, block, 1, start, end)
        keys, low, w, nan = _half_keys32(bits, block, 0)
        keys_2, low_2, w_2, nan_2 = _half_keys32(bits_2, block, 1)
        halves = (BLOCK - tl.sum(tl.sum(nan + nan_2, axis=1), axis=0), keys, low, w, keys_2, low_2, w_2)
    else:
        pair, w = _half_pairs(row_ptr, block, 0, start, end)
        pair_2, w_2 = _half_pairs(row_ptr, block, 1, start, end)
        keys, nan = _pair_keys(pair)
        keys_2, nan_2 = _pair_keys(pair_2)
        nans = tl.sum(tl.sum(nan + nan_2, axis=1), axis=0)  # even and odd tokens' NaNs, 16 bits each
        halves = (BLOCK - (nans & 0xFFFF) - (nans >> 16), keys, w, keys_2, w_2)
    return halves


@triton.jit
def _filter_half(region, lows, order, low, w, kept, level_floor, probe, REGION: tl.constexpr):
    """One half block of ``_filter_pairs``: its candidates' words from slot
    ``kept`` of the region (with 32-bit scores their low halves ``low``,
    from slot ``kept`` of ``lows``; else both None); returns (kept, probe
    counts, the highest low half of the probe's tokens and 0xFFFF less
    their lowest, -1 for none or 16-bit scores) with the half's added.
    Both tokens of a word at once (``order``: their keys, ``_pair_keys``):
    a candidate iff its level (ord16 >> 1) reaches the floor's
    (``level_floor``: (0x8000 - (floor >> 1)) in each half; the sum sets
    the half's top bit iff it does, and never carries out of it). The
    probe counts (``_probe_counts``): tokens whose level reaches (probe +
    1) >> 1, and tokens equal to the probe."""
    take = (((order >> 1) & 0x7FFF7FFF) + level_floor) & -0x7FFF8000  # bits 15, 31: even, odd taken
    take_even = (take >> 15) & 1
    taken = take_even + ((take >> 31) & 1)
    candidates = tl.sum(tl.sum(taken, axis=1), axis=0)
    second = tl.zeros((), dtype=tl.int32)
    highest = tl.full((), -1, tl.int32)
    lowest = tl.full((), -1, tl.int32)
    if probe != 0:
        reached = (((order >> 1) & 0x7FFF7FFF) + (0x8000 - ((probe + 1) >> 1)) * 0x10001) & -0x7FFF8000
        other = order ^ (probe * 0x10001)  # a half is 0 iff it is the probe
        equal = ~(((other & 0x7FFF7FFF) + 0x7FFF7FFF) | other) & -0x7FFF8000  # bits 15, 31: a half is 0
        # per line (4 words): a byte each for the even and odd tokens' two counts, then folded to 16-bit fields
        line = tl.sum(((reached >> 15) & 0x10001) | (((equal >> 15) & 0x10001) << 8), axis=1)
        line = (line & 0xFFFF) + ((line >> 16) & 0xFFFF)  # the even and odd tokens' bytes added
        second = tl.sum((line & 0xFF) | ((line & 0xFF00) << 8), axis=0)
        if low is not None:
            low_even = tl.where((equal & 0x8000) != 0, low & 0xFFFF, -1)
            low_odd = tl.where(equal < 0, (low >> 16) & 0xFFFF, -1)
            highest = tl.max(tl.max(tl.maximum(low_even, low_odd), axis=1), axis=0)
            lowest = tl.max(tl.max(tl.maximum(tl.where(low_even >= 0, 0xFFFF - low_even, -1),
                                              tl.where(low_odd >= 0, 0xFFFF - low_odd, -1)), axis=1), axis=0)
    pos = kept + line_positions(taken)
    keep_even = take_even != 0
    keep_odd = take < 0
    if REGION < BLOCK:  # a block with more candidates than its region keeps its first
        keep_even = keep_even & (pos < REGION)
        keep_odd = keep_odd & (pos + take_even < REGION)
    id_even = 0xFFFF - ((2 * w) & 0xFFFF)
    tl.store(region + pos, (order << 16) | id_even, mask=keep_even)
    tl.store(region + pos + take_even, (order & -0x10000) | (id_even - 1), mask=keep_odd)
    if lows is not None:
        tl.store(lows + pos, low, mask=keep_even)
        tl.store(lows + pos + take_even, low >> 16, mask=keep_odd)
    return kept + candidates, second, highest, lowest


@triton.jit
def _filter_pairs(scratch, pairs, block, REGION: tl.constexpr, REGIONS_AT: tl.constexpr, LOWS_AT: tl.constexpr,
                  SCORE_BITS: tl.constexpr):
    """``_filter_block`` over a block read as int32 pairs of tokens
    (``_block_pairs``: of bf16, or of fp32 scores' top halves with their
    low halves beside them, as ``_filter_block32`` writes them), both
    tokens of a word at once (``_filter_half``), the scans over pairs, half
    a block at a time (each half loaded before either is filtered). The
    floor is compared on levels: the candidates are the valid tokens of
    ord16 >= floor rounded down to even (the estimate's floors are even but
    for MIN_VALID, and every valid token reaches that)."""
    level_floor = (0x8000 - (tl.load(scratch + FLOOR) >> 1)) * 0x10001
    probe = tl.load(scratch + PROBE)
    region = scratch + REGIONS_AT + block * REGION
    if SCORE_BITS == 32:
        valid, first_keys, first_low, first_w, second_keys, second_low, second_w = pairs
        lows = _region_lows(scratch, LOWS_AT, 32) + block * REGION
    else:
        valid, first_keys, first_w, second_keys, second_w = pairs
        first_low, second_low, lows = None, None, None
    kept, second, highest, lowest = _filter_half(region, lows, first_keys, first_low, first_w, 0, level_floor, probe,
                                                 REGION)
    kept, second_2, highest_2, lowest_2 = _filter_half(region, lows, second_keys, second_low, second_w, kept,
                                                       level_floor, probe, REGION)
    reach, above = _probe_counts(second + second_2, probe)
    counts = scratch + HEADER + block * COUNT_FIELDS
    tl.store(counts, valid)
    tl.store(counts + 1, kept)
    tl.store(counts + 2, reach)
    tl.store(counts + 3, above)
    if SCORE_BITS == 32:
        tl.store(counts + 4, tl.maximum(highest, highest_2))
        tl.store(counts + 5, tl.maximum(lowest, lowest_2))


@triton.jit
def _probe_counts(fields, probe):
    """(tokens >= probe, tokens > probe) from ``fields``: the tokens whose
    level reaches (probe + 1) >> 1 (bits 0-15) and those equal to the probe
    (bits 16-31). An even probe is the lowest score of its level, an odd
    one the highest: the level count is the tokens >= an even probe, or >
    an odd one."""
    level_count = fields & 0xFFFF
    equal = fields >> 16
    odd = (probe & 1) != 0
    return level_count + tl.where(odd, equal, 0), level_count - tl.where(odd, 0, equal)


@any_width
def filter_kernel(scratch_ptr, rows, width_limit, REGION: tl.constexpr, REGIONS_AT: tl.constexpr,
                  LOWS_AT: tl.constexpr, LIST: tl.constexpr, PAIRS: tl.constexpr, PDL: tl.constexpr,
                  SCORE_BITS: tl.constexpr):
    """One read of the block: its counts and its candidates' words, in
    order, to its region (the first REGION of them: a block with more has
    more candidates than any row that is settled from them). PAIRS: rows
    read two tokens a word (``_filter_pairs``): bf16, or fp32 with 32-bit
    scores."""
    logits_ptr, row_starts_ptr, row_ends_ptr, sat_ptr, logits_stride, scratch_stride, rank = rows
    block = tl.program_id(0)
    row = tl.program_id(1).to(tl.int64)
    scratch = scratch_ptr + row * scratch_stride
    window = row_window(row_starts_ptr, row_ends_ptr, row, width_limit)
    if LIST:  # only the saturated rows, known once the select has run
        after_prior_kernel(PDL)
        if row_target(row, sat_ptr, rank, 1, 1, LIST, SCORE_BITS)[0]:
            if PAIRS:
                _filter_pairs(scratch, _block_pairs(logits_ptr + row * logits_stride, block, window, SCORE_BITS),
                              block, REGION, REGIONS_AT, LOWS_AT, SCORE_BITS)
            elif SCORE_BITS == 32:
                _filter_block32(scratch, _block_parts(logits_ptr + row * logits_stride, block, window), block,
                                REGION, REGIONS_AT, LOWS_AT)
            else:
                x, local = _block_tokens(logits_ptr, row, logits_stride, block, window)
                _filter_block(scratch, x, local, block, REGION, REGIONS_AT)
    elif PAIRS:
        # The logits and row ends were written before the estimate, which
        # waited for them before this kernel could launch: the block is read
        # while the estimate still runs, and only its floor waits for it.
        pairs = _block_pairs(logits_ptr + row * logits_stride, block, window, SCORE_BITS)
        after_prior_kernel(PDL)
        _filter_pairs(scratch, pairs, block, REGION, REGIONS_AT, LOWS_AT, SCORE_BITS)
    elif SCORE_BITS == 32:  # read while the estimate runs, as the pairs are
        parts = _block_parts(logits_ptr + row * logits_stride, block, window)
        after_prior_kernel(PDL)
        _filter_block32(scratch, parts, block, REGION, REGIONS_AT, LOWS_AT)
    else:
        x, local = _block_tokens(logits_ptr, row, logits_stride, block, window)
        after_prior_kernel(PDL)
        _filter_block(scratch, x, local, block, REGION, REGIONS_AT)


# ------------------------------------------------------------------ settle


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
def _write_block(out_row, lows, logits_ptr, row, logits_stride, block, window, threshold, take, offset,
                 N: tl.constexpr, PLANES: tl.constexpr, SCORE_BITS: tl.constexpr):
    """The block's tokens above the threshold (a ``token_order``) and its
    first ``take`` threshold ties, in order, into the packed row from slot
    ``offset`` (``lows``: where its low halves go, 32-bit scores). Returns
    (tokens written, threshold ties seen). ``window``: the row's valid
    tokens (start, end)."""
    x, local = _block_tokens(logits_ptr, row, logits_stride, block, window)
    order = token_order(x, SCORE_BITS)
    valid = order != no_order(SCORE_BITS)
    tie = valid & (order == threshold)
    ties = tl.sum(tl.sum(tie.to(tl.int32), axis=1), axis=0)
    keep = valid & (order > threshold)
    if take >= ties:
        keep = keep | tie
    elif take > 0:  # the block holds the row's last kept tie
        keep = keep | (tie & (line_positions(tie.to(tl.int32)) < take))
    keep_i = keep.to(tl.int32)
    store_words(out_row, offset + line_positions(keep_i), order, local, keep, N, PLANES, lows)
    return tl.sum(tl.sum(keep_i, axis=1), axis=0), ties


@triton.jit
def _write_span(out_row, lows, logits_ptr, row, logits_stride, span, blocks, window, threshold, quota, offset,
                ties_before, N: tl.constexpr, PLANES: tl.constexpr, SPAN: tl.constexpr, SCORE_BITS: tl.constexpr):
    """The span's blocks' kept tokens, in order, from slot ``offset``; the
    row's first ``quota`` threshold ties are kept, ``ties_before`` of them
    lie before the span; each block's counts come from its own read.
    Returns the slot after the last written."""
    for j in range(SPAN):
        block = span * SPAN + j
        if block < blocks:
            written, ties = _write_block(out_row, lows, logits_ptr, row, logits_stride, block, window, threshold,
                                         tl.maximum(quota - ties_before, 0), offset, N, PLANES, SCORE_BITS)
            offset += written
            ties_before += ties
    return offset


@triton.jit
def _region_lows(scratch, LOWS_AT: tl.constexpr, SCORE_BITS: tl.constexpr):
    """The regions' low halves (int32, slot for slot with their words) with
    32-bit scores; None with 16-bit ones."""
    if SCORE_BITS == 32:
        lows = scratch + LOWS_AT
    else:
        lows = None
    return lows


@triton.jit
def _region_token(word, block, region_lows, index, mask):
    """(local id, order) of candidate words (``keys.packed_word``) of block
    ``block``'s region: the word holds the id's low 16 bits, inverted; the
    block gives the others (a block never straddles 2^16). The order is the
    word's ord16, or with ``region_lows`` (32-bit scores) and the low half
    at ``index`` the fp32 order (``token_order``; an empty word's,
    NO_SCORE32, when ``mask`` is off). Low halves are read from L2: the
    radix lists' are written by other programs of the kernel."""
    local = ((block * BLOCK) & ~0xFFFF) | (0xFFFF - (word & 0xFFFF))
    order = (word >> 16) & 0xFFFF
    if region_lows is not None:
        low = tl.load(region_lows + index, mask=mask, other=0, cache_modifier=".cg")
        order = fp32_order(order, low.to(tl.int32) & 0xFFFF)
    return local, order


@triton.jit
def _copy_region(out_row, lows, regions, region_lows, block, count, offset, N: tl.constexpr, PLANES: tl.constexpr,
                 REGION: tl.constexpr):
    """A block's first ``count`` candidate words (and low halves), read from
    its region (in order), into slots ``offset`` on of a packed row."""
    first = block * REGION
    for start in tl.static_range(0, REGION, 1024):
        i = start + tl.arange(0, 1024)
        copied = i < count
        local, order = _region_token(tl.load(regions + first + i, mask=copied, other=0), block, region_lows, first + i,
                                     copied)
        store_words(out_row, offset + i, order, local, copied, N, PLANES, lows)


@triton.jit
def _write_counted_span(out_row, lows, regions, region_lows, logits_ptr, row, logits_stride, span, blocks, window,
                        threshold, quota, counts, N: tl.constexpr, PLANES: tl.constexpr, BLOCKS_P2: tl.constexpr,
                        REGION: tl.constexpr, SPAN: tl.constexpr, SCORE_BITS: tl.constexpr):
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
                    _copy_region(out_row, lows, regions, region_lows, block, count, offset, N, PLANES, REGION)
                else:
                    _write_block(out_row, lows, logits_ptr, row, logits_stride, block, window, threshold,
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
    return _region_token(tl.load(regions + index, mask=valid, other=0), block, region_lows, index, valid)


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
        lowest = tl.where(total >= N, fp32_order(_below_candidates(floor), 0), NO_SCORE32)
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
        lowest = tl.where(total >= N, _below_candidates(floor), 0)  # fewer: every one is kept
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
        region_lows = _region_lows(scratch, LOWS_AT, SCORE_BITS)
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
            threshold, quota = _span_threshold(logits_ptr, row, logits_stride, span, blocks, window, N, SPAN,
                                               SCORE_BITS)
            start = tl.zeros((), dtype=tl.int32)
            end = _write_span(scratch + REGIONS_AT + own, own_lows, logits_ptr, row, logits_stride, span, blocks,
                              window, threshold, quota, start, start, N, 0, SPAN, SCORE_BITS)
            tl.store(scratch + SPANS_KEPT_AT + span, end)
            if last_to_arrive(scratch + RADIX_ARRIVALS, spans):
                threshold, quota = _lists_threshold(scratch + REGIONS_AT, region_lows, scratch + SPANS_KEPT_AT, spans,
                                                    N, REGION, SPAN, SCORE_BITS)
                _compact_spans(out_ptr + offset, lows, scratch + REGIONS_AT, region_lows, scratch + SPANS_KEPT_AT,
                               spans, threshold, quota, N, PLANES, REGION, SPAN, SCORE_BITS)
                _publish(out_ptr, offset, row, peers, sat_ptr, rank, N, PLANES, WORLD, LIST, KAPPA_SHIFT,
                         LIBRARY_PEERS, SCORE_BITS)


# ------------------------------------------------------------------- radix


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
    local, order = _region_token(word, s * SPAN, region_lows, index, inside)
    return local, order, inside


@triton.jit
def _compact_spans(out_row, lows, regions, region_lows, kept_ptr, spans, threshold, quota, N: tl.constexpr,
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
def _span_threshold(logits_ptr, row, logits_stride, span, blocks, window, N: tl.constexpr, SPAN: tl.constexpr,
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
                    x = _block_tokens(logits_ptr, row, logits_stride, block, window)[0]
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
def _lists_threshold(regions, region_lows, kept_ptr, spans, N: tl.constexpr, REGION: tl.constexpr,
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


# ---------------------------------------------------------------- launcher


def launches(out, scratch, rows_arg, peers_arg, limit: int, *, n: int, max_local_len: int, pairs: bool,
             target: dict, peers: dict) -> list[Launch]:
    """The three launches over ``rows_arg``'s rows (``pack.pipeline`` builds
    the arguments; ``target`` holds SCORE_BITS), each compiled for rows of
    up to ``max_local_len`` tokens; ``pairs``: rows read two tokens a word
    (bf16; fp32 with 32-bit scores)."""
    rows = rows_arg[0].shape[0]
    words = out.shape[-1]
    listing, pdl, score_bits = target["LIST"], target["PDL"], target["SCORE_BITS"]
    p = plan(n, max_local_len, score_bits)
    blocks = triton.cdiv(max(limit, 1), BLOCK.value)
    spans = triton.cdiv(blocks, p.span)
    return [
        Launch(estimate_kernel, (rows,), (out, scratch, rows_arg, limit),
               dict(N=n, WORDS=words, SLOTS=target["SLOTS"], LIST=listing, GROUPS=p.groups, ROOM=p.room, PDL=pdl,
                    SCORE_BITS=score_bits), ESTIMATE_WARPS),
        Launch(filter_kernel, (blocks, rows), (scratch, rows_arg, limit),
               dict(REGION=p.region, REGIONS_AT=p.regions_at, LOWS_AT=p.lows_at, LIST=listing,
                    PAIRS=pairs, PDL=pdl, SCORE_BITS=score_bits), FILTER_WARPS,
               FILTER32_REGISTERS if score_bits == 32 else None),
        Launch(finish_kernel, (rows, spans), (out, scratch, rows_arg, limit, peers_arg),
               dict(target, REGION=p.region, BLOCKS_P2=p.blocks_p2, SPANS_KEPT_AT=p.spans_kept_at,
                    REGIONS_AT=p.regions_at, LOWS_AT=p.lows_at, ROOM=p.room, SPAN=p.span, **peers),
               max(SPAN_WARPS, p.room // 512)),
    ]

"""The spread pipeline's first kernel (``spread.py``), a program per row:
the row's floor and probe, from a sample, into its scratch (FLOOR, PROBE),
its radix arrivals zeroed and its output row zeroed. Precondition: the
row's scores were written before the prior kernel ended. The floor is
below the row's n-th score with four standard deviations to spare (a
miss costs the radix steps, never a wrong row); the probe, where many
sampled tokens tie, is a score the filter counts exactly."""

import triton
import triton.language as tl

from .keys import MIN_VALID, near_bin, radix_boundary
from .rows import any_width, row_target, row_window, token_order, word_score, zero_row_from
from .spread import FLOOR, GROUP, PROBE, RADIX_ARRIVALS, SAMPLE_RANK, SIGMAS
from .sync import after_prior_kernel

SAMPLE_BINS = tl.constexpr(128)  # the fine histogram: its cost grows with its bins, its reach too
COARSE_BINS = tl.constexpr(64)  # its coarser levels' (of 32 scores they reach 16 binades; of 2048, every score)



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


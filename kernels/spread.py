"""The local top-n of calls wider than ``pack.SHORT_ROWS``: three kernels,
in which only the estimate is a program per row, and it reads a sample;
every step that reads the row is spread over its blocks of BLOCK tokens,
so no program walks a row:

1. ``estimate.py`` (a program per row): the row's n-th score is expected at
   rank r of a sample of groups of GROUP adjacent tokens spread over the
   row. The ``floor`` is the sample's score at rank r_lo, four standard
   deviations of r further down, the ``probe`` its score at rank r; when
   many sampled tokens tie on the floor's score, that score is the probe
   and the floor moves above it. A row of at most ROOM tokens needs no
   estimate: every valid token is a candidate. Zeroes the output row.
2. ``filter.py`` (a program per block): each block counts its valid tokens,
   those >= floor (the candidates), >= probe and > probe, and writes its
   candidates' words, in order, to its region of the scratch.
3. ``finish.py`` (a program per span of up to MAX_SPAN blocks) settles each
   row from the counts summed over its blocks, the same way in every
   program:
   - listed: n <= candidates <= ROOM, or every valid token is one. The first
     span's program selects from them in registers, a count a bit.
   - exact: the probe is the threshold (fewer than n above it, n at or
     above it), or every valid token is taken. Each block with tokens to
     keep writes them at its place in the row, from the earlier counts:
     copied from its region when they are its candidates, else re-read.
   - radix (``radix.py``): neither (the sample misled). Each span takes its
     own top-n, a superset of its share of the row's, by histograms of a
     byte of its scores each (its blocks re-read from L2 for each) and
     writes it to its region; the last span to arrive takes the row's
     threshold from histograms of those lists and compacts them into the
     row.
A row that several spans write is published (pushed to every peer, its flag
raised) by the last span to finish it. Whatever the path, the output is
``reference.pack``'s, bit for bit: the estimate decides how much work is
done, never what is written.

This module holds what the stages share: the plan (the compile-time shape
of a pipeline), the row's scratch layout, and the block and region helpers.
``pack.pipeline`` builds the launches.

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

from .rows import fp32_order, line_positions, load_tokens, store_words, token_order, no_order

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



# ------------------------------------------------------------- the stages'


@triton.jit
def block_tokens(logits_ptr, row, logits_stride, block, window):
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
def region_lows_at(scratch, LOWS_AT: tl.constexpr, SCORE_BITS: tl.constexpr):
    """The regions' low halves (int32, slot for slot with their words) with
    32-bit scores; None with 16-bit ones."""
    if SCORE_BITS == 32:
        lows = scratch + LOWS_AT
    else:
        lows = None
    return lows


@triton.jit
def region_token(word, block, region_lows, index, mask):
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
def write_block(out_row, lows, logits_ptr, row, logits_stride, block, window, threshold, take, offset,
                 N: tl.constexpr, PLANES: tl.constexpr, SCORE_BITS: tl.constexpr):
    """The block's tokens above the threshold (a ``token_order``) and its
    first ``take`` threshold ties, in order, into the packed row from slot
    ``offset`` (``lows``: where its low halves go, 32-bit scores). Returns
    (tokens written, threshold ties seen). ``window``: the row's valid
    tokens (start, end)."""
    x, local = block_tokens(logits_ptr, row, logits_stride, block, window)
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

"""Pack: a row's local top-N by (score desc, local id asc) as a packed row.

The exact walk (``pack_row``): a 256-bin histogram of the high byte of
ord16, a histogram of the low byte inside the boundary bucket (together they
fix the threshold score and how many of its ties are taken), then an ordered
compaction that writes the kept tokens by ascending local id, ties at the
threshold lowest id first. A saturated rank also builds its pushed list so.

The pack itself selects from a short candidate list, not the row:
  1. estimate (a program per row): over groups of 8 adjacent tokens spread
     evenly over the row (a 16-byte load each), a score ``tau`` that, by
     the groups' top scores, comfortably more than N tokens reach;
  2. filter (a program per block of the row): tokens >= tau are candidates
     (bf16 compared as floats, 16-byte loads); each block writes their
     words (bf16 bits and low id bits), in order, to its own region of the
     scratch, and their count;
  3. finish (a program per row): the running sums of the counts place each
     region's candidates in the row's list (a binary search per slot). When
     the candidates hold the row's top-N (at least N of them, or tau = 0 so
     that every valid token is one; not more than the room), the threshold
     and the compaction run over them, held in registers (or walked tile by
     tile when more than a tile came); otherwise the exact walk runs over the
     whole row. Either way the output is ``reference.pack``'s, bit for bit:
     tau decides how much work is done, never what is written. In a merge by
     push, the finish then stores the row into every rank's gather buffer
     and raises its flags.
A tile in registers (the groups' tops, the candidates) takes its threshold from
one histogram of each score's level (two scores a bin) below the tile's
top level and a count of the boundary level's upper score; the byte
histograms run only when the boundary lies 254 or more steps down. Only the
filter reads the whole row, once; the finish reads only the candidates'
words, not the logits."""

import math

import torch
import triton
import triton.language as tl

from .exchange import push_row
from .keys import NEAR_BINS, bf16_bits, is_nan_bits, ord16, radix_boundary, score_bits
from .sync import after_prior_kernel, dependent_launch


@triton.jit
def _scores(in_row, local, inside):
    """(ord16 score, valid: inside and not NaN) of the tokens ``local``."""
    bits = score_bits(in_row + local, inside)
    return ord16(bits), inside & ~is_nan_bits(bits)


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
def _candidates(scratch, slot, total, counts, ends, BLOCKS: tl.constexpr, BLOCKS_P2: tl.constexpr,
                BLOCK: tl.constexpr):
    """(local id, ord16 score, valid) of candidates ``slot`` (in ascending
    local id) of a row whose blocks wrote their candidates' packed words to
    their own regions: a binary search over the blocks' inclusive ends
    (``ends``, held in registers with the ``counts``; BLOCKS_P2 entries,
    padded with the total) finds the block of each slot, the first whose end
    is past it. A word holds the score's bf16 bits and the id's low 16 bits
    (as a packed word's, inverted); the block gives the id's other bits (a
    block never straddles 2^16)."""
    block = tl.zeros(slot.shape, dtype=tl.int32)
    for k in tl.static_range(20):  # halving steps BLOCKS_P2 / 2, ..., 1 (compile-time)
        if (BLOCKS_P2 >> (k + 1)) > 0:
            probe = block + (BLOCKS_P2 >> (k + 1))
            block = tl.where(tl.gather(ends, probe - 1, 0) <= slot, probe, block)
    start = tl.gather(ends, block, 0) - tl.gather(counts, block, 0)
    valid = slot < total
    word = tl.load(scratch + 1 + BLOCKS + block.to(tl.int64) * BLOCK + slot - start, mask=valid, other=0)
    local = ((block * BLOCK) & ~0xFFFF) | (0xFFFF - (word & 0xFFFF))
    return local, ord16((word >> 16) & 0xFFFF), valid


@triton.jit
def _walk_tokens(in_row, scratch, counts, ends, start, count, FROM_LIST: tl.constexpr, BLOCKS: tl.constexpr,
                 BLOCKS_P2: tl.constexpr, REGION: tl.constexpr, BLOCK: tl.constexpr):
    """Local ids of tokens [start, start + BLOCK) of a walk over ``count``
    tokens (the candidates in ``scratch``'s block regions, or the row
    itself), and their (ord16 score, valid)."""
    i = start + tl.arange(0, BLOCK)
    if FROM_LIST:
        local, score, valid = _candidates(scratch, i, count, counts, ends, BLOCKS, BLOCKS_P2, REGION)
    else:
        local = i
        score, valid = _scores(in_row, local, i < count)
    return local, score, valid


@triton.jit
def _walk_histogram(in_row, scratch, counts, ends, count, high_byte, SELECT_LOW: tl.constexpr, FROM_LIST: tl.constexpr,
                    BLOCKS: tl.constexpr, BLOCKS_P2: tl.constexpr, REGION: tl.constexpr, BLOCK: tl.constexpr):
    hist = tl.zeros((256,), dtype=tl.int32)
    start = 0
    while start < count:  # a while loop: the bound is a run-time scalar
        _, score, valid = _walk_tokens(in_row, scratch, counts, ends, start, count, FROM_LIST, BLOCKS, BLOCKS_P2,
                                       REGION, BLOCK)
        hist += _histogram(score, valid, high_byte, SELECT_LOW)
        start += BLOCK
    return hist


@triton.jit
def _threshold(high_bucket, above_high, low, need):
    """(threshold ord16, ties of it taken) from the high byte's boundary
    (``radix_boundary`` of its histogram) and the low byte's histogram
    inside that bucket. With fewer than ``need`` elements every one is
    taken: threshold 0 is below any valid score."""
    low_bucket, above_low, _ = radix_boundary(low, need - above_high)
    enough = high_bucket >= 0
    threshold = tl.where(enough, high_bucket * 256 + low_bucket, 0)
    return threshold, tl.where(enough, need - above_high - above_low, 0)


@triton.jit
def _tile_threshold(score, valid, need):
    """(threshold ord16, ties of it taken) of the ``need`` largest valid
    scores of one tile held in registers. One histogram of how far each
    score's level (the score without its lowest bit, as in the select's
    ``kth_largest``) lies below the top level (bin NEAR_BINS - 1 - distance,
    bin 0 for NEAR_BINS - 1 levels or more): a top-N of bf16 scores rarely
    spans 254 steps. Then a count of the boundary level's upper score splits it. Only when
    the boundary falls in bin 0 do the two byte histograms run."""
    level = score >> 1
    top = tl.max(tl.where(valid, level, 0), axis=0)
    near = NEAR_BINS - 1 - tl.minimum(tl.maximum(top - level, 0), NEAR_BINS - 1)
    bucket, above, _ = radix_boundary(tl.histogram(near, NEAR_BINS, mask=valid), need)
    upper = (top - (NEAR_BINS - 1) + bucket) * 2 + 1
    ties_taken = need - above
    upper_count = tl.sum((valid & (score == upper)).to(tl.int32), axis=0)
    threshold = tl.where(ties_taken <= upper_count, upper, upper - 1)
    ties_taken = tl.where(ties_taken <= upper_count, ties_taken, ties_taken - upper_count)
    if bucket == 0:
        high_bucket, above_high, _ = radix_boundary(_histogram(score, valid, 0, False), need)
        threshold, ties_taken = _threshold(high_bucket, above_high, _histogram(score, valid, high_bucket, True), need)
    elif bucket < 0:  # fewer than ``need``: every one is taken
        threshold = 0
        ties_taken = 0
    return threshold, ties_taken


@triton.jit
def _zero_row(out_row, WORDS: tl.constexpr, BLOCK: tl.constexpr):
    for start in tl.range(0, WORDS, BLOCK):
        offs = start + tl.arange(0, BLOCK)
        tl.store(out_row + offs, tl.zeros((BLOCK,), dtype=tl.int32), mask=offs < WORDS)


@triton.jit
def _walk(in_row, scratch, counts, ends, count, out_row, N: tl.constexpr, PLANES: tl.constexpr, FROM_LIST: tl.constexpr,
          BLOCKS: tl.constexpr, BLOCKS_P2: tl.constexpr, REGION: tl.constexpr, BLOCK: tl.constexpr):
    """Write the packed top-N of ``count`` tokens (the candidates, in
    ascending local id, or the row) to ``out_row``, in one program, BLOCK
    tokens at a time: two histogram passes, then the ordered compaction."""
    _zero_row(out_row, N + PLANES * (N // 32), BLOCK)
    tl.debug_barrier()
    high = _walk_histogram(in_row, scratch, counts, ends, count, 0, False, FROM_LIST, BLOCKS, BLOCKS_P2, REGION,
                           BLOCK)
    high_bucket, above_high, _ = radix_boundary(high, N)
    low = _walk_histogram(in_row, scratch, counts, ends, count, high_bucket, True, FROM_LIST, BLOCKS, BLOCKS_P2,
                          REGION, BLOCK)
    threshold, ties_taken = _threshold(high_bucket, above_high, low, N)
    kept = tl.zeros((), dtype=tl.int32)
    ties_seen = tl.zeros((), dtype=tl.int32)
    start = 0
    while start < count:
        local, score, valid = _walk_tokens(in_row, scratch, counts, ends, start, count, FROM_LIST, BLOCKS,
                                           BLOCKS_P2, REGION, BLOCK)
        kept, ties_seen = _compact(out_row, local, score, valid, threshold, ties_taken, kept, ties_seen, N, PLANES)
        start += BLOCK


@triton.jit
def pack_row(in_row, end, out_row, N: tl.constexpr, PLANES: tl.constexpr, BLOCK: tl.constexpr):
    """The exact walk over the whole row: the packed top-N of scores
    ``in_row[0:end]`` to ``out_row`` (N + PLANES * N / 32 int32 words)."""
    unused = tl.zeros((1,), dtype=tl.int32)
    _walk(in_row, in_row, unused, unused, end, out_row, N, PLANES, False, 1, 1, 1, BLOCK)


@triton.jit
def _compact(out_row, local, score, valid, threshold, ties_taken, kept, ties_seen,
             N: tl.constexpr, PLANES: tl.constexpr):
    """Write one tile's kept tokens from slot ``kept`` on, in tile order;
    ``ties_seen`` threshold ties came before the tile. Returns both updated."""
    is_tie = valid & (score == threshold)
    tie = is_tie.to(tl.int32)
    keep = (valid & (score > threshold)) | (is_tie & (ties_seen + tl.cumsum(tie, axis=0) - tie < ties_taken))
    keep_i = keep.to(tl.int32)
    pos = kept + tl.cumsum(keep_i, axis=0) - keep_i
    word = (score.to(tl.int64) << 16) | (0xFFFF - (local & 0xFFFF))
    tl.store(out_row + pos, word.to(tl.int32), mask=keep)
    for p in tl.static_range(PLANES):  # kept tokens of one tile may share a plane word
        bit = (local >> (16 + p)) & 1
        tl.atomic_or(out_row + N + p * (N // 32) + pos // 32, bit << (pos % 32),
                     mask=keep & (bit != 0), sem="relaxed")
    return kept + tl.sum(keep_i, axis=0), ties_seen + tl.sum(tie, axis=0)


@triton.jit
def _row_end(row_ends_ptr, row, width_limit):
    return tl.minimum(tl.maximum(tl.load(row_ends_ptr + row), 0), width_limit)


# Scratch per row (int32): [0] tau, [1, 1 + BLOCKS) candidates per block,
# then one region of BLOCK candidate words per block: bf16 bits << 16 and
# 0xFFFF - (id & 0xFFFF) (the block, a power of two up to 2^16, gives the
# id's other bits).


@triton.jit
def estimate_kernel(scratch_ptr, logits_ptr, row_ends_ptr, logits_stride, width_limit, scratch_stride,
                    N: tl.constexpr, GROUPS: tl.constexpr, TOPS: tl.constexpr, PDL: tl.constexpr):
    """tau of a row from GROUPS groups of 8 adjacent tokens (a thread loads
    a group at once), evenly spread over the row, or every group when that
    is the whole row: from the groups' top scores (TOPS), or from all their
    tokens (where N is so large a share of the row that most groups hold one
    of the top-N)."""
    after_prior_kernel(PDL)
    row = tl.program_id(0).to(tl.int64)
    end = _row_end(row_ends_ptr, row, width_limit)
    in_row = logits_ptr + row * logits_stride
    group = tl.arange(0, GROUPS).to(tl.int64)
    token = tl.arange(0, 8)[None, :]
    sampled = end > 8 * GROUPS
    if sampled:  # whole groups at 8-token boundaries: 16-byte loads, none past the end
        x = tl.load(in_row + ((group * end) // GROUPS // 8 * 8)[:, None] + token)
    else:
        local = group[:, None] * 8 + token
        x = _load_tokens(in_row + local, local < end, False)
    bits = bf16_bits(x)
    score = tl.where(is_nan_bits(bits), 0, ord16(bits))  # 0: no valid token
    # Over the whole row, the N-th largest value leaves at least N tokens at
    # or above it. Sampled, the row's top-N puts about ``expected`` values
    # in the sample (a group's top reaches the N-th score with probability
    # 1 - (1 - N / end)^8); asking for five (Poisson) standard deviations
    # more keeps rows whose sample promised too much, and so fall back to
    # the whole-row walk, rare.
    share = tl.minimum(N / tl.maximum(end, 1).to(tl.float32), 1.0)
    if TOPS:
        values = tl.max(score, axis=1)
        miss = (1.0 - share) * (1.0 - share)
        miss = miss * miss
        expected = GROUPS * (1.0 - miss * miss)
    else:
        values = tl.reshape(score, (GROUPS * 8,), can_reorder=True)
        expected = GROUPS * 8 * share
    need = tl.where(sampled, tl.ceil(expected + 5.0 * tl.sqrt(expected)).to(tl.int32) + 4, N)
    tau, _ = _tile_threshold(values, values != 0, need)
    tl.store(scratch_ptr + row * scratch_stride, tau)


@triton.jit
def _score_floor(tau):
    """The float f with {non-NaN x : x >= f} = {x : ord16(x) >= tau}, up to
    a monotone widening that keeps it a threshold set (-0 >= +0 is true,
    and a NaN pattern widens to an infinity), which is all the filter needs."""
    bits = tl.where(tau >= 0x8000, tau & 0x7FFF, ~tau & 0xFFFF)
    floor = (bits << 16).to(tl.float32, bitcast=True)
    return tl.where(is_nan_bits(bits), tl.where(tau >= 0x8000, float("inf"), float("-inf")), floor)


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
def _reaches(x, tau, floor):
    """(reached, bf16 bits << 16 as int32) of the scores ``x``: whether each
    scores at least ``tau`` (NaN never), and its bits as the high half of a
    word. bf16 is compared as a float against ``floor`` (a few instructions
    a token); fp32 goes through its bf16 rounding."""
    if x.dtype == tl.bfloat16:
        # Widened on the bits (a bf16 is the high half of its fp32): exact for
        # subnormals too, which the interpreter's bf16 conversion is not.
        wide = x.to(tl.int16, bitcast=True).to(tl.int32) << 16
        reached = wide.to(tl.float32, bitcast=True) >= floor
    else:
        bits = bf16_bits(x)
        reached = ~is_nan_bits(bits) & (ord16(bits) >= tau)
        wide = bits << 16
    return reached, wide


@triton.jit
def filter_kernel(scratch_ptr, logits_ptr, row_ends_ptr, logits_stride, width_limit, scratch_stride,
                  BLOCKS: tl.constexpr, BLOCK: tl.constexpr, PDL: tl.constexpr):
    """One read of the block: its candidates' words (bf16 bits and the local
    id's low 16 bits, so that the finish reads no logits), in order,
    to the block's own region, and their count (the finish finds where each
    region's candidates fall in the row's list). The block is held as
    [BLOCK / 8, 8]: each thread loads 8 tokens at once and numbers its
    candidates itself; one scan across the block's lines places them."""
    block = tl.program_id(0)
    row = tl.program_id(1).to(tl.int64)
    scratch = scratch_ptr + row * scratch_stride
    end = _row_end(row_ends_ptr, row, width_limit)
    local = block * BLOCK + tl.arange(0, BLOCK // 8)[:, None] * 8 + tl.arange(0, 8)[None, :]
    ptrs = logits_ptr + row * logits_stride + local
    # The logits and row ends were written before the estimate, which waited
    # for them before this kernel could launch: the block is read while the
    # estimate still runs, and only tau waits for it.
    if (block + 1) * BLOCK <= end:
        x = _load_tokens(ptrs, local < end, True)
    else:
        x = _load_tokens(ptrs, local < end, False)
    after_prior_kernel(PDL)
    tau = tl.load(scratch)
    candidate, wide = _reaches(x, tau, _score_floor(tau))
    flag = candidate.to(tl.int32)
    per_line = tl.sum(flag, axis=1)
    pos = (tl.cumsum(per_line, axis=0) - per_line)[:, None] + tl.cumsum(flag, axis=1) - flag
    tl.store(scratch + 1 + BLOCKS + block.to(tl.int64) * BLOCK + pos, wide | (~local & 0xFFFF), mask=candidate)
    tl.store(scratch + 1 + block, tl.sum(per_line, axis=0))


@triton.jit
def finish_kernel(out_ptr, scratch_ptr, logits_ptr, row_ends_ptr, logits_stride, width_limit, scratch_stride,
                  epochs_ptr, gather_ptrs, flag_ptrs, max_rows, rank,
                  N: tl.constexpr, PLANES: tl.constexpr, BLOCKS: tl.constexpr, BLOCKS_P2: tl.constexpr,
                  REGION: tl.constexpr, TILE: tl.constexpr, ROOM: tl.constexpr, ROW_BLOCK: tl.constexpr,
                  WORLD: tl.constexpr, PDL: tl.constexpr):
    """The row's packed top-N to ``out_row``; with WORLD > 0 also pushed to
    every rank's gather buffer and flagged (the push exchange's work, done
    here so that it costs no launch of its own)."""
    after_prior_kernel(PDL)
    row = tl.program_id(0).to(tl.int64)
    scratch = scratch_ptr + row * scratch_stride
    in_row = logits_ptr + row * logits_stride
    words: tl.constexpr = N + PLANES * (N // 32)
    out_row = out_ptr + row * words
    blocks = tl.arange(0, BLOCKS_P2)
    counts = tl.load(scratch + 1 + blocks, mask=blocks < BLOCKS, other=0)
    ends = tl.cumsum(counts, axis=0)
    total = tl.max(ends, axis=0)
    complete = (total <= ROOM) & ((total >= N) | (tl.load(scratch) == 0))
    if complete & (total <= TILE):  # the common case: loaded once, selected in registers
        local, score, valid = _candidates(scratch, tl.arange(0, TILE), total, counts, ends, BLOCKS, BLOCKS_P2,
                                          REGION)
        _zero_row(out_row, words, 1024)
        threshold, ties_taken = _tile_threshold(score, valid, N)
        tl.debug_barrier()
        zero = tl.zeros((), dtype=tl.int32)
        _compact(out_row, local, score, valid, threshold, ties_taken, zero, zero, N, PLANES)
    elif complete:  # more candidates than one tile: walk the list
        _walk(in_row, scratch, counts, ends, total, out_row, N, PLANES, True, BLOCKS, BLOCKS_P2, REGION, TILE)
    else:
        pack_row(in_row, _row_end(row_ends_ptr, row, width_limit), out_row, N, PLANES, ROW_BLOCK)
    if WORLD > 0:
        tl.debug_barrier()  # the whole row, plane bits included, is written before any thread reads it
        epoch = tl.load(epochs_ptr + row) + 1
        push_row(out_row, row, epoch, gather_ptrs, flag_ptrs, max_rows, rank, words, WORLD, 1024)


MAX_GROUPS = 2048  # group tops ranked: a histogram of at most 2048 values
MAX_TOKEN_GROUPS = 512  # tokens ranked: at most 4096
ESTIMATE_WARPS = 8
FILTER_BLOCK = 4096  # a power of two up to 2^16: the finish rebuilds ids from a candidate's block
FILTER_WARPS = 4
FINISH_WARPS = 8
ROW_BLOCK = 4096
MAX_TILE = 4096


def _token_share(reached: float, tops: bool) -> float:
    """The share of a row's tokens at or above a score that a share
    ``reached`` of the estimate's values (group tops, or tokens) reach."""
    return 1 - (1 - reached) ** 0.125 if tops else reached


def candidate_plan(local_topk: int, width: int) -> tuple[int, bool, int, int]:
    """(groups, tops, tile, room) for rows of ``width``: the groups of 8
    tokens the estimate reads and whether it ranks their top scores or all
    their tokens, the candidates the finish holds in registers at once, and
    how many a row may have before it falls back to the whole-row walk
    (between tile and room the finish walks them tile by tile). The
    finish's time follows its tile and the estimate's its histogram, so the
    plan is the smallest tile that holds a row's candidates with four
    standard deviations to spare, then the fewest values ranked.
    Sampled, tau is the need-th largest value (``estimate_kernel``); about
    need + 4 sqrt(need) of the values reach it at most, so a share f of the
    groups' tops means a share 1 - (1 - f)^(1/8) of the tokens, and of all
    their tokens, f of them. Read whole, tau is the N-th largest value: of
    group tops, a group seldom holds a second token that high. Tiles are at
    least 256 (a token per thread) and at most MAX_TILE (registers)."""
    share = min(local_topk / max(width, 1), 1.0)
    best = None
    for tops in (True, False):
        groups = 256
        while groups <= (MAX_GROUPS if tops else MAX_TOKEN_GROUPS):
            values = groups if tops else 8 * groups
            whole = 8 * groups >= width
            if whole:
                candidates = min(2 * width * _token_share(min(8 * share, 1.0) if tops else share, tops), width)
            else:
                expected = values * ((1 - (1 - share) ** 8) if tops else share)
                need = math.ceil(expected + 5 * math.sqrt(expected)) + 4
                candidates = width * _token_share(min((need + 4 * math.sqrt(need)) / values, 1.0), tops)
            tile = triton.next_power_of_2(max(math.ceil(candidates), 256))
            if best is None or (tile, values) < (best[2], best[3]):
                best = groups, tops, tile, values
            if whole:
                break
            groups *= 2
    tile = min(best[2], MAX_TILE)
    return best[0], best[1], tile, 2 * tile


def _warps(least: int, tile: int) -> int:
    """Warps of a program that holds ``tile`` tokens in registers: at least
    ``least``, and enough that a thread holds at most 8 (the finish at a
    tile of 4096 ran about 1 us faster with 16 warps than with 8 in the
    constants sweep of commit 80a3d99, and does not spill)."""
    return max(least, tile // 256)


def _estimate_warps(groups: int) -> int:
    """Warps of the estimate: a thread loads at most 4 groups."""
    return max(ESTIMATE_WARPS, groups // 128)


def _planes(out, local_topk: int) -> int:
    return (out.shape[1] - local_topk) // (local_topk // 32)


def pack(out, logits, row_ends, *, local_topk: int, max_local_len: int, push=None) -> None:
    """out: int32 [T, N + P*N/32] (P read off its width); logits: [T, S]
    bf16/fp32 (stride(1) == 1); row_ends: int32 [T]. ``push``, when given,
    is (epochs, gather_ptrs, flag_ptrs, max_rows, rank, world_size) as
    ``exchange.push_rows`` takes them (every peer with an address): the
    finish then pushes each row and raises its flags."""
    rows, width = logits.shape
    if rows == 0:
        return
    limit = min(width, max_local_len)
    blocks = max(1, triton.cdiv(limit, FILTER_BLOCK))
    groups, tops, tile, room = candidate_plan(local_topk, limit)
    scratch = torch.empty((rows, 1 + blocks + blocks * FILTER_BLOCK), dtype=torch.int32, device=out.device)
    args = (logits, row_ends, logits.stride(0), limit, scratch.stride(0))
    pdl = dependent_launch(out.device)
    estimate_kernel[(rows,)](scratch, *args, N=local_topk, GROUPS=groups, TOPS=tops,
                             num_warps=_estimate_warps(groups), **pdl)
    filter_kernel[(blocks, rows)](scratch, *args, BLOCKS=blocks, BLOCK=FILTER_BLOCK, num_warps=FILTER_WARPS,
                                  **pdl)
    epochs, gather_ptrs, flag_ptrs, max_rows, rank, world_size = push or (row_ends, row_ends, row_ends, 0, 0, 0)
    finish_kernel[(rows,)](out, scratch, *args, epochs, gather_ptrs, flag_ptrs, max_rows, rank, N=local_topk,
                           PLANES=_planes(out, local_topk), BLOCKS=blocks, BLOCKS_P2=triton.next_power_of_2(blocks),
                           REGION=FILTER_BLOCK, TILE=tile, ROOM=room, ROW_BLOCK=ROW_BLOCK, WORLD=world_size,
                           num_warps=_warps(FINISH_WARPS, tile), **pdl)


@triton.jit
def pack_indices_kernel(out_ptr, logits_ptr, idx_ptr, row_ends_ptr, logits_stride, idx_stride,
                        width_limit, N: tl.constexpr, PLANES: tl.constexpr, GROUPS: tl.constexpr,
                        PDL: tl.constexpr):
    """Slot j of the output keeps candidate j of ``idx``; 32 slots a group,
    GROUPS groups per step, so each plane word is built in registers."""
    after_prior_kernel(PDL)
    row = tl.program_id(0).to(tl.int64)
    words: tl.constexpr = N + PLANES * (N // 32)
    end = _row_end(row_ends_ptr, row, width_limit)
    out_row = out_ptr + row * words
    lane = tl.arange(0, 32)
    for g0 in tl.range(0, N // 32, GROUPS):
        group = g0 + tl.arange(0, GROUPS)
        slot = group[:, None] * 32 + lane[None, :]
        in_range = (group < N // 32)[:, None] & (lane >= 0)[None, :]
        local = tl.load(idx_ptr + row * idx_stride + slot, mask=in_range, other=-1)
        inside = (local >= 0) & (local < end)
        bits = score_bits(logits_ptr + row * logits_stride + tl.where(inside, local, 0), inside)
        present = inside & ~is_nan_bits(bits)
        word = (ord16(bits).to(tl.int64) << 16) | (0xFFFF - (local & 0xFFFF))
        tl.store(out_row + slot, tl.where(present, word, 0).to(tl.int32), mask=in_range)
        for p in tl.static_range(PLANES):
            bit = tl.where(present, (local >> (16 + p)) & 1, 0)
            plane = tl.sum((bit << lane[None, :]).to(tl.int64), axis=1).to(tl.int32)
            tl.store(out_row + N + p * (N // 32) + group, plane, mask=group < N // 32)


def pack_indices(out, logits, local_idx, row_ends, *, max_local_len: int) -> None:
    rows, width = logits.shape
    n = local_idx.shape[1]
    if rows == 0:
        return
    pack_indices_kernel[(rows,)](out, logits, local_idx, row_ends, logits.stride(0), local_idx.stride(0),
                                 min(width, max_local_len), N=n, PLANES=_planes(out, n),
                                 GROUPS=8, num_warps=4, **dependent_launch(out.device))

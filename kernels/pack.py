"""Pack: a row's local top-N by (score desc, local id asc) as a packed row.

Three steps over the valid prefix of a row's scores: a 256-bin histogram of
the high byte of ord16; a histogram of the low byte inside the boundary
bucket (together they fix the threshold score and how many of its ties are
taken); an ordered compaction that writes candidates by ascending local id,
ties at the threshold lowest id first. Bit-identical to ``reference.pack``.

Two launch shapes share the helpers below. With rows enough to fill the GPU,
one program walks its whole row (``pack_kernel``; ``pack_row`` is also how
a saturated rank builds the list it pushes). With few rows, each row is split
over many programs: the histograms are summed with atomics, each program
counts what it keeps, and the compaction starts at the sum of the counts of
the chunks before it, so the output is the same."""

import torch
import triton
import triton.language as tl

from .keys import is_nan_bits, ord16, score_bits


@triton.jit
def _byte_histogram(in_row, lo, hi, high_byte, SELECT_LOW: tl.constexpr, BLOCK: tl.constexpr):
    """Histogram over valid tokens in [lo, hi) of the high byte of ord16
    (or, with SELECT_LOW, of the low byte of those whose high byte is
    ``high_byte``)."""
    bins = tl.arange(0, 256)
    hist = tl.zeros((256,), dtype=tl.int32)
    start = lo
    while start < hi:  # a while loop: the bounds are run-time scalars
        local = start + tl.arange(0, BLOCK)
        inside = local < hi
        bits = score_bits(in_row + local, inside)
        score = ord16(bits)
        start += BLOCK
        if SELECT_LOW:
            counted = inside & ~is_nan_bits(bits) & ((score >> 8) == high_byte)
            digit = score & 0xFF
        else:
            counted = inside & ~is_nan_bits(bits)
            digit = score >> 8
        part = tl.histogram(tl.where(counted, digit, 0), 256)
        skipped = BLOCK - tl.sum(counted.to(tl.int32), axis=0)
        hist += tl.where(bins == 0, part - skipped, part)
    return hist


@triton.jit
def _boundary(hist, need):
    """The bucket holding the ``need``-th largest element, and how many
    elements lie in higher buckets."""
    bins = tl.arange(0, 256)
    at_or_above = tl.sum(hist, axis=0) - tl.cumsum(hist, axis=0) + hist
    bucket = tl.max(tl.where(at_or_above >= need, bins, -1), axis=0)
    above = tl.sum(tl.where(bins > bucket, hist, 0), axis=0)
    return bucket, above


@triton.jit
def _threshold(high, low, N: tl.constexpr):
    """(threshold ord16, ties of it taken) from the two histograms. With
    fewer valid tokens than N every one is taken: threshold 0 is below any
    valid score."""
    high_bucket, above_high = _boundary(high, N)
    low_bucket, above_low = _boundary(low, N - above_high)
    enough = tl.sum(high, axis=0) >= N
    threshold = tl.where(enough, high_bucket * 256 + low_bucket, 0)
    return threshold, tl.where(enough, N - above_high - above_low, 0)


@triton.jit
def _classify(in_row, local, hi, threshold):
    inside = local < hi
    bits = score_bits(in_row + local, inside)
    valid = inside & ~is_nan_bits(bits)
    score = ord16(bits)
    return score, valid & (score > threshold), valid & (score == threshold)


@triton.jit
def _count(in_row, lo, hi, threshold, BLOCK: tl.constexpr):
    """(tokens above the threshold, ties of it) in [lo, hi)."""
    above = tl.zeros((), dtype=tl.int32)
    ties = tl.zeros((), dtype=tl.int32)
    start = lo
    while start < hi:
        _, is_above, is_tie = _classify(in_row, start + tl.arange(0, BLOCK), hi, threshold)
        above += tl.sum(is_above.to(tl.int32), axis=0)
        ties += tl.sum(is_tie.to(tl.int32), axis=0)
        start += BLOCK
    return above, ties


@triton.jit
def _compact(in_row, lo, hi, out_row, threshold, ties_taken, kept, ties_seen,
             N: tl.constexpr, PLANES: tl.constexpr, BLOCK: tl.constexpr):
    """Write the kept tokens of [lo, hi) from slot ``kept`` on, in local id
    order; ``ties_seen`` threshold ties precede ``lo`` in the row. Plane bits
    are OR-ed in: chunks of one row may share a plane word."""
    start = lo
    while start < hi:
        local = start + tl.arange(0, BLOCK)
        score, is_above, is_tie = _classify(in_row, local, hi, threshold)
        tie = is_tie.to(tl.int32)
        tie_rank = ties_seen + tl.cumsum(tie, axis=0) - tie
        keep = is_above | (is_tie & (tie_rank < ties_taken))
        keep_i = keep.to(tl.int32)
        pos = kept + tl.cumsum(keep_i, axis=0) - keep_i
        word = (score.to(tl.int64) << 16) | (0xFFFF - (local & 0xFFFF))
        tl.store(out_row + pos, word.to(tl.int32), mask=keep)
        for p in tl.static_range(PLANES):
            bit = (local >> (16 + p)) & 1
            tl.atomic_or(out_row + N + p * (N // 32) + pos // 32, bit << (pos % 32),
                         mask=keep & (bit != 0), sem="relaxed")
        kept += tl.sum(keep_i, axis=0)
        ties_seen += tl.sum(tie, axis=0)
        start += BLOCK


@triton.jit
def _zero_row(out_row, WORDS: tl.constexpr, BLOCK: tl.constexpr):
    for start in tl.range(0, WORDS, BLOCK):
        offs = start + tl.arange(0, BLOCK)
        tl.store(out_row + offs, tl.zeros((BLOCK,), dtype=tl.int32), mask=offs < WORDS)


@triton.jit
def pack_row(in_row, end, out_row, N: tl.constexpr, PLANES: tl.constexpr, BLOCK: tl.constexpr):
    """Write the packed top-N of scores ``in_row[0:end]`` to ``out_row``
    (N + PLANES * N / 32 int32 words), in one program."""
    _zero_row(out_row, N + PLANES * (N // 32), BLOCK)
    tl.debug_barrier()
    high = _byte_histogram(in_row, 0, end, 0, False, BLOCK)
    high_bucket, _ = _boundary(high, N)
    low = _byte_histogram(in_row, 0, end, high_bucket, True, BLOCK)
    threshold, ties_taken = _threshold(high, low, N)
    zero = tl.zeros((), dtype=tl.int32)
    _compact(in_row, 0, end, out_row, threshold, ties_taken, zero, zero, N, PLANES, BLOCK)


@triton.jit
def _row_end(row_ends_ptr, row, width_limit):
    return tl.minimum(tl.maximum(tl.load(row_ends_ptr + row), 0), width_limit)


@triton.jit
def pack_kernel(out_ptr, logits_ptr, row_ends_ptr, logits_stride, width_limit,
                N: tl.constexpr, PLANES: tl.constexpr, BLOCK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    words: tl.constexpr = N + PLANES * (N // 32)
    pack_row(logits_ptr + row * logits_stride, _row_end(row_ends_ptr, row, width_limit),
             out_ptr + row * words, N, PLANES, BLOCK)


# Split rows. Scratch per row (int32): [0, 256) high-byte histogram,
# [256, 512) low-byte histogram, then (above, ties) per chunk.


@triton.jit
def _split_chunk(row_ends_ptr, width_limit, chunk):
    """(row, chunk index, lo, hi): this program's part [lo, hi) of its row."""
    row = tl.program_id(0).to(tl.int64)
    split = tl.program_id(1)
    lo = split * chunk
    return row, split, lo, tl.minimum(lo + chunk, _row_end(row_ends_ptr, row, width_limit))


@triton.jit
def _scratch_threshold(scratch, N: tl.constexpr):
    bins = tl.arange(0, 256)
    return _threshold(tl.load(scratch + bins), tl.load(scratch + 256 + bins), N)


@triton.jit
def split_histogram_kernel(out_ptr, scratch_ptr, logits_ptr, row_ends_ptr, logits_stride, width_limit,
                           chunk, scratch_stride, N: tl.constexpr, PLANES: tl.constexpr,
                           SELECT_LOW: tl.constexpr, BLOCK: tl.constexpr):
    row, split, lo, hi = _split_chunk(row_ends_ptr, width_limit, chunk)
    hists = scratch_ptr + row * scratch_stride + tl.arange(0, 256)
    in_row = logits_ptr + row * logits_stride
    if SELECT_LOW:
        high_bucket, _ = _boundary(tl.load(hists), N)
        tl.atomic_add(hists + 256, _byte_histogram(in_row, lo, hi, high_bucket, True, BLOCK), sem="relaxed")
    else:
        if split == 0:
            _zero_row(out_ptr + row * (N + PLANES * (N // 32)), N + PLANES * (N // 32), BLOCK)
        tl.atomic_add(hists, _byte_histogram(in_row, lo, hi, 0, False, BLOCK), sem="relaxed")


@triton.jit
def split_count_kernel(scratch_ptr, logits_ptr, row_ends_ptr, logits_stride, width_limit, chunk,
                       scratch_stride, N: tl.constexpr, BLOCK: tl.constexpr):
    row, split, lo, hi = _split_chunk(row_ends_ptr, width_limit, chunk)
    scratch = scratch_ptr + row * scratch_stride
    threshold, _ = _scratch_threshold(scratch, N)
    above, ties = _count(logits_ptr + row * logits_stride, lo, hi, threshold, BLOCK)
    tl.store(scratch + 512 + 2 * split, above)
    tl.store(scratch + 513 + 2 * split, ties)


@triton.jit
def split_compact_kernel(out_ptr, scratch_ptr, logits_ptr, row_ends_ptr, logits_stride, width_limit,
                         chunk, scratch_stride, N: tl.constexpr, PLANES: tl.constexpr,
                         SPLITS_P2: tl.constexpr, BLOCK: tl.constexpr):
    row, split, lo, hi = _split_chunk(row_ends_ptr, width_limit, chunk)
    scratch = scratch_ptr + row * scratch_stride
    threshold, ties_taken = _scratch_threshold(scratch, N)
    earlier = tl.arange(0, SPLITS_P2)
    before = earlier < split
    above = tl.load(scratch + 512 + 2 * earlier, mask=before, other=0)
    ties = tl.load(scratch + 513 + 2 * earlier, mask=before, other=0)
    tie_start = tl.cumsum(ties, axis=0) - ties
    taken = tl.minimum(tl.maximum(ties_taken - tie_start, 0), ties)
    out_row = out_ptr + row * (N + PLANES * (N // 32))
    _compact(logits_ptr + row * logits_stride, lo, hi, out_row, threshold, ties_taken,
             tl.sum(above + taken, axis=0), tl.sum(ties, axis=0), N, PLANES, BLOCK)


PACK_BLOCK = 4096
PACK_GROUPS = 8
# Split rows over programs until about two programs per SM are busy
# (H200: 132 SMs); a chunk is at least one block.
TARGET_PROGRAMS = 264


def _planes(out, local_topk: int) -> int:
    return (out.shape[1] - local_topk) // (local_topk // 32)


def pack(out, logits, row_ends, *, local_topk: int, max_local_len: int, splits: int | None = None) -> None:
    """out: int32 [T, N + P*N/32] (P read off its width); logits: [T, S]
    bf16/fp32 (stride(1) == 1); row_ends: int32 [T]. ``splits``: programs
    per row (default: enough to fill the GPU)."""
    rows, width = logits.shape
    if rows == 0:
        return
    limit = min(width, max_local_len)
    planes = _planes(out, local_topk)
    if splits is None:
        splits = max(1, min(triton.cdiv(TARGET_PROGRAMS, rows), triton.cdiv(limit, PACK_BLOCK)))
    if splits == 1:
        pack_kernel[(rows,)](out, logits, row_ends, logits.stride(0), limit,
                             N=local_topk, PLANES=planes, BLOCK=PACK_BLOCK, num_warps=16)
        return
    chunk = triton.cdiv(triton.cdiv(limit, splits), PACK_BLOCK) * PACK_BLOCK
    splits = triton.cdiv(limit, chunk)
    scratch = torch.zeros((rows, 512 + 2 * splits), dtype=torch.int32, device=out.device)
    args = (logits, row_ends, logits.stride(0), limit, chunk, scratch.stride(0))
    grid = (rows, splits)
    for select_low in (False, True):
        split_histogram_kernel[grid](out, scratch, *args, N=local_topk, PLANES=planes,
                                     SELECT_LOW=select_low, BLOCK=PACK_BLOCK, num_warps=16)
    split_count_kernel[grid](scratch, *args, N=local_topk, BLOCK=PACK_BLOCK, num_warps=16)
    split_compact_kernel[grid](out, scratch, *args, N=local_topk, PLANES=planes,
                               SPLITS_P2=triton.next_power_of_2(splits), BLOCK=PACK_BLOCK, num_warps=16)


@triton.jit
def pack_indices_kernel(out_ptr, logits_ptr, idx_ptr, row_ends_ptr, logits_stride, idx_stride,
                        width_limit, N: tl.constexpr, PLANES: tl.constexpr, GROUPS: tl.constexpr):
    """Slot j of the output keeps candidate j of ``idx``; 32 slots a group,
    GROUPS groups per step, so each plane word is built in registers."""
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
                                 GROUPS=PACK_GROUPS, num_warps=4)

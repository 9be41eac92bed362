"""Pack: a row's local top-N by (score desc, local id asc) as a packed row.

Per row, three passes over the valid prefix of the scores: a 256-bin
histogram of the high byte of ord16, a histogram of the low byte inside the
boundary bucket (this fixes the threshold score and how many of its ties
are taken), then an ordered compaction: candidates are written by ascending
local id, ties at the threshold taken lowest id first. The output is
bit-identical to ``reference.pack``. ``pack_row`` also builds the local
top-K list a saturated rank pushes in the select."""

import triton
import triton.language as tl

from .keys import is_nan_bits, ord16, score_bits


@triton.jit
def _byte_histogram(in_row, end, high_byte, SELECT_LOW: tl.constexpr, BLOCK: tl.constexpr):
    """Histogram of the high byte of ord16 over valid tokens (or, with
    SELECT_LOW, of the low byte over valid tokens whose high byte is
    ``high_byte``)."""
    bins = tl.arange(0, 256)
    hist = tl.zeros((256,), dtype=tl.int32)
    start = 0
    while start < end:  # a while loop: ``end`` is a run-time scalar
        local = start + tl.arange(0, BLOCK)
        inside = local < end
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
def pack_row(in_row, end, out_row, N: tl.constexpr, PLANES: tl.constexpr, BLOCK: tl.constexpr):
    """Write the packed top-N of scores ``in_row[0:end]`` to ``out_row``
    (N + PLANES * N / 32 int32 words)."""
    words: tl.constexpr = N + PLANES * (N // 32)
    for start in tl.range(0, words, BLOCK):
        offs = start + tl.arange(0, BLOCK)
        tl.store(out_row + offs, tl.zeros((BLOCK,), dtype=tl.int32), mask=offs < words)
    tl.debug_barrier()

    high = _byte_histogram(in_row, end, 0, False, BLOCK)
    total = tl.sum(high, axis=0)
    high_bucket, above_high = _boundary(high, N)
    low = _byte_histogram(in_row, end, high_bucket, True, BLOCK)
    low_bucket, above_low = _boundary(low, N - above_high)
    # Fewer valid tokens than N: all of them (threshold 0 is below any score).
    enough = total >= N
    threshold = tl.where(enough, high_bucket * 256 + low_bucket, 0)
    ties_taken = tl.where(enough, N - above_high - above_low, 0)

    kept = tl.zeros((), dtype=tl.int32)
    ties_seen = tl.zeros((), dtype=tl.int32)
    start = 0
    while start < end:
        local = start + tl.arange(0, BLOCK)
        inside = local < end
        start += BLOCK
        bits = score_bits(in_row + local, inside)
        valid = inside & ~is_nan_bits(bits)
        score = ord16(bits)
        tie = (valid & (score == threshold)).to(tl.int32)
        tie_rank = ties_seen + tl.cumsum(tie, axis=0) - tie
        keep = valid & ((score > threshold) | ((tie != 0) & (tie_rank < ties_taken)))
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


@triton.jit
def pack_kernel(out_ptr, logits_ptr, row_ends_ptr, logits_stride, width_limit,
                N: tl.constexpr, PLANES: tl.constexpr, BLOCK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    words: tl.constexpr = N + PLANES * (N // 32)
    end = tl.minimum(tl.maximum(tl.load(row_ends_ptr + row), 0), width_limit)
    pack_row(logits_ptr + row * logits_stride, end, out_ptr + row * words, N, PLANES, BLOCK)


@triton.jit
def pack_indices_kernel(out_ptr, logits_ptr, idx_ptr, row_ends_ptr, logits_stride, idx_stride,
                        width_limit, N: tl.constexpr, PLANES: tl.constexpr, GROUPS: tl.constexpr):
    """Slot j of the output keeps candidate j of ``idx``; 32 slots a group,
    GROUPS groups per step, so each plane word is built in registers."""
    row = tl.program_id(0).to(tl.int64)
    words: tl.constexpr = N + PLANES * (N // 32)
    end = tl.minimum(tl.maximum(tl.load(row_ends_ptr + row), 0), width_limit)
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


PACK_BLOCK = 4096
PACK_GROUPS = 8


def _planes(out, local_topk: int) -> int:
    return (out.shape[1] - local_topk) // (local_topk // 32)


def pack(out, logits, row_ends, *, local_topk: int, max_local_len: int) -> None:
    """out: int32 [T, N + P*N/32] (P read off its width); logits: [T, S]
    bf16/fp32 (stride(1) == 1); row_ends: int32 [T]."""
    rows, width = logits.shape
    if rows == 0:
        return
    pack_kernel[(rows,)](out, logits, row_ends, logits.stride(0), min(width, max_local_len),
                         N=local_topk, PLANES=_planes(out, local_topk), BLOCK=PACK_BLOCK, num_warps=16)


def pack_indices(out, logits, local_idx, row_ends, *, max_local_len: int) -> None:
    rows, width = logits.shape
    n = local_idx.shape[1]
    if rows == 0:
        return
    pack_indices_kernel[(rows,)](out, logits, local_idx, row_ends, logits.stride(0), local_idx.stride(0),
                                 min(width, max_local_len), N=n, PLANES=_planes(out, n),
                                 GROUPS=PACK_GROUPS, num_warps=4)

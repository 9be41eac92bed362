"""Tiny Triton kernels that expose one device helper each to the tests
(imported inside the tests, so that collecting them needs no Triton)."""

import triton
import triton.language as tl

from nvshmem_topk.kernels.keys import NEAR_BINS, TIE_TILE, distance_boundary, kth_largest, radix_boundary
from nvshmem_topk.kernels.rows import bisected_threshold, load_tokens, row_threshold, trim_list
from nvshmem_topk.kernels.filter import _block_pairs, _filter_block, _filter_pairs, _score_floor
from nvshmem_topk.kernels.spread import block_tokens


@triton.jit
def radix_boundary_kernel(out_ptr, hist_ptr, need_ptr):
    """Per program: radix_boundary of hist_ptr[case] for need_ptr[case],
    as three int32 at out_ptr[case]."""
    case = tl.program_id(0).to(tl.int64)
    hist = tl.load(hist_ptr + case * 256 + tl.arange(0, 256))
    bucket, above, in_bucket = radix_boundary(hist, tl.load(need_ptr + case))
    tl.store(out_ptr + case * 3, bucket)
    tl.store(out_ptr + case * 3 + 1, above)
    tl.store(out_ptr + case * 3 + 2, in_bucket)


@triton.jit
def distance_boundary_kernel(out_ptr, distance_ptr, need_ptr, TILE: tl.constexpr, BINS: tl.constexpr):
    """Per program: distance_boundary of distance_ptr[case] ([TILE] int32)
    for need_ptr[case], as three int32 at out_ptr[6 * case], and bounded by
    the largest present distance and their count (as the select's far
    counts call it; meaningful where at least need are present) at
    out_ptr[6 * case + 3]."""
    case = tl.program_id(0).to(tl.int64)
    distance = tl.load(distance_ptr + case * TILE + tl.arange(0, TILE))
    need = tl.load(need_ptr + case)
    present = distance < BINS
    for bounded in tl.static_range(2):
        if bounded:
            d, above, at_d = distance_boundary(distance, need, BINS, tl.max(tl.where(present, distance, 0), axis=0),
                                               tl.sum(present.to(tl.int32), axis=0))
        else:
            d, above, at_d = distance_boundary(distance, need, BINS)
        tl.store(out_ptr + case * 6 + 3 * bounded, d)
        tl.store(out_ptr + case * 6 + 3 * bounded + 1, above)
        tl.store(out_ptr + case * 6 + 3 * bounded + 2, at_d)


@triton.jit
def candidate_kernel(out_ptr, x_ptr, floor_ptr, WIDTH: tl.constexpr, BLOCK: tl.constexpr, WHOLE: tl.constexpr):
    """Per program: the filter's candidate test of every bf16 x_ptr[0:WIDTH]
    against floor_ptr[case] (the float compare with ``_score_floor``), as
    int8 at out_ptr[case]."""
    case = tl.program_id(0).to(tl.int64)
    floor = _score_floor(tl.load(floor_ptr + case))
    for start in tl.range(0, WIDTH, BLOCK):
        offs = start + tl.arange(0, BLOCK)
        x = load_tokens(x_ptr + offs, offs < WIDTH, WHOLE)
        wide = (x.to(tl.int16, bitcast=True).to(tl.int32) << 16).to(tl.float32, bitcast=True)
        tl.store(out_ptr + case * WIDTH + offs, (wide >= floor).to(tl.int8), mask=offs < WIDTH)


@triton.jit
def filter_block_kernel(scratch_ptr, x_ptr, width, scratch_stride, REGION: tl.constexpr, REGIONS_AT: tl.constexpr,
                        PAIRS: tl.constexpr):
    """The filter's work on block program_id(0) of the one row x_ptr[0:width]
    (PAIRS: read as int32 pairs of bf16, ``_filter_pairs``; else token by
    token, ``_filter_block``), with the floor and probe the caller put in the
    scratch row of case program_id(1): the counts and the candidates' words
    land at the block's place in that row."""
    block = tl.program_id(0)
    scratch = scratch_ptr + tl.program_id(1).to(tl.int64) * scratch_stride
    if PAIRS:
        _filter_pairs(scratch, _block_pairs(x_ptr, block, (0, width), 16), block, REGION, REGIONS_AT, 0, 16)
    else:
        x, local = block_tokens(x_ptr, 0, 0, block, (0, width))
        _filter_block(scratch, x, local, block, REGION, REGIONS_AT)


@triton.jit
def bisected_threshold_kernel(out_ptr, score_ptr, need_ptr, TILE: tl.constexpr):
    """Per program: ``bisected_threshold`` of score_ptr[case] (ord16 as
    int32, 0 for invalid tokens) for need_ptr[case], (threshold, above)
    unbounded at out_ptr[10 * case] and, at out_ptr[10 * case + 2], bounded as
    the finish bounds its candidates (their lowest score when they hold
    need, and their highest); the same with DISTINCT at out_ptr[10 * case +
    4]; ``row_threshold``'s (the near count first) at out_ptr[10 * case + 8]."""
    case = tl.program_id(0).to(tl.int64)
    score = tl.load(score_ptr + case * TILE + tl.arange(0, TILE))
    need = tl.load(need_ptr + case)
    valid = score != 0
    lowest = tl.where(tl.sum(valid.to(tl.int32), axis=0) >= need, tl.min(tl.where(valid, score, 0xFFFF), axis=0), 0)
    for distinct in tl.static_range(2):
        for bounded in tl.static_range(2):
            if bounded:
                threshold, above = bisected_threshold(score, need, lowest, tl.max(score, axis=0), distinct == 1)
            else:
                threshold, above = bisected_threshold(score, need, 0, 0xFFFF, distinct == 1)
            tl.store(out_ptr + 10 * case + 4 * distinct + 2 * bounded, threshold)
            tl.store(out_ptr + 10 * case + 4 * distinct + 2 * bounded + 1, above)
    threshold, above = row_threshold(score, need, 0)
    tl.store(out_ptr + 10 * case + 8, threshold)
    tl.store(out_ptr + 10 * case + 9, above)


@triton.jit
def kth_largest_kernel(out_ptr, ties_ptr, keys_ptr, k_ptr, lowest_ptr, ROWS: tl.constexpr, COLS: tl.constexpr,
                       KEY_BITS: tl.constexpr):
    """Per program: ``kth_largest`` of keys_ptr[case] ([ROWS, COLS] int64)
    for k_ptr[case], with TIE_TILE int64 of scratch at ties_ptr[case]: the
    k-th key at out_ptr[4 * case], the count it selects at out_ptr[4 * case
    + 1]; the same anchored at level lowest_ptr[case] at out_ptr[4 * case + 2]
    and out_ptr[4 * case + 3]."""
    case = tl.program_id(0).to(tl.int64)
    offs = case * ROWS * COLS + tl.arange(0, ROWS)[:, None] * COLS + tl.arange(0, COLS)[None, :]
    keys = tl.load(keys_ptr + offs)
    kth, selected = kth_largest(keys, tl.load(k_ptr + case), KEY_BITS, ties_ptr + case * TIE_TILE)
    tl.store(out_ptr + 4 * case, kth)
    tl.store(out_ptr + 4 * case + 1, selected.to(tl.int64))
    kth, selected = kth_largest(keys, tl.load(k_ptr + case), KEY_BITS, ties_ptr + case * TIE_TILE,
                                tl.load(lowest_ptr + case))
    tl.store(out_ptr + 4 * case + 2, kth)
    tl.store(out_ptr + 4 * case + 3, selected.to(tl.int64))


@triton.jit
def trim_list_kernel(rows_ptr, floor_ptr, N: tl.constexpr, PLANES: tl.constexpr):
    """Per program: ``trim_list`` of packed row rows_ptr[case] (in place)
    at floor_ptr[case]."""
    case = tl.program_id(0).to(tl.int64)
    trim_list(rows_ptr + case * (N + PLANES * (N // 32)), tl.load(floor_ptr + case), N, PLANES)

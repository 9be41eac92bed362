"""The spread pipeline's second kernel (``spread.py``), a program per
block of BLOCK tokens, the row's one full read: the block's counts (valid
tokens, candidates at or above the estimate's floor, tokens >= and > its
probe; with 32-bit scores the probe's tokens' highest and lowest low half)
into its counts, and its first REGION candidates' packed words, in token
order, into its region of the row's scratch (``spread.py``'s layout).
Precondition: the estimate of the row ended (the prior kernel); the block
is read and keyed before the wait, the floor and probe after it. The
candidates are a threshold set of ord16 that holds the row's top-n
whenever the floor is below its n-th score."""

import triton
import triton.language as tl

from .keys import MIN_VALID, NO_SCORE32, folded32, is_nan_bits, ord16, packed_word, score16_bits
from .rows import any_width, line_positions, load_tokens, row_target, row_window
from .spread import BLOCK, COUNT_FIELDS, FLOOR, HEADER, PROBE, block_tokens, region_lows_at
from .sync import after_prior_kernel



@triton.jit
def _score_floor(floor):
    """The float f with {non-NaN x : x >= f} = {x : ord16(x) >= floor}, up
    to a monotone widening that keeps it a threshold set (-0 >= +0 is true,
    and a NaN pattern widens to an infinity): all the candidates need."""
    bits = tl.where(floor >= 0x8000, floor & 0x7FFF, ~floor & 0xFFFF)
    f = (bits << 16).to(tl.float32, bitcast=True)
    return tl.where(is_nan_bits(bits), tl.where(floor >= 0x8000, float("inf"), float("-inf")), f)


@triton.jit
def below_candidates(floor):
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
    lows = region_lows_at(scratch, LOWS_AT, 32) + block * REGION
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
        lows = region_lows_at(scratch, LOWS_AT, 32) + block * REGION
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
                x, local = block_tokens(logits_ptr, row, logits_stride, block, window)
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
        x, local = block_tokens(logits_ptr, row, logits_stride, block, window)
        after_prior_kernel(PDL)
        _filter_block(scratch, x, local, block, REGION, REGIONS_AT)


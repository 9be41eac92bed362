"""Device helpers shared by the kernel families: scores, packed words,
select keys, the exact top-K threshold and the ordered emit. The layout's
constants come from ``nvshmem_topk/format.py``, its one description."""

import triton
import triton.language as tl

from .. import format as fmt

LOW_BITS = tl.constexpr(fmt.LOW_BITS)
SAT_MASK_SHIFT = tl.constexpr(fmt.SAT_MASK_SHIFT)
SAT_KAPPA_MASK = tl.constexpr(fmt.SAT_KAPPA_MASK)
MIN_VALID = tl.constexpr(fmt.MIN_VALID_ORD16)  # every valid score's ord16 is at least this; 0 is "none"
MAX_PEERS = tl.constexpr(fmt.MAX_WORLD_SIZE)
NO_SCORE32 = tl.constexpr(-(1 << 31))  # ``folded32`` of NaN: below every score


@triton.constexpr_function
def low_halves_at(n, planes):
    """Where a 32-bit-score row's low score halves start, in int32 words:
    after the words and the planes (``format.packed_row_words``, which a
    kernel cannot call; tests hold the two equal)."""
    return n + planes * (n // 32)


@triton.constexpr_function
def packed_words(n, planes, score_bits):
    """``format.packed_row_words`` in kernels: the low halves (32-bit
    scores) take n / 2 words more."""
    return low_halves_at(n, planes) + (n // 2 if score_bits == 32 else 0)


@triton.jit
def low_halves(row_ptr, N: tl.constexpr, PLANES: tl.constexpr):
    """A 32-bit-score packed row's low halves, as int16 (``low_halves_at``)."""
    return (row_ptr + low_halves_at(N, PLANES)).to(tl.pointer_type(tl.int16))


@triton.jit
def packed_word(score, local):
    """The candidate word (int32) of a token of ord16 ``score`` and local id
    ``local``: the score over the id's low 16 bits, inverted."""
    return (score.to(tl.int32) << LOW_BITS) | (0xFFFF - (local & 0xFFFF)).to(tl.int32)  # wraps as int32


@triton.jit
def ord16(bits):
    """bf16 or fp16 bits (int32 in [0, 0xFFFF]) -> order-preserving unsigned
    image (the same sign-magnitude rule serves both)."""
    return tl.where(bits >= 0x8000, ~bits & 0xFFFF, bits | 0x8000)


@triton.jit
def score_bits(ptr, mask):
    """16-bit score bits of the scores at ``ptr`` (0 where not ``mask``)."""
    return score16_bits(tl.load(ptr, mask=mask, other=0.0))


@triton.jit
def score16_bits(x):
    """The 16-bit pattern each score ``x`` is ranked by (int32 in [0,
    0xFFFF]): bf16 and fp16 as they are, except that an fp16 NaN becomes
    bf16's (is_nan_bits knows one pattern set; ord16 orders either format);
    fp32 rounded to bf16, to nearest even on the bits (torch's rule, written
    out so that every backend, the interpreter included, rounds alike; NaN
    stays NaN)."""
    if x.dtype == tl.float32:  # compile-time: only the taken branch is built
        u = x.to(tl.int32, bitcast=True).to(tl.int64) & 0xFFFFFFFF
        rounded = ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).to(tl.int32) & 0xFFFF
        bits = tl.where(x != x, 0x7FC0, rounded)
    elif x.dtype == tl.float16:
        bits = tl.where(x != x, 0x7FC0, x.to(tl.int16, bitcast=True).to(tl.int32) & 0xFFFF)
    else:
        bits = x.to(tl.int16, bitcast=True).to(tl.int32) & 0xFFFF
    return bits


@triton.jit
def is_nan_bits(bits):
    return (bits & 0x7FFF) > 0x7F80


@triton.jit
def folded32(x):
    """The fp32 order of the scores ``x`` (any float; bf16 widened on its
    bits, exactly, as the interpreter's conversion is not for subnormals)
    as a signed int32, ord32 - 2^31 (``format.ord32``), NO_SCORE32 for NaN:
    its top 16 bits + 0x8000 are the word's score, its low 16 bits the
    low half."""
    if x.dtype == tl.bfloat16:
        bits = x.to(tl.int16, bitcast=True).to(tl.int32) << 16
    else:
        bits = x.to(tl.float32).to(tl.int32, bitcast=True)
    nan = (bits & 0x7FFFFFFF) > 0x7F800000  # on the bits: the interpreter's bf16 NaN compares equal to itself
    return tl.where(nan, NO_SCORE32, bits ^ ((bits >> 31) & 0x7FFFFFFF))


@triton.jit
def load_sat(sat_ptr, row, SCORE_BITS: tl.constexpr):
    """(mask, kappa) of ``row``'s saturation state (``format.sat_word``: one
    int64 a row, two with 32-bit scores)."""
    if SCORE_BITS == 32:
        mask = tl.load(sat_ptr + 2 * row) >> SAT_MASK_SHIFT
        kappa = tl.load(sat_ptr + 2 * row + 1)
    else:
        sat = tl.load(sat_ptr + row)
        mask = sat >> SAT_MASK_SHIFT
        kappa = sat & SAT_KAPPA_MASK
    return mask, kappa


@triton.jit
def store_sat(sat_ptr, row, mask, kappa, SCORE_BITS: tl.constexpr):
    """``row``'s saturation state, as ``load_sat`` reads it."""
    if SCORE_BITS == 32:
        tl.store(sat_ptr + 2 * row, mask << SAT_MASK_SHIFT)
        tl.store(sat_ptr + 2 * row + 1, kappa)
    else:
        tl.store(sat_ptr + row, (mask << SAT_MASK_SHIFT) | kappa)


@triton.jit
def decode_keys(row_ptr, slot, owner, present_mask, NUM: tl.constexpr, PLANES: tl.constexpr,
                WORLD: tl.constexpr, INTERLEAVE: tl.constexpr, GID_BITS: tl.constexpr,
                SCORE_BITS: tl.constexpr = 16):
    """Keys (int64, 0 = empty) of candidates ``slot`` of the packed row(s) at
    ``row_ptr`` (int32 pointers, broadcasting with ``slot``) sent by ``owner``;
    with 32-bit scores the word's score and its low half make the ord32."""
    word = tl.load(row_ptr + slot, mask=present_mask, other=0).to(tl.int64) & 0xFFFFFFFF
    local = 0xFFFF - (word & 0xFFFF)
    for p in tl.static_range(PLANES):
        plane = tl.load(row_ptr + NUM + p * (NUM // 32) + slot // 32, mask=present_mask, other=0)
        local |= ((plane >> (slot % 32)) & 1).to(tl.int64) << (LOW_BITS + p)
    gid = (local // INTERLEAVE) * (WORLD * INTERLEAVE) + owner * INTERLEAVE + local % INTERLEAVE
    score = word >> LOW_BITS
    if SCORE_BITS == 32:
        low = tl.load(low_halves(row_ptr, NUM, PLANES) + slot, mask=present_mask, other=0)
        score = (score << 16) | (low.to(tl.int64) & 0xFFFF)
    key = (score << GID_BITS) | ((1 << GID_BITS) - 1 - gid)
    return tl.where(word != 0, key, 0)


@triton.jit
def key_gid(keys, GID_BITS: tl.constexpr):
    """The global ids of non-zero ``keys`` (``format.key_to_global_id``)."""
    return (1 << GID_BITS) - 1 - (keys & ((1 << GID_BITS) - 1))


@triton.jit
def owner_and_local(gid, WORLD: tl.constexpr, INTERLEAVE: tl.constexpr):
    """(rank, local id) of global ids ``gid`` (``format.owner_and_local``)."""
    return (gid // INTERLEAVE) % WORLD, (gid // (INTERLEAVE * WORLD)) * INTERLEAVE + gid % INTERLEAVE


@triton.jit
def radix_digit_histogram(flat, prefix, shift):
    """Histogram of the 8-bit digit at ``shift`` of the non-zero keys of
    ``flat`` (1-D) whose higher digits equal those of ``prefix``."""
    match = (flat != 0) & ((flat >> (shift + 8)) == (prefix >> (shift + 8)))
    return tl.histogram(((flat >> shift) & 0xFF).to(tl.int32), 256, mask=match)


@triton.jit
def radix_boundary(hist, need):
    """(bucket, above, in_bucket) of a 256-bin histogram: the bucket that
    holds the ``need``-th largest element (-1 when there are fewer), how
    many elements lie in higher buckets, and how many in that bucket. The
    buckets whose count from the top reaches ``need`` are 0..bucket, so one
    reverse scan and one reduction find all three: each cross-warp step of
    a program is a barrier and a shared-memory round trip. The reduction
    sums three fields of one int64: the reaching buckets (at most 256, bits
    0-8), the counts above them and the count of the last one (each below
    2^27, bits 9-35 and 36-62)."""
    at_or_above = tl.cumsum(hist, axis=0, reverse=True)
    reaching = at_or_above >= need
    last = reaching & (at_or_above - hist < need)
    fields = tl.sum(reaching.to(tl.int64) | (tl.where(reaching, 0, hist).to(tl.int64) << 9)
                    | (tl.where(last, hist, 0).to(tl.int64) << 36), axis=0)
    return (fields & 0x1FF).to(tl.int32) - 1, ((fields >> 9) & 0x7FFFFFF).to(tl.int32), (fields >> 36).to(tl.int32)


TIE_TILE = tl.constexpr(256)
NEAR_BINS = tl.constexpr(256)  # the select's distances below the top: a level is two scores


@triton.jit
def near_bin(top, level, BINS: tl.constexpr):
    """Bin of a level in a near histogram of BINS bins, by how far it lies
    below ``top``: BINS - 1 - distance, bin 0 for BINS - 1 levels or more
    (levels above ``top`` count as at it): the estimate's histograms, whose
    cost grows with their bins."""
    distance = tl.minimum(tl.maximum(top - level, 0), BINS - 1)
    return -(distance - (BINS - 1))  # tensor - constexpr: the interpreter keeps a tensor


@triton.jit
def _nearer_than(pairs, distance):
    """How many of the 16-bit fields of ``pairs`` (two to an int32, each at
    most 0x8000) are below ``distance``: field + 0x8000 - distance sets the
    field's top bit iff field >= distance, and never carries out of it."""
    at_least = tl.sum(((pairs + (0x8000 - distance) * 0x10001) >> 15) & 0x10001, axis=0)
    return pairs.numel * 2 - (at_least & 0xFFFF) - (at_least >> 16)


@triton.jit
def distance_boundary(distance, need, BINS: tl.constexpr, deepest=None, present=None):
    """(d, above, at_d) of the present elements of ``distance`` (1-D int32:
    how far each lies below the top, in [0, BINS), BINS for absent ones;
    BINS a power of 2): the least d with at least ``need`` of them at
    distance <= d, BINS when fewer are present; how many lie nearer than d
    (every present one when fewer); how many at d (0 when fewer). One count
    a bit, from the top, of two 16-bit fields to an int32 reduction, as
    ``rows.bisected_threshold`` counts: log2(BINS) block-wide sums, where a
    histogram of BINS bins and its scan cost several times as much. Given
    the largest present distance (``deepest``) and how many are present
    (``present``, at least need): one count first, of those nearer than
    the deepest; where fewer than need are, d is the deepest (zeros under a
    few positives), else no bit past it needs a count (every present one
    is nearer than such a candidate)."""
    halves = tl.reshape(distance, (distance.numel // 2, 2), can_reorder=True)  # counts need no order
    even, odd = tl.split(halves)
    pairs = even | (odd << 16)
    d = tl.zeros((), dtype=tl.int32)  # the largest distance with fewer than need nearer
    above = tl.zeros((), dtype=tl.int32)
    reach = tl.zeros((), dtype=tl.int32)  # nearer than d + 1: the count of the last bit that failed
    if deepest is not None:
        shallower = _nearer_than(pairs, deepest)
        if shallower < need:  # d is the deepest: every later candidate is at or past it, and none is counted
            d += deepest
            above = shallower
            reach += present
    for bit in tl.static_range(log2(BINS) - 1, -1, -1):
        candidate = d | (1 << bit)
        if deepest is None:
            nearer = _nearer_than(pairs, candidate)
        else:
            nearer = tl.zeros((), dtype=tl.int32) + present  # past the deepest: every present one
            if candidate == deepest:
                nearer = shallower
            elif candidate < deepest:
                nearer = _nearer_than(pairs, candidate)
        if nearer < need:
            d = candidate
            above = nearer
        else:
            reach = nearer
    if deepest is None:
        if d == BINS - 1:  # no bit failed: d + 1 is BINS, every present element
            reach = _nearer_than(pairs, BINS)
            if reach < need:
                d = BINS
                above = reach
    return d, above, tl.where(d == BINS, 0, reach - above)


LEVELS = tl.constexpr(1 << 15)  # a key's level: its score without the lowest bit


@triton.jit
def near_boundary(level, present, need):
    """(boundary level, fewer, above, in_bucket): the level of the
    ``need``-th largest of the present ``level``s, whether fewer than need
    are present, how many lie above that level (every present one when
    fewer) and how many at it. From counts of how far each lies below the
    top one (``distance_boundary``): up to NEAR_BINS - 1 first, the last
    gathering every level further down, since a top-K of bf16 scores
    rarely spans 510 steps (an indexer's spans about 270 at W = 8, K =
    2048; normal scores' 140); where it does (heavy tails, zeros under a
    few positives, fp16), the distances past that decide, bounded by the
    deepest (one maximum)."""
    top = tl.max(tl.where(present, level, 0), axis=0)
    distance = top - level
    d, above, in_bucket = distance_boundary(tl.where(present, tl.minimum(distance, NEAR_BINS - 1), NEAR_BINS), need,
                                            NEAR_BINS)
    fewer = d == NEAR_BINS
    if d == NEAR_BINS - 1:  # fewer than need are nearer: the far distance is at least 1
        far = tl.where(present, tl.maximum(distance - (NEAR_BINS - 2), 0), LEVELS)
        d, above, in_bucket = distance_boundary(far, need, LEVELS, tl.max(tl.where(present, far, 0), axis=0),
                                                above + in_bucket)
        d += NEAR_BINS - 2
    return top - d, fewer, above, in_bucket


# Radix digits. tl.histogram takes a warp ballot per bit of the bin and then
# each lane's bins in turn, so a pass over B bins costs about (B / 32) log2(B)
# operations an element: the tie tile (256 keys, the score's last bit and a
# 17-bit gid: three passes) takes 6-bit digits, the whole tile (4096 keys)
# 5-bit ones (docs/performance.md has the H200's figures).
TIE_DIGIT = tl.constexpr(6)
TIE_BINS = tl.constexpr(1 << TIE_DIGIT.value)
WIDE_DIGIT = tl.constexpr(5)
WIDE_BINS = tl.constexpr(1 << WIDE_DIGIT.value)


@triton.jit
def _gid_select(flat, present, prefix, need, fixed, DIGIT: tl.constexpr, BINS: tl.constexpr):
    """The ``need``-th largest of the non-zero ``flat`` keys (1-D) whose
    bits >= ``fixed`` equal ``prefix``'s: a radix select, DIGIT bits a pass
    (a histogram of BINS = 2^DIGIT), that stops once the k-th is the first or
    second key from either end of the chosen bucket: one or two block-wide
    maxima (of the keys, or of their negations from the bottom) cost less than
    another histogram pass, and at W = 8 they end every row's select after
    its first pass instead of half of them after their second."""
    found = tl.zeros((), dtype=tl.int64)
    while fixed > 0:
        shift = tl.maximum(fixed - DIGIT, 0)
        match = present & ((flat >> fixed) == (prefix >> fixed))
        digit = ((flat >> shift) & ((tl.full((), 1, tl.int64) << (fixed - shift)) - 1)).to(tl.int32)
        chosen, above, bucket_count = radix_boundary(tl.histogram(digit, BINS, mask=match), need)
        need -= above
        prefix |= chosen.to(tl.int64) << shift
        fixed = shift
        from_bottom = bucket_count - need + 1
        nth = tl.minimum(need, from_bottom)
        if nth <= 2:
            sign = tl.where(need <= from_bottom, 1, -1).to(tl.int64)
            unranked = -0x7FFFFFFFFFFFFFFF  # below every key and every negated key
            ranked = tl.where(match & (digit == chosen), flat * sign, unranked)
            found = tl.max(ranked, axis=0)
            if nth == 2:
                found = tl.max(tl.where(ranked == found, unranked, ranked), axis=0)
            found *= sign
            fixed = tl.zeros((), dtype=tl.int32)
    return tl.where(found != 0, found, prefix)


ANCHOR_BINS = tl.constexpr(32)  # the rescue's levels above kappa's


@triton.jit
def _anchored_boundary(level, present, need, lowest):
    """``near_boundary`` when every present ``level`` is at least
    ``lowest``: counts of how far each lies above it, ANCHOR_BINS distances
    from the top one, which gathers the rest; where the boundary falls
    there, the distances below the top level decide, as they do without an
    anchor."""
    steps = tl.minimum(tl.maximum(level - lowest, 0), ANCHOR_BINS - 1)
    d, above, in_bucket = distance_boundary(tl.where(present, ANCHOR_BINS - 1 - steps, ANCHOR_BINS), need,
                                            ANCHOR_BINS)
    boundary = lowest + ANCHOR_BINS - 1 - d
    fewer = d == ANCHOR_BINS
    if d == 0:
        boundary, fewer, above, in_bucket = near_boundary(level, present, need)
    return boundary, fewer, above, in_bucket


@triton.jit
def kth_largest(keys, k, KEY_BITS: tl.constexpr, tie_ptr, lowest=None):
    """(kth, selected): the k-th largest of the unique non-negative int64
    ``keys`` (a 2-D tensor; 0 = empty) whose top 16 of KEY_BITS bits are an
    ord16 score (or an ord32's top half), or 0 when fewer than k are
    non-zero; and how many keys are selected by it (k, or every non-zero key
    when fewer), which the emit would otherwise count with a block-wide sum.
    First counts of how far each key's level (its score without the lowest
    bit) lies below the top level (``near_boundary``) fix the k-th key's
    level. Given ``lowest``, a level every key reaches (the rescue's:
    kappa's), the counts are of levels above it instead
    (``_anchored_boundary``), fewer of them and no maximum first. Then a
    radix select over the lower bits (the score's last bit and the gid)
    among the keys of that level. A histogram costs as much for a masked slot as for any other, so when at
    most TIE_TILE keys share the k-th level they are first compacted through
    ``tie_ptr`` (TIE_TILE int64 of scratch) and the radix runs over those
    alone."""
    level_shift: tl.constexpr = KEY_BITS - 15
    flat = tl.reshape(keys, (keys.shape[0] * keys.shape[1],), can_reorder=True)
    present = flat != 0
    level = (flat >> level_shift).to(tl.int32)
    if lowest is None:
        boundary, fewer, above, bucket_count = near_boundary(level, present, k)
    else:
        boundary, fewer, above, bucket_count = _anchored_boundary(level, present, k, lowest)
    prefix = boundary.to(tl.int64) << level_shift
    need = k - above
    selected = tl.where(fewer, above, k)  # fewer than k: above counts every key
    if fewer:
        kth = tl.zeros((), dtype=tl.int64)
    elif need == bucket_count:  # every key of the k-th level is taken
        kth = tl.min(tl.where(present & (level == boundary), flat, 0x7FFFFFFFFFFFFFFF), axis=0)
    elif bucket_count <= TIE_TILE:
        tie = (keys != 0) & ((keys >> level_shift) == boundary)
        tl.store(tie_ptr + flat_positions(tie.to(tl.int32)), keys, mask=tie)
        tl.debug_barrier()  # the block's stores are seen by all its threads
        slot = tl.arange(0, TIE_TILE)
        ties = tl.load(tie_ptr + slot, mask=slot < bucket_count, other=0)
        kth = _gid_select(ties, ties != 0, prefix, need, tl.full((), level_shift, tl.int32), TIE_DIGIT,
                          TIE_BINS)
    else:
        kth = _gid_select(flat, present, prefix, need, tl.full((), level_shift, tl.int32), WIDE_DIGIT, WIDE_BINS)
    return kth, selected


@triton.jit
def fill_tail(row_ptr, count, TOPK: tl.constexpr):
    """-1 into slots [count, TOPK) of a row (TOPK need not be a power of 2)."""
    for start in tl.static_range(0, TOPK, 1024):
        offs = start + tl.arange(0, 1024)
        tl.store(row_ptr + offs, tl.full((1024,), -1, tl.int32), mask=(offs >= count) & (offs < TOPK))


@triton.jit
def flat_positions(flags):
    """Exclusive row-major prefix count of a 2-D 0/1 int32 tensor: the slot
    each set element takes when they are compacted in candidate order. One
    scan of the flattened tile: row sums, a scan over them and a scan along
    the rows each cross the warps (three block-wide steps, not one)."""
    flat = tl.reshape(flags, (flags.shape[0] * flags.shape[1],))
    return tl.reshape(tl.cumsum(flat, axis=0), (flags.shape[0], flags.shape[1])) - flags


@triton.constexpr_function
def log2(n):
    """log2 of a power of 2, in kernels."""
    return n.bit_length() - 1


@triton.constexpr_function
def power_of_2(n):
    """The least power of 2 >= n, in kernels (of a constexpr) and on the host."""
    return triton.next_power_of_2(n)


@triton.jit
def emit_selected(keys, kappa, count, row, outputs, sizes, rank, sort_row, keep_keys, TOPK: tl.constexpr,
                  WORLD: tl.constexpr, INTERLEAVE: tl.constexpr, GID_BITS: tl.constexpr, EMIT_IDS: tl.constexpr,
                  EMIT_ROWS: tl.constexpr, SORTED: tl.constexpr):
    """The keys >= kappa of a 2-D [ranks, slots] tensor in candidate order
    (``count`` of them, known to the caller): written as ids and/or this
    rank's physical rows of ``row`` (``write_outputs``) in candidate order;
    or, when SORTED, stored in candidate order to ``sort_row`` (int64, TOPK
    rounded up to a power of 2 of them, zeros after the last), which
    ``select.order_kernel`` then sorts and writes. A sort is a kernel of its
    own: inside the select and the rescue it cost each 5 to 13 s of
    compilation. ``keep_keys``: store them there too when not SORTED (the
    rescue starts from the select's keys)."""
    chosen = (keys >= kappa) & (keys != 0)
    slot = flat_positions(chosen.to(tl.int32))
    if SORTED:
        store_keys(sort_row, keys, chosen, slot, count, TOPK)
    else:
        write_outputs(key_gid(keys, GID_BITS), chosen, slot, count, row, outputs, sizes, rank, TOPK, WORLD,
                      INTERLEAVE, EMIT_IDS, EMIT_ROWS)
        if keep_keys:
            store_keys(sort_row, keys, chosen, slot, count, TOPK)


@triton.jit
def store_keys(row_ptr, keys, chosen, slot, count, TOPK: tl.constexpr):
    """The ``count`` chosen keys at ``slot`` of ``row_ptr``, zeros after
    them up to TOPK rounded up to a power of 2 (a caller whose keys came
    from there first lets every thread read them)."""
    width: tl.constexpr = power_of_2(TOPK)
    tl.store(row_ptr + slot, keys, mask=chosen)
    tail = tl.arange(0, width)
    tl.store(row_ptr + tail, tl.zeros((width,), dtype=tl.int64), mask=tail >= count)


@triton.jit
def write_outputs(gid, chosen, slot, count, row, outputs, sizes, rank, TOPK: tl.constexpr, WORLD: tl.constexpr,
                  INTERLEAVE: tl.constexpr, EMIT_IDS: tl.constexpr, EMIT_ROWS: tl.constexpr):
    """The ``count`` chosen global ids ``gid`` (2-D) of ``row`` as ids at
    ``slot`` and/or as this rank's physical rows, compacted in the same
    order, -1 after. ``outputs``: (ids_ptr, rows_ptr, valid_ptr, req_ptr,
    table_ptr); ``sizes``: (table_stride, num_reqs, num_blocks, block_size,
    stride_rows, rows_stride), as ``select.output_args`` builds them."""
    ids_ptr, rows_ptr, valid_ptr, req_ptr, table_ptr = outputs
    table_stride, num_reqs, num_blocks, block_size, stride_rows, rows_stride = sizes
    if EMIT_IDS:
        ids_row = ids_ptr + row * TOPK
        tl.store(ids_row + slot, gid.to(tl.int32), mask=chosen)
        fill_tail(ids_row, count, TOPK)
    if EMIT_ROWS:
        owner, local = owner_and_local(gid, WORLD, INTERLEAVE)
        block = local // block_size
        req = tl.load(req_ptr + row).to(tl.int64)
        keep = chosen & (owner == rank) & (block < num_blocks) & (req >= 0) & (req < num_reqs)
        entry = tl.load(table_ptr + req * table_stride + block, mask=keep, other=0).to(tl.int64)
        keep_i = keep.to(tl.int32)
        owned = tl.sum(tl.sum(keep_i, axis=1), axis=0)
        out_row = rows_ptr + row * rows_stride
        tl.store(out_row + flat_positions(keep_i), (entry * stride_rows + local % block_size).to(tl.int32),
                 mask=keep)
        fill_tail(out_row, owned, TOPK)
        tl.store(valid_ptr + row, owned)

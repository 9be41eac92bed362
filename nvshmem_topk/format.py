"""The packed candidate format and the key order: the one place these facts live.

Every other module (reference, kernels, coordinator, tests) takes its
constants and conversions from here, so the layout can change in one file.

Scores
    ``ord16(bits)`` maps the 16 bits of a bf16 to an unsigned 16-bit value
    whose integer order is the float order (-inf lowest, -0 < +0, +inf
    highest). Every non-NaN bf16 maps to >= ``MIN_VALID_ORD16`` (0x007F), so
    a word or key of 0 can mean "empty". With 32-bit scores (``score_bits``
    32: exact fp32 order) ``ord32`` does the same to the 32 bits of an fp32
    (every non-NaN fp32 maps to >= 0x007FFFFF); its top 16 bits are the
    ord16 of the fp32 cut to bf16, not rounded.

Words (round 1 and pushed lists)
    A candidate of local index ``l`` is the 32-bit word
    ``(ord16 << 16) | (0xFFFF - (l & 0xFFFF))`` stored as int32 (two's
    complement), followed by ``planes`` blocks of ``n / 32`` words: bit
    ``j % 32`` of word ``j // 32`` of plane ``p`` holds bit ``16 + p`` of the
    local index of candidate ``j``. With 32-bit scores the word holds the
    top 16 bits of ord32, and ``n / 2`` words follow the planes: bits
    ``16 * (j % 2)`` to ``16 * (j % 2) + 15`` of word ``j // 2`` hold the low
    16 bits of candidate ``j``'s ord32. A row of ``n`` candidates is
    ``packed_row_words(n, planes, score_bits)`` int32 words; a 0 word is an
    empty slot.

Keys (the select order)
    ``key = (ord << gid_bits) | (2**gid_bits - 1 - g)`` as int64, with ``ord``
    the ord16 (or ord32) of the score and ``g`` the global token id (at most
    32 + 31 bits). Keys are unique; a larger key means a higher score, then a
    lower global id. 0 is "no candidate".

Saturation state (one int64 per row; two with 32-bit scores)
    ``(mask << SAT_MASK_SHIFT) | kappa``: bit q of ``mask`` is set when rank
    q was saturated in round 1; ``kappa`` is the K-th selected key (0 when
    fewer than K were selected). A key of a 32-bit score does not leave room
    for the mask: the row's state is then ``[mask << SAT_MASK_SHIFT, kappa]``.
"""

from __future__ import annotations

import math

import torch

WARP = 32
LOW_BITS = 16
LOW_MASK = (1 << LOW_BITS) - 1
MAX_PLANES = 4
LOCAL_ID_BITS = LOW_BITS + MAX_PLANES
MAX_LOCAL_LEN = 1 << LOCAL_ID_BITS
MIN_VALID_ORD16 = 0x007F
SCORE_BITS = (16, 32)  # what a word ranks: ord16 (bf16, fp16; fp32 rounded to bf16), or ord32 (fp32 order)
MAX_WORLD_SIZE = 16
MIN_TOPK, MAX_TOPK = 1, 4096
MAX_GID_BITS = 31  # global ids are int32; keys then fit 47 bits (63 with 32-bit scores)
SAT_MASK_SHIFT = 16 + MAX_GID_BITS
SAT_KAPPA_MASK = (1 << SAT_MASK_SHIFT) - 1


# ---------------------------------------------------------------- sizes


def num_planes(max_local_len: int) -> int:
    """Bit planes needed for local ids below ``max_local_len`` (0..4)."""
    if not 1 <= max_local_len <= MAX_LOCAL_LEN:
        raise ValueError(
            f"max_local_len must be in [1, {MAX_LOCAL_LEN}] (2^{LOCAL_ID_BITS} "
            f"local tokens per rank), got {max_local_len}"
        )
    return max(0, (max_local_len - 1).bit_length() - LOW_BITS)


def packed_row_words(num_candidates: int, planes: int = 0, score_bits: int = 16) -> int:
    """int32 words of one packed row: the words, then the bit planes, then
    (32-bit scores) the scores' low halves, two a word."""
    low_halves = num_candidates // 2 if score_bits == 32 else 0
    return num_candidates + planes * (num_candidates // WARP) + low_halves


def score_bits_of(score_dtype) -> int:
    """The scores' bits a merge ranks by: None, the logits' own 16-bit order
    (fp32 rounded to bf16), 16; torch.float32, the full fp32 order, 32."""
    if score_dtype is None:
        return 16
    if score_dtype == torch.float32:
        return 32
    raise ValueError(f"score_dtype must be None (bf16 or fp16 order; fp32 rounded to bf16) or torch.float32 "
                     f"(exact fp32 order), got {score_dtype!r}")


def rescue_slots(topk: int, local_topk: int) -> int:
    """Receive slots per row: at most K // N ranks can be saturated."""
    return topk // local_topk


def list_len(topk: int) -> int:
    """Slots of a saturated rank's pushed list: its local top-K (of the
    tokens at or above ``list_floor``), K rounded up to a multiple of 32 (a
    bit-plane word holds 32 candidates' bits). A superset of that rank's
    share of the top-K is all the rescue needs."""
    return round_up_to_warp(topk)


def round_up_to_warp(n: int) -> int:
    return WARP * math.ceil(n / WARP)


def default_local_topk(topk: int, world_size: int) -> int:
    """N = ceil(1.5 * K / W), rounded up to a multiple of 32."""
    return round_up_to_warp(math.ceil(3 * topk / (2 * world_size)))


def global_id_bits(world_size: int, interleave: int, max_local_len: int) -> int:
    """Bits of the largest global id any rank's local id below
    ``max_local_len`` can map to (local ids are bounded by the planes)."""
    top_local = (1 << (LOW_BITS + num_planes(max_local_len))) - 1
    bits = global_id(top_local, world_size - 1, world_size, interleave).bit_length()
    if bits > MAX_GID_BITS:
        raise ValueError(
            f"global ids need {bits} bits (W={world_size}, interleave={interleave}, "
            f"max_local_len={max_local_len}); at most {MAX_GID_BITS} fit int32 ids"
        )
    return bits


# ------------------------------------------------------- token placement


def global_id(local, rank, world_size: int, interleave: int):
    """Global id of local token ``local`` on ``rank`` (ints or tensors)."""
    return (local // interleave) * (world_size * interleave) + rank * interleave + local % interleave


def owner_and_local(gid, world_size: int, interleave: int):
    """(rank, local id) of global token ``gid`` (ints or tensors)."""
    rank = (gid // interleave) % world_size
    local = (gid // (interleave * world_size)) * interleave + gid % interleave
    return rank, local


# -------------------------------------------------------- scores, words


def score16_bits(scores: torch.Tensor) -> torch.Tensor:
    """The 16-bit patterns ``scores`` are ranked by, as int32 in [0, 0xFFFF]:
    bf16 and fp16 as they are, an fp16 NaN made bf16's (0x7FC0) so that
    ``is_nan_bits`` serves both; fp32 rounded to bf16 first (to nearest
    even)."""
    if scores.dtype == torch.float16:
        bits = scores.view(torch.int16).to(torch.int32) & 0xFFFF
        return torch.where(scores.isnan(), 0x7FC0, bits)
    return scores.to(torch.bfloat16).view(torch.int16).to(torch.int32) & 0xFFFF


def is_nan_bits(bits: torch.Tensor) -> torch.Tensor:
    return (bits & 0x7FFF) > 0x7F80


def ord16(bits: torch.Tensor) -> torch.Tensor:
    """Order-preserving unsigned image of bf16 or fp16 bits (int32 in, int32 out)."""
    return torch.where(bits >= 0x8000, ~bits & 0xFFFF, bits | 0x8000)


def ord32(scores: torch.Tensor) -> torch.Tensor:
    """Order-preserving unsigned image (int64) of the fp32 value of each
    score (bf16 and fp16 widen exactly)."""
    bits = scores.float().view(torch.int32).long() & 0xFFFFFFFF
    return torch.where(bits >= 1 << 31, ~bits & 0xFFFFFFFF, bits | (1 << 31))


def score_order(scores: torch.Tensor, score_bits: int = 16) -> tuple[torch.Tensor, torch.Tensor]:
    """(ord, valid): each score's ord16 (``score_bits`` 16) or ord32 (32)
    as int64, and whether it is not NaN."""
    if score_bits == 32:
        return ord32(scores), ~scores.isnan()
    bits = score16_bits(scores)
    return ord16(bits).long(), ~is_nan_bits(bits)


def local_key(ord_: torch.Tensor, local: torch.Tensor) -> torch.Tensor:
    """Rank-local order (score desc, local id asc) as int64; rank-independent."""
    return (ord_.long() << LOCAL_ID_BITS) | ((1 << LOCAL_ID_BITS) - 1 - local.long())


def to_int32(u32: torch.Tensor) -> torch.Tensor:
    """Unsigned 32-bit values held in int64 -> their int32 bit pattern."""
    return torch.where(u32 >= 1 << 31, u32 - (1 << 32), u32).to(torch.int32)


def make_words(ord_: torch.Tensor, local: torch.Tensor, score_bits: int = 16) -> torch.Tensor:
    """Candidate words (int64 holding the unsigned 32-bit value) of scores
    of order ``ord_`` (ord16 or ord32: its top 16 bits)."""
    return ((ord_.long() >> (score_bits - 16)) << LOW_BITS) | (LOW_MASK - (local.long() & LOW_MASK))


def pack_rows(words: torch.Tensor, local: torch.Tensor, planes: int, low: torch.Tensor | None = None) -> torch.Tensor:
    """[T, n] words (int64, 0 = empty) + their local ids (+ with 32-bit
    scores ``low``, their ord32's low 16 bits, 0 where empty) -> packed
    int32 ``[T, packed_row_words(n, planes, 32 if low else 16)]``. Empty
    slots get 0 plane bits."""
    rows, n = words.shape
    present = words != 0
    bit = torch.ones(1, dtype=torch.int64, device=words.device) << torch.arange(
        WARP, device=words.device
    )
    blocks = [words]
    for p in range(planes):
        high = ((local.long() >> (LOW_BITS + p)) & 1) & present.long()
        blocks.append((high.view(rows, n // WARP, WARP) * bit).sum(-1))
    if low is not None:
        blocks.append(low[:, 0::2].long() | (low[:, 1::2].long() << 16))
    return to_int32(torch.cat(blocks, dim=1))


def unpack_rows(packed: torch.Tensor, num_candidates: int, planes: int, score_bits: int = 16):
    """Packed int32 rows ``[..., packed_row_words(n, planes, score_bits)]``
    -> (ord16 or ord32 int64, local int64, present bool), each ``[..., n]``."""
    n = num_candidates
    words = packed[..., :n].long() & 0xFFFFFFFF
    local = LOW_MASK - (words & LOW_MASK)
    slot = torch.arange(n, device=packed.device)
    for p in range(planes):
        plane = packed[..., n + p * (n // WARP) : n + (p + 1) * (n // WARP)].long() & 0xFFFFFFFF
        local |= ((plane[..., slot // WARP] >> (slot % WARP)) & 1) << (LOW_BITS + p)
    order = words >> LOW_BITS
    if score_bits == 32:
        halves = packed[..., packed_row_words(n, planes):].long() & 0xFFFFFFFF  # after the words and planes
        order = (order << 16) | ((halves[..., slot // 2] >> (16 * (slot % 2))) & 0xFFFF)
    return order, local, words != 0


def make_keys(ord_: torch.Tensor, gid: torch.Tensor, present: torch.Tensor, gid_bits: int):
    """Select keys (int64, 0 where not ``present``) of scores of order ``ord_``."""
    keys = (ord_.long() << gid_bits) | ((1 << gid_bits) - 1 - gid.long())
    return torch.where(present, keys, torch.zeros_like(keys))


def key_to_global_id(keys: torch.Tensor, gid_bits: int) -> torch.Tensor:
    """Global ids of keys (int64), -1 where the key is 0."""
    mask = (1 << gid_bits) - 1
    return torch.where(keys != 0, mask - (keys & mask), torch.full_like(keys, -1))


def sat_word(mask: torch.Tensor, kappa: torch.Tensor, score_bits: int = 16) -> torch.Tensor:
    """The rows' saturation states: [T] int64, or [T, 2] with 32-bit scores."""
    if score_bits == 32:
        return torch.stack([mask.long() << SAT_MASK_SHIFT, kappa.long()], dim=-1)
    return (mask.long() << SAT_MASK_SHIFT) | kappa.long()


def sat_mask(sat: torch.Tensor, score_bits: int = 16) -> torch.Tensor:
    """Each row's mask of saturated ranks, from ``sat_word``'s states."""
    return (sat[..., 0] if score_bits == 32 else sat) >> SAT_MASK_SHIFT


def sat_kappa(sat: torch.Tensor, score_bits: int = 16) -> torch.Tensor:
    """Each row's kappa, from ``sat_word``'s states."""
    return sat[..., 1] if score_bits == 32 else sat & SAT_KAPPA_MASK


def list_floor(sat: torch.Tensor, gid_bits: int, score_bits: int = 16) -> torch.Tensor:
    """The lowest ord16 (ord32) a saturated rank's pushed list holds: kappa's score.
    No token below it can be selected (its key is below kappa), so the list
    is the local top-L of the tokens at or above it."""
    return sat_kappa(sat, score_bits) >> gid_bits

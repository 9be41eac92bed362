"""The packed candidate format and the key order: the one place these facts live.

Every other module (reference, kernels, coordinator, tests) takes its
constants and conversions from here, so the layout can change in one file.

Scores
    ``ord16(bits)`` maps the 16 bits of a bf16 to an unsigned 16-bit value
    whose integer order is the float order (-inf lowest, -0 < +0, +inf
    highest). Every non-NaN bf16 maps to >= ``MIN_VALID_ORD16`` (0x007F), so
    a word or key of 0 can mean "empty".

Words (round 1 and pushed lists)
    A candidate of local index ``l`` is the 32-bit word
    ``(ord16 << 16) | (0xFFFF - (l & 0xFFFF))`` stored as int32 (two's
    complement), followed by ``planes`` blocks of ``n / 32`` words: bit
    ``j % 32`` of word ``j // 32`` of plane ``p`` holds bit ``16 + p`` of the
    local index of candidate ``j``. A row of ``n`` candidates is
    ``packed_row_words(n, planes)`` int32 words; a 0 word is an empty slot.

Keys (the select order)
    ``key = (ord16 << gid_bits) | (2**gid_bits - 1 - g)`` as int64, with ``g``
    the global token id. Keys are unique; a larger key means a higher score,
    then a lower global id. 0 is "no candidate".

Saturation state (one int64 per row)
    ``(mask << SAT_MASK_SHIFT) | kappa``: bit q of ``mask`` is set when rank
    q was saturated in round 1; ``kappa`` is the K-th selected key (0 when
    fewer than K were selected).
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
MAX_WORLD_SIZE = 16
MIN_TOPK, MAX_TOPK = 1, 4096
MAX_GID_BITS = 31  # global ids are int32; keys then fit 47 bits
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


def packed_row_words(num_candidates: int, planes: int = 0) -> int:
    """int32 words of one packed row: the words, then the bit planes."""
    return num_candidates + planes * (num_candidates // WARP)


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


def local_key(ord16_: torch.Tensor, local: torch.Tensor) -> torch.Tensor:
    """Rank-local order (score desc, local id asc) as int64; rank-independent."""
    return (ord16_.long() << LOCAL_ID_BITS) | ((1 << LOCAL_ID_BITS) - 1 - local.long())


def to_int32(u32: torch.Tensor) -> torch.Tensor:
    """Unsigned 32-bit values held in int64 -> their int32 bit pattern."""
    return torch.where(u32 >= 1 << 31, u32 - (1 << 32), u32).to(torch.int32)


def make_words(ord16_: torch.Tensor, local: torch.Tensor) -> torch.Tensor:
    """Candidate words (int64 holding the unsigned 32-bit value)."""
    return (ord16_.long() << LOW_BITS) | (LOW_MASK - (local.long() & LOW_MASK))


def pack_rows(words: torch.Tensor, local: torch.Tensor, planes: int) -> torch.Tensor:
    """[T, n] words (int64, 0 = empty) + their local ids -> packed int32
    ``[T, packed_row_words(n, planes)]``. Empty slots get 0 plane bits."""
    rows, n = words.shape
    present = words != 0
    bit = torch.ones(1, dtype=torch.int64, device=words.device) << torch.arange(
        WARP, device=words.device
    )
    blocks = [words]
    for p in range(planes):
        high = ((local.long() >> (LOW_BITS + p)) & 1) & present.long()
        blocks.append((high.view(rows, n // WARP, WARP) * bit).sum(-1))
    return to_int32(torch.cat(blocks, dim=1))


def unpack_rows(packed: torch.Tensor, num_candidates: int, planes: int):
    """Packed int32 rows ``[..., packed_row_words(n, planes)]`` ->
    (ord16 int64, local int64, present bool), each ``[..., n]``."""
    n = num_candidates
    words = packed[..., :n].long() & 0xFFFFFFFF
    local = LOW_MASK - (words & LOW_MASK)
    slot = torch.arange(n, device=packed.device)
    for p in range(planes):
        plane = packed[..., n + p * (n // WARP) : n + (p + 1) * (n // WARP)].long() & 0xFFFFFFFF
        local |= ((plane[..., slot // WARP] >> (slot % WARP)) & 1) << (LOW_BITS + p)
    return words >> LOW_BITS, local, words != 0


def make_keys(ord16_: torch.Tensor, gid: torch.Tensor, present: torch.Tensor, gid_bits: int):
    """Select keys (int64, 0 where not ``present``)."""
    keys = (ord16_.long() << gid_bits) | ((1 << gid_bits) - 1 - gid.long())
    return torch.where(present, keys, torch.zeros_like(keys))


def key_to_global_id(keys: torch.Tensor, gid_bits: int) -> torch.Tensor:
    """Global ids of keys (int64), -1 where the key is 0."""
    mask = (1 << gid_bits) - 1
    return torch.where(keys != 0, mask - (keys & mask), torch.full_like(keys, -1))


def sat_word(mask: torch.Tensor, kappa: torch.Tensor) -> torch.Tensor:
    return (mask.long() << SAT_MASK_SHIFT) | kappa.long()


def sat_mask(sat: torch.Tensor) -> torch.Tensor:
    return sat >> SAT_MASK_SHIFT


def sat_kappa(sat: torch.Tensor) -> torch.Tensor:
    return sat & SAT_KAPPA_MASK


def list_floor(sat: torch.Tensor, gid_bits: int) -> torch.Tensor:
    """The lowest ord16 a saturated rank's pushed list holds: kappa's score.
    No token below it can be selected (its key is below kappa), so the list
    is the local top-L of the tokens at or above it."""
    return sat_kappa(sat) >> gid_bits

"""The packed layout, checked on hand-worked values."""

import pytest
import torch

from nvshmem_topk import format as fmt


def _bits(values):
    return fmt.score16_bits(torch.tensor(values, dtype=torch.float32))


def test_ord16_is_a_total_order_with_signed_zero_and_inf():
    values = [float("-inf"), -2.0, -1.0, -0.0, 0.0, 1e-30, 1.0, 2.0, float("inf")]
    ords = fmt.ord16(_bits(values)).tolist()
    assert ords == sorted(ords) and len(set(ords)) == len(ords)
    assert ords[0] == fmt.MIN_VALID_ORD16 == 0x007F
    assert ords[-1] == 0xFF80
    assert fmt.ord16(_bits([-0.0])).item() == 0x7FFF
    assert fmt.ord16(_bits([0.0])).item() == 0x8000


def test_nan_bits_are_recognised_and_order_below_every_number():
    nan_bits = torch.tensor([0x7FC0, 0xFFC0, 0x7F81, 0xFFFF], dtype=torch.int32)
    assert fmt.is_nan_bits(nan_bits).all()
    assert not fmt.is_nan_bits(_bits([float("inf"), float("-inf"), 0.0])).any()
    assert (fmt.ord16(nan_bits & 0xFFFF)[nan_bits >= 0x8000] < fmt.MIN_VALID_ORD16).all()


def test_fp32_scores_round_to_nearest_bf16():
    assert _bits([1.0 + 2**-8]).item() == 0x3F80  # tie rounds to even
    assert _bits([1.0 + 3 * 2**-9]).item() == 0x3F81


def test_word_layout_by_hand():
    # score 1.0 (bf16 0x3F80 -> ord 0xBF80), local id 5
    word = fmt.make_words(torch.tensor([0xBF80]), torch.tensor([5]))
    assert word.item() == (0xBF80 << 16) | (0xFFFF - 5)
    packed = fmt.pack_rows(word.expand(1, 32).clone(), torch.full((1, 32), 5), planes=0)
    assert packed.dtype == torch.int32 and packed[0, 0].item() == ((0xBF80 << 16) | 0xFFFA) - (1 << 32)


@pytest.mark.parametrize("planes", [0, 1, 2, 4])
def test_pack_unpack_roundtrip_with_bit_planes(planes):
    gen = torch.Generator().manual_seed(planes)
    n = 64
    local = torch.randint(0, 1 << (16 + planes), (3, n), generator=gen)
    ords = torch.randint(fmt.MIN_VALID_ORD16, 0xFF81, (3, n), generator=gen)
    words = fmt.make_words(ords, local)
    words[:, -5:] = 0
    packed = fmt.pack_rows(words, local, planes)
    assert packed.shape == (3, fmt.packed_row_words(n, planes)) == (3, n + planes * 2)
    ord_back, local_back, present = fmt.unpack_rows(packed, n, planes)
    assert present[:, :-5].all() and not present[:, -5:].any()
    assert torch.equal(ord_back[:, :-5], ords[:, :-5])
    assert torch.equal(local_back[:, :-5], local[:, :-5])
    assert (packed[:, -5 - planes * 2 : n] == 0).all()


def test_plane_bit_positions_by_hand():
    local = torch.zeros(1, 32, dtype=torch.int64)
    local[0, 3] = 1 << 16  # plane 0, candidate 3
    local[0, 31] = 1 << 17  # plane 1, candidate 31
    words = fmt.make_words(torch.full((1, 32), 0x8000), local)
    packed = fmt.pack_rows(words, local, planes=2)
    assert packed[0, 32].item() == 1 << 3
    assert packed[0, 33].item() == -(1 << 31)


def test_num_planes_follows_declared_length():
    assert [fmt.num_planes(v) for v in (1, 1 << 16, (1 << 16) + 1, 1 << 17, 1 << 20)] == [0, 0, 1, 1, 4]
    with pytest.raises(ValueError, match="max_local_len"):
        fmt.num_planes((1 << 20) + 1)


def test_sizes():
    assert fmt.packed_row_words(384, 1) == 396
    assert fmt.rescue_slots(2048, 384) == 5
    assert fmt.rescue_slots(2048, 4096) == 0
    assert fmt.default_local_topk(2048, 8) == 384
    assert fmt.default_local_topk(2048, 2) == 1536
    assert fmt.default_local_topk(2048, 16) == 192
    assert fmt.default_local_topk(32, 16) == 32


@pytest.mark.parametrize("world_size,interleave", [(1, 1), (3, 1), (4, 2), (8, 64), (16, 5)])
def test_interleave_mapping_roundtrips_and_grows_with_local(world_size, interleave):
    gids = torch.arange(0, 5000)
    rank, local = fmt.owner_and_local(gids, world_size, interleave)
    assert torch.equal(fmt.global_id(local, rank, world_size, interleave), gids)
    for r in range(world_size):
        mine = local[rank == r]
        assert torch.equal(mine, torch.arange(mine.numel()))
    assert ((gids // interleave) % world_size == rank).all()


def test_keys_order_by_score_then_lower_global_id():
    bits = fmt.global_id_bits(8, 1, 1 << 17)
    assert bits == (((1 << 17) - 1) * 8 + 7).bit_length() == 20
    keys = fmt.make_keys(
        torch.tensor([0x8001, 0x8001, 0x8002]), torch.tensor([7, 3, 100]), torch.tensor([True] * 3), bits
    )
    assert keys[2] > keys[1] > keys[0]
    assert fmt.key_to_global_id(keys, bits).tolist() == [7, 3, 100]
    assert fmt.key_to_global_id(torch.tensor([0]), bits).tolist() == [-1]


def test_sat_word_roundtrip():
    sat = fmt.sat_word(torch.tensor([0b1010_0000_0000_0001]), torch.tensor([(0xFF80 << 31) | 12345]))
    assert fmt.sat_mask(sat).item() == 0b1010_0000_0000_0001
    assert fmt.sat_kappa(sat).item() == (0xFF80 << 31) | 12345


def test_global_ids_must_fit_int32():
    assert fmt.global_id_bits(16, 1, 1 << 20) == 24
    with pytest.raises(ValueError, match="int32"):
        fmt.global_id_bits(16, 1 << 28, 1 << 20)

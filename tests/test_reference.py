"""The eager reference: each stage on hand-checked cases, then the whole
simulated merge against the oracle over every adversarial family; and the
generic merge the benchmarks compare against."""

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from nvshmem_topk.testing import families, special_value_case
from nvshmem_topk import format as fmt
from nvshmem_topk import reference, simulate_dcp_topk_merge
from oracle import assert_exact, oracle_topk


def _bf16(values):
    return torch.tensor(values, dtype=torch.float32).bfloat16()


def _round1(logits, ends, topk, local_topk):
    """Every rank's pack of ``logits`` [W, T, S], gathered, then the select."""
    world, _, width = logits.shape
    gathered = torch.stack([reference.pack(logits[r], ends[r], local_topk, width) for r in range(world)])
    selected, sat = reference.select(gathered, topk=topk, local_topk=local_topk, world_size=world,
                                     interleave=1, max_local_len=width)
    return gathered, selected, sat


# ------------------------------------------------------------- stages


def test_local_topk_indices_by_hand():
    logits = _bf16([[1.0, 3.0, float("nan"), 3.0, 2.0, 5.0, -1.0]])
    row_ends = torch.tensor([6], dtype=torch.int32)
    # valid: 0..5 minus NaN at 2; top-3 by (score desc, id asc): 5, 1, 3
    idx = reference.local_topk_indices(logits, row_ends, 3, max_local_len=1 << 16)
    assert idx.tolist() == [[1, 3, 5]]
    idx = reference.local_topk_indices(logits, torch.tensor([2], dtype=torch.int32), 3, 1 << 16)
    assert idx.tolist() == [[0, 1, -1]]
    assert reference.local_topk_indices(logits, row_ends, 3, max_local_len=2).tolist() == [[0, 1, -1]]


def test_pack_by_hand_is_ascending_local_id_and_empty_last():
    logits = torch.zeros(1, 40).bfloat16()
    logits[0, 7] = 2.0
    logits[0, 3] = 1.0
    packed = reference.pack(logits, torch.tensor([40], dtype=torch.int32), 32, 1 << 16)
    ord16, local, present = fmt.unpack_rows(packed, 32, 0)
    # top-32 of 40: 2.0 at 7, 1.0 at 3, then zeros at the 30 lowest other ids
    expected = sorted([7, 3] + [i for i in range(40) if i not in (3, 7)][:30])
    assert local[0].tolist() == expected and present.all()
    assert ord16[0, expected.index(7)].item() == fmt.ord16(fmt.score16_bits(_bf16([2.0]))).item()


def test_pack_indices_keeps_slots_and_drops_bad_ids():
    logits = _bf16([[0.5, float("nan"), 1.5, 2.5]])
    idx = torch.full((1, 32), -1, dtype=torch.int32)
    idx[0, :5] = torch.tensor([2, 1, 9, 3, 0])  # NaN at 1, 9 past S, 3 past row end
    packed = reference.pack_indices(logits, idx, torch.tensor([3], dtype=torch.int32), 1 << 16)
    _, local, present = fmt.unpack_rows(packed, 32, 0)
    assert present[0].tolist()[:5] == [True, False, False, False, True]
    assert local[0, 0].item() == 2 and local[0, 4].item() == 0
    assert not present[0, 5:].any()


def test_pack_with_planes_crossing_2_pow_16():
    width = (1 << 16) + 100
    logits = torch.zeros(1, width).bfloat16()
    logits[0, (1 << 16) + 7] = 9.0
    logits[0, 11] = 8.0
    packed = reference.pack(logits, torch.tensor([width], dtype=torch.int32), 32, width)
    assert packed.shape == (1, 33)
    _, local, _ = fmt.unpack_rows(packed, 32, 1)
    assert (1 << 16) + 7 in local[0].tolist() and 11 in local[0].tolist()


def test_select_and_saturation_by_hand():
    # W = 2, N = 32, K = 32: rank 0 holds the 32 best scores, all of them.
    world, n, k = 2, 32, 32
    logits = torch.zeros(world, 1, 64).bfloat16()
    logits[0, 0, :40] = 5.0
    ends = torch.full((world, 1), 64, dtype=torch.int32)
    gathered, selected, sat = _round1(logits, ends, k, n)
    bits = fmt.global_id_bits(world, 1, 64)
    ids = fmt.key_to_global_id(selected, bits)
    assert sorted(ids[0].tolist()) == [2 * l for l in range(32)]
    assert fmt.sat_mask(sat).tolist() == [0b01]
    assert fmt.key_to_global_id(fmt.sat_kappa(sat), bits).tolist() == [62]


def test_fewer_candidates_than_k_sets_kappa_zero_and_saturates_full_ranks():
    world, n, k = 2, 32, 128
    logits = torch.randn(world, 1, 100).bfloat16()
    ends = torch.tensor([[100], [10]], dtype=torch.int32)
    gathered, selected, sat = _round1(logits, ends, k, n)
    assert (selected[0] != 0).sum().item() == 42
    assert fmt.sat_kappa(sat).item() == 0 and fmt.sat_mask(sat).item() == 0b01


def test_rescue_slot_is_rank_order_among_saturated():
    mask = torch.tensor([0b1011])
    assert [reference.rescue_slot(mask, q).item() for q in (0, 1, 3)] == [0, 1, 2]


def test_rescue_by_hand_recovers_the_unsent_tokens():
    world, n, k = 3, 32, 64
    logits = torch.zeros(world, 1, 128).bfloat16()
    logits[0, 0, :100] = 3.0
    ends = torch.full((world, 1), 128, dtype=torch.int32)
    gathered, selected, sat = _round1(logits, ends, k, n)
    assert fmt.sat_mask(sat).item() == 0b001
    received = torch.zeros(1, 2, fmt.packed_row_words(k, 0), dtype=torch.int32)
    received[:, 0] = reference.pack(logits[0], ends[0], k, 128)
    rescued = reference.rescue(gathered, sat, received, topk=k, local_topk=n, world_size=world,
                               interleave=1, max_local_len=128)
    ids = fmt.key_to_global_id(rescued, fmt.global_id_bits(world, 1, 128))
    assert sorted(ids[0].tolist()) == [3 * l for l in range(64)]


def test_owned_rows_by_hand():
    ids = torch.tensor([[6, 1, 4, 9, -1, 2]], dtype=torch.int32)  # W = 2: rank 0 owns evens
    block_table = torch.tensor([[10, 20]], dtype=torch.int32)  # block size 2, stride 100
    rows, count = reference.owned_rows(ids, rank=0, world_size=2, interleave=1,
                                       req_id=torch.tensor([0], dtype=torch.int32),
                                       block_table=block_table, block_size=2, stride_rows=100)
    # local ids: 6->3 (block 1, off 1), 4->2 (block 1, off 0), 2->1 (block 0, off 1)
    assert rows.tolist() == [[2001, 2000, 1001, -1, -1, -1]] and count.tolist() == [3]
    rows, count = reference.owned_rows(ids, rank=0, world_size=2, interleave=1,
                                       req_id=torch.tensor([0], dtype=torch.int32),
                                       block_table=block_table[:, :1], block_size=2, stride_rows=100)
    assert rows.tolist()[0][:2] == [1001, -1] and count.tolist() == [1]


def test_ids_from_keys_sorted():
    keys = torch.tensor([[5 << 4 | 9, 7 << 4 | 15, 0]])
    assert reference.ids_from_keys(keys, 4, sorted=True).tolist() == [[0, 6, -1]]
    assert reference.ids_from_keys(keys, 4, sorted=False).tolist() == [[6, 0, -1]]


# ------------------------------------------------------ whole merge


@pytest.mark.parametrize("world_size", [1, 2, 3, 4, 7, 8, 16])
def test_every_family_matches_the_oracle(world_size):
    for name, logits, ends, k, n, inter in families(world_size):
        ids = simulate_dcp_topk_merge(logits, ends, topk=k, local_topk=n, interleave=inter)
        assert_exact(ids, oracle_topk(logits, ends, k, inter), context=name)
        ids_sorted = simulate_dcp_topk_merge(logits, ends, topk=k, local_topk=n, interleave=inter,
                                             sorted=True)
        assert_exact(ids_sorted, oracle_topk(logits, ends, k, inter), ordered=True, context=name)


def test_boundary_ties_saturate_a_rank_that_the_strict_rule_would_miss():
    """A full rank whose lowest sent score ties the K-th score holds unsent
    ties with lower global ids than selected ones: it must be saturated."""
    world, k, n = 2, 64, 32
    logits = torch.ones(world, 1, 512).bfloat16()
    logits[1, 0, :100] = 0.0  # rank 1's ties start at global id 201
    ends = torch.full((world, 1), 512, dtype=torch.int32)
    gathered, _, sat = _round1(logits, ends, k, n)
    kappa_ord = fmt.sat_kappa(sat) >> fmt.global_id_bits(world, 1, 512)
    lowest_sent_ord = (gathered[0, 0, :n].long() & 0xFFFFFFFF) >> 16
    assert (lowest_sent_ord == kappa_ord).all()  # the strict ">" rule marks nobody
    assert fmt.sat_mask(sat).item() & 0b01
    ids = simulate_dcp_topk_merge(logits, ends, topk=k, local_topk=n)
    assert_exact(ids, oracle_topk(logits, ends, k))
    assert sorted(ids[0, 0].tolist()) == list(range(0, 2 * k, 2))


@pytest.mark.parametrize("width,world_size", [((1 << 16) + 300, 2), ((1 << 17) + 300, 3)])
def test_local_lengths_past_2_pow_16_and_17(width, world_size):
    gen = torch.Generator().manual_seed(width)
    logits = (torch.randn(world_size, 2, width, generator=gen) * 0.1).bfloat16()
    logits[:, :, -200:] += 3.0  # the winners sit past 2^16 / 2^17
    ends = torch.tensor([[width, width - 150]] * world_size, dtype=torch.int32)
    ids = simulate_dcp_topk_merge(logits, ends, topk=256)
    assert_exact(ids, oracle_topk(logits, ends, 256))


@pytest.mark.parametrize("topk,world_size", [(4096, 2), (4096, 16), (32, 16), (3000, 4), (2047, 8), (7, 2), (1, 16)])
def test_large_and_small_k(topk, world_size):
    gen = torch.Generator().manual_seed(topk + world_size)
    logits = torch.randn(world_size, 2, 3000, generator=gen).bfloat16()
    logits[0, 0, :2500] += 10  # saturate rank 0 on row 0
    ends = torch.full((world_size, 2), 3000, dtype=torch.int32)
    ids = simulate_dcp_topk_merge(logits, ends, topk=topk)
    assert_exact(ids, oracle_topk(logits, ends, topk))


@pytest.mark.parametrize("world_size,interleave", [(2, 1), (4, 2), (8, 64)])
def test_row_starts_match_the_oracle(world_size, interleave):
    """Windows [start, end) per rank and row (a prefill row's), the best
    scores just outside them."""
    gen = torch.Generator().manual_seed(world_size)
    rows, width, k = 5, 700, 100
    logits = torch.randn(world_size, rows, width, generator=gen).bfloat16()
    starts = torch.randint(0, width, (world_size, rows), generator=gen, dtype=torch.int32)
    ends = (starts + torch.randint(0, width, (world_size, rows), generator=gen, dtype=torch.int32)).clamp(max=width)
    for r in range(world_size):
        for t in range(rows):
            for outside in (int(starts[r, t]) - 1, int(ends[r, t])):
                if 0 <= outside < width:
                    logits[r, t, outside] = 50.0
    ids = simulate_dcp_topk_merge(logits, ends, topk=k, interleave=interleave, row_starts=starts)
    assert_exact(ids, oracle_topk(logits, ends, k, interleave, row_starts=starts))


def test_fp32_logits_are_rounded_to_bf16():
    gen = torch.Generator().manual_seed(3)
    logits = torch.randn(2, 3, 400, generator=gen)
    ends = torch.full((2, 3), 400, dtype=torch.int32)
    ids = simulate_dcp_topk_merge(logits, ends, topk=64)
    assert torch.equal(ids, simulate_dcp_topk_merge(logits.bfloat16(), ends, topk=64))


def test_deterministic_across_runs():
    for _, logits, ends, k, n, inter in families(4, seed=9):
        a = simulate_dcp_topk_merge(logits, ends, topk=k, local_topk=n, interleave=inter)
        b = simulate_dcp_topk_merge(logits.clone(), ends.clone(), topk=k, local_topk=n, interleave=inter)
        assert torch.equal(a, b)


@settings(max_examples=60, deadline=None)
@given(
    world_size=st.integers(1, 16),
    rows=st.integers(1, 3),
    width=st.integers(1, 300),
    k_blocks=st.integers(1, 8),
    n_blocks=st.integers(1, 6),
    interleave=st.integers(1, 9),
    levels=st.integers(1, 6),
    seed=st.integers(0, 2**31 - 1),
)
def test_property_matches_the_oracle(world_size, rows, width, k_blocks, n_blocks, interleave, levels, seed):
    logits, ends = special_value_case(world_size, rows, width, levels, seed)
    topk = 32 * k_blocks
    ids = simulate_dcp_topk_merge(logits, ends, topk=topk, local_topk=32 * n_blocks, interleave=interleave)
    assert_exact(ids, oracle_topk(logits, ends, topk, interleave))


@pytest.mark.parametrize("rank_by_rank", [False, True])
def test_the_generic_baseline_finds_the_top_k(rank_by_rank):
    from nvshmem_topk.baseline import generic_merge_compute

    world, rows, width, k = 3, 2, 200, 50
    # Distinct scores (consecutive positive bf16 patterns, shuffled): the top-K is one set.
    bits = 0x3F80 + torch.randperm(world * rows * width, generator=torch.Generator().manual_seed(5))
    logits = bits.to(torch.int16).view(torch.bfloat16).reshape(world, rows, width)
    ids = generic_merge_compute(logits, k, rank_by_rank=rank_by_rank)
    ends = torch.full((world, rows), width, dtype=torch.int32)
    assert [sorted(r) for r in ids.tolist()] == [sorted(r) for r in oracle_topk(logits, ends, k)]

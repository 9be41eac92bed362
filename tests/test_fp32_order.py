"""Exact fp32 order (``score_dtype=torch.float32``): the engines' own check
that a DCP merge equals the unsharded fp32 top-k, the cases that bf16
rounding gets wrong, and the 32-bit stages against their layout."""

import pytest
import torch

import nvshmem_topk as nt
from nvshmem_topk import format as fmt
from nvshmem_topk import reference
from nvshmem_topk.contract import assert_packed_merge_contract
from nvshmem_topk.testing import shard, sub_bf16_scores
from oracle import assert_exact, oracle_topk

FP32 = torch.float32


def _from_bits(bits: torch.Tensor) -> torch.Tensor:
    return bits.to(torch.int32).view(torch.float32)


def _unsharded_topk_agrees(got: torch.Tensor, scores: torch.Tensor, topk: int) -> None:
    """Where torch.topk of the unsharded fp32 row has one answer (the K-th
    score above the next), the merge returns exactly its set."""
    values, ids = scores.topk(min(topk + 1, scores.shape[1]), dim=1)
    for t in range(scores.shape[0]):
        if values.shape[1] <= topk or values[t, topk - 1] > values[t, topk]:
            assert set(got[t].tolist()) == set(ids[t, :topk].tolist()), f"row {t}"


@pytest.mark.parametrize("world_size", [2, 4, 8])
@pytest.mark.parametrize("interleave", [1, 2])
def test_dcp_equals_the_unsharded_fp32_topk(world_size, interleave):
    gen = torch.Generator().manual_seed(world_size * 10 + interleave)
    topk, width = 64, 256
    scores = sub_bf16_scores(4, world_size * width, gen)
    logits = shard(scores, world_size, interleave)
    ends = torch.full((world_size, 4), width, dtype=torch.int32)
    got = nt.simulate_dcp_topk_merge(logits, ends, topk=topk, interleave=interleave, score_dtype=FP32)
    assert_exact(got, oracle_topk(logits, ends, topk, interleave, score_dtype=FP32))
    _unsharded_topk_agrees(got[0], scores, topk)
    rounded = nt.simulate_dcp_topk_merge(logits, ends, topk=topk, interleave=interleave)
    assert not torch.equal(rounded.sort(-1).values, got.sort(-1).values), "bf16 order would do: the case is void"


def test_the_cases_bf16_rounding_gets_wrong():
    world_size, width = 4, 64
    scores = torch.full((3, world_size * width), -1.0)
    # 33 scores 1.125 + i 2^-23, all on rank 0 (global ids 0, 4, 8, ...), K = 32: the largest is chosen
    scores[0, torch.arange(33) * world_size] = 1.125 + torch.arange(33) * 2.0 ** -23
    # 511 and 514 round to one bf16 value; 514 is larger
    scores[1, 0], scores[1, 5] = 511.0, 514.0
    # one bf16 level, ten low bits apart
    scores[2] = _from_bits(0x3F800000 + torch.randperm(world_size * width, generator=torch.Generator().manual_seed(1)))
    logits = shard(scores, world_size)
    ends = torch.full((world_size, 3), width, dtype=torch.int32)
    got = nt.simulate_dcp_topk_merge(logits, ends, topk=32, score_dtype=FP32, sorted=True)
    assert got[0, 0].tolist() == (torch.arange(32, 0, -1) * world_size).tolist()
    assert got[0, 1, 0] == 5
    assert got[0, 2].tolist() == scores[2].topk(32).indices.tolist()


@pytest.mark.parametrize("topk", [1, 7, 2047, 3000, 4096])
def test_any_topk_in_fp32_order(topk):
    world_size, width = 4, 2048
    scores = sub_bf16_scores(2, world_size * width, torch.Generator().manual_seed(topk))
    logits = shard(scores, world_size, 2)
    ends = torch.full((world_size, 2), width, dtype=torch.int32)
    got = nt.simulate_dcp_topk_merge(logits, ends, topk=topk, interleave=2, score_dtype=FP32, sorted=True)
    assert_exact(got, oracle_topk(logits, ends, topk, 2, score_dtype=FP32), ordered=True)


def test_windows_nan_infinities_and_signed_zeros():
    """-0 ranks below +0 (as in bf16 order); NaN is never chosen; each row's
    window [start, end) bounds its tokens."""
    gen = torch.Generator().manual_seed(3)
    world_size, rows, width, topk = 4, 6, 96, 48
    logits = sub_bf16_scores(world_size * rows, width, gen).view(world_size, rows, width)
    special = torch.tensor([float("nan"), float("inf"), -float("inf"), 0.0, -0.0, 1e-45, -1e-45])
    spots = torch.rand(logits.shape, generator=gen) < 0.3
    logits[spots] = special[torch.randint(0, len(special), (int(spots.sum()),), generator=gen)]
    logits[:, 2] = torch.where(torch.rand(world_size, width, generator=gen) < 0.5, 0.0, -0.0)  # the boundary at 0
    starts = torch.randint(0, width // 2, (world_size, rows), generator=gen)
    ends = torch.randint(width // 2, width + 8, (world_size, rows), generator=gen)
    ends[0, 0], starts[1, 1] = 0, width  # an empty window on one rank
    got = nt.simulate_dcp_topk_merge(logits, ends, topk=topk, row_starts=starts, score_dtype=FP32, sorted=True)
    assert_exact(got, oracle_topk(logits, ends, topk, row_starts=starts, score_dtype=FP32), ordered=True)


def test_16_bit_logits_rank_alike_in_either_mode():
    """bf16 and fp16 widen to fp32 exactly: the fp32 order is their order."""
    gen = torch.Generator().manual_seed(5)
    for dtype in (torch.bfloat16, torch.float16):
        logits = torch.randint(-6, 6, (4, 3, 200), generator=gen).to(dtype) / 4
        ends = torch.full((4, 3), 200, dtype=torch.int64)
        for topk in (5, 100):
            exact = nt.simulate_dcp_topk_merge(logits, ends, topk=topk, score_dtype=FP32, sorted=True)
            assert torch.equal(exact, nt.simulate_dcp_topk_merge(logits, ends, topk=topk, sorted=True))


def test_a_saturated_rank_is_rescued_in_fp32_order():
    """Rank 0 holds the best scores, which tie at bf16 level: it saturates,
    and the rescue ranks its pushed list by the full fp32 order."""
    world_size, width, topk = 4, 512, 64
    scores = sub_bf16_scores(2, world_size * width, torch.Generator().manual_seed(9))
    on_rank_0 = torch.arange(world_size * width) % world_size == 0
    scores[:, on_rank_0] = _from_bits(0x41200000 + torch.randperm(width, generator=torch.Generator().manual_seed(2)))
    logits = shard(scores, world_size)
    ends = torch.full((world_size, 2), width, dtype=torch.int32)
    local_topk = fmt.default_local_topk(topk, world_size)
    packed = torch.stack([reference.pack(logits[r], ends[r], local_topk, width, score_bits=32)
                          for r in range(world_size)])
    _, sat = reference.select(packed, topk=topk, local_topk=local_topk, world_size=world_size, interleave=1,
                              max_local_len=width, score_bits=32)
    assert fmt.sat_mask(sat, 32).tolist() == [1, 1]
    got = nt.simulate_dcp_topk_merge(logits, ends, topk=topk, score_dtype=FP32)
    assert_exact(got, oracle_topk(logits, ends, topk, score_dtype=FP32))
    _unsharded_topk_agrees(got[0], scores, topk)


def test_32_bit_words_hold_the_whole_order():
    """A packed row of 32-bit scores: the words, the plane bits, then the
    low halves, which decode to each candidate's ord32; the contract checker
    accepts it in the fp32 order and the merge takes it as round-1 rows."""
    gen = torch.Generator().manual_seed(11)
    rows, width, n = 3, 70000, 64  # local ids past 2^16: one plane
    logits = sub_bf16_scores(rows, width, gen)
    ends = torch.tensor([width, 40000, 17], dtype=torch.int64)
    packed = nt.dcp_topk_pack(logits, ends, local_topk=n, max_local_len=width, score_dtype=FP32)
    assert packed.shape == (rows, fmt.packed_row_words(n, 1, 32)) == (rows, n + n // 32 + n // 2)
    order, local, present = fmt.unpack_rows(packed, n, 1, 32)
    for t in range(rows):
        want = reference.local_topk_indices(logits[t:t + 1], ends[t:t + 1], n, width, score_bits=32)[0]
        assert local[t][present[t]].tolist() == want[want >= 0].tolist()
        assert torch.equal(order[t][present[t]], fmt.ord32(logits[t, local[t][present[t]]]))
    assert_packed_merge_contract(packed, logits, ends, local_topk=n, max_local_len=width, score_dtype=FP32)
    with pytest.raises(AssertionError):
        assert_packed_merge_contract(packed, logits, ends, local_topk=n, max_local_len=width)


def test_score_dtype_is_checked_before_anything_runs():
    logits = torch.zeros(1, 64)
    ends = torch.full((1,), 64, dtype=torch.int32)
    with pytest.raises(ValueError, match="score_dtype must be None .* or torch.float32"):
        nt.dcp_topk_pack(logits, ends, local_topk=32, max_local_len=64, score_dtype=torch.float16)


def test_the_indexer_hook_ranks_fp32_order():
    """An engine's indexer built for fp32 order warms up on fp32 logits and
    merges them in that order."""
    group = nt.SimulatedGroup(1, torch.device("cpu"))
    indexer = nt.DcpTopkIndexer(group.ranks[0], max_rows=3, topk=32, max_local_len=500, score_dtype=FP32)
    indexer.warmup()
    scores = sub_bf16_scores(3, 500, torch.Generator().manual_seed(6))
    ids, ends = torch.empty(3, 32, dtype=torch.int32), torch.full((3,), 500, dtype=torch.int32)
    indexer.dcp_topk_merge(scores, ends, ids, sorted=True)
    assert_exact(ids[None], oracle_topk(scores[None], ends[None], 32, score_dtype=FP32), ordered=True)
    indexer.destroy()
    group.destroy()

"""Triton kernels against the reference, bit for bit, stage by stage.

On CPU these run under TRITON_INTERPRET=1 (small shapes, in CI); the ``gpu``
tests run the same comparison at serving shapes on one GPU."""

import math
import os

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import nvshmem_topk as nt
from nvshmem_topk.testing import families, special_value_case
from drive import STAGES, drive
from oracle import assert_exact, oracle_topk

interpreted = os.environ.get("TRITON_INTERPRET") == "1"
needs_triton = pytest.mark.skipif(
    not interpreted and not torch.cuda.is_available(),
    reason="Triton kernels need a GPU or TRITON_INTERPRET=1",
)


@pytest.fixture(params=["one program a row", "spread"])
def pack_kernels(request, monkeypatch):
    """The pack's two kernel families at the short widths of these tests:
    one program a row (``pack.row_kernel``), and the spread pipeline that
    rows wider than ``pack.SHORT_ROWS`` take."""
    from nvshmem_topk.kernels import pack

    if request.param == "spread":
        monkeypatch.setattr(pack, "SHORT_ROWS", 0)
    return request.param


def _same_at_every_stage(logits, ends, **kw):
    ref = drive(logits, ends, impl="reference", **kw)
    tri = drive(logits, ends, impl="triton", **kw)
    for stage in STAGES:
        assert torch.equal(tri[stage].cpu(), ref[stage].cpu()), f"stage {stage} differs"
    return tri


@needs_triton
@pytest.mark.parametrize("world_size", [1, 2, 3, *(pytest.param(w, marks=pytest.mark.slow) for w in (5, 8, 16))])
def test_kernels_match_reference_stage_by_stage(world_size, device, pack_kernels):
    for name, logits, ends, k, n, inter in families(world_size, seed=2, rows=3, width=200, topk=64):
        got = _same_at_every_stage(logits.to(device), ends.to(device), topk=k, local_topk=n,
                                   interleave=inter)
        assert_exact(got["ids"].cpu(), oracle_topk(logits, ends, k, inter), context=name)


@needs_triton
@pytest.mark.parametrize("interleave", [1, 64])
def test_score_families_match_reference_stage_by_stage(interleave, device, pack_kernels):
    """Every score family of the benchmarks (nvshmem_topk.testing), global
    rows sharded over 4 ranks, rows wide enough that each rank's pack
    samples them; and one rank holding the best scores (it saturates, so its
    pushed list and the rescue run)."""
    from nvshmem_topk.testing import SCORE_FAMILIES, family_scores, shard

    gen = torch.Generator().manual_seed(interleave)
    world, rows, width, k = 4, 2, 2560, 256
    cases = [(name, shard(family_scores(name, rows, world * width, gen), world, interleave))
             for name in SCORE_FAMILIES]
    best = shard(family_scores("normal", rows, world * width, gen), world, interleave)
    best[1] = (best[1].float() + 6).bfloat16()
    cases.append(("one rank holds the best", best))
    ends = torch.full((world, rows), width, dtype=torch.int32)
    for name, logits in cases:
        got = _same_at_every_stage(logits.to(device), ends.to(device), topk=k, local_topk=96, interleave=interleave)
        assert_exact(got["ids"].cpu(), oracle_topk(logits, ends, k, interleave), context=name)
        if name == "one rank holds the best":
            assert ((got["sat"].cpu() >> 47) == 2).all(), "rank 1 is saturated on every row"


@needs_triton
def test_whole_rows_match_reference_stage_by_stage(device):
    """Rows whose window is the short rows' whole tile (read unmasked, 16
    bytes a thread) beside rows that end or start inside it; rank 0 holds
    the best scores, so its pushed list (read up to the call's width before
    its window is known) and the rescue run too."""
    from nvshmem_topk.testing import family_scores, shard

    gen = torch.Generator().manual_seed(21)
    world, rows, width, k = 2, 3, 1024, 128
    logits = shard(family_scores("normal", rows, world * width, gen), world)
    logits[0] = (logits[0].float() + 6).bfloat16()
    ends = torch.full((world, rows), width, dtype=torch.int32)
    ends[:, 1] = width - 5
    starts = torch.zeros((world, rows), dtype=torch.int32)
    starts[:, 2] = 3
    logits[:, 1, width - 5:] = 100.0  # outside the window, above every score inside it
    logits[:, 2, :3] = 100.0
    got = _same_at_every_stage(logits.to(device), ends.to(device), topk=k, local_topk=96, starts=starts.to(device))
    assert_exact(got["ids"].cpu(), oracle_topk(logits, ends, k, row_starts=starts))
    assert ((got["sat"].cpu() >> 47) == 1).all(), "rank 0 is saturated on every row"


@needs_triton
@pytest.mark.slow
def test_rescue_with_more_candidates_than_its_tile_matches_reference(device):
    """Eight saturated ranks whose boosted scores rise with the rank: every
    list but the lowest rank's lies wholly above kappa, so the lists (more
    keys than rescue_keys(K) leaves after the select's K) are streamed
    instead of held."""
    from nvshmem_topk.kernels.select import rescue_keys

    world, width, k, n = 12, 2304, 2048, 256
    gen = torch.Generator().manual_seed(12)
    logits = torch.randn(world, 1, width, generator=gen)
    for q in range(8):
        logits[q] += 10 + 2 * q
    logits = logits.bfloat16()
    ends = torch.full((world, 1), width, dtype=torch.int32)
    got = _same_at_every_stage(logits.to(device), ends.to(device), topk=k, local_topk=n)
    assert (got["sat"].cpu() >> 47).tolist() == [[0xFF]] * world
    from nvshmem_topk import format as fmt

    kappa_score = (int(got["sat"][0, 0]) & fmt.SAT_KAPPA_MASK) >> got["workspaces"][0].gid_bits
    listed = fmt.ord16(logits[:8, 0].float().topk(k, dim=1).values.bfloat16().view(torch.int16).int() & 0xFFFF)
    assert int((listed > kappa_score).sum()) > rescue_keys(k) - k  # list keys the rescue cannot hold
    assert_exact(got["ids"].cpu(), oracle_topk(logits, ends, k))


@needs_triton
@pytest.mark.parametrize("world_size", [2, pytest.param(5, marks=pytest.mark.slow)])
def test_merge_whose_pack_pushes_matches_reference(world_size, device, pack_kernels):
    """The merge as a serving call runs it (simulate_dcp_topk_merge, not
    stage by stage): the pack pushes each row and raises the flags, with no
    push kernel. Every family against the reference and the oracle."""

    for name, logits, ends, k, n, inter in families(world_size, seed=4, rows=3, width=200, topk=64):
        got = nt.simulate_dcp_topk_merge(logits.to(device), ends.to(device), topk=k, local_topk=n,
                                         interleave=inter, impl="triton")
        want = nt.simulate_dcp_topk_merge(logits, ends, topk=k, local_topk=n, interleave=inter, impl="reference")
        assert torch.equal(got.cpu(), want), name
        assert_exact(got.cpu(), oracle_topk(logits, ends, k, inter), context=name)


def _one_rank_merge(logits, ends, k, n, impl, sorted_, starts=None):
    """ids, owned rows and their counts of a one-rank group's merge (both
    outputs asked), as a serving call runs it."""
    rows, width = logits.shape
    device = logits.device
    group = nt.SimulatedGroup(1, device)
    ws = nt.init_dcp_topk_merge(group.ranks[0], max_rows=rows, topk=k, local_topk=n, max_local_len=width, impl=impl)
    # 17 blocks of 16 tokens a request: tokens from 272 on are off the table (dropped from the rows)
    table = torch.randperm(rows * 40, generator=torch.Generator().manual_seed(3))[: rows * 17].view(rows, 17)
    ids = torch.full((rows, k), -7, dtype=torch.int32, device=device)
    rows_out = torch.full((rows, k + 2), -7, dtype=torch.int32, device=device)
    valid = torch.full((rows,), -7, dtype=torch.int32, device=device)
    nt.dcp_topk_merge_rows(logits=logits, row_ends=ends, workspace=ws, ids_out=ids,
                           req_id=torch.arange(rows - 1, -1, -1, dtype=torch.int32, device=device),
                           block_table=table.int().to(device), block_size=16, stride_rows=64, rows_out=rows_out,
                           valid_out=valid, sorted=sorted_, row_starts=starts)
    ws.destroy()
    group.destroy()
    return ids.cpu(), rows_out.cpu(), valid.cpu()


@needs_triton
@pytest.mark.parametrize("sorted_", [False, True])
def test_one_rank_merge_is_one_kernel_with_the_stages_outputs(sorted_, monkeypatch, device):
    """A one-rank group's merge of short rows is one kernel
    (``local_merge_kernel``; then ``order_kernel`` when sorted), whose ids,
    owned rows (the last blocks off the table) and counts are the stages'
    (the reference's), on every family, with row starts, fp16 logits, K not
    a multiple of 32 and N below K."""
    from nvshmem_topk.kernels import launch

    launched = []
    run = launch.Launch.__call__
    monkeypatch.setattr(launch.Launch, "__call__", lambda self: (launched.append(self.kernel.__name__), run(self))[1])
    for name, logits, ends, k, n, _ in families(1, seed=5, rows=3, width=300, topk=45):
        starts = torch.tensor([0, 7, 250], dtype=torch.int32) if name == "random" else None
        for x in (logits[0], logits[0].half()) if name == "random" else (logits[0],):
            for local_topk in (n, 32):
                launched.clear()
                got = _one_rank_merge(x.to(device), ends[0].to(device), k, local_topk, "triton", sorted_,
                                      None if starts is None else starts.to(device))
                assert launched == ["local_merge_kernel"] + ["order_kernel"] * sorted_, (name, launched)
                want = _one_rank_merge(x, ends[0], k, local_topk, "reference", sorted_, starts)
                for g, w in zip(got, want):
                    assert torch.equal(g, w), name


@needs_triton
@pytest.mark.parametrize("topk,local_topk", [(1, 1), (7, 3), (45, 20), (96, 32), (160, 64)])
def test_any_topk_and_local_topk_match_reference(topk, local_topk, device, pack_kernels):
    """K need not be a multiple of 32 nor a power of 2, N is rounded up to
    32; from K = 45 a rank saturates in "saturated_max" (its pushed list
    holds K rounded up to 32) and the rescue runs."""
    for name, logits, ends, _, _, inter in families(3, seed=8, rows=2, width=300, topk=topk):
        if name not in ("random", "saturated_max", "all_equal", "fewer_valid_than_k"):
            continue
        got = _same_at_every_stage(logits.to(device), ends.to(device), topk=topk, local_topk=local_topk,
                                   interleave=inter)
        assert_exact(got["ids"].cpu(), oracle_topk(logits, ends, topk, inter), context=name)
        if name == "saturated_max" and topk >= 45:
            assert (got["sat"].cpu() >> 47 != 0).all(), "a rank is saturated on every row"


@needs_triton
@pytest.mark.slow
def test_sorted_output_and_planes_match_reference(device):
    gen = torch.Generator().manual_seed(5)
    width = (1 << 16) + 64
    logits = (torch.randn(2, 2, width, generator=gen) * 0.1).bfloat16()
    logits[:, :, -40:] += 2.0
    logits[0, 1, :] = 1.0  # all-equal row: ties everywhere, rank 0 saturated
    ends = torch.tensor([[width, width - 5], [width - 20, width]], dtype=torch.int32)
    got = _same_at_every_stage(logits.to(device), ends.to(device), topk=64, local_topk=32, sorted=True)
    assert_exact(got["ids"].cpu(), oracle_topk(logits, ends, 64), ordered=True)


@needs_triton
@pytest.mark.parametrize("topk", [45, 96])
def test_sorted_output_with_a_saturated_rank_and_k_not_a_power_of_2(topk, device):
    """Sorted outputs come from the sort kernel, which sorts the chosen
    keys alone (K rounded up to a power of 2 of them), after the select and
    after the rescue: rank 0 holds the best scores of row 0 (saturated),
    row 1 is all ties, row 2 ends short. The rows output asked alone (no
    ids) is the same."""
    gen = torch.Generator().manual_seed(topk)
    logits = torch.randn(2, 3, 300, generator=gen).bfloat16()
    logits[0, 0, :150] += 4.0
    logits[:, 1] = 0.5
    ends = torch.tensor([[300, 300, 40], [300, 300, 17]], dtype=torch.int32)
    got = _same_at_every_stage(logits.to(device), ends.to(device), topk=topk, local_topk=32, sorted=True)
    assert (got["sat"][0, 0] >> 47).item() & 1, "rank 0 is saturated on row 0"
    assert_exact(got["ids"].cpu(), oracle_topk(logits, ends, topk), ordered=True)
    rows_only = _same_at_every_stage(logits.to(device), ends.to(device), topk=topk, local_topk=32, sorted=True,
                                     with_ids=False)
    assert torch.equal(rows_only["rows_out"], got["rows_out"]), "the rows alone, as beside the ids"


@needs_triton
@pytest.mark.parametrize("world_size,width,topk", [(3, 6000, 4096), (8, 4000, 4096), (3, 6000, 3000),
                                                    (4, 4000, 2047)])
def test_large_k_with_saturation_matches_reference(world_size, width, topk, device, pack_kernels):
    gen = torch.Generator().manual_seed(world_size)
    logits = torch.randn(world_size, 2, width, generator=gen).bfloat16()
    logits[0, 0, :8192] += 6.0  # rank 0 saturated on row 0
    logits[:, 1] = 1.0
    ends = torch.randint(width // 2, width + 1, (world_size, 2), generator=gen, dtype=torch.int32)
    n = nt.default_local_topk(topk, world_size)
    got = _same_at_every_stage(logits.to(device), ends.to(device), topk=topk, local_topk=n)
    assert (got["sat"][:, 0] >> 47).tolist() == [1] * world_size
    assert_exact(got["ids"].cpu(), oracle_topk(logits, ends, topk))


def _sampled_groups(n: int, width: int) -> torch.Tensor:
    """The token ids the estimate samples from a row of ``width`` tokens."""
    from nvshmem_topk.kernels import spread

    size = spread.GROUP.value
    groups = min(math.ceil(spread.SAMPLE_RANK.value * width / (size * n)), width // size, spread.plan(n, width).groups)
    starts = ((torch.arange(groups) * ((width << 16) // groups)) >> 16) // size * size
    return (starts[:, None] + torch.arange(size)).flatten()


@needs_triton
@pytest.mark.parametrize("score_bits", [16, 32])
def test_pack_every_path_matches_reference(score_bits, monkeypatch, device):
    """Rows of several blocks, each built to settle one way, the way it
    settles read back from the scratch: from the candidates (also with a
    room they nearly fill), exactly on a probed tie (the ties straddling
    blocks; a block past the last kept tie copies its candidates), every
    valid token (fewer than n), and the radix steps (the sampled groups
    hold low scores, the rest of the row high ones: the floor lets almost
    every token through; also with the row's top-n in one span). A sampled
    outlier far above the rest, and zeros below fewer than n positives
    (ties at the lowest sampled score), still settle from the sample.
    Planes past 2^16, fp32 scores. The filter reads bf16 rows of an even
    width as pairs of tokens (odd row ends included), others token by token
    (an odd width, fp32). In exact fp32 order (fp32 logits, read as pairs
    of their top halves): the same rows, and a probed level of the top
    halves whose tokens differ in their low halves (not a tie: the radix
    steps), with one of its values repeated across blocks and the rest
    below it (the radix lists' ties); NaNs whose top halves read as
    infinities; bf16 and fp16 logits, token by token."""
    from nvshmem_topk import reference
    from nvshmem_topk.kernels import pack, spread

    monkeypatch.setattr(pack, "SHORT_ROWS", 0)  # rows this short are one program's (``row_kernel``)
    gen = torch.Generator().manual_seed(6)
    n, width = 128, 3 * 4096 + 700
    normal = torch.randn(2, width, generator=gen)
    ties = torch.zeros(2, width)
    ties[:, ::7] = 1.0  # the threshold: ties in every block
    ties[:, 5000:5100] = 2.0
    few = torch.full((2, width), float("nan"))
    few[:, ::400] = 1.5
    attack = torch.randn(2, width, generator=gen)
    attack[0, _sampled_groups(n, width)] = -1.0
    attack[1, _sampled_groups(n, width - 3)] = -1.0  # the last row ends 3 tokens early
    # The row's whole top-n in one span, cut inside a tie: that span's own
    # top-n is all of it, to the last tie.
    one_span = attack.clamp(max=2.5)
    best = torch.arange(2 * 4096, 3 * 4096, 7)
    best = best[~torch.isin(best, torch.cat([_sampled_groups(n, width), _sampled_groups(n, width - 3)]))]
    one_span[:, best[:300]] = 3.0
    one_span[:, best[300:350]] = 4.0
    wide_width = (1 << 17) + 3000
    planes = torch.randn(1, wide_width, generator=gen)
    planes[0, -2000:] += 3
    planes_attack = torch.randn(1, wide_width, generator=gen)
    planes_attack[0, _sampled_groups(64, wide_width - 3)] = -5.0  # its one row ends 3 tokens early too
    outlier = torch.randn(2, width, generator=gen)
    outlier[:, 0] = 1e30  # token 0 is always sampled
    zeros = torch.relu(torch.randn(2, width, generator=gen) - 2.5)
    one_level = 1.0 + torch.randint(0, 128, (2, width), generator=gen) * 2.0**-23  # one bf16 level, 128 values
    one_level[:, ::101] = 1.0 + 200 * 2.0**-23  # about 130 a row: k = 512 reaches below it
    payloads = torch.randn(2, width, generator=gen)  # NaNs whose top halves read as infinities, beside infinities
    payloads.view(torch.int32)[:, ::89] = torch.tensor([0x7F800001, -0x7FFFFF], dtype=torch.int32)[:, None]
    payloads[:, 5::211] = float("inf")
    payloads[:, 7::211] = -float("inf")
    listed, exact, radix = spread.LISTED.value, spread.EXACT.value, spread.RADIX.value
    cases = [("listed", normal, n, listed), ("ties", ties, n, exact), ("fewer than n", few, n, listed),
             ("radix", attack, n, radix), ("radix, one span", one_span, n, radix), ("planes", planes, n, listed),
             ("planes radix", planes_attack, 64, radix),
             ("fp32", normal, n, listed), ("odd width", normal[:, 1:], n, listed), ("outlier", outlier, n, listed),
             ("zeros", zeros, n, exact)]
    if score_bits == 32:
        cases += [("one level", one_level, n, radix), ("one level, k past its top value", one_level, 512, radix),
                  ("bf16 logits", normal, n, listed), ("fp16 logits, ties", ties, n, exact),
                  ("NaN payloads", payloads, n, listed)]
    for name, scores, k, mode in cases:
        dtype = torch.float32 if name == "fp32" or score_bits == 32 else torch.bfloat16
        logits = scores.to({"bf16 logits": torch.bfloat16, "fp16 logits, ties": torch.float16}.get(name, dtype))
        ends = torch.full((logits.shape[0],), logits.shape[1], dtype=torch.int32)
        ends[-1] -= 3
        want = reference.pack(logits, ends, k, logits.shape[1], score_bits=score_bits)
        got = torch.full_like(want, 123).to(device)
        scratch, arrivals = pack.scratch_for(logits.shape[0], k, logits.shape[1], device, score_bits=score_bits)
        pack.pack(got, logits.to(device), None, ends.to(device), local_topk=k, max_local_len=logits.shape[1],
                  scratch=(scratch, arrivals), score_bits=score_bits)
        assert torch.equal(got.cpu(), want), name
        assert scratch[:, spread.MODE.value].tolist() == [mode] * logits.shape[0], name
        assert not arrivals.any(), name
        if name == "listed":  # the select's tile of half the room
            assert (_listed(scratch, logits.shape[1]) <= spread.plan(k, logits.shape[1], score_bits).room // 2).all()
    # A room of 256 for about 200 candidates: the select holds nearly all of it (its tile of the whole room).
    m = 96
    planned = spread.plan(m, width, score_bits)
    full = spread.Plan(n=m, room=256, groups=planned.groups, blocks_p2=planned.blocks_p2, score_bits=score_bits)
    monkeypatch.setattr(spread, "plan", lambda *_: full)
    logits = normal.bfloat16() if score_bits == 16 else normal
    ends = torch.full((2,), width, dtype=torch.int32)
    want = reference.pack(logits, ends, m, width, score_bits=score_bits)
    got = torch.full_like(want, 123).to(device)
    scratch, arrivals = pack.scratch_for(2, m, width, device, score_bits=score_bits)
    pack.pack(got, logits.to(device), None, ends.to(device), local_topk=m, max_local_len=width,
              scratch=(scratch, arrivals), score_bits=score_bits)
    assert torch.equal(got.cpu(), want)
    listed = _listed(scratch, width)
    assert ((listed > full.room // 2) & (scratch[:, spread.MODE.value] == spread.LISTED.value)).all(), listed


def _listed(scratch, width):
    """Each row's candidates, summed over its blocks' counts in the pipeline's scratch."""
    from nvshmem_topk.kernels import spread

    fields, blocks = spread.COUNT_FIELDS.value, -(-width // spread.BLOCK.value)
    return scratch[:, spread.HEADER.value + 1: spread.HEADER.value + blocks * fields: fields].sum(dim=1)


def _pushed_list(logits, floors, n, max_local_len, device, score_bits=16):
    """``pack.select_local``'s pushed list of every row of ``logits`` (rank
    0 of 1, saturated everywhere, kappa at score ``floors``, an ord16 or
    ord32), the reference's, and the scratch the kernels left."""
    from nvshmem_topk import format as fmt, reference
    from nvshmem_topk.kernels import pack

    rows = logits.shape[0]
    gid_bits = fmt.global_id_bits(1, 1, max_local_len)
    sat = fmt.sat_word(torch.ones(rows, dtype=torch.int64), floors.long() << gid_bits | 5, score_bits)
    ends = torch.full((rows,), logits.shape[1], dtype=torch.int32)
    want = reference.pack(logits, ends, n, max_local_len, None, fmt.list_floor(sat, gid_bits, score_bits),
                          score_bits=score_bits)
    recv = torch.full((rows, 1, want.shape[1]), 123, dtype=torch.int32, device=device)
    flags = torch.zeros(2 * rows, dtype=torch.int32, device=device)

    def address(buffer):
        return torch.tensor([buffer.data_ptr()], device=device)

    publish = pack.Publish(torch.zeros(rows, dtype=torch.int32, device=device), address(recv), address(flags),
                           torch.zeros(1, dtype=torch.int32, device=device), rows, 0, 1, sat=sat.to(device),
                           list_slots=1, gid_bits=gid_bits)
    scratch, arrivals = pack.scratch_for(rows, n, max_local_len, device, score_bits=score_bits)
    pack.select_local(recv, logits.to(device), None, ends.to(device), n=n, max_local_len=max_local_len,
                      scratch=scratch, arrivals=arrivals, publish=publish, score_bits=score_bits)
    assert flags[rows:].tolist() == [1] * rows
    return recv[:, 0].cpu(), want, scratch.cpu()


@needs_triton
@pytest.mark.parametrize("score_bits", [16, 32])
def test_a_pushed_list_holds_the_top_tokens_at_or_above_kappas_score(score_bits, device, pack_kernels):
    """A saturated rank's list is its top-L among the tokens whose score
    reaches kappa's (``format.list_floor``): every one of them when fewer
    than L do (the row kernel selects among them, the spread pipeline trims
    its top-L of the row), its top-L when more do or kappa is 0; words
    past a trim move with their plane bits (ids past 2^16), also when the
    sample misleads the spread pipeline into its radix steps. In exact fp32
    order (fp32 logits, 32-bit floors) too."""
    from nvshmem_topk import format as fmt
    from nvshmem_topk.kernels import spread
    from nvshmem_topk.testing import sub_bf16_scores

    def scores(x):  # the logits the order ranks exactly
        return x.bfloat16() if score_bits == 16 else x

    gen = torch.Generator().manual_seed(23)
    n = 64
    logits = torch.randn(4, 3000, generator=gen).bfloat16() if score_bits == 16 else sub_bf16_scores(4, 3000, gen)
    ranked = fmt.score_order(logits, score_bits)[0].sort(dim=1, descending=True).values
    floors = torch.stack([ranked[0, 20], ranked[1, 200], torch.tensor(0), ranked[3, n - 1]])
    got, want, _ = _pushed_list(logits, floors, n, (1 << 17) + 5, device, score_bits)
    assert (want[0, :n] != 0).sum() < n and (want[1:, :n] != 0).all()
    assert torch.equal(got, want)
    if pack_kernels == "spread":
        wide = torch.randn(1, (1 << 16) + 2000, generator=gen)
        wide[0, 100:140] = 8.0 + torch.arange(40) / 16  # kept, before the ids past 2^16 move down
        wide[0, -1000:-980] = 6.0 + torch.arange(20) / 16
        wide = scores(wide)
        floor = fmt.score_order(torch.tensor([5.5]), score_bits)[0]
        got, want, _ = _pushed_list(wide, floor, n, wide.shape[1], device, score_bits)
        assert want[0, n:].any() and (want[0, :n] != 0).sum() < n
        assert torch.equal(got, want)
        # The same through the radix steps: the sampled groups hold low scores.
        wide[0, _sampled_groups(n, wide.shape[1])] = -5.0
        got, want, scratch = _pushed_list(wide, floor, n, wide.shape[1], device, score_bits)
        assert scratch[0, spread.MODE.value] == spread.RADIX.value
        assert want[0, n:].any() and (want[0, :n] != 0).sum() < n
        assert torch.equal(got, want)


@needs_triton
def test_trim_list_is_the_top_n_of_the_tokens_at_or_above_the_floor(device):
    """``rows.trim_list`` of a packed top-n row equals the packed top-n of
    the row's tokens at or above the floor, for floors from below every
    token to above all of them, rows with fewer than n valid tokens, and
    ids past 2^16 and 2^17 (two planes)."""
    from kernel_probes import trim_list_kernel

    from nvshmem_topk import format as fmt, reference

    gen = torch.Generator().manual_seed(31)
    n, rows, width = 64, 12, (1 << 17) + 900
    logits = torch.randn(rows, width, generator=gen)
    logits[:, torch.randint(0, width, (rows, 40), generator=gen)] += 4.0  # tops spread over every plane
    logits = logits.bfloat16()
    ends = torch.full((rows,), width, dtype=torch.int32)
    ends[1] = 30  # fewer than n valid
    ranked = fmt.ord16(fmt.score16_bits(logits)).sort(dim=1, descending=True).values
    pick = torch.tensor([0, 0, 1, 5, 20, 40, 63, 64, 100, 0, 0, 0])
    floors = ranked.gather(1, pick[:, None])[:, 0].long()
    floors[0], floors[9], floors[10], floors[11] = 0, 1, 0xFFFF, ranked[11, 0] + 1
    packed = reference.pack(logits, ends, n, width)
    assert packed.shape[1] == fmt.packed_row_words(n, 2)
    got = packed.clone().to(device)
    trim_list_kernel[(rows,)](got, floors.int().to(device), N=n, PLANES=2)
    want = reference.pack(logits, ends, n, width, None, floors)
    assert torch.equal(got.cpu(), want)
    assert (want[:, n:] != packed[:, n:]).any(), "some plane bits moved"


@needs_triton
def test_short_rows_of_a_wide_workspace_fill_every_word(device):
    """A call at most pack.SHORT_ROWS wide on a workspace planned for ids
    past 2^16 (bit planes): the short-row kernel writes every word of the
    packed row (the kept words, zeros after them, zero planes) over
    whatever the buffer held; rows cut short, fewer valid tokens than n."""
    from nvshmem_topk import reference
    from nvshmem_topk.kernels import pack

    gen = torch.Generator().manual_seed(17)
    n, width, max_local_len = 64, 3000, (1 << 17) + 5
    logits = torch.randn(3, width, generator=gen).bfloat16()
    logits[1, 40:] = float("nan")  # 40 valid tokens: fewer than n
    ends = torch.tensor([width, width, 777], dtype=torch.int32)
    want = reference.pack(logits, ends, n, max_local_len)
    assert want.shape[1] > n, "the rows carry planes"
    got = torch.full_like(want, -1).to(device)
    pack.pack(got, logits.to(device), None, ends.to(device), local_topk=n, max_local_len=max_local_len)
    assert torch.equal(got.cpu(), want)


@needs_triton
@pytest.mark.parametrize("pairs", [False, True], ids=["tokens", "pairs"])
def test_filter_counts_and_words_are_exact_on_every_bf16(pairs, device):
    """The filter's four counts of a block (valid tokens, candidates, >= and
    > the probe, the last two on the sign-folded integer of the bits, not as
    floats) and its candidates' words, in order, over every bf16 bit pattern,
    for probes at the edges (both zeros, the infinities, the lowest valid
    score) and none, and floors even, odd and at the edges: equal to those
    of ord16 (-0 below +0, NaN never counted). Token by token the floor is
    compared as a float (-0 >= +0 passes); two tokens a word, on levels (the
    floor rounded down to even)."""
    from kernel_probes import filter_block_kernel

    from nvshmem_topk import format as fmt
    from nvshmem_topk.kernels import spread

    bits = torch.arange(1 << 16, dtype=torch.int32)
    x = bits.to(torch.int16).view(torch.bfloat16)
    order = fmt.ord16(bits)
    valid = ~fmt.is_nan_bits(bits)
    probes = [0, 0x7F, 0x80, 0x7FFF, 0x8000, 0x8001, 0xBF80, 0xFF80]
    floors = [0xBF80, 0xBF81, 0x7F, 0x8000, 0xC001, 0x4000, 0x8002, 0xFF80]
    plan = spread.plan(64, 1 << 16)
    scratch = torch.zeros((len(probes), plan.scratch_words), dtype=torch.int32)
    scratch[:, spread.FLOOR.value] = torch.tensor(floors)
    scratch[:, spread.PROBE.value] = torch.tensor(probes)
    scratch = scratch.to(device)
    blocks = (1 << 16) // spread.BLOCK.value
    filter_block_kernel[(blocks, len(probes))](scratch, x.to(device), 1 << 16, scratch.stride(0), REGION=plan.region,
                                               REGIONS_AT=plan.regions_at, PAIRS=pairs)
    scratch = scratch.cpu()
    fields = spread.COUNT_FIELDS.value
    counts = scratch[:, spread.HEADER.value: spread.HEADER.value + fields * blocks].view(len(probes), blocks, fields)
    words = fmt.make_words(order, bits).to(torch.int32)  # the stored two's complement
    for case, (probe, floor) in enumerate(zip(probes, floors)):
        lowest = floor & ~1 if pairs else {0x8000: 0x7FFF}.get(floor, floor)
        candidate = valid & (order >= lowest)
        reach = int((valid & (order >= probe)).sum()) if probe else 0
        above = int((valid & (order > probe)).sum()) if probe else 0
        assert counts[case, :, :4].sum(0).tolist() == [int(valid.sum()), int(candidate.sum()), reach, above], hex(probe)
        for block in range(blocks):
            mine = candidate[block * spread.BLOCK.value:(block + 1) * spread.BLOCK.value]
            want = words[block * spread.BLOCK.value:(block + 1) * spread.BLOCK.value][mine][:plan.region]
            at = plan.regions_at + block * plan.region
            assert torch.equal(scratch[case, at: at + len(want)], want), (hex(floor), block)


@needs_triton
def test_radix_boundary_matches_a_scan_of_the_histogram(device):
    """keys.radix_boundary (three results from one int64 reduction) against
    the definition: the highest bucket whose count from the top reaches
    ``need`` (-1 if none), the count above it, and its own count."""
    import numpy as np
    from kernel_probes import radix_boundary_kernel

    rng = np.random.default_rng(5)
    hists = rng.integers(0, 9, (64, 256)) * (rng.random((64, 256)) < 0.2)
    hists[0] = 0
    hists[1] = 0
    hists[1, 255] = 70_000  # one full bucket, at the top
    hists[2] = 0
    hists[2, 0] = 1 << 20  # a whole 2^20-token row in bucket 0
    totals = hists.sum(axis=1)
    needs = np.array([1, 70_000, 1 << 20] + [int(rng.integers(1, t + 3)) for t in totals[3:]])
    out = torch.empty((64, 3), dtype=torch.int32, device=device)
    radix_boundary_kernel[(64,)](out, torch.tensor(hists, dtype=torch.int32, device=device),
                                 torch.tensor(needs, dtype=torch.int32, device=device))
    for case, (hist, need) in enumerate(zip(hists, needs)):
        from_top = np.cumsum(hist[::-1])[::-1]
        reaching = np.nonzero(from_top >= need)[0]
        bucket = int(reaching.max()) if reaching.size else -1
        want = [bucket, int(hist[bucket + 1:].sum()) if bucket >= 0 else int(hist.sum()),
                int(hist[bucket]) if bucket >= 0 else 0]
        assert out[case].tolist() == want, (case, int(need), int(hist.sum()))


@needs_triton
@pytest.mark.parametrize("whole", [True, False])
def test_filter_threshold_keeps_a_threshold_set(whole, device):
    """The filter compares bf16 as floats against a float derived from the
    floor (tau here). Over every bf16 bit pattern, for taus at the edges
    (NaN patterns, the infinities, both zeros) and at random, the tokens it
    keeps must be every non-NaN token of ord16 >= t for one t <= tau (t =
    tau but for the zero's sign and NaN floors): then the candidates hold the
    row's top-N whenever there are N of them, which is all the finish relies
    on."""
    from kernel_probes import candidate_kernel

    from nvshmem_topk.format import ord16

    bits = torch.arange(1 << 16, dtype=torch.int32)
    x = bits.to(torch.int16).view(torch.bfloat16)
    order = ord16(bits).to(torch.int64)
    valid = ~torch.isnan(x)
    edges = [0, 1, 0x7E, 0x7F, 0x80, 0x4000, 0x7FFE, 0x7FFF, 0x8000, 0x8001, 0xC000, 0xFF7F, 0xFF80, 0xFF81, 0xFFFF]
    taus = torch.tensor(edges + torch.randint(0, 1 << 16, (9,), generator=torch.Generator().manual_seed(3)).tolist(),
                        dtype=torch.int32)
    out = torch.empty((len(taus), 1 << 16), dtype=torch.int8, device=device)
    candidate_kernel[(len(taus),)](out, x.to(device), taus.to(device), WIDTH=1 << 16, BLOCK=4096, WHOLE=whole)
    for tau, kept in zip(taus.tolist(), out.cpu().bool()):
        assert not (kept & ~valid).any(), f"tau {tau:#x} keeps a NaN"
        assert not (valid & (order >= tau) & ~kept).any(), f"tau {tau:#x} misses a token"
        floor = int(order[kept].min()) if kept.any() else 1 << 16
        assert torch.equal(kept, valid & (order >= floor)), f"tau {tau:#x} keeps no threshold set"
        widened = {0x8000: 0x7FFF}.get(tau, min(max(tau, 0x7F), 0xFF80))  # -0 >= +0; NaN floors: infinities
        assert floor == widened, f"tau {tau:#x} keeps from {floor:#x}"


@needs_triton
def test_bisected_threshold_is_the_need_th_largest_score(device):
    """The threshold of the short rows and of the finish's candidates (a
    count a bit, the first fifteen on two levels an int32; the finish's
    bounded by the candidates' lowest and highest scores), and how many
    scores are above it, against their definitions: scores spread from the
    least valid ord16 to +inf (both present), half of them masked,
    all-equal and two-level rows on both sides of an odd/even step, a narrow
    cluster, and needs past the valid count (0). Also with DISTINCT, whose
    search ends where a count parts exactly need scores (the spread rows
    part there). And ``row_threshold``, whose near count 511 below the
    highest score reaches need on some rows and not on others (its bound
    then the highest), or lies below every score (the low scores)."""
    from kernel_probes import bisected_threshold_kernel

    from nvshmem_topk.kernels.keys import MIN_VALID

    gen = torch.Generator().manual_seed(14)
    tile, cases = 4096, []
    for need in (1, 2, 384, 2048, 4095, 4096, 4097):
        spread = torch.randint(MIN_VALID.value, 0xFF81, (tile,), generator=gen)
        spread[:2] = torch.tensor([MIN_VALID.value, 0xFF80])
        cases.append((spread, need))
        masked = spread.clone()
        masked[torch.rand(tile, generator=gen) < 0.5] = 0  # invalid tokens count nothing
        cases.append((masked, need))
        cases.append((torch.full((tile,), 0xBF81), need))  # all equal, an odd score
        two = torch.full((tile,), 0x8000)
        two[::3] = 0x8001  # ReLU-style zeros and the next score up
        cases.append((two, need))
        cases.append((0xC000 + torch.randint(0, 4, (tile,), generator=gen), need))
        cases.append((0xBFF8 + torch.randint(0, 16, (tile,), generator=gen), need))  # across a carry of bits
        cases.append((MIN_VALID.value + torch.randint(0, 300, (tile,), generator=gen), need))  # no near count
        below_near = torch.full((tile,), 0xBFFF)  # the near count at 0xC000 finds one score: the top
        below_near[0], below_near[1::2] = 0xC1FF, 0x9000
        cases.append((below_near, need))
    scores = torch.stack([c[0] for c in cases]).to(torch.int32)
    needs = torch.tensor([c[1] for c in cases], dtype=torch.int32)
    out = torch.empty((len(cases), 10), dtype=torch.int32, device=device)
    bisected_threshold_kernel[(len(cases),)](out, scores.to(device), needs.to(device), TILE=tile)
    for case, (score, need) in enumerate(zip(scores, needs.tolist())):
        kept = score[score != 0].sort(descending=True).values
        want = int(kept[need - 1]) if kept.numel() >= need else 0
        above = int((score > want).sum()) if want else kept.numel()
        assert out[case].tolist() == [want, above] * 5, (case, need)


@needs_triton
def test_distance_boundary_matches_a_histogram(device):
    """keys.distance_boundary (a count a bit of two 16-bit fields to an
    int32) against a histogram's scan: the least distance that reaches
    need, the counts nearer and at it; need at every place of a row, at the
    last distance (BINS - 1), past every present element (fewer), and rows
    with no element present or all at one distance; bounded by the deepest
    present distance where at least need are present (the boundary at the
    deepest, above it, and every bit past it skipped)."""
    from kernel_probes import distance_boundary_kernel

    gen = torch.Generator().manual_seed(7)
    tile = 256
    for bins in (32, 128):
        rows = [torch.randint(0, bins, (tile,), generator=gen),
                torch.randint(bins - 3, bins + 1, (tile,), generator=gen),
                torch.full((tile,), bins), torch.full((tile,), bins - 1), torch.zeros(tile, dtype=torch.int64),
                torch.randint(0, bins // 4 + 3, (tile,), generator=gen), torch.full((tile,), bins // 2 + 3)]
        rows[0][torch.rand(tile, generator=gen) < 0.3] = bins  # absent
        rows[-1][:20] = torch.randint(0, 8, (20,), generator=gen)  # a few near, the rest at one deep distance
        rows[-1][20:40] = bins
        cases = [(row, need) for row in rows for need in (1, 2, 17, 100, 200, 255, 256, 257)]
        distance = torch.stack([row for row, _ in cases]).to(torch.int32)
        needs = torch.tensor([need for _, need in cases], dtype=torch.int32)
        out = torch.empty(len(cases), 6, dtype=torch.int32, device=device)
        distance_boundary_kernel[(len(cases),)](out, distance.to(device), needs.to(device), TILE=tile, BINS=bins)
        for case, (row, need) in enumerate(cases):
            hist = torch.bincount(row[row < bins], minlength=bins)
            reach = hist.cumsum(0)
            d = int((reach < need).sum())
            want = [d, int(reach[d - 1]) if d else 0, int(hist[d])] if d < bins else [bins, int(reach[-1]), 0]
            assert out[case, :3].tolist() == want, (bins, case, need)
            if int(reach[-1]) >= need:
                assert out[case, 3:].tolist() == want, (bins, case, need, "bounded")


def test_kth_largest_near_the_top_and_far_from_it(device):
    """The select's k-th key (counts of how far the score's level lies below
    the top level, near it and past NEAR_BINS - 1 levels, then the last
    score bit and the gid bits) against sorting: clustered and spread
    scores, the boundary at the seam of the near counts and the far ones,
    keys at the boundary level (few enough to be compacted into the tie
    tile, and too many, and a few in one bucket of the tie radix), ties at
    zero under positives of many binades, fewer keys than k; and the
    count of keys it selects (k, or every key when fewer), which the emit
    uses. The same anchored at a level every key reaches (the rescue's:
    kappa's), the lowest key's or two below it: the boundary in the anchored
    bins, and past them (then below the top level as before)."""
    from kernel_probes import NEAR_BINS, TIE_TILE, kth_largest_kernel

    gen = torch.Generator().manual_seed(4)
    rows, cols, gid_bits = 2, 512, 12
    cases = []
    for k in (1, 100, 700, 1024, 1025):
        # clustered, spread, about 230 keys a level of two scores (TIE_TILE is 256) and 300 a score, one score
        for low, span in ((0xC000, 60), (0x7F, 0xFF01), (0xC000, 8), (0xC000, 3), (0xBF80, 1)):
            score = low + torch.randint(0, span, (rows * cols,), generator=gen)
            gid = torch.randperm(1 << gid_bits, generator=gen)[: rows * cols]
            key = (score.long() << gid_bits) | ((1 << gid_bits) - 1 - gid.long())
            key[torch.rand(rows * cols, generator=gen) < 0.1] = 0  # empty slots
            cases.append((key.view(rows, cols), k))
    # Five keys of one score whose gids share their top bits (one bucket after
    # the first tie pass) under ten of a higher score: the k-th is each of them.
    gid = torch.tensor([0, 1, 2, 3, 4] + list(range(64, 74)))
    score = torch.tensor([0xC000] * 5 + [0xC010] * 10)
    key = torch.zeros(rows * cols, dtype=torch.int64)
    key[torch.randperm(rows * cols, generator=gen)[: gid.numel()]] = (score << gid_bits) | ((1 << gid_bits) - 1 - gid)
    cases += [(key.view(rows, cols), k) for k in range(11, 16)]
    # Three keys at each of the levels 0 and NEAR_BINS - 3 to NEAR_BINS below
    # the top: the k-th on either side of the seam.
    levels = torch.tensor([0] + list(range(NEAR_BINS - 3, NEAR_BINS + 1))).repeat_interleave(3)
    gid = torch.randperm(1 << gid_bits, generator=gen)[: levels.numel()]
    key = torch.zeros(rows * cols, dtype=torch.int64)
    key[torch.randperm(rows * cols, generator=gen)[: gid.numel()]] = (
        ((0xC000 - 2 * levels) << gid_bits) | ((1 << gid_bits) - 1 - gid))
    cases += [(key.view(rows, cols), k) for k in range(1, levels.numel() + 2)]
    # ReLU-style: ties at zero far below positives of many binades
    score = torch.full((rows * cols,), 0x8000)
    score[: rows * cols // 4] += torch.randint(0x0400, 0x4000, (rows * cols // 4,), generator=gen)
    gid = torch.randperm(1 << gid_bits, generator=gen)[: rows * cols]
    key = (score.long() << gid_bits) | ((1 << gid_bits) - 1 - gid.long())
    cases += [(key.view(rows, cols), k) for k in (300, 600, 1000)]
    keys = torch.stack([c[0] for c in cases])
    ks = torch.tensor([c[1] for c in cases], dtype=torch.int32)
    lowest = [int(key[key != 0].min()) >> (gid_bits + 1) for key, _ in cases]
    lowest = torch.tensor([max(level - 2 * (case % 2), 0) for case, level in enumerate(lowest)], dtype=torch.int32)
    out = torch.empty(len(cases), 4, dtype=torch.int64, device=device)
    ties = torch.empty(len(cases), TIE_TILE, dtype=torch.int64, device=device)
    kth_largest_kernel[(len(cases),)](out, ties, keys.to(device), ks.to(device), lowest.to(device), ROWS=rows,
                                      COLS=cols, KEY_BITS=16 + gid_bits)
    for case, (key, k) in enumerate(cases):
        present = key[key != 0].sort(descending=True).values
        want = int(present[k - 1]) if present.numel() >= k else 0
        assert out[case].tolist() == [want, min(k, present.numel())] * 2, (case, k)


def test_kernels_size_packed_rows_as_the_format_does():
    from nvshmem_topk import format as fmt
    from nvshmem_topk.kernels.keys import packed_words
    from nvshmem_topk.kernels.select import list_len, list_slots

    for n in (32, 64, 384, 2048, 4096):
        for planes in range(fmt.MAX_PLANES + 1):
            for score_bits in fmt.SCORE_BITS:
                assert packed_words(n, planes, score_bits) == fmt.packed_row_words(n, planes, score_bits)
    for topk in (1, 31, 32, 45, 2048, 3000, 4096):
        assert list_len(topk) == fmt.list_len(topk)
        for n in (32, 384, 4096):
            assert list_slots(topk, n) == max(fmt.rescue_slots(topk, n), 1)


def test_plan_sizes_the_room_and_the_scratch():
    """The local selection's plan: a power-of-two room between 512 and
    MAX_ROOM that holds twice the expected candidates (n r_lo / r, r the
    sample rank where the n-th score is expected) with four standard
    deviations to spare; a narrower row never needs more scratch than the widest (the
    workspace sizes it once, for max_local_len), and a workspace whose
    calls are all short keeps one word a row (the row kernel reads none)."""
    from nvshmem_topk.kernels import pack, spread

    for n in (32, 192, 384, 768, 1536, 2048, 4096):
        widest = spread.plan(n, 1 << 20)
        for width in (100, 4096, 16384, 65536, 131072, 1 << 20):
            p = spread.plan(n, width)
            assert p.room & (p.room - 1) == 0 and 512 <= p.room <= spread.MAX_ROOM, (n, width, p)
            assert p.groups & (p.groups - 1) == 0 and p.groups <= spread.MAX_GROUPS, (n, width, p)
            rank = max(1.0, min(spread.SAMPLE_RANK.value, n * spread.GROUP.value * p.groups / width))
            assert min(2 * spread.expected_candidates(n, rank), spread.MAX_ROOM) <= p.room, (n, width, p)
            assert p.scratch_words <= widest.scratch_words, (n, width)
    assert spread.plan(384, 16384).room == 2048
    assert spread.plan(384, 131072).room == 4096
    assert pack.scratch_words(384, pack.SHORT_ROWS) == 1
    assert pack.scratch_words(384, pack.SHORT_ROWS + 1) == spread.plan(384, pack.SHORT_ROWS + 1).scratch_words


@needs_triton
@pytest.mark.slow
@settings(max_examples=15, deadline=None)
@given(
    world_size=st.integers(1, 6),
    rows=st.integers(1, 2),
    width=st.integers(1, 130),
    k_blocks=st.integers(1, 3),
    n_blocks=st.integers(1, 3),
    interleave=st.integers(1, 5),
    levels=st.integers(1, 5),
    sorted_=st.booleans(),
    seed=st.integers(0, 2**31 - 1),
)
def test_property_kernels_match_reference_stage_by_stage(device, world_size, rows, width, k_blocks, n_blocks,
                                                         interleave, levels, sorted_, seed):
    logits, ends = special_value_case(world_size, rows, width, levels, seed)
    got = _same_at_every_stage(logits.to(device), ends.to(device), topk=32 * k_blocks,
                               local_topk=32 * n_blocks, interleave=interleave, sorted=sorted_)
    assert_exact(got["ids"].cpu(), oracle_topk(logits, ends, 32 * k_blocks, interleave), ordered=sorted_)


@needs_triton
@pytest.mark.parametrize("world_size,rows,width", [(2, 3, 0), (2, 0, 100), (1, 2, 1), (3, 1, 31)])
def test_empty_and_tiny_shapes(world_size, rows, width, device):

    logits = torch.randn(world_size, rows, width, generator=torch.Generator().manual_seed(1)).bfloat16()
    ends = torch.full((world_size, rows), width, dtype=torch.int32)
    got = nt.simulate_dcp_topk_merge(logits.to(device), ends.to(device), topk=32, impl="triton")
    assert got.shape == (world_size, rows, 32)
    assert torch.equal(got.cpu(), nt.simulate_dcp_topk_merge(logits, ends, topk=32, impl="reference"))
    assert_exact(got.cpu(), oracle_topk(logits, ends, 32))


@needs_triton
def test_fp32_logits_round_to_bf16_like_the_reference(device):
    gen = torch.Generator().manual_seed(9)
    logits = torch.randn(3, 3, 300, generator=gen)
    logits[:, :, ::7] = 1.0 + 2**-8  # halfway between two bf16 values: rounds to even
    logits[:, 0, :5] = float("nan")
    ends = torch.full((3, 3), 300, dtype=torch.int32)
    got = _same_at_every_stage(logits.to(device), ends.to(device), topk=64, local_topk=32)
    assert_exact(got["ids"].cpu(), oracle_topk(logits.bfloat16(), ends, 64))


@needs_triton
@pytest.mark.parametrize("world_size,interleave,topk,local_topk", [(2, 1, 64, 64), (4, 2, 45, 32),
                                                                  pytest.param(8, 64, 128, 32, marks=pytest.mark.slow)])
def test_fp32_order_matches_reference_stage_by_stage(world_size, interleave, topk, local_topk, device, pack_kernels):
    """Exact fp32 order on both pack kernels, the select and the rescue:
    scores that tie at bf16 but not in fp32 (every row), NaN,
    infinities and signed zeros, windows, bf16 logits widened, and one rank
    holding the best scores (its pushed list and the rescue), sorted or
    not."""
    from nvshmem_topk.testing import shard, sub_bf16_scores

    gen = torch.Generator().manual_seed(world_size)
    rows, width = 4, 320  # a multiple of the interleave: every global id is on some rank
    scores = sub_bf16_scores(rows, world_size * width, gen)
    scores[1, :: 7] = torch.tensor([float("nan"), float("inf"), -float("inf"), 0.0, -0.0])[torch.arange(
        scores[1, ::7].numel()) % 5]
    owner, _ = nt.format.owner_and_local(torch.arange(world_size * width), world_size, interleave)
    scores[2, owner == 1] += 50  # rank 1 holds the best: it saturates
    logits = shard(scores, world_size, interleave)
    starts = torch.randint(0, 40, (world_size, rows), generator=gen)
    ends = torch.randint(width - 40, width + 5, (world_size, rows), generator=gen)
    fp32 = torch.float32
    for sorted_ in (False, True):
        got = _same_at_every_stage(logits.to(device), ends.to(device), topk=topk, local_topk=local_topk,
                                   interleave=interleave, sorted=sorted_, starts=starts.to(device), score_dtype=fp32)
        want = oracle_topk(logits, ends, topk, interleave, row_starts=starts, score_dtype=fp32)
        assert_exact(got["ids"].cpu(), want, ordered=sorted_)
    assert want != oracle_topk(logits, ends, topk, interleave, row_starts=starts), "bf16 order would do"
    assert (got["sat"].cpu()[:, 2, 0] >> 47 == 2).all(), "rank 1 is saturated on row 2"
    wide = logits.bfloat16()  # 16-bit logits in fp32 order: their own
    got = _same_at_every_stage(wide.to(device), ends.to(device), topk=topk, local_topk=local_topk,
                               interleave=interleave, score_dtype=fp32)
    assert_exact(got["ids"].cpu(), oracle_topk(wide, ends, topk, interleave))


@needs_triton
def test_fp32_pack_indices_kernel_matches_reference(device):
    from nvshmem_topk import reference
    from nvshmem_topk.testing import sub_bf16_scores

    logits = sub_bf16_scores(3, 300, torch.Generator().manual_seed(4))
    logits[1, ::5] = float("nan")
    ends = torch.tensor([300, 200, 7], dtype=torch.int32)
    idx = reference.local_topk_indices(logits, ends, 64, 300, score_bits=32).int()
    idx[:, ::3] = idx.flip(1)[:, ::3]  # any order, some ids repeated or -1
    lg, e, ix = logits.to(device), ends.to(device), idx.to(device)
    a = nt.dcp_topk_pack_indices(lg, ix, e, max_local_len=300, impl="triton", score_dtype=torch.float32)
    b = nt.dcp_topk_pack_indices(lg, ix, e, max_local_len=300, impl="reference", score_dtype=torch.float32)
    assert torch.equal(a.cpu(), b.cpu())


@needs_triton
def test_fp16_scores_rank_in_fp16_order_with_int64_row_ends(device, pack_kernels):
    """fp16 scores that tie once rounded to bf16 (so a bf16 ranking would
    choose other ids), every fp16 NaN pattern class, infinities, zeros of
    both signs and subnormals; int64 row ends, some rows cut short."""
    gen = torch.Generator().manual_seed(16)
    world, rows, width, k = 2, 4, 300, 64
    logits = torch.randn(world, rows, width, generator=gen).half()
    logits[:, :2, :200] = (1.0 + torch.arange(200) * 2.0**-10).half()  # 8 fp16 steps per bf16 step
    special = torch.tensor([0x7C01, 0x7E00, 0xFC01, 0xFFFF, 0x7C00, 0xFC00, 0x0000, 0x8000, 0x0001, 0x8001],
                           dtype=torch.int32).to(torch.int16).view(torch.float16)
    logits[:, 2, :10] = special
    logits[1, 3] = float("nan")
    ends = torch.randint(width // 2, width + 1, (world, rows), generator=gen, dtype=torch.int64)
    ends[:, 0] = width
    got = _same_at_every_stage(logits.to(device), ends.to(device), topk=k, local_topk=32, sorted=True)
    want = oracle_topk(logits, ends, k)
    assert want != oracle_topk(logits.bfloat16(), ends, k), "the case must tell fp16 order from bf16's"
    assert_exact(got["ids"].cpu(), want, ordered=True)


@needs_triton
@pytest.mark.parametrize("width,dtype", [(9000, torch.bfloat16), (9001, torch.bfloat16), (700, torch.float32)])
def test_row_starts_match_reference_stage_by_stage(width, dtype, device, pack_kernels):
    """Rows valid from a start: at 0, odd (inside a bf16 pair: an even
    width is read in pairs, an odd one token by token), on and around a
    block's edge, at or past the end; long rows (sampled, several blocks),
    all-equal rows (the ties taken move with the start), a rank holding the
    best scores (saturated: its pushed list starts there too); int64
    starts."""
    gen = torch.Generator().manual_seed(width)
    world, rows, k = 3, 8, 64
    logits = torch.randn(world, rows, width, generator=gen).to(dtype)
    logits[:, 1] = 1.0
    logits[0, 2] += 6.0
    ends = torch.full((world, rows), width, dtype=torch.int32)
    ends[:, 5] = width // 3
    starts = torch.tensor([0, 1, 7, 4095, 4097, width // 3, width // 2, width + 5], dtype=torch.int64)
    starts = (starts[None, :] + torch.arange(world)[:, None] * 3).clamp(max=width + 5)
    for r in range(world):  # the best scores just outside each row: taken only if a bound is off by one
        for t in range(rows):
            for outside in (int(starts[r, t]) - 1, int(ends[r, t])):
                if 0 <= outside < width:
                    logits[r, t, outside] = 50.0
    got = _same_at_every_stage(logits.to(device), ends.to(device), topk=k, local_topk=32, starts=starts.to(device))
    assert_exact(got["ids"].cpu(), oracle_topk(logits, ends, k, row_starts=starts))
    assert ((got["sat"][:, 2].cpu() >> 47) & 1 == 1).all(), "rank 0 is saturated on row 2"


@needs_triton
@pytest.mark.parametrize("world_size,width,dtype,score_dtype", [
    (1, 1000, torch.bfloat16, None), (2, 1000, torch.bfloat16, None), (2, 1020, torch.bfloat16, None),
    (2, 1000, torch.float32, None), (2, 1000, torch.float32, torch.float32)])
def test_rows_off_16_bytes_match_reference_stage_by_stage(world_size, width, dtype, score_dtype, device, pack_kernels,
                                                           monkeypatch):
    """Rows Triton cannot prove 16-byte aligned (an odd row stride, a base
    three tokens into the buffer): the short-row kernels read each from the
    16-byte boundary below it (``pack.align_down``; at a width of 1020 ROW
    has no room for it, and they read a token a thread), and every row's
    first token falls at another offset in its 16 bytes. The padding
    between rows and the previous row's tail, read with a row, hold the
    best scores: taken only if a row's bounds are off. Row starts and ends
    near both edges, a saturated rank's pushed list; one rank's merge is
    one kernel (``local_merge_kernel``)."""
    from nvshmem_topk import format as fmt
    from nvshmem_topk.kernels import launch, pack

    gen = torch.Generator().manual_seed(width)
    rows, k = 8, 64
    buffer = torch.full((world_size, rows, width + 5), 100.0).to(dtype)  # rows of width + 5 tokens, an odd stride
    logits = buffer[:, :, 3:3 + width]
    logits.copy_(torch.randn(world_size, rows, width, generator=gen))
    logits[:, :, -2:] = 40.0  # the next row reads them before its first token
    logits[0, 2] += 6.0
    ends = torch.full((world_size, rows), width, dtype=torch.int32)
    ends[:, 3] = width - 1
    starts = torch.tensor([0, 1, 0, 3, 7, 8, 0, 15], dtype=torch.int32).repeat(world_size, 1)
    if pack_kernels == "one program a row":
        assert pack.align_down(logits[0], width) == (width == 1000)
    score_dtype = {"score_dtype": score_dtype} if score_dtype else {}
    got = _same_at_every_stage(logits.to(device), ends.to(device), topk=k, local_topk=32, starts=starts.to(device),
                               **score_dtype)
    assert_exact(got["ids"].cpu(), oracle_topk(logits, ends, k, row_starts=starts, **score_dtype))
    if world_size > 1:
        mask = fmt.sat_mask(got["sat"][:, 2].cpu(), 32 if score_dtype else 16)
        assert (mask & 1 == 1).all(), "rank 0 is saturated on row 2"
    elif pack_kernels == "one program a row":
        launched = []
        run = launch.Launch.__call__
        monkeypatch.setattr(launch.Launch, "__call__", lambda self: (launched.append(self.kernel.__name__),
                                                                     run(self))[1])
        for sorted_ in (False, True):
            got = _one_rank_merge(logits[0].to(device), ends[0].to(device), k, 32, "triton", sorted_,
                                  starts[0].to(device))
            assert launched[0] == "local_merge_kernel", launched
            want = _one_rank_merge(logits[0], ends[0], k, 32, "reference", sorted_, starts[0])
            for g, w in zip(got, want):
                assert torch.equal(g, w)
            launched.clear()


@needs_triton
def test_pack_indices_kernel_matches_reference(device):
    from nvshmem_topk import reference

    for _, logits, ends, _, n, _ in families(1, seed=3, rows=3, width=300, topk=64):
        idx = reference.local_topk_indices(logits[0], ends[0], n, 300).int()
        idx[:, ::3] = idx.flip(1)[:, ::3]  # any order, some ids repeated or -1
        lg, e, ix = logits[0].to(device), ends[0].to(device), idx.to(device)
        a = nt.dcp_topk_pack_indices(lg, ix, e, max_local_len=300, impl="triton")
        b = nt.dcp_topk_pack_indices(lg, ix, e, max_local_len=300, impl="reference")
        assert torch.equal(a.cpu(), b.cpu())


@needs_triton
@pytest.mark.parametrize("sorted_", [False, True])
def test_kernel_timeout_records_status_and_raises(sorted_, device):
    """A select whose wait expires writes nothing (nor, sorted, does the
    sort kernel after it) and records the wait."""
    group = nt.SimulatedGroup(2, device)
    ws = [nt.init_dcp_topk_merge(g, max_rows=1, topk=32, max_local_len=64, timeout_s=0.01, impl="triton")
          for g in group.ranks]
    logits = torch.zeros(1, 64, device=device).bfloat16()
    ends = torch.full((1,), 64, dtype=torch.int32, device=device)
    nt.dcp_topk_exchange(nt.dcp_topk_pack(logits, ends, local_topk=32, max_local_len=64, impl="triton"),
                         workspace=ws[0])
    ids = torch.full((1, 32), -7, dtype=torch.int32, device=device)
    nt.dcp_topk_select(logits, ends, workspace=ws[0], num_rows=1, ids_out=ids, sorted=sorted_)
    if device == "cuda":
        torch.cuda.synchronize()
    with pytest.raises(nt.DcpTopkTimeoutError, match="rank 1's flag of row 0, epoch 1"):
        ws[0].check()
    assert (ids == -7).all(), "nothing is written after an expired wait"


@needs_triton
def test_rows_after_an_expired_wait_do_not_wait_again(device):
    """Rows that wait one after another (the interpreter runs a grid's
    programs in turn; on a GPU, a second wave of CTAs) end their waits once
    the status records an expired one: 16 rows take about one bound, not 16.
    Under the interpreter a poll takes 0.25 to 0.9 ms (protocol.py, SPINS_PER_SECOND) and the
    bound is 1000 polls: 16 bounds take at least 4 s, one bound and 15 rows
    that each poll until the next status check (32 polls) at most 1.3 s."""
    import time


    rows, timeout_s = 16, 0.5
    group = nt.SimulatedGroup(2, device)
    ws = nt.init_dcp_topk_merge(group.ranks[0], max_rows=rows, topk=32, max_local_len=64, timeout_s=timeout_s,
                                impl="triton")
    logits = torch.zeros(rows, 64, device=device).bfloat16()
    ends = torch.full((rows,), 64, dtype=torch.int32, device=device)
    nt.dcp_topk_exchange(nt.dcp_topk_pack(logits, ends, local_topk=32, max_local_len=64, impl="triton"),
                         workspace=ws)
    ids = torch.empty(rows, 32, dtype=torch.int32, device=device)
    start = time.monotonic()
    nt.dcp_topk_select(logits, ends, workspace=ws, num_rows=rows, ids_out=ids)
    if device == "cuda":
        torch.cuda.synchronize()
    elapsed = time.monotonic() - start
    with pytest.raises(nt.DcpTopkTimeoutError, match="rank 1's flag of row"):
        ws.check()
    assert elapsed < 6 * timeout_s, f"16 rows waited {elapsed:.1f} s"


@pytest.mark.gpu
@pytest.mark.parametrize("world_size,rows,width,topk", [
    (1, 8, 16384, 2048), (2, 64, 65536, 2048), (8, 256, 16384, 2048), (8, 16, 131072, 2048),
    (4, 4, (1 << 17) + 1000, 2048), (16, 8, 8192, 2048), (8, 8, 32768, 4096), (3, 8, 20000, 4096),
    (4, 16, 32768, 3000), (8, 8, 16384, 2047), (2, 8, 16384, 7),
])
def test_gpu_serving_shapes_match_reference_and_oracle(world_size, rows, width, topk):
    gen = torch.Generator().manual_seed(world_size * rows)
    logits = torch.randn(world_size, rows, width, generator=gen).bfloat16()
    logits[0, 0, : topk * 2] += 6.0  # rank 0 saturated on row 0
    logits[:, 1 % rows] = 1.0  # all equal: every full rank saturated
    ends = torch.randint(width // 2, width + 1, (world_size, rows), generator=gen, dtype=torch.int32)
    ends[:, 2 % rows] = 7
    n = nt.default_local_topk(topk, world_size)
    got = _same_at_every_stage(logits.cuda(), ends.cuda(), topk=topk, local_topk=n)
    assert_exact(got["ids"].cpu(), oracle_topk(logits, ends, topk))


@pytest.mark.gpu
@pytest.mark.parametrize("world_size,rows,width,topk", [
    (2, 64, 65536, 2048), (8, 16, 131072, 2048), (4, 4, (1 << 17) + 1000, 2048), (4, 16, 32768, 3000),
])
def test_gpu_fp32_order_on_wide_rows_matches_reference_and_oracle(world_size, rows, width, topk):
    """Exact fp32 order through the wide rows' pipeline: scores that bf16
    cannot rank (row 0 all in one bf16 level), a saturated rank, a row of
    one value, short rows, windows."""
    from nvshmem_topk.testing import shard, sub_bf16_scores

    gen = torch.Generator().manual_seed(world_size * rows)
    logits = shard(sub_bf16_scores(rows, world_size * width, gen), world_size, 1)
    logits[0, 1, : topk * 2] += 6.0  # rank 0 saturated on row 1
    logits[:, 2] = 1.0  # one value: every full rank saturated
    starts = torch.randint(0, 50, (world_size, rows), generator=gen, dtype=torch.int32)
    ends = torch.randint(width // 2, width + 1, (world_size, rows), generator=gen, dtype=torch.int32)
    ends[:, 3] = 7
    n = nt.default_local_topk(topk, world_size)
    fp32 = torch.float32
    got = _same_at_every_stage(logits.cuda(), ends.cuda(), topk=topk, local_topk=n, starts=starts.cuda(),
                               score_dtype=fp32)
    assert_exact(got["ids"].cpu(), oracle_topk(logits, ends, topk, row_starts=starts, score_dtype=fp32))


@needs_triton
@pytest.mark.parametrize("impl", ["reference", "triton"])
def test_select_alone_reads_the_rows_of_the_merge(impl, device):
    """SimulatedMerge.select_alone (what the benchmarks time) selects over
    the merged rows, not over a gather buffer no merge wrote."""
    from nvshmem_topk.timing import SimulatedMerge

    logits = torch.randn(3, 2, 300, generator=torch.Generator().manual_seed(4)).bfloat16()
    ends = torch.full((3, 2), 300, dtype=torch.int32)
    merge = SimulatedMerge(logits.to(device), ends.to(device), 64, impl)
    try:
        select = merge.select_alone()
        merge.ids.fill_(-2)
        select()
        assert torch.equal(merge.ids[0].cpu(), nt.simulate_dcp_topk_merge(logits, ends, topk=64,
                                                                          impl="reference")[0])
    finally:
        merge.destroy()


@needs_triton
def test_a_merge_allocates_nothing_in_the_kernels_launchers(monkeypatch, device):
    """Every scratch buffer of the pack, the saturated push, the select and
    the rescue lives in the workspace: with the launchers' modules unable to
    allocate, a merge with saturated ranks still runs, exact."""
    import types

    from nvshmem_topk.kernels import exchange, pack, select
    from nvshmem_topk.timing import SimulatedMerge

    logits = torch.randn(3, 2, 900, generator=torch.Generator().manual_seed(8)).bfloat16()
    logits[0, 0, :200] += 6.0  # rank 0 saturated on row 0
    ends = torch.full((3, 2), 900, dtype=torch.int32)
    merge = SimulatedMerge(logits.to(device), ends.to(device), 64, "triton")

    def refuse(*args, **kwargs):
        raise AssertionError("a kernel launcher allocated during a merge")

    no_alloc = types.SimpleNamespace(**{name: getattr(torch, name) for name in dir(torch) if not name.startswith("__")})
    for name in ("empty", "zeros", "ones", "full", "empty_like", "zeros_like", "full_like", "tensor"):
        setattr(no_alloc, name, refuse)
    try:
        for module in (pack, select, exchange):
            monkeypatch.setattr(module, "torch", no_alloc, raising=False)
        merge()
        monkeypatch.undo()
        assert torch.equal(merge.ids.cpu(), nt.simulate_dcp_topk_merge(logits, ends, topk=64, impl="reference"))
        assert int((merge.workspaces[0].sat[:2] >> 47).ne(0).sum()) == 1
    finally:
        merge.destroy()


_FORKED_COMPILES = """
import sys, triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource
from nvshmem_topk.kernels.launch import _ForkedCompiles
from kernel_probes import radix_boundary_kernel

hits = []
triton.knobs.compilation.listener = lambda **kw: hits.append(kw["cache_hit"])
src = ASTSource(fn=radix_boundary_kernel, signature={"out_ptr": "*i32", "hist_ptr": "*i32", "need_ptr": "*i32"})
def job(warps):
    return triton.compile(src, target=GPUTarget("cuda", 90, 32), options={"num_warps": warps})
def broken():
    raise ValueError("no such variant")
compiles = _ForkedCompiles(2)
futures = [compiles.submit(job, warps) for warps in (1, 2, 4)] + [compiles.submit(broken)]
compiles.run()
assert [f.result().metadata.num_warps for f in futures[:3]] == [1, 2, 4]
assert isinstance(futures[3].exception(), ValueError)
print(hits)
"""


def test_forked_compiles_leave_every_variant_in_the_cache_for_this_process(tmp_path):
    """compile_only's executor: forked processes compile the submitted jobs
    (here three sm_90 variants of a probe kernel) into Triton's file cache,
    so that each job run again in this process is a cache hit; a job that
    fails gives its future the error. (A subprocess: the suite runs under
    the interpreter, which compiles nothing.)"""
    import subprocess
    import sys

    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"} | {"TRITON_CACHE_DIR": str(tmp_path)}
    env["PYTHONPATH"] = os.pathsep.join([os.path.dirname(__file__), env.get("PYTHONPATH", "")])
    out = subprocess.run([sys.executable, "-c", _FORKED_COMPILES], capture_output=True, text=True, timeout=300, env=env)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["[True,", "True,", "True]"], out.stdout


def test_forked_compiles_kill_a_child_past_the_bound_and_compile_here():
    """A child still compiling after the bound is killed and its job runs
    in this process instead: run() returns, nothing hangs."""
    import time

    from nvshmem_topk.kernels.launch import _ForkedCompiles

    parent = os.getpid()

    def job():
        if os.getpid() != parent:
            time.sleep(60)  # a child that would hold the warm-up for a minute
        return 7

    compiles = _ForkedCompiles(1, bound_s=0.5)
    future = compiles.submit(job)
    start = time.monotonic()
    compiles.run()
    assert time.monotonic() - start < 10 and future.result() == 7


def test_forked_compiles_with_no_processes_compile_here(tmp_path):
    """processes=0 (a process that must not fork): every job runs here,
    once, and nowhere else."""
    from nvshmem_topk.kernels.launch import _ForkedCompiles

    log = tmp_path / "pids"

    def job():
        with open(log, "a") as f:
            f.write(f"{os.getpid()}\n")

    compiles = _ForkedCompiles(0)
    for _ in range(3):
        compiles.submit(job)
    compiles.run()
    assert log.read_text().split() == [str(os.getpid())] * 3


def test_compile_only_launches_compile_the_same_variant_and_run_nothing():
    """Within launch.compile_only() a Launch calls its kernel's warmup with
    the arguments, constexprs and options it would launch with (so it
    compiles the variant the launch will look up), and never launches."""
    from nvshmem_topk.kernels.launch import Launch, compile_only

    class Kernel:
        def __init__(self):
            self.warmups, self.launches = [], []

        def warmup(self, *args, grid, **kwargs):
            self.warmups.append((args, grid, kwargs))

        def __getitem__(self, grid):
            return lambda *args, **kwargs: self.launches.append((args, grid, kwargs))

    kernel = Kernel()
    launch = Launch(kernel, (3, 2), (torch.zeros(1), (5, None)), dict(N=32, PDL=False), 4)
    with compile_only(processes=2):
        launch()
    launch()
    assert len(kernel.launches) == 1 and len(kernel.warmups) == 1, "inside: compiled, not launched"
    (args, grid, kwargs), = kernel.warmups
    assert (args, grid, kwargs) == kernel.launches[0], "the compile and the launch look up one variant"

"""Triton kernels against the reference, bit for bit, stage by stage.

On CPU these run under TRITON_INTERPRET=1 (small shapes, in CI); the ``gpu``
tests run the same comparison at serving shapes on one GPU."""

import math
import os

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from nvshmem_topk.testing import families, special_value_case
from drive import STAGES, drive
from oracle import assert_exact, oracle_topk

interpreted = os.environ.get("TRITON_INTERPRET") == "1"
needs_triton = pytest.mark.skipif(
    not interpreted and not torch.cuda.is_available(),
    reason="Triton kernels need a GPU or TRITON_INTERPRET=1",
)


def _same_at_every_stage(logits, ends, **kw):
    ref = drive(logits, ends, impl="reference", **kw)
    tri = drive(logits, ends, impl="triton", **kw)
    for stage in STAGES:
        assert torch.equal(tri[stage].cpu(), ref[stage].cpu()), f"stage {stage} differs"
    return tri


@needs_triton
@pytest.mark.parametrize("world_size", [1, 2, 3, 5, 8, 16])
def test_kernels_match_reference_stage_by_stage(world_size):
    device = "cuda" if not interpreted else "cpu"
    for name, logits, ends, k, n, inter in families(world_size, seed=2, rows=3, width=200, topk=64):
        got = _same_at_every_stage(logits.to(device), ends.to(device), topk=k, local_topk=n,
                                   interleave=inter)
        assert_exact(got["ids"].cpu(), oracle_topk(logits, ends, k, inter), context=name)


@needs_triton
@pytest.mark.parametrize("world_size", [2, 5])
def test_merge_whose_finish_pushes_matches_reference(world_size):
    """The merge as a serving call runs it (simulate_dcp_topk_merge, not
    stage by stage): the pack's finish pushes each row and raises the flags,
    with no push kernel. Every family against the reference and the oracle."""
    import nvshmem_topk as nt

    device = "cuda" if not interpreted else "cpu"
    for name, logits, ends, k, n, inter in families(world_size, seed=4, rows=3, width=200, topk=64):
        got = nt.simulate_dcp_topk_merge(logits.to(device), ends.to(device), topk=k, local_topk=n,
                                         interleave=inter, impl="triton")
        want = nt.simulate_dcp_topk_merge(logits, ends, topk=k, local_topk=n, interleave=inter, impl="reference")
        assert torch.equal(got.cpu(), want), name
        assert_exact(got.cpu(), oracle_topk(logits, ends, k, inter), context=name)


@needs_triton
@pytest.mark.parametrize("topk,local_topk", [(96, 32), (160, 64)])
def test_topk_not_a_power_of_two(topk, local_topk):
    device = "cuda" if not interpreted else "cpu"
    for name, logits, ends, _, _, inter in families(3, seed=8, rows=2, width=300, topk=topk):
        if name not in ("random", "saturated_max", "all_equal", "fewer_valid_than_k"):
            continue
        got = _same_at_every_stage(logits.to(device), ends.to(device), topk=topk, local_topk=local_topk,
                                   interleave=inter)
        assert_exact(got["ids"].cpu(), oracle_topk(logits, ends, topk, inter), context=name)


@needs_triton
def test_sorted_output_and_planes_match_reference():
    gen = torch.Generator().manual_seed(5)
    width = (1 << 16) + 64
    logits = (torch.randn(2, 2, width, generator=gen) * 0.1).bfloat16()
    logits[:, :, -40:] += 2.0
    logits[0, 1, :] = 1.0  # all-equal row: ties everywhere, rank 0 saturated
    ends = torch.tensor([[width, width - 5], [width - 20, width]], dtype=torch.int32)
    device = "cuda" if not interpreted else "cpu"
    got = _same_at_every_stage(logits.to(device), ends.to(device), topk=64, local_topk=32, sorted=True)
    assert_exact(got["ids"].cpu(), oracle_topk(logits, ends, 64), ordered=True)


@needs_triton
@pytest.mark.parametrize("world_size,width", [(3, 6000), (8, 4000)])
def test_k4096_with_saturation_matches_reference(world_size, width):
    gen = torch.Generator().manual_seed(world_size)
    logits = torch.randn(world_size, 2, width, generator=gen).bfloat16()
    logits[0, 0, :8192] += 6.0  # rank 0 saturated on row 0
    logits[:, 1] = 1.0
    ends = torch.randint(width // 2, width + 1, (world_size, 2), generator=gen, dtype=torch.int32)
    n = -(-(3 * 4096 // (2 * world_size)) // 32) * 32
    device = "cuda" if not interpreted else "cpu"
    got = _same_at_every_stage(logits.to(device), ends.to(device), topk=4096, local_topk=n)
    assert (got["sat"][:, 0] >> 47).tolist() == [1] * world_size
    assert_exact(got["ids"].cpu(), oracle_topk(logits, ends, 4096))


@needs_triton
@pytest.mark.parametrize("tile,room", [(None, None), (32, 8192), (32, 64)])
def test_pack_candidates_and_whole_row_walk_match_reference(monkeypatch, tile, room):
    """Rows of several blocks and a sampled estimate: ties at the threshold
    straddle blocks. The candidates are held in one tile (default), walked
    tile by tile (a small ``tile``), or, with little ``room`` for them, the
    rows fall back to the whole-row walk."""
    from nvshmem_topk import reference
    from nvshmem_topk.kernels import pack

    monkeypatch.setattr(pack, "FILTER_BLOCK", 1024)
    plan = pack.candidate_plan
    if tile is not None:
        monkeypatch.setattr(pack, "candidate_plan", lambda local_topk, width: (*plan(local_topk, width)[:2], tile, room))
    device = "cuda" if not interpreted else "cpu"
    cases = [c for c in families(1, seed=6, rows=2, width=4500, topk=256) if c[0] != "inf_and_signed_zero"]
    ascending = torch.linspace(-3, 3, 4500).bfloat16().expand(1, 2, 4500).contiguous()
    cases.append(("ascending", ascending, cases[0][2], None, cases[0][4], None))
    for name, logits, ends, _, n, _ in cases:
        for limit in (4500, 3000):
            want = reference.pack(logits[0], ends[0], n, limit)
            got = torch.full_like(want, 123).to(device)
            pack.pack(got, logits[0].to(device), ends[0].to(device), local_topk=n, max_local_len=limit)
            assert torch.equal(got.cpu(), want), (name, limit)


@needs_triton
def test_radix_boundary_matches_a_scan_of_the_histogram():
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
    device = "cuda" if not interpreted else "cpu"
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
def test_filter_threshold_keeps_a_threshold_set(whole):
    """The filter compares bf16 as floats against a floor derived from tau.
    Over every bf16 bit pattern, for taus at the edges (NaN patterns, the
    infinities, both zeros) and at random, the tokens it keeps must be every
    non-NaN token of ord16 >= t for one t <= tau (t = tau but for the
    zero's sign and NaN floors): then the candidates hold the row's top-N
    whenever there are N of them, which is all the finish relies on."""
    from kernel_probes import reaches_kernel

    from nvshmem_topk.format import ord16

    bits = torch.arange(1 << 16, dtype=torch.int32)
    x = bits.to(torch.int16).view(torch.bfloat16)
    order = ord16(bits).to(torch.int64)
    valid = ~torch.isnan(x)
    edges = [0, 1, 0x7E, 0x7F, 0x80, 0x4000, 0x7FFE, 0x7FFF, 0x8000, 0x8001, 0xC000, 0xFF7F, 0xFF80, 0xFF81, 0xFFFF]
    taus = torch.tensor(edges + torch.randint(0, 1 << 16, (9,), generator=torch.Generator().manual_seed(3)).tolist(),
                        dtype=torch.int32)
    device = "cuda" if not interpreted else "cpu"
    out = torch.empty((len(taus), 1 << 16), dtype=torch.int8, device=device)
    reaches_kernel[(len(taus),)](out, x.to(device), taus.to(device), WIDTH=1 << 16, BLOCK=4096,
                                WHOLE=whole)
    for tau, kept in zip(taus.tolist(), out.cpu().bool()):
        assert not (kept & ~valid).any(), f"tau {tau:#x} keeps a NaN"
        assert not (valid & (order >= tau) & ~kept).any(), f"tau {tau:#x} misses a token"
        floor = int(order[kept].min()) if kept.any() else 1 << 16
        assert torch.equal(kept, valid & (order >= floor)), f"tau {tau:#x} keeps no threshold set"
        widened = {0x8000: 0x7FFF}.get(tau, min(max(tau, 0x7F), 0xFF80))  # -0 >= +0; NaN floors: infinities
        assert floor == widened, f"tau {tau:#x} keeps from {floor:#x}"


@needs_triton
def test_tile_threshold_near_the_top_and_far_from_it():
    """The estimate's and the finish's threshold (one histogram of the
    level below the tile's top level and a count, the byte histograms when
    the boundary is 254 or more steps down) against its definition: the need-th largest
    valid score and how many of its ties are taken, (0, 0) when fewer."""
    from kernel_probes import tile_threshold_kernel

    gen = torch.Generator().manual_seed(9)
    tile, cases = 1024, []
    for need in (1, 37, 384, 1024, 1025):
        cases.append((torch.randint(0x7F, 0xFF81, (tile,), generator=gen), need))  # spread: the byte walk
        cases.append((0xC000 + torch.randint(0, 90, (tile,), generator=gen), need))  # clustered: one histogram
        outlier = 0xC000 + torch.randint(0, 90, (tile,), generator=gen)
        outlier[:3] = 0xFF80  # +inf far above a cluster
        cases.append((outlier, need))
        cases.append((torch.full((tile,), 0xBF80), need))  # all equal
    scores = torch.stack([c[0] for c in cases]).to(torch.int32)
    valid = (torch.rand(scores.shape, generator=gen) < 0.9).to(torch.int32)
    valid[3::4] = 1
    needs = torch.tensor([c[1] for c in cases], dtype=torch.int32)
    device = "cuda" if not interpreted else "cpu"
    out = torch.empty((len(cases), 2), dtype=torch.int32, device=device)
    tile_threshold_kernel[(len(cases),)](out, scores.to(device), valid.to(device), needs.to(device), TILE=tile)
    for case, (score, ok, need) in enumerate(zip(scores, valid.bool(), needs.tolist())):
        kept = score[ok].sort(descending=True).values
        if kept.numel() < need:
            want = [0, 0]
        else:
            threshold = int(kept[need - 1])
            want = [threshold, need - int((kept > threshold).sum())]
        assert out[case].tolist() == want, (case, need)


@needs_triton
def test_kth_largest_near_the_top_and_far_from_it():
    """The select's k-th key (a histogram of the score's level below the top
    level, then the last score bit and the gid bits; the full radix from the top
    bit when the boundary is 127 or more levels down) against sorting: clustered
    and spread scores, keys at the boundary level (few enough to be compacted
    into the tie tile, and too many, and a few in one bucket of the tie radix),
    fewer keys than k; and the count of keys it selects (k, or every key when
    fewer), which the emit uses."""
    from kernel_probes import TIE_TILE, kth_largest_kernel

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
    keys = torch.stack([c[0] for c in cases])
    ks = torch.tensor([c[1] for c in cases], dtype=torch.int32)
    device = "cuda" if not interpreted else "cpu"
    out = torch.empty(len(cases), 2, dtype=torch.int64, device=device)
    ties = torch.empty(len(cases), TIE_TILE, dtype=torch.int64, device=device)
    kth_largest_kernel[(len(cases),)](out, ties, keys.to(device), ks.to(device), ROWS=rows, COLS=cols,
                                      KEY_BITS=16 + gid_bits)
    for case, (key, k) in enumerate(cases):
        present = key[key != 0].sort(descending=True).values
        want = int(present[k - 1]) if present.numel() >= k else 0
        assert out[case].tolist() == [want, min(k, present.numel())], (case, k)


@needs_triton
def test_kernel_constants_mirror_the_layout():
    """The kernels keep their own copies of the layout's constants (they
    import nothing of the package); each must equal format's."""
    from nvshmem_topk import format as fmt
    from nvshmem_topk.kernels import exchange, keys

    assert exchange.MAX_PEERS == fmt.MAX_WORLD_SIZE
    assert (keys.LOW_BITS, keys.SAT_MASK_SHIFT, keys.SAT_KAPPA_MASK) == (
        fmt.LOW_BITS, fmt.SAT_MASK_SHIFT, fmt.SAT_KAPPA_MASK)


@needs_triton
def test_candidate_plan_keeps_the_tile_small_with_room_to_spare():
    """The estimate's groups and the finish's tile: the smallest tile that
    holds a row's expected candidates with four standard deviations to
    spare, more groups only where they make it smaller, all the groups'
    tokens ranked only where N is a large share of the row, whole short
    rows, and tiles between 256 and MAX_TILE."""
    from nvshmem_topk.kernels import pack

    assert pack.candidate_plan(384, 16384) == (512, True, 1024, 2048)
    assert pack.candidate_plan(384, 65536) == (2048, True, 1024, 2048)
    assert pack.candidate_plan(384, 131072) == (2048, True, 1024, 2048)
    assert pack.candidate_plan(1536, 65536) == (512, True, 4096, 8192)
    assert pack.candidate_plan(1536, 131072) == (1024, True, 4096, 8192)
    assert pack.candidate_plan(3072, 16384) == (256, False, 4096, 8192)
    assert pack.candidate_plan(384, 1000) == (256, True, 1024, 2048)
    assert pack.candidate_plan(32, 4500) == (256, True, 256, 512)
    assert pack.candidate_plan(2048, 131072)[2] == pack.MAX_TILE
    gen = torch.Generator().manual_seed(7)
    # The margin holds on normal scores (in the room when MAX_TILE capped the tile).
    for n, width in ((384, 16384), (384, 131072), (1536, 65536), (3072, 16384)):
        groups, tops, tile, room = pack.candidate_plan(n, width)
        start = (torch.arange(groups) * width) // groups // 8 * 8
        rows = torch.randn(64, width, generator=gen).bfloat16().float()
        values = rows[:, start[:, None] + torch.arange(8)]
        values = values.amax(dim=2) if tops else values.flatten(1)
        share = n / width
        expected = values.shape[1] * ((1 - (1 - share) ** 8) if tops else share)
        need = math.ceil(expected + 5 * math.sqrt(expected)) + 4
        tau = values.topk(need, dim=1).values[:, -1:]
        counts = (rows >= tau).sum(dim=1)
        held = tile if tile < pack.MAX_TILE else room
        assert n <= int(counts.min()) and int(counts.max()) <= held, (n, width, counts.min(), counts.max())


@needs_triton
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
def test_property_kernels_match_reference_stage_by_stage(world_size, rows, width, k_blocks, n_blocks,
                                                         interleave, levels, sorted_, seed):
    logits, ends = special_value_case(world_size, rows, width, levels, seed)
    device = "cuda" if not interpreted else "cpu"
    got = _same_at_every_stage(logits.to(device), ends.to(device), topk=32 * k_blocks,
                               local_topk=32 * n_blocks, interleave=interleave, sorted=sorted_)
    assert_exact(got["ids"].cpu(), oracle_topk(logits, ends, 32 * k_blocks, interleave), ordered=sorted_)


@needs_triton
@pytest.mark.parametrize("world_size,rows,width", [(2, 3, 0), (2, 0, 100), (1, 2, 1), (3, 1, 31)])
def test_empty_and_tiny_shapes(world_size, rows, width):
    import nvshmem_topk as nt

    device = "cuda" if not interpreted else "cpu"
    logits = torch.randn(world_size, rows, width, generator=torch.Generator().manual_seed(1)).bfloat16()
    ends = torch.full((world_size, rows), width, dtype=torch.int32)
    got = nt.simulate_dcp_topk_merge(logits.to(device), ends.to(device), topk=32, impl="triton")
    assert got.shape == (world_size, rows, 32)
    assert torch.equal(got.cpu(), nt.simulate_dcp_topk_merge(logits, ends, topk=32, impl="reference"))
    assert_exact(got.cpu(), oracle_topk(logits, ends, 32))


@needs_triton
def test_fp32_logits_round_to_bf16_like_the_reference():
    gen = torch.Generator().manual_seed(9)
    logits = torch.randn(3, 3, 300, generator=gen)
    logits[:, :, ::7] = 1.0 + 2**-8  # halfway between two bf16 values: rounds to even
    logits[:, 0, :5] = float("nan")
    ends = torch.full((3, 3), 300, dtype=torch.int32)
    device = "cuda" if not interpreted else "cpu"
    got = _same_at_every_stage(logits.to(device), ends.to(device), topk=64, local_topk=32)
    assert_exact(got["ids"].cpu(), oracle_topk(logits.bfloat16(), ends, 64))


@needs_triton
def test_pack_indices_kernel_matches_reference():
    import nvshmem_topk as nt
    from nvshmem_topk import reference

    device = "cuda" if not interpreted else "cpu"
    for _, logits, ends, _, n, _ in families(1, seed=3, rows=3, width=300, topk=64):
        idx = reference.local_topk_indices(logits[0], ends[0], n, 300).int()
        idx[:, ::3] = idx.flip(1)[:, ::3]  # any order, some ids repeated or -1
        lg, e, ix = logits[0].to(device), ends[0].to(device), idx.to(device)
        a = nt.dcp_topk_pack_indices(lg, ix, e, max_local_len=300, impl="triton")
        b = nt.dcp_topk_pack_indices(lg, ix, e, max_local_len=300, impl="reference")
        assert torch.equal(a.cpu(), b.cpu())


@needs_triton
def test_kernel_timeout_records_status_and_raises():
    import nvshmem_topk as nt

    device = "cuda" if not interpreted else "cpu"
    group = nt.SimulatedGroup(2, device)
    ws = [nt.init_dcp_topk_merge(g, max_rows=1, topk=32, max_local_len=64, timeout_s=0.01, impl="triton")
          for g in group.ranks]
    logits = torch.zeros(1, 64, device=device).bfloat16()
    ends = torch.full((1,), 64, dtype=torch.int32, device=device)
    nt.dcp_topk_exchange(nt.dcp_topk_pack(logits, ends, local_topk=32, max_local_len=64, impl="triton"),
                         workspace=ws[0])
    ids = torch.empty(1, 32, dtype=torch.int32, device=device)
    nt.dcp_topk_select(logits, ends, workspace=ws[0], num_rows=1, ids_out=ids)
    if device == "cuda":
        torch.cuda.synchronize()
    with pytest.raises(nt.DcpTopkTimeoutError, match="rank 1's flag of row 0, epoch 1"):
        ws[0].check()


@needs_triton
def test_rows_after_an_expired_wait_do_not_wait_again():
    """Rows that wait one after another (the interpreter runs a grid's
    programs in turn; on a GPU, a second wave of CTAs) end their waits once
    the status records an expired one: 16 rows take about one bound, not 16.
    Under the interpreter a poll takes 0.25 to 0.9 ms (_backends.py) and the
    bound is 1000 polls: 16 bounds take at least 4 s, one bound and 15 rows
    that each poll until the next status check (32 polls) at most 1.3 s."""
    import time

    import nvshmem_topk as nt

    device = "cuda" if not interpreted else "cpu"
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
])
def test_gpu_serving_shapes_match_reference_and_oracle(world_size, rows, width, topk):
    gen = torch.Generator().manual_seed(world_size * rows)
    logits = torch.randn(world_size, rows, width, generator=gen).bfloat16()
    logits[0, 0, : topk * 2] += 6.0  # rank 0 saturated on row 0
    logits[:, 1 % rows] = 1.0  # all equal: every full rank saturated
    ends = torch.randint(width // 2, width + 1, (world_size, rows), generator=gen, dtype=torch.int32)
    ends[:, 2 % rows] = 7
    n = -(-(3 * topk // (2 * world_size)) // 32) * 32
    got = _same_at_every_stage(logits.cuda(), ends.cuda(), topk=topk, local_topk=n)
    assert_exact(got["ids"].cpu(), oracle_topk(logits, ends, topk))


@needs_triton
@pytest.mark.parametrize("impl", ["reference", "triton"])
def test_select_alone_reads_the_rows_of_the_merge(impl):
    """SimulatedMerge.select_alone (what the benchmarks time) selects over
    the merged rows, not over a gather buffer no merge wrote."""
    import nvshmem_topk as nt
    from nvshmem_topk.timing import SimulatedMerge

    device = "cuda" if not interpreted else "cpu"
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

"""Per-rank API on the simulated group: stages, rows output, contract
checker, and every validation error."""

import gc
import importlib.util
import weakref

import pytest
import torch

import nvshmem_topk as nt
from nvshmem_topk.testing import families
from nvshmem_topk import format as fmt
from nvshmem_topk import reference
from nvshmem_topk.protocol import Outputs, run_merge
from drive import drive
from oracle import assert_exact, oracle_topk


@pytest.mark.parametrize("world_size", [1, 2, 5])
def test_rows_output_matches_ids(world_size):
    for name, logits, ends, k, n, inter in families(world_size, seed=4):
        got = drive(logits, ends, topk=k, local_topk=n, interleave=inter)
        assert_exact(got["ids"], oracle_topk(logits, ends, k, inter))
        for r in range(world_size):
            want, count = reference.owned_rows(got["ids"][r], rank=r, world_size=world_size,
                                               interleave=inter, req_id=got["req_id"],
                                               block_table=got["table"], block_size=16, stride_rows=64)
            assert torch.equal(got["rows_out"][r, :, :k], want), name
            assert torch.equal(got["valid_out"][r], count), name
            assert (got["rows_out"][r, :, k:] == -7).all(), "columns past K are not written"


def test_rows_by_hand_against_block_table():
    logits = torch.zeros(2, 1, 64).bfloat16()
    logits[0, 0, 5] = 4.0  # global 10
    logits[1, 0, 3] = 3.0  # global 7
    ends = torch.full((2, 1), 64, dtype=torch.int32)
    got = drive(logits, ends, topk=32, local_topk=32, block_size=4, stride_rows=10)
    assert {10, 7} <= set(got["ids"][0, 0].tolist())
    # rank 0 owns global 10 = local 5 -> block 1, offset 1
    assert got["table"][0, 1].item() * 10 + 1 in got["rows_out"][0, 0].tolist()


def test_merge_rows_per_rank_api_at_w1_with_packed_input():
    gen = torch.Generator().manual_seed(0)
    logits = torch.randn(3, 700, generator=gen).bfloat16()
    ends = torch.tensor([700, 10, 0], dtype=torch.int32)
    group = nt.SimulatedGroup(1)
    ws = nt.init_dcp_topk_merge(group.ranks[0], max_rows=4, topk=64, local_topk=64, max_local_len=700)
    idx = reference.local_topk_indices(logits, ends, 64, 700).int()
    packed = nt.dcp_topk_pack_indices(logits, idx, ends, max_local_len=700)
    nt.assert_packed_merge_contract(packed, logits, ends, local_topk=64, max_local_len=700)
    rows_out = torch.empty(3, 64, dtype=torch.int32)
    valid = torch.empty(3, dtype=torch.int32)
    ids = torch.empty(3, 64, dtype=torch.int32)
    nt.dcp_topk_merge_rows(logits=logits, row_ends=ends, workspace=ws, req_id=torch.zeros(3, dtype=torch.int32),
                           block_table=torch.arange(64, dtype=torch.int32)[None], block_size=16,
                           stride_rows=16, rows_out=rows_out, valid_out=valid, ids_out=ids, packed=packed)
    assert_exact(ids[None], oracle_topk(logits[None], ends[None], 64))
    assert valid.tolist() == [64, 10, 0]
    again = torch.empty_like(ids)
    nt.dcp_topk_merge(logits, ends, again, workspace=ws)
    assert torch.equal(again, ids)
    assert ws.epochs[:3].tolist() == [2, 2, 2]


def test_contract_checker_catches_a_bad_producer():
    logits = torch.arange(64, dtype=torch.float32).bfloat16()[None]
    ends = torch.tensor([64], dtype=torch.int32)
    worst = torch.arange(32, dtype=torch.int32)[None]  # the lowest scores, not a top-32
    packed = nt.dcp_topk_pack_indices(logits, worst, ends, max_local_len=64)
    with pytest.raises(AssertionError, match="not a top-32"):
        nt.assert_packed_merge_contract(packed, logits, ends, local_topk=32, max_local_len=64)


def test_simulated_per_rank_merge_is_refused_with_advice():
    group = nt.SimulatedGroup(2)
    ws = [nt.init_dcp_topk_merge(g, max_rows=1, topk=32, max_local_len=64) for g in group.ranks]
    with pytest.raises(ValueError, match="simulate_dcp_topk_merge"):
        nt.dcp_topk_merge(torch.zeros(1, 64).bfloat16(), torch.ones(1, dtype=torch.int32),
                          torch.empty(1, 32, dtype=torch.int32), workspace=ws[0])


def test_a_missing_peer_times_out_and_poisons_the_workspace():
    group = nt.SimulatedGroup(2)
    ws = [nt.init_dcp_topk_merge(g, max_rows=1, topk=32, max_local_len=64, timeout_s=0.05)
          for g in group.ranks]
    logits, ends = torch.zeros(1, 64).bfloat16(), torch.full((1,), 64, dtype=torch.int32)
    nt.dcp_topk_exchange(nt.dcp_topk_pack(logits, ends, local_topk=32, max_local_len=64), workspace=ws[0])
    ids = torch.empty(1, 32, dtype=torch.int32)
    with pytest.raises(nt.DcpTopkTimeoutError, match="rank 1's flag of row 0, epoch 1"):
        nt.dcp_topk_select(logits, ends, workspace=ws[0], num_rows=1, ids_out=ids)
        ws[0].check()
    with pytest.raises(nt.DcpTopkTimeoutError):
        nt.dcp_topk_select(logits, ends, workspace=ws[0], num_rows=1, ids_out=ids)


def test_destroyed_workspace_is_refused():
    group = nt.SimulatedGroup(1)
    ws = nt.init_dcp_topk_merge(group.ranks[0], max_rows=1, topk=32, max_local_len=64)
    ws.destroy()
    with pytest.raises(RuntimeError, match="destroyed"):
        nt.dcp_topk_merge(torch.zeros(1, 64).bfloat16(), torch.ones(1, dtype=torch.int32),
                          torch.empty(1, 32, dtype=torch.int32), workspace=ws)


def test_destroyed_workspaces_return_their_symmetric_memory():
    """Each rank's destroy() hands the workspace's symmetric tensors back to
    the group, which lets them go once every rank has: 100 build/destroy
    cycles leave nothing alive, and a later workspace still merges."""
    group = nt.SimulatedGroup(2)
    freed = []
    for _ in range(100):
        workspaces = [nt.init_dcp_topk_merge(g, max_rows=2, topk=64, max_local_len=300) for g in group.ranks]
        freed += [weakref.ref(t) for ws in workspaces for t in (ws.gather.local, ws.recv.local, ws.flags.local)]
        for ws in workspaces:
            ws.destroy()
        del workspaces
    gc.collect()
    assert sum(ref() is not None for ref in freed) == 0
    logits = torch.randn(2, 2, 300, generator=torch.Generator().manual_seed(0)).bfloat16()
    ends = torch.full((2, 2), 300, dtype=torch.int32)
    workspaces = [nt.init_dcp_topk_merge(g, max_rows=2, topk=64, max_local_len=300) for g in group.ranks]
    ids = torch.empty(2, 2, 64, dtype=torch.int32)
    run_merge(workspaces, list(logits), list(ends), [Outputs(ids[r], None, False) for r in range(2)], 2)
    assert_exact(ids, oracle_topk(logits, ends, 64))
    group.destroy()


def test_a_workspace_whose_wait_expired_is_destroyed_without_a_collective():
    """After an expired wait a peer may be dead: destroy() returns nothing
    to the group (a collective free could wait for that peer forever)."""
    group = nt.SimulatedGroup(2)
    ws = nt.init_dcp_topk_merge(group.ranks[0], max_rows=2, topk=64, max_local_len=300)
    group.ranks[0].free_symmetric = lambda tensors: pytest.fail("destroy() freed collectively after a timeout")
    ws.record_timeout(row=0, rank=1, epoch=1)
    ws.destroy()
    assert ws.destroyed


# ------------------------------------------------------------ validation

_L = torch.zeros(2, 2, 64).bfloat16()
_E = torch.full((2, 2), 64, dtype=torch.int32)


@pytest.mark.parametrize("kwargs,error,match", [
    (dict(topk=0), ValueError, "topk must be in \\[1, 4096\\], got 0"),
    (dict(topk=8192), ValueError, "topk must be in"),
    (dict(topk=64, local_topk=0), ValueError, "local_topk must be >= 1, got 0"),
    (dict(topk=64.0), TypeError, "topk must be an int, got float"),
    (dict(topk=64, impl="cuda"), ValueError, "impl must be one of"),
    (dict(topk=64, interleave=0), ValueError, "interleave must be >= 1, got 0"),
])
def test_simulate_rejects_bad_sizes(kwargs, error, match):
    with pytest.raises(error, match=match):
        nt.simulate_dcp_topk_merge(_L, _E, **kwargs)


@pytest.mark.parametrize("logits,ends,error,match", [
    (_L.double(), _E, TypeError,
     "logits must be torch.bfloat16 or torch.float16 or torch.float32, got torch.float64"),
    (_L[0], _E, ValueError, "logits must have 3 dimensions, got shape \\(2, 64\\)"),
    (_L.transpose(1, 2), _E, ValueError, "stride"),
    (_L, _E.short(), TypeError, "row_ends must be torch.int32 or torch.int64, got torch.int16"),
    (_L, _E[:1], ValueError, "row_ends must be \\[2, 2\\], got \\(1, 2\\)"),
    ([1, 2], _E, TypeError, "logits must be a torch.Tensor, got list"),
    (torch.zeros(17, 1, 64).bfloat16(), torch.zeros(17, 1, dtype=torch.int32), ValueError,
     "world_size must be in \\[1, 16\\], got 17"),
])
def test_simulate_rejects_bad_tensors(logits, ends, error, match):
    with pytest.raises(error, match=match):
        nt.simulate_dcp_topk_merge(logits, ends, topk=32)


def test_outputs_with_gaps_between_rows_are_refused():
    """The kernels write ids row r at r * K: an [T, K] view of a wider
    buffer would have its rows written past the view."""
    ws = _ws(max_rows=3)
    wide = torch.full((3, 128), -7, dtype=torch.int32)
    message = r"ids_out must have contiguous rows \(stride\(0\) == 64\), got strides \(128, 1\)"
    with pytest.raises(ValueError, match=message):
        nt.dcp_topk_merge(torch.zeros(3, 64).bfloat16(), torch.full((3,), 64, dtype=torch.int32), wide[:, :64],
                          workspace=ws)
    assert (wide == -7).all()
    ws.destroy()


@pytest.mark.parametrize("starts,error,match", [
    (_E.float(), TypeError, "row_starts must be torch.int32 or torch.int64, got torch.float32"),
    (_E[:, :1], ValueError, "row_starts must be \\[2, 2\\], got \\(2, 1\\)"),
])
def test_bad_row_starts_are_rejected_by_the_simulated_merge(starts, error, match):
    with pytest.raises(error, match=match):
        nt.simulate_dcp_topk_merge(_L, _E, topk=32, row_starts=starts)


@pytest.mark.parametrize("starts,error,match", [
    (_E[0].float(), TypeError, "row_starts must be torch.int32 or torch.int64, got torch.float32"),
    (_E[0, :1], ValueError, "row_starts must have >= 2 entries, got 1"),
])
def test_bad_row_starts_are_rejected_by_the_merge(starts, error, match):
    ws = _ws()
    with pytest.raises(error, match=match):
        nt.dcp_topk_merge(_L[0], _E[0], torch.empty(2, 64, dtype=torch.int32), workspace=ws, row_starts=starts)
    ws.destroy()


def test_triton_on_cpu_without_the_interpreter_is_an_error(monkeypatch):
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    with pytest.raises(RuntimeError, match="TRITON_INTERPRET=1"):
        nt.simulate_dcp_topk_merge(_L, _E, topk=32, impl="triton")


def _ws(**kw):
    args = dict(max_rows=2, topk=64, max_local_len=64)
    args.update(kw)
    return nt.init_dcp_topk_merge(nt.SimulatedGroup(1).ranks[0], **args)


@pytest.mark.parametrize("kwargs,error,match", [
    (dict(max_rows=0), ValueError, "max_rows must be >= 1, got 0"),
    (dict(max_local_len=(1 << 20) + 1), ValueError, "max_local_len must be in \\[1, 1048576\\]"),
    (dict(timeout_s=0), ValueError, "timeout_s must be > 0"),
    (dict(topk=5000), ValueError, "topk must be"),
    (dict(exchange="nccl"), ValueError, "exchange must be one of \\('push', 'all_gather', 'fcollect'\\)"),
    (dict(exchange="all_gather"), ValueError, r"exchange='all_gather' is not one that SimulatedRank runs"),
    (dict(exchange="fcollect"), ValueError, r"exchange='fcollect' is not one that SimulatedRank runs: \('push',\)"),
])
def test_init_rejects_bad_arguments(kwargs, error, match):
    with pytest.raises(error, match=match):
        _ws(**kwargs)


def test_init_rejects_a_non_group():
    with pytest.raises(TypeError, match="group must implement DcpGroup, got str"):
        nt.init_dcp_topk_merge("world", max_rows=1, topk=32, max_local_len=64)


def test_merge_argument_errors():
    ws = _ws()
    logits, ends = torch.zeros(2, 64).bfloat16(), torch.full((2,), 64, dtype=torch.int32)
    ids = torch.empty(2, 64, dtype=torch.int32)
    with pytest.raises(RuntimeError, match="init_dcp_topk_merge"):
        nt.dcp_topk_merge(logits, ends, ids, workspace=None)
    with pytest.raises(TypeError, match="workspace must be a DcpTopkWorkspace, got dict"):
        nt.dcp_topk_merge(logits, ends, ids, workspace={})
    with pytest.raises(ValueError, match="3 rows exceed the workspace's max_rows=2"):
        nt.dcp_topk_merge(torch.zeros(3, 64).bfloat16(), torch.zeros(3, dtype=torch.int32),
                          torch.empty(3, 64, dtype=torch.int32), workspace=ws)
    with pytest.raises(ValueError, match="ids_out must be \\[2, 64\\], got \\(2, 32\\)"):
        nt.dcp_topk_merge(logits, ends, torch.empty(2, 32, dtype=torch.int32), workspace=ws)
    with pytest.raises(TypeError, match="ids_out must be torch.int32, got torch.int64"):
        nt.dcp_topk_merge(logits, ends, ids.long(), workspace=ws)
    with pytest.raises(ValueError, match="row_ends must have >= 2 entries, got 1"):
        nt.dcp_topk_merge(logits, ends[:1], ids, workspace=ws)
    with pytest.raises(ValueError, match="must be on cpu"):
        nt.dcp_topk_merge(logits.to("meta"), ends, ids, workspace=ws)


def test_merge_rows_argument_errors():
    ws = _ws()
    logits, ends = torch.zeros(2, 64).bfloat16(), torch.full((2,), 64, dtype=torch.int32)
    good = dict(logits=logits, row_ends=ends, workspace=ws, req_id=torch.zeros(2, dtype=torch.int32),
                block_table=torch.zeros(1, 4, dtype=torch.int32), block_size=16, stride_rows=16,
                rows_out=torch.empty(2, 64, dtype=torch.int32), valid_out=torch.empty(2, dtype=torch.int32))
    for change, error, match in [
        (dict(rows_out=torch.empty(2, 63, dtype=torch.int32)), ValueError, "rows_out must be \\[2, >= 64\\]"),
        (dict(valid_out=torch.empty(3, dtype=torch.int32)), ValueError, "valid_out must be \\[2\\]"),
        (dict(block_size=0), ValueError, "block_size must be >= 1, got 0"),
        (dict(req_id=torch.zeros(1, dtype=torch.int32)), ValueError, "req_id must have >= 2 entries"),
        (dict(block_table=torch.zeros(4, dtype=torch.int32)), ValueError, "block_table must have 2 dimensions"),
        (dict(packed=torch.zeros(2, 10, dtype=torch.int32)), ValueError, "packed must be \\[2, 96\\]"),
    ]:
        with pytest.raises(error, match=match):
            nt.dcp_topk_merge_rows(**{**good, **change})


def test_pack_argument_errors():
    logits, ends = torch.zeros(2, 64).bfloat16(), torch.full((2,), 64, dtype=torch.int32)
    with pytest.raises(ValueError, match="local_topk must be >= 32 and a multiple of 32, got 33"):
        nt.dcp_topk_pack(logits, ends, local_topk=33, max_local_len=64)
    with pytest.raises(ValueError, match="out must be \\[2, 32\\], got \\(2, 33\\)"):
        nt.dcp_topk_pack(logits, ends, local_topk=32, max_local_len=64,
                         out=torch.empty(2, 33, dtype=torch.int32))
    with pytest.raises(TypeError, match="local_idx must be torch.int32"):
        nt.dcp_topk_pack_indices(logits, torch.zeros(2, 32), ends, max_local_len=64)
    with pytest.raises(ValueError, match="local_idx.shape\\[1\\] must be >= 32 and a multiple of 32, got 40"):
        nt.dcp_topk_pack_indices(logits, torch.zeros(2, 40, dtype=torch.int32), ends, max_local_len=64)


def test_select_needs_an_output():
    ws = _ws()
    with pytest.raises(ValueError, match="nowhere to write"):
        nt.dcp_topk_select(torch.zeros(2, 64).bfloat16(), torch.zeros(2, dtype=torch.int32),
                           workspace=ws, num_rows=2)


def test_import_does_not_pull_nvshmem_or_triton():
    import subprocess
    import sys

    code = "import sys, nvshmem_topk; print(any(m.split('.')[0] in ('nvshmem', 'triton') for m in sys.modules))"
    assert subprocess.check_output([sys.executable, "-c", code], text=True).strip() == "False"


def test_families_reach_saturation_up_to_the_slot_limit():
    for name, logits, ends, k, n, inter in families(4):
        if name != "saturated_max":
            continue
        world = logits.shape[0]
        gathered = torch.stack([reference.pack(logits[r], ends[r], n, logits.shape[2]) for r in range(world)])
        _, sat = reference.select(gathered, topk=k, local_topk=n, world_size=world, interleave=inter,
                                  max_local_len=logits.shape[2])
        popcount = [bin(int(m)).count("1") for m in fmt.sat_mask(sat)]
        assert popcount == [min(world, k // n)] * logits.shape[1]


def test_indexer_adapter_seed_call_shape_and_errors():
    group = nt.SimulatedGroup(1)
    indexer = nt.DcpTopkIndexer(group.ranks[0], max_rows=2, topk=64, local_topk=64, max_local_len=300,
                                micro_batches=2)
    indexer.warmup(rows=True)
    logits = torch.randn(2, 300, generator=torch.Generator().manual_seed(3)).bfloat16()
    ends = torch.tensor([300, 40], dtype=torch.int32)
    ids = torch.empty(2, 64, dtype=torch.int32)
    indexer.dcp_topk_merge(logits, ends, ids, 64, micro_batch=1)
    assert_exact(ids[None], oracle_topk(logits[None], ends[None], 64))
    with pytest.raises(ValueError, match="local_topk=32 differs from this indexer's N=64"):
        indexer.dcp_topk_merge(logits, ends, ids, 32)
    with pytest.raises(ValueError, match="micro_batch must be in \\[0, 2\\), got 2"):
        indexer.dcp_topk_merge(logits, ends, ids, micro_batch=2)
    with pytest.raises(ValueError, match="micro_batches must be a positive int, got 0"):
        nt.DcpTopkIndexer(group.ranks[0], max_rows=2, topk=64, max_local_len=300, micro_batches=0)
    indexer.destroy()
    with pytest.raises(RuntimeError, match="destroyed"):
        indexer.dcp_topk_merge(logits, ends, ids)


def test_nvshmem_group_rejects_an_unknown_device_library_mode_first():
    with pytest.raises(ValueError, match="device_library must be one of \\('auto', 'always', 'never'\\), got 'on'"):
        nt.NvshmemGroup(device_library="on")


def test_nvshmem_group_and_bootstrap_arguments_are_checked_first():
    with pytest.raises(ValueError, match="as process_group \\(torchrun\\) or as dcp_size \\(PMI / MPI\\), not both"):
        nt.NvshmemGroup(object(), dcp_size=2)
    with pytest.raises(ValueError, match="bootstrap must be one of \\('torch', 'pmi', 'mpi'\\), got 'slurm'"):
        nt.init_nvshmem("slurm")


def test_launcher_local_rank_reads_hydra_open_mpi_and_slurm(monkeypatch):
    from nvshmem_topk.groups.nvshmem import LOCAL_RANK_VARIABLES, launcher_local_rank

    for name in LOCAL_RANK_VARIABLES:
        monkeypatch.delenv(name, raising=False)
    assert launcher_local_rank() is None
    monkeypatch.setenv("SLURM_LOCALID", "3")
    assert launcher_local_rank() == 3
    monkeypatch.setenv("MPI_LOCALRANKID", "1")  # Hydra (MPICH, nvshmrun) first
    assert launcher_local_rank() == 1


@pytest.mark.skipif(importlib.util.find_spec("nvshmem") is not None, reason="nvshmem4py is installed here")
def test_nvshmem_group_without_nvshmem4py_says_how_to_install_it():
    with pytest.raises(ImportError, match=r"nvshmem-topk\[nvshmem\]"):
        nt.NvshmemGroup()


def test_simulated_ranks_that_disagree_on_settings_raise_naming_them():
    group = nt.SimulatedGroup(2)
    nt.init_dcp_topk_merge(group.ranks[0], max_rows=2, topk=64, max_local_len=300)
    with pytest.raises(ValueError, match=r"topk \(rank 0: 64, rank 1: 128\)"):
        nt.init_dcp_topk_merge(group.ranks[1], max_rows=2, topk=128, max_local_len=300)
    group.destroy()


def test_pdl_is_a_setting_on_by_default_only_on_gpus():
    group = nt.SimulatedGroup(1)
    assert nt.init_dcp_topk_merge(group.ranks[0], max_rows=1, topk=64, max_local_len=300).pdl is False
    with pytest.raises(ValueError, match="pdl must be None, False, or True on a CUDA device; got True on cpu"):
        nt.init_dcp_topk_merge(group.ranks[0], max_rows=1, topk=64, max_local_len=300, pdl=True)
    logits, ends = torch.zeros(1, 300, dtype=torch.bfloat16), torch.full((1,), 300, dtype=torch.int32)
    with pytest.raises(ValueError, match="pdl must be"):
        nt.dcp_topk_pack(logits, ends, local_topk=32, max_local_len=300, pdl="yes")
    group.destroy()

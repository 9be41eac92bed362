"""The torch custom ops: fake tensors, opcheck, and torch.compile(fullgraph)
staying exact (simulated group here; real processes in test_multiprocess)."""

import pytest
import torch

import nvshmem_topk as nt
from nvshmem_topk.testing import families
from oracle import assert_exact, oracle_topk


def _data(world=3, rows=2, width=500, seed=0):
    gen = torch.Generator().manual_seed(seed)
    return (torch.randn(world, rows, width, generator=gen).bfloat16(),
            torch.full((world, rows), width, dtype=torch.int32))


def test_fake_simulate_merge_has_the_real_shape():
    from torch._subclasses.fake_tensor import FakeTensorMode

    with FakeTensorMode():
        out = torch.ops.nvshmem_topk.simulate_merge(torch.empty(3, 2, 500, dtype=torch.bfloat16),
                                                    torch.empty(3, 2, dtype=torch.int32), 64, 0,
                                                    "reference", 1, False)
    assert out.shape == (3, 2, 64) and out.dtype == torch.int32


def test_opcheck_simulate_merge():
    logits, ends = _data()
    torch.library.opcheck(torch.ops.nvshmem_topk.simulate_merge.default,
                          (logits, ends, 64, 0, "reference", 1, False))


def test_compiled_simulated_merge_is_exact():
    for _, logits, ends, k, n, inter in list(families(3, seed=12, rows=2, width=300, topk=64))[:4]:
        compiled = torch.compile(
            lambda x, e: torch.ops.nvshmem_topk.simulate_merge(x * 2, e, k, n, "reference", inter, True),
            fullgraph=True)
        assert_exact(compiled(logits, ends), oracle_topk(logits.float() * 2, ends, k, inter), ordered=True)


def test_compiled_per_rank_merge_mutates_ids_out():
    logits, ends = _data(world=1)
    ws = nt.init_dcp_topk_merge(nt.SimulatedGroup(1).ranks[0], max_rows=2, topk=64, max_local_len=500)

    @torch.compile(fullgraph=True)
    def step(x, e, ids):
        torch.ops.nvshmem_topk.merge(x + 1, e, ids, ws.handle, False)
        return ids[:, :8] * 1

    ids = torch.full((2, 64), -7, dtype=torch.int32)
    head = step(logits[0], ends[0], ids)
    assert_exact(ids[None], oracle_topk(logits + 1, ends, 64))
    assert torch.equal(head, ids[:, :8])


def test_a_destroyed_workspace_handle_is_refused():
    ws = nt.init_dcp_topk_merge(nt.SimulatedGroup(1).ranks[0], max_rows=2, topk=64, max_local_len=500)
    ws.destroy()
    logits, ends = _data(world=1)
    with pytest.raises(RuntimeError, match=f"no live DCP top-k workspace has handle {ws.handle}"):
        torch.ops.nvshmem_topk.merge(logits[0], ends[0], torch.empty(2, 64, dtype=torch.int32), ws.handle, False)


def test_public_api_compiles_fullgraph_and_matches_eager():
    """What an engine compiles: the public calls themselves, not the raw ops
    (nt.dcp_topk_merge, dcp_topk_merge_rows, the indexer's, and
    simulate_dcp_topk_merge; two of them with row starts), each traced with
    no graph break and equal to the eager call."""
    logits, ends = _data(world=1, rows=3, width=700, seed=4)
    x, e = logits[0], ends[0]
    indexer = nt.DcpTopkIndexer(nt.SimulatedGroup(1).ranks[0], max_rows=3, topk=64, max_local_len=700)
    ws = indexer.workspaces[0]
    table = torch.arange(12, dtype=torch.int32).reshape(1, 12)
    req = torch.zeros(3, dtype=torch.int32)
    starts = torch.tensor([0, 5, 300], dtype=torch.int32)

    def merge(x, e, ids):
        nt.dcp_topk_merge(x * 1, e, ids, workspace=ws, sorted=True, row_starts=starts)
        return ids + 0

    def merge_rows(x, e, rows_out, valid_out, ids):
        nt.dcp_topk_merge_rows(logits=x * 1, row_ends=e, workspace=ws, req_id=req, block_table=table, block_size=64,
                               stride_rows=100, rows_out=rows_out, valid_out=valid_out, ids_out=ids)
        return rows_out + 0, valid_out + 0, ids + 0

    def indexed(x, e, ids):
        indexer.dcp_topk_merge(x * 1, e, ids, sorted=True)
        return ids + 0

    def indexed_rows(x, e, rows_out, valid_out):
        indexer.dcp_topk_merge_rows(logits=x * 1, row_ends=e, req_id=req, block_table=table, block_size=64,
                                    stride_rows=100, rows_out=rows_out, valid_out=valid_out)
        return rows_out + 0, valid_out + 0

    def simulated(x, e):
        return nt.simulate_dcp_topk_merge(x * 1, e, topk=64, sorted=True, row_starts=starts[None])

    ids = lambda: torch.full((3, 64), -7, dtype=torch.int32)
    rows = lambda: (torch.full((3, 64), -7, dtype=torch.int32), torch.zeros(3, dtype=torch.int32))
    cases = [(merge, lambda: (x, e, ids())), (merge_rows, lambda: (x, e, *rows(), ids())),
             (indexed, lambda: (x, e, ids())), (indexed_rows, lambda: (x, e, *rows())),
             (simulated, lambda: (logits, ends))]
    for fn, args in cases:
        eager = fn(*args())
        torch._dynamo.reset()
        compiled = torch.compile(fn, fullgraph=True)(*args())
        for want, got in zip(eager if isinstance(eager, tuple) else (eager,),
                             compiled if isinstance(compiled, tuple) else (compiled,)):
            assert torch.equal(got, want), fn.__name__
    indexer.destroy()

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

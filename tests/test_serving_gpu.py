"""An engine's decode path on one GPU: nothing compiles after the indexer's
warm-up, whatever the row widths and batch sizes, and graphs captured per
batch size on two micro-batches replay exact with changing inputs."""

import time

import pytest
import torch

from batch_graphs import SIZES, replay_per_batch_size
from oracle import assert_exact, oracle_topk

pytestmark = pytest.mark.gpu

WIDTH, ROWS, TOPK = 20000, 16, 256  # rows on both sides of the pack's short-row bound (16384)


def _indexer(micro_batches: int, max_rows: int = ROWS, width: int = WIDTH, topk: int = TOPK,
             local_topk: int = TOPK):
    import nvshmem_topk as nt

    # One rank whose N is at most K: it is saturated on every row wider than pack.SHORT_ROWS, so the pushed
    # list and the rescue run too; its shorter rows take the one-kernel merge (kernels/local.py).
    return nt.DcpTopkIndexer(nt.SimulatedGroup(1, "cuda").ranks[0], max_rows=max_rows, topk=topk,
                             local_topk=local_topk, max_local_len=width, micro_batches=micro_batches)


def _variants() -> dict[str, set]:
    """The compiled variants of every kernel of the package, by kernel: the
    keys of Triton's in-process cache (one per specialisation, whether
    compiled here or loaded from Triton's disk cache)."""
    import importlib
    import pkgutil

    import triton

    from nvshmem_topk import kernels as package

    modules = [importlib.import_module(f"{package.__name__}.{m.name}") for m in pkgutil.iter_modules(package.__path__)]
    kernels = {v for m in modules for v in vars(m).values() if isinstance(v, triton.JITFunction)}
    return {k.__name__: {key for caches in k.device_caches.values() for key in caches[0]} for k in kernels}


def _timed_warmup(indexer, label: str) -> dict[str, set]:
    """indexer.warmup(), timed: prints its time and how many variants it
    compiled; returns every compiled variant after it."""
    before = _variants()
    start = time.monotonic()
    indexer.warmup()
    torch.cuda.synchronize()
    warm_s, compiled = time.monotonic() - start, _variants()
    print(f"warmup {label}: {warm_s:.1f} s, {sum(len(keys - before[k]) for k, keys in compiled.items())} variants")
    return compiled


def _merge(indexer, logits, ends, form: int, micro_batch: int = 0) -> torch.Tensor:
    """ids of one merge, in one of the four output forms (ids or rows,
    unsorted or sorted); rows are asked with ids beside them."""
    rows = logits.shape[0]
    ids = torch.empty(rows, TOPK, dtype=torch.int32, device="cuda")
    if form < 2:
        indexer.dcp_topk_merge(logits, ends, ids, micro_batch=micro_batch, sorted=form == 1)
    else:
        table = torch.arange(WIDTH // 16 + 1, dtype=torch.int32, device="cuda")[None]
        indexer.dcp_topk_merge_rows(logits=logits, row_ends=ends, req_id=torch.zeros(rows, dtype=torch.int32,
                                                                                   device="cuda"),
                                    block_table=table, block_size=16, stride_rows=16,
                                    rows_out=torch.empty_like(ids), valid_out=torch.empty(rows, dtype=torch.int32,
                                                                                          device="cuda"),
                                    ids_out=ids, micro_batch=micro_batch, sorted=form == 3)
    return ids


def test_nothing_compiles_after_warmup_at_any_width_or_batch_size():
    indexer = _indexer(micro_batches=2)
    compiled = _timed_warmup(indexer, f"at K = {TOPK}")
    gen = torch.Generator().manual_seed(0)
    buffer = torch.randn(ROWS, WIDTH, generator=gen).bfloat16().cuda()  # a stride of a multiple of 16 elements
    widths = [*range(1, 300), *range(300, WIDTH + 1, 97), 16383, 16384, 16385, WIDTH - 1, WIDTH]
    for i, width in enumerate(widths):
        rows = 1 + i % ROWS
        logits = buffer[:rows, :width]
        ends = torch.randint(0, width + 1, (rows,), generator=gen, dtype=torch.int32)
        ids = _merge(indexer, logits, ends.cuda(), form=i % 4, micro_batch=i % 2)
        if i % 8 == 0 or width > 16000:
            assert_exact(ids.cpu()[None], oracle_topk(logits.cpu()[None], ends[None], TOPK),
                         ordered=i % 4 in (1, 3), context=f"width {width}, {rows} rows")
    new = {name: keys - compiled[name] for name, keys in _variants().items() if keys - compiled[name]}
    assert not new, f"merges compiled variants after warmup(): {new}; warmup compiled {compiled}"
    indexer.workspaces[0].check()
    indexer.destroy()


def test_warmup_at_deepseek_k_then_nothing_compiles():
    """The warm-up at DeepSeek-V3.2's K = 2048, N = 384 (its default at
    W = 8) and 131072 local tokens (1M over 8 ranks), on a one-rank group
    (so every row wider than 16384 tokens saturates and the pushed list and
    rescue run; shorter ones take the one-kernel merge): prints its time and
    variant count; merges of every form and width class after it compile
    nothing."""
    indexer = _indexer(micro_batches=2, max_rows=64, width=131072, topk=2048, local_topk=384)
    compiled = _timed_warmup(indexer, "at K = 2048")
    gen = torch.Generator().manual_seed(1)
    buffer = torch.randn(64, 131072, generator=gen).bfloat16().cuda()  # a row stride of a multiple of 16 elements
    for i, width in enumerate((1, 5000, 16384, 16385, 131072)):
        logits = buffer[:, :width]
        ends = torch.randint(0, width + 1, (64,), generator=gen, dtype=torch.int32)
        ids = torch.empty(64, 2048, dtype=torch.int32, device="cuda")
        indexer.dcp_topk_merge(logits, ends.cuda(), ids, micro_batch=i % 2, sorted=i % 2 == 1)
        assert_exact(ids.cpu()[None], oracle_topk(logits.cpu()[None], ends[None], 2048), ordered=i % 2 == 1,
                     context=f"width {width}")
    new = {name: keys - compiled[name] for name, keys in _variants().items() if keys - compiled[name]}
    assert not new, f"merges compiled variants after warmup(): {new}"
    indexer.destroy()


def test_graphs_per_batch_size_replay_exact_on_two_micro_batches():
    """Graphs captured per batch size on two micro-batches' workspaces
    (``batch_graphs``); the NVSHMEM group's form is in test_nvshmem.py."""
    indexer = _indexer(micro_batches=2, max_rows=max(SIZES), width=4096)
    indexer.warmup(rows=False)
    assert replay_per_batch_size(indexer, lambda ids: ids.cpu()[None], width=4096) == 60
    indexer.destroy()

"""One rank of the CPU multi-process tests (started by launch.run_ranks).

    python mp_worker.py MODE IMPL EXCHANGE

Every rank builds the same global data from one seed and keeps its shard."""

from __future__ import annotations

import os
import sys
import time

import torch

import nvshmem_topk as nt
from nvshmem_topk.testing import families
from nvshmem_topk import reference
from oracle import assert_exact, oracle_topk


def merge_rows(ws, logits, ends, topk, interleave, block_size=16, stride_rows=64):
    rows, width = logits.shape
    blocks = -(-width // block_size)
    gen = torch.Generator().manual_seed(1)  # the same table on every rank
    table = torch.randperm(rows * blocks + 7, generator=gen)[: rows * blocks].view(rows, blocks).int()
    table = table[:, : max(1, blocks - 1)].contiguous()
    req_id = torch.arange(rows - 1, -1, -1, dtype=torch.int32)
    ids = torch.full((rows, topk), -7, dtype=torch.int32)
    rows_out = torch.full((rows, topk), -7, dtype=torch.int32)
    valid = torch.full((rows,), -7, dtype=torch.int32)
    nt.dcp_topk_merge_rows(logits=logits, row_ends=ends, workspace=ws, req_id=req_id, block_table=table,
                           block_size=block_size, stride_rows=stride_rows, rows_out=rows_out,
                           valid_out=valid, ids_out=ids)
    want_rows, want_valid = reference.owned_rows(ids, rank=ws.rank, world_size=ws.world_size,
                                                 interleave=interleave, req_id=req_id, block_table=table,
                                                 block_size=block_size, stride_rows=stride_rows)
    assert torch.equal(rows_out, want_rows) and torch.equal(valid, want_valid), "rows differ"
    return ids


def families_mode(group, impl, exchange):
    world, rank = group.world_size, group.rank
    checked = 0
    for name, logits, ends, k, n, inter in families(world, seed=11, rows=3, width=200, topk=64):
        ws = nt.init_dcp_topk_merge(group, max_rows=4, topk=k, local_topk=n, max_local_len=200,
                                    interleave=inter, impl=impl, exchange=exchange, timeout_s=30)
        want = oracle_topk(logits, ends, k, inter)
        for _ in range(2):  # two merges: epochs advance, parities alternate
            ids = merge_rows(ws, logits[rank], ends[rank], k, inter)
            gathered = [torch.empty_like(ids) for _ in range(world)]
            torch.distributed.all_gather(gathered, ids)
            assert_exact(torch.stack(gathered), want)
            checked += 1
        ws.destroy()
    print(f"rank {rank} ok {checked}", flush=True)


def serving_mode(group, impl, exchange):
    """As a serving engine drives it: one workspace per in-flight merge,
    reused by every layer of every step, batch sizes changing up to
    max_rows, mixed row lengths, saturation on some steps and not others."""
    world, rank = group.world_size, group.rank
    max_rows, width, topk = 6, 400, 64
    ws = nt.init_dcp_topk_merge(group, max_rows=max_rows, topk=topk, local_topk=32, max_local_len=width,
                                impl=impl, exchange=exchange, timeout_s=30)
    gen = torch.Generator().manual_seed(5)  # the same on every rank
    merges = 0
    for step in range(6):
        rows = int(torch.randint(1, max_rows + 1, (1,), generator=gen))
        ends = torch.randint(0, width + 1, (world, rows), generator=gen, dtype=torch.int32)
        for layer in range(3):
            logits = torch.randn(world, rows, width, generator=gen).bfloat16()
            if (step + layer) % 2:
                logits[int(torch.randint(0, world, (1,), generator=gen))] += 5.0  # one rank saturates
            ids = merge_rows(ws, logits[rank], ends[rank], topk, 1)
            gathered = [torch.empty_like(ids) for _ in range(world)]
            torch.distributed.all_gather(gathered, ids)
            assert_exact(torch.stack(gathered), oracle_topk(logits, ends, topk))
            merges += 1
    print(f"rank {rank} served {merges} merges, epochs {ws.epochs.tolist()}", flush=True)
    ws.destroy()


def tp_dcp_mode(world_group, impl, exchange):
    """World of 4 = a TP group holding two DCP groups of 2; each DCP group
    serves its own requests through the indexer adapter, two micro-batches
    in flight alternately, batch sizes changing, warm-up first."""
    import torch.distributed as dist

    world_rank = world_group.rank
    subgroups = [dist.new_group([0, 1]), dist.new_group([2, 3])]
    mine = world_rank // 2
    group = nt.ShmGroup(subgroups[mine])
    indexer = nt.DcpTopkIndexer(group, max_rows=4, topk=64, local_topk=32, max_local_len=300,
                                micro_batches=2, impl=impl, exchange=exchange, timeout_s=30)
    indexer.warmup(rows=False)  # ids only, as this step asks
    gen = torch.Generator().manual_seed(100 + mine)  # each DCP group has its own requests
    merges = 0
    for step in range(4):
        rows = int(torch.randint(1, 5, (1,), generator=gen))
        ends = torch.randint(0, 301, (2, rows), generator=gen, dtype=torch.int32)
        for layer in range(4):
            logits = torch.randn(2, rows, 300, generator=gen).bfloat16()
            if layer % 2:
                logits[0] += 4.0
            ids = torch.empty(rows, 64, dtype=torch.int32)
            indexer.dcp_topk_merge(logits[group.rank], ends[group.rank], ids, 32, micro_batch=layer % 2)
            gathered = [torch.empty_like(ids) for _ in range(2)]
            dist.all_gather(gathered, ids, group=subgroups[mine])
            assert_exact(torch.stack(gathered), oracle_topk(logits, ends, 64))
            merges += 1
    indexer.destroy()
    print(f"rank {world_rank} (dcp group {mine}, dcp rank {group.rank}) ok {merges}", flush=True)


def compiled_mode(group, impl, exchange):
    """torch.compile(fullgraph=True) of a step that calls the public merge
    (which the trace turns into the custom op)."""
    world, rank = group.world_size, group.rank
    logits = torch.randn(world, 3, 400, generator=torch.Generator().manual_seed(2)).bfloat16()
    logits[0, 1] += 5.0  # rank 0 saturates row 1
    ends = torch.full((world, 3), 400, dtype=torch.int32)
    ws = nt.init_dcp_topk_merge(group, max_rows=3, topk=64, max_local_len=400, impl=impl, exchange=exchange,
                                timeout_s=60)

    @torch.compile(fullgraph=True, backend="aot_eager")
    def step(x, e, ids):
        nt.dcp_topk_merge(x * 0.5, e, ids, workspace=ws, sorted=True)
        return ids

    for _ in range(2):
        ids = step(logits[rank], ends[rank], torch.empty(3, 64, dtype=torch.int32))
        gathered = [torch.empty_like(ids) for _ in range(world)]
        torch.distributed.all_gather(gathered, ids)
        assert_exact(torch.stack(gathered), oracle_topk(logits.float() * 0.5, ends, 64), ordered=True)
    print(f"rank {rank} compiled ok", flush=True)


def fault_mode(group, impl, exchange, fault):
    """Rank 1 misbehaves on the second merge; every other rank must raise."""
    rank = group.rank
    logits = torch.randn(2, 300, generator=torch.Generator().manual_seed(rank)).bfloat16()
    ends = torch.full((2,), 300, dtype=torch.int32)
    ws = nt.init_dcp_topk_merge(group, max_rows=2, topk=32, max_local_len=300, impl=impl,
                                exchange=exchange, timeout_s=2.0)
    ids = torch.empty(2, 32, dtype=torch.int32)
    nt.dcp_topk_merge(logits, ends, ids, workspace=ws)
    if rank == 1:
        if fault == "absent":
            time.sleep(8)
            print("rank 1 stayed away", flush=True)
            return
        if fault == "killed":  # dies between its pack and its exchange
            nt.dcp_topk_pack(logits, ends, local_topk=ws.local_topk, max_local_len=300, impl=impl)
            os._exit(9)
        if fault == "bad_input":
            try:
                nt.dcp_topk_merge(logits, ends.float(), ids, workspace=ws)
            except TypeError as err:
                print(f"rank 1 refused: {err}", flush=True)
            return
    start = time.monotonic()
    try:
        nt.dcp_topk_merge(logits, ends, ids, workspace=ws)
    except nt.DcpTopkTimeoutError as err:
        print(f"rank {rank} raised after {time.monotonic() - start:.1f} s: {err}", flush=True)
        return
    raise SystemExit(f"rank {rank}: the merge returned although rank 1 {fault}")


def mismatch_mode(group, impl, exchange):
    """Rank 1 asks for another K, rank 2 for another interleave: every rank's
    build raises one ValueError naming both, with every rank's value."""
    rank = group.rank
    try:
        nt.init_dcp_topk_merge(group, max_rows=2, topk=128 if rank == 1 else 64, max_local_len=300,
                               interleave=2 if rank == 2 else 1, impl=impl, exchange=exchange)
    except ValueError as err:
        print(f"rank {rank} refused: {err}", flush=True)
        return
    raise SystemExit(f"rank {rank}: the workspace was built")


def main() -> None:
    mode, impl, exchange = sys.argv[1:4]
    group = nt.ShmGroup.from_env(timeout_s=60)
    modes = {"families": families_mode, "serving": serving_mode, "compiled": compiled_mode, "tp_dcp": tp_dcp_mode,
             "mismatch": mismatch_mode}
    if mode in modes:
        modes[mode](group, impl, exchange)
    else:
        fault_mode(group, impl, exchange, mode)
    # The outcome is reported. Interpreter shutdown can abort in a C++ thread
    # still joinable (gloo with a peer gone, torch.compile's workers); that is
    # not what these tests check, so leave without it.
    sys.stdout.flush()
    os._exit(0)


if __name__ == "__main__":
    main()

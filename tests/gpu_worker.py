"""One rank of the NVSHMEM tests on GPUs, one process per GPU: started by
launch.run_ranks (torchrun's environment; results are gathered over
torch.distributed and checked against the oracle) or by a PMI launcher
(BOOTSTRAP pmi or mpi: no torch.distributed; each rank checks its own
results, which makes every rank equal to the oracle). Every rank builds the
same global data from one seed and keeps its shard.

    python gpu_worker.py MODE EXCHANGE [DEVICE_LIBRARY [BOOTSTRAP]]"""

from __future__ import annotations

import os
import sys
import time

import torch
import torch.distributed as dist

import nvshmem_topk as nt
from nvshmem_topk import format as fmt
from nvshmem_topk.groups.nvshmem import NvshmemGroup, finalize_nvshmem, launcher_local_rank
from nvshmem_topk.testing import families
from batch_graphs import SIZES, replay_per_batch_size
from oracle import assert_exact, oracle_topk


# Bound of every wait in these tests but the timeout test: a rank's first
# merges compile their kernels (those linked with NVSHMEM's device library
# take seconds each), so the ranks can be that far apart without a fault.
WAIT_S = 60.0


def gathered(ids):
    """[W, ...] of every rank's ``ids`` (only this rank's without torch.distributed)."""
    if not dist.is_initialized():
        return ids.cpu()[None]
    parts = [torch.empty_like(ids) for _ in range(dist.get_world_size())]
    dist.all_gather(parts, ids)
    return torch.stack(parts).cpu()


def families_mode(group, exchange):
    world, rank, dev = group.world_size, group.rank, group.device
    checked, failures = 0, []
    for name, logits, ends, k, n, inter in families(world, seed=11, rows=4, width=3000, topk=256):
        ws = nt.init_dcp_topk_merge(group, max_rows=4, topk=k, local_topk=n, max_local_len=3000,
                                    interleave=inter, exchange=exchange, timeout_s=WAIT_S)
        want = oracle_topk(logits, ends, k, inter)
        for merge in range(2):  # epochs advance, parities alternate
            ids = torch.empty(4, k, dtype=torch.int32, device=dev)
            nt.dcp_topk_merge(logits[rank].to(dev), ends[rank].to(dev), ids, workspace=ws)
            got = gathered(ids)  # waits for the merge
            ws.check()  # an expired wait leaves ids unwritten: say so, not "differs"
            try:
                assert_exact(got, want)
                checked += 1
            except AssertionError as err:  # every family still runs: the report names each that failed
                failures.append(f"{name} merge {merge}: {err}")
        ws.destroy()
    for failure in failures:
        print(f"rank {rank} FAILED {failure}", flush=True)
    print(f"rank {rank} ok {checked}", flush=True)


def graph_mode(group, exchange, replays=1000):
    """Capture one merge, then replay it with new inputs each time (one rank
    saturated on odd replays), every result exact."""
    world, rank, dev = group.world_size, group.rank, group.device
    rows, width, k = 8, 4096, 256
    ws = nt.init_dcp_topk_merge(group, max_rows=rows, topk=k, max_local_len=width, exchange=exchange,
                                timeout_s=WAIT_S)
    x = torch.zeros(rows, width, dtype=torch.bfloat16, device=dev)
    ends = torch.full((rows,), width, dtype=torch.int32, device=dev)
    ids = torch.empty(rows, k, dtype=torch.int32, device=dev)
    nt.dcp_topk_merge(x, ends, ids, workspace=ws)  # compiles every kernel before capture
    torch.cuda.synchronize()
    ws.check()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        nt.dcp_topk_merge(x, ends, ids, workspace=ws)
    gen = torch.Generator().manual_seed(3)  # the same on every rank
    for i in range(replays):
        logits = torch.randn(world, rows, width, generator=gen).bfloat16()
        row_ends = torch.randint(width // 2, width + 1, (world, rows), generator=gen, dtype=torch.int32)
        if i % 2:
            logits[i % world, : rows // 2] += 4.0
        x.copy_(logits[rank])
        ends.copy_(row_ends[rank])
        graph.replay()
        assert_exact(gathered(ids), oracle_topk(logits, row_ends, k), context=f"replay {i}")
    ws.check()
    print(f"rank {rank} replays ok {replays}", flush=True)
    ws.destroy()


def batch_graphs_mode(group, exchange):
    """Graphs per batch size on two micro-batches (``batch_graphs``)."""
    indexer = nt.DcpTopkIndexer(group, max_rows=max(SIZES), topk=256, max_local_len=4096, micro_batches=2,
                                exchange=exchange, timeout_s=WAIT_S)
    indexer.warmup(rows=False)
    steps = replay_per_batch_size(indexer, gathered, width=4096)
    print(f"rank {group.rank} batch graphs ok {steps}", flush=True)
    indexer.destroy()


def soak_mode(group, exchange, merges=10000):
    """Many small merges with random saturation; every 50th checked; the
    epochs agree on every rank at the end."""
    world, rank, dev = group.world_size, group.rank, group.device
    rows, width, k = 4, 1024, 128
    ws = nt.init_dcp_topk_merge(group, max_rows=rows, topk=k, max_local_len=width, exchange=exchange,
                                timeout_s=WAIT_S)
    gen = torch.Generator().manual_seed(9)
    base = torch.randn(world, rows, width, generator=gen).bfloat16()
    ids = torch.empty(rows, k, dtype=torch.int32, device=dev)
    ends = torch.full((world, rows), width, dtype=torch.int32)
    start = time.monotonic()
    for i in range(merges):
        logits = base.clone()
        hot = int(torch.randint(0, world + 1, (1,), generator=gen))
        if hot < world:
            logits[hot, int(torch.randint(0, rows, (1,), generator=gen))] += 3.0
        used = int(torch.randint(1, rows + 1, (1,), generator=gen))
        nt.dcp_topk_merge(logits[rank, :used].to(dev), ends[rank, :used].to(dev), ids[:used], workspace=ws)
        if i % 50 == 0:
            got = gathered(ids[:used])
            ws.check()
            assert_exact(got, oracle_topk(logits[:, :used], ends[:, :used], k), context=f"merge {i}")
    torch.cuda.synchronize()
    epochs = gathered(ws.epochs)
    assert all(torch.equal(e, epochs[0]) for e in epochs), epochs
    print(f"rank {rank} soak ok {merges} in {time.monotonic() - start:.1f} s, epochs {epochs[0].tolist()}",
          flush=True)
    ws.destroy()


def compiled_mode(group, exchange):
    world, rank, dev = group.world_size, group.rank, group.device
    logits = torch.randn(world, 3, 2000, generator=torch.Generator().manual_seed(2)).bfloat16()
    logits[0, 1] += 5.0
    ends = torch.full((world, 3), 2000, dtype=torch.int32)
    ws = nt.init_dcp_topk_merge(group, max_rows=3, topk=128, max_local_len=2000, exchange=exchange,
                                timeout_s=WAIT_S)

    @torch.compile(fullgraph=True)
    def step(x, e, ids):
        torch.ops.nvshmem_topk.merge(x * 0.5, e, ids, ws.handle, True)
        return ids

    for _ in range(2):
        ids = step(logits[rank].to(dev), ends[rank].to(dev), torch.empty(3, 128, dtype=torch.int32, device=dev))
        got = gathered(ids)
        ws.check()
        assert_exact(got, oracle_topk(logits.float() * 0.5, ends, 128), ordered=True)
    print(f"rank {rank} compiled ok", flush=True)
    ws.destroy()


def heap_mode(group, exchange, cycles=100):
    """Build a workspace that holds over a third of the NVSHMEM heap, merge
    once, destroy it; ``cycles`` times. Without destroy() returning the
    memory the third build would fail; the device's free memory after the
    last cycle is that after the first."""
    world, rank, dev = group.world_size, group.rank, group.device
    heap = int(os.environ["NVSHMEM_SYMMETRIC_SIZE"])
    k, width = 256, 4096
    words = fmt.packed_row_words(fmt.default_local_topk(k, world), fmt.num_planes(width))
    max_rows = heap // 3 // (2 * world * words * 4) + 1  # the gather buffer alone: a third of the heap
    logits = torch.randn(world, 2, width, generator=torch.Generator().manual_seed(5)).bfloat16()
    ends = torch.full((world, 2), width, dtype=torch.int32)
    want = oracle_topk(logits, ends, k)
    free = []
    for _ in range(cycles):
        ws = nt.init_dcp_topk_merge(group, max_rows=max_rows, topk=k, max_local_len=width, exchange=exchange,
                                    timeout_s=WAIT_S)
        ids = torch.empty(2, k, dtype=torch.int32, device=dev)
        nt.dcp_topk_merge(logits[rank].to(dev), ends[rank].to(dev), ids, workspace=ws)
        assert_exact(gathered(ids), want)
        ws.check()
        ws.destroy()
        torch.cuda.synchronize()
        torch.cuda.empty_cache()  # torch's cached blocks are not what is measured
        free.append(torch.cuda.mem_get_info()[0])
    grown = (free[0] - free[-1]) / 2**20
    assert grown < 64, f"device memory in use grew by {grown:.0f} MiB over {cycles} cycles"
    print(f"rank {rank} heap ok {cycles} cycles of {max_rows} rows, grew {grown:.1f} MiB", flush=True)


def timeout_mode(group, exchange):
    """Rank 1 skips the second merge; the others raise within the bound."""
    rank, dev = group.rank, group.device
    ws = nt.init_dcp_topk_merge(group, max_rows=2, topk=64, max_local_len=500, exchange=exchange, timeout_s=2.0)
    logits = torch.randn(2, 500, device=dev).bfloat16()
    ends = torch.full((2,), 500, dtype=torch.int32, device=dev)
    ids = torch.empty(2, 64, dtype=torch.int32, device=dev)
    nt.dcp_topk_merge(logits, ends, ids, workspace=ws)
    torch.cuda.synchronize()
    if rank == 1:
        print("rank 1 skipped a merge", flush=True)
        return
    start = time.monotonic()
    nt.dcp_topk_merge(logits, ends, ids, workspace=ws)
    torch.cuda.synchronize()
    try:
        ws.check()
    except nt.DcpTopkTimeoutError as err:
        print(f"rank {rank} raised after {time.monotonic() - start:.1f} s: {err}", flush=True)
        return
    raise SystemExit(f"rank {rank}: no timeout although rank 1 skipped the merge")


def main() -> None:
    mode, exchange = sys.argv[1:3]
    device_library = sys.argv[3] if len(sys.argv) > 3 else "auto"
    bootstrap = sys.argv[4] if len(sys.argv) > 4 else "torch"
    if bootstrap == "torch":
        torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))
        dist.init_process_group("cpu:gloo,cuda:nccl")
    else:
        torch.cuda.set_device(launcher_local_rank())
        nt.init_nvshmem(bootstrap)
    group = NvshmemGroup(device_library=device_library)
    modes = {"families": families_mode, "graph": graph_mode, "batch_graphs": batch_graphs_mode, "soak": soak_mode,
             "compiled": compiled_mode, "timeout": timeout_mode, "heap": heap_mode}
    modes[mode](group, exchange)
    if mode != "timeout":  # after a timeout the peers are out of step; leave without collectives
        group.destroy()
        finalize_nvshmem()
    sys.stdout.flush()
    os._exit(0)


if __name__ == "__main__":
    main()

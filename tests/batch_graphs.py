"""Graphs per batch size, as engines capture them: T = 1, 2, 4 ... 256 on
each micro-batch's workspace, replayed interleaved with new scores, ties and
row lengths every time. Shared by the simulated group's test on one GPU and
the NVSHMEM group's (one rank per GPU)."""

from __future__ import annotations

import torch

from oracle import assert_exact, oracle_topk

SIZES = tuple(1 << i for i in range(9))


def replay_per_batch_size(indexer, gather, *, width: int = 4096, steps: int = 60) -> int:
    """Captures a merge per (micro-batch, batch size) on ``indexer`` (warmed
    up, ids outputs), replays them ``steps`` times, each result checked
    against the oracle of the global scores; ``gather(ids)``: every rank's
    ids [W, T, K]. Returns the steps checked."""
    group, topk = indexer.group, indexer.topk
    world, rank, device = group.world_size, group.rank, group.device
    inputs, graphs = {}, {}
    for micro_batch in range(len(indexer.workspaces)):
        for rows in SIZES:
            x = torch.zeros(rows, width, dtype=torch.bfloat16, device=device)
            ends = torch.full((rows,), width, dtype=torch.int32, device=device)
            ids = torch.empty(rows, topk, dtype=torch.int32, device=device)
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph):
                indexer.dcp_topk_merge(x, ends, ids, micro_batch=micro_batch)
            inputs[micro_batch, rows], graphs[micro_batch, rows] = (x, ends, ids), graph
    gen = torch.Generator().manual_seed(1)  # the same on every rank
    for step in range(steps):
        micro_batch, rows = step % len(indexer.workspaces), SIZES[(step * 5) % len(SIZES)]
        x, ends, ids = inputs[micro_batch, rows]
        logits = torch.randn(world, rows, width, generator=gen).bfloat16()
        logits[step % world, : rows // 2, : step * 7] = 3.0  # ties at the top of some rows, on one rank
        lengths = torch.randint(0, width + 1, (world, rows), generator=gen, dtype=torch.int32)
        x.copy_(logits[rank])
        ends.copy_(lengths[rank])
        graphs[micro_batch, rows].replay()
        got = gather(ids)
        for ws in indexer.workspaces:
            ws.check()  # an expired wait leaves ids unwritten: say so, not "differs"
        assert_exact(got, oracle_topk(logits, lengths, topk),
                     context=f"step {step}, micro-batch {micro_batch}, {rows} rows")
    return steps

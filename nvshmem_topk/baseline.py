"""The generic merge every benchmark compares against: each rank's local
top-K as 8-byte (score, global id) pairs, then a top-K over the W*K pairs on
every rank. Bytes per row exchanged: W*K*8 (vs this library's
W*(N + P*N/32)*4)."""

from __future__ import annotations

import torch


def generic_merge_compute(logits: torch.Tensor, topk: int, *, rank_by_rank: bool = False) -> torch.Tensor:
    """The compute of the generic merge for all W ranks of ``logits``
    [W, T, S] (interleave 1), the exchange left out: int64 [T, K] global ids
    (ties broken by torch.topk, not by global id). The local top-Ks run as
    one call over the W ranks' rows, or with ``rank_by_rank`` a call per
    rank, as W GPUs run them (and as a simulated group runs this library's
    pack); the second top-K always runs once per rank."""
    world, rows, _ = logits.shape
    if rank_by_rank:
        vals = logits.new_empty(world, rows, topk)
        idx = torch.empty(world, rows, topk, dtype=torch.int64, device=logits.device)
        for r in range(world):
            torch.topk(logits[r], topk, dim=1, out=(vals[r], idx[r]))
    else:
        vals, idx = logits.topk(topk, dim=2)
    gid = idx * world + torch.arange(world, device=logits.device)[:, None, None]
    pair_scores = vals.float().permute(1, 0, 2).reshape(rows, world * topk)
    pair_ids = gid.permute(1, 0, 2).reshape(rows, world * topk)
    for _ in range(world):  # every rank selects again
        best = pair_scores.topk(topk, dim=1).indices
    return pair_ids.gather(1, best)

"""The generic merge every benchmark compares against: each rank's local
top-K as 8-byte (score, global id) pairs, then a top-K over the W*K pairs on
every rank. Bytes per row exchanged: W*K*8 (vs this library's
W*(N + P*N/32)*4)."""

from __future__ import annotations

import torch


def generic_merge_compute(logits: torch.Tensor, topk: int) -> torch.Tensor:
    """The compute of the generic merge for all W ranks of ``logits``
    [W, T, S] (interleave 1), the exchange left out: int64 [T, K] global ids
    (ties broken by torch.topk, not by global id)."""
    world, rows, _ = logits.shape
    vals, idx = logits.topk(topk, dim=2)
    gid = idx * world + torch.arange(world, device=logits.device)[:, None, None]
    pair_scores = vals.float().permute(1, 0, 2).reshape(rows, world * topk)
    pair_ids = gid.permute(1, 0, 2).reshape(rows, world * topk)
    for _ in range(world):  # every rank selects again
        best = pair_scores.topk(topk, dim=1).indices
    return pair_ids.gather(1, best)

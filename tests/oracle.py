"""The test oracle: rebuild each global row and sort it. Independent of the
library's key/word code on purpose (floats, numpy lexsort)."""

from __future__ import annotations

import numpy as np
import torch


def global_id(local: np.ndarray, rank: int, world_size: int, interleave: int) -> np.ndarray:
    return (local // interleave) * (world_size * interleave) + rank * interleave + local % interleave


def oracle_topk(logits: torch.Tensor, row_ends: torch.Tensor, topk: int, interleave: int = 1, row_starts=None,
                score_dtype=None):
    """logits [W, T, S], row_ends (and row_starts) [W, T] -> per row the list
    of global ids of the top-K valid tokens, by score desc (-0 below +0),
    then global id asc: bf16 and fp16 scores as they are, fp32 rounded to
    bf16 unless ``score_dtype`` is torch.float32."""
    world_size, rows, width = logits.shape
    exact = logits.dtype in (torch.bfloat16, torch.float16) or score_dtype == torch.float32
    scores = (logits if exact else logits.to(torch.bfloat16)).float().numpy()
    out = []
    for t in range(rows):
        vals, gids = [], []
        for r in range(world_size):
            end = max(0, min(int(row_ends[r, t]), width))
            start = 0 if row_starts is None else min(max(0, int(row_starts[r, t])), end)
            x = scores[r, t, start:end]
            keep = ~np.isnan(x)
            vals.append(x[keep])
            gids.append(global_id(start + np.nonzero(keep)[0], r, world_size, interleave))
        x = np.concatenate(vals) if vals else np.zeros(0)
        g = np.concatenate(gids) if gids else np.zeros(0, dtype=np.int64)
        negzero = (x == 0) & np.signbit(x)
        order = np.lexsort((g, negzero, -x))
        out.append(g[order[:topk]].tolist())
    return out


def assert_exact(ids: torch.Tensor, expected, *, ordered: bool = False, context: str = "") -> None:
    """ids [W, T, K] (every rank) against the oracle's lists: same set per row
    (same list when ``ordered``), -1 padding after, and all ranks equal.
    ``context`` leads every failure's message (which case, which merge)."""
    try:
        _assert_exact(ids, expected, ordered)
    except AssertionError as err:
        raise AssertionError(f"{context}: {err}" if context else str(err)) from None


def _assert_exact(ids: torch.Tensor, expected, ordered: bool) -> None:
    world_size, rows, topk = ids.shape
    for r in range(world_size):
        differ = (ids[r] != ids[0]).any(dim=1).nonzero().flatten().tolist()
        assert not differ, f"rank {r} differs from rank 0 in rows {differ}"
    for t in range(rows):
        row = ids[0, t].tolist()
        n = len(expected[t])
        assert row[n:] == [-1] * (topk - n), f"row {t}: padding {row[n:]}"
        if ordered:
            assert row[:n] == expected[t], f"row {t}: order differs"
        else:
            got, want = set(row[:n]), set(expected[t])
            assert len(got) == n and got == want, (
                f"row {t}: missing {sorted(want - got)[:8]}, extra {sorted(got - want)[:8]}"
            )

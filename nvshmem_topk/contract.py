"""Host-side check of a caller's packed round-1 rows (for tests and
debugging; synchronises)."""

from __future__ import annotations

import torch

from . import format as fmt


def assert_packed_merge_contract(
    packed: torch.Tensor, logits: torch.Tensor, row_ends: torch.Tensor, *, local_topk: int,
    max_local_len: int, score_dtype: torch.dtype | None = None,
) -> None:
    """Raise ``AssertionError`` unless every row of ``packed`` [T, words]
    holds min(N, v) words (v = the row's valid tokens), of distinct local ids
    below min(row_ends, S, max_local_len), each word's score equal to its
    logit's (in the order ``score_dtype`` names, as the merge's), and no
    unsent valid token scoring above the lowest sent one. That is what
    ``dcp_topk_merge_rows(packed=...)`` relies on."""
    rows, width = logits.shape
    assert packed.dtype == torch.int32, f"packed must be int32, got {packed.dtype}"
    planes = fmt.num_planes(max_local_len)
    score_bits = fmt.score_bits_of(score_dtype)
    words = fmt.packed_row_words(local_topk, planes, score_bits)
    assert tuple(packed.shape) == (rows, words), f"packed must be [{rows}, {words}], got {tuple(packed.shape)}"
    order, local, present = fmt.unpack_rows(packed.cpu(), local_topk, planes, score_bits)
    score, valid_all = fmt.score_order(logits.cpu(), score_bits)
    for t in range(rows):
        end = max(0, min(int(row_ends[t]), width, max_local_len))
        valid = valid_all[t, :end]
        ids = local[t][present[t]]
        expected = min(local_topk, int(valid.sum()))
        assert ids.numel() == expected, f"row {t}: {ids.numel()} words, expected {expected}"
        if not ids.numel():
            continue
        assert int(ids.max()) < end, f"row {t}: local id {int(ids.max())} >= row end {end}"
        assert ids.unique().numel() == ids.numel(), f"row {t}: a local id is sent twice"
        assert bool(valid[ids].all()), f"row {t}: a NaN score was sent"
        sent = order[t][present[t]]
        assert torch.equal(sent, score[t, ids]), f"row {t}: a word's score is not its logit"
        unsent = valid.clone()
        unsent[ids] = False
        if bool(unsent.any()):
            best_unsent = int(score[t, :end][unsent].max())
            assert best_unsent <= int(sent.min()), f"row {t}: not a top-{local_topk} by score"

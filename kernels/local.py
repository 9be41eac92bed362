"""The merge of a one-rank group: each row's top-K straight to the outputs,
one program a row (rows of at most ``pack.SHORT_ROWS`` tokens, 16-bit
scores). With one rank the exchange is the identity and round 1 alone is
exact whatever N, so the pack, the select and the rescue reduce to the
pack's kernel at n = K, emitting as the select does: the same ids, in
candidate order (ascending local id, which is the global id), the same
owned rows and, sorted, the same keys for ``select.order_kernel``. One
launch (two sorted) where the three stages took three."""

import triton
import triton.language as tl

from . import pack
from .keys import store_keys, write_outputs
from .launch import Launch
from .pack import ROW_WARPS, align_down, row_lines, row_scores, short_row
from .rows import kept_of_row, row_threshold, row_window, token_ord16
from .select import OUTPUT_SIZES, output_args, rescue_keys
from .sync import after_prior_kernel


@triton.jit(do_not_specialize=OUTPUT_SIZES + ["width_limit"])
def local_merge_kernel(outputs, table_stride, num_reqs, num_blocks, block_size, stride_rows, rows_stride, width_limit,
                       rows, selected_ptr, TOPK: tl.constexpr, ROW: tl.constexpr, ALIGN_DOWN: tl.constexpr,
                       GID_BITS: tl.constexpr, EMIT_IDS: tl.constexpr, EMIT_ROWS: tl.constexpr, SORTED: tl.constexpr,
                       PDL: tl.constexpr):
    """``outputs`` and the sizes after it: as ``select.output_args`` builds
    them; ``rows``: (logits_ptr, row_starts_ptr, row_ends_ptr,
    logits_stride); ``selected_ptr``: the sorted form's keys, [T,
    rescue_keys(TOPK)] int64, as the select leaves them; ALIGN_DOWN: as
    ``pack.row_scores`` takes it."""
    after_prior_kernel(PDL)
    sizes = (table_stride, num_reqs, num_blocks, block_size, stride_rows, rows_stride)
    logits_ptr, row_starts_ptr, row_ends_ptr, logits_stride = rows
    row = tl.program_id(0).to(tl.int64)
    x, lead = row_scores(logits_ptr + row * logits_stride, width_limit, ROW, ALIGN_DOWN, 16)  # before the window
    start, end = row_window(row_starts_ptr, row_ends_ptr, row, width_limit)
    local = row_lines(ROW, 16)[0] - lead  # the tokens' ids
    score = tl.where((local >= start) & (local < end), token_ord16(x), 0)
    threshold, above = row_threshold(score, TOPK, 0)
    slot, keep, kept = kept_of_row(score, threshold, above, TOPK)
    if SORTED:
        keys = (score.to(tl.int64) << GID_BITS) | ((1 << GID_BITS) - 1 - local)  # format.key, the gid being local
        store_keys(selected_ptr + row * rescue_keys(TOPK), keys, keep, slot, kept, TOPK)
    else:
        write_outputs(local, keep, slot, kept, row, outputs, sizes, 0, TOPK, 1, 1, EMIT_IDS, EMIT_ROWS)


def merges_locally(world_size: int, score_bits: int, width: int, max_local_len: int) -> bool:
    """Whether a merge of calls ``width`` tokens wide is one ``local_merge_kernel``."""
    return world_size == 1 and score_bits == 16 and min(width, max_local_len) <= pack.SHORT_ROWS


def local_merge_launch(*, logits, row_starts, row_ends, ids, rows, sorted, selected, topk, max_local_len, gid_bits,
                       pdl) -> Launch:
    """The merge of a one-rank group's ``logits`` [T, S] (bf16, fp16 or fp32
    rounded to bf16), its rows' windows, into ``ids`` and/or ``rows`` (as
    the select takes them), or, ``sorted``, their keys into ``selected``."""
    return Launch(local_merge_kernel, (logits.shape[0],),
                  (*output_args(ids, rows, row_ends), min(logits.shape[1], max_local_len),
                   (logits, row_starts, row_ends, logits.stride(0)), selected),
                  dict(TOPK=topk, ROW=short_row(max_local_len), ALIGN_DOWN=align_down(logits, max_local_len),
                       GID_BITS=gid_bits,
                       EMIT_IDS=ids is not None and not sorted, EMIT_ROWS=rows is not None and not sorted,
                       SORTED=sorted, PDL=pdl), ROW_WARPS)

"""Push all-gather of round-1 rows: every rank stores its packed rows into
every peer's gather buffer (this epoch's parity, its own sender slot), then
releases the peer's flag for each row."""

import triton
import triton.language as tl

from .sync import release_flag


@triton.jit
def push_rows_kernel(packed_ptr, epochs_ptr, gather_ptrs, flag_ptrs, max_rows, rank,
                     WORDS: tl.constexpr, WORLD: tl.constexpr, BLOCK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    epoch = tl.load(epochs_ptr + row) + 1
    dest = (((epoch & 1) * WORLD + rank) * max_rows + row) * WORDS
    for start in tl.range(0, WORDS, BLOCK):
        offs = start + tl.arange(0, BLOCK)
        words = tl.load(packed_ptr + row * WORDS + offs, mask=offs < WORDS)
        for q in tl.static_range(WORLD):
            peer = tl.load(gather_ptrs + q).to(tl.pointer_type(tl.int32))
            tl.store(peer + dest + offs, words, mask=offs < WORDS)
    for q in tl.static_range(WORLD):
        peer_flags = tl.load(flag_ptrs + q).to(tl.pointer_type(tl.int32))
        release_flag(peer_flags + rank * max_rows + row, epoch)


def push_rows(packed, epochs, gather_ptrs, flag_ptrs, *, max_rows: int, rank: int, world_size: int) -> None:
    """packed: int32 [T, words]; epochs: int32 [>= T] (this call is epoch+1);
    gather_ptrs / flag_ptrs: int64 [W] peer addresses of the symmetric
    gather buffers [2, W, max_rows, words] and flags [2, W, max_rows]."""
    rows, words = packed.shape
    if rows == 0:
        return
    push_rows_kernel[(rows,)](packed, epochs, gather_ptrs, flag_ptrs, max_rows, rank,
                              WORDS=words, WORLD=world_size, BLOCK=512, num_warps=4)

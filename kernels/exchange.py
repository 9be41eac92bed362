"""Push all-gather of round-1 rows: every rank stores its packed rows into
every peer's gather buffer (this epoch's parity, its own sender slot), then
releases the peer's flag for each row. Peers in LIBRARY_PEERS (no load/store
address) get the row by an NVSHMEM put and the flag by an NVSHMEM atomic
after a fence; the others through the peer address table. When every peer
has an address, the pack's finish pushes its rows itself with the same two
helpers (``store_to_peers``, ``release_peers``) and this kernel is not run."""

import triton
import triton.language as tl

from . import nvshmem_device
from .sync import release_flag


@triton.jit
def gather_slot(row, epoch, max_rows, sender, WORDS: tl.constexpr, WORLD: tl.constexpr):
    """Word offset of ``sender``'s round-1 ``row`` in a gather buffer
    [2, W, max_rows, WORDS] (this epoch's parity)."""
    return (((epoch & 1) * WORLD + sender) * max_rows + row) * WORDS


@triton.jit
def store_to_peers(row_ptr, row, epoch, gather_ptrs, max_rows, rank, WORDS: tl.constexpr, WORLD: tl.constexpr,
                   LIBRARY_PEERS: tl.constexpr, BLOCK: tl.constexpr):
    """This rank's packed row ``row_ptr`` (WORDS int32, read from L2: the
    pack may have written it in this kernel) into its sender slot of every
    address peer's gather buffer, this epoch's parity."""
    dest = gather_slot(row, epoch, max_rows, rank, WORDS, WORLD)
    for start in tl.range(0, WORDS, BLOCK):
        offs = start + tl.arange(0, BLOCK)
        words = tl.load(row_ptr + offs, mask=offs < WORDS, cache_modifier=".cg")
        for q in tl.static_range(WORLD):
            if ((LIBRARY_PEERS >> q) & 1) == 0:
                peer = tl.load(gather_ptrs + q).to(tl.pointer_type(tl.int32))
                tl.store(peer + dest + offs, words, mask=offs < WORDS)


@triton.jit
def release_peers(row, epoch, flag_ptrs, max_rows, rank, WORLD: tl.constexpr, LIBRARY_PEERS: tl.constexpr):
    """Raise this rank's round-1 flag of ``row`` on every address peer."""
    for q in tl.static_range(WORLD):
        if ((LIBRARY_PEERS >> q) & 1) == 0:
            peer_flags = tl.load(flag_ptrs + q).to(tl.pointer_type(tl.int32))
            release_flag(peer_flags + rank * max_rows + row, epoch)


@triton.jit
def push_rows_kernel(packed_ptr, epochs_ptr, gather_ptrs, flag_ptrs, pes_ptr, max_rows, rank,
                     WORDS: tl.constexpr, WORLD: tl.constexpr, LIBRARY_PEERS: tl.constexpr, BLOCK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    epoch = tl.load(epochs_ptr + row) + 1
    store_to_peers(packed_ptr + row * WORDS, row, epoch, gather_ptrs, max_rows, rank, WORDS, WORLD, LIBRARY_PEERS,
                   BLOCK)
    if LIBRARY_PEERS != 0:  # compile-time: the address-only kernel links nothing
        dest = gather_slot(row, epoch, max_rows, rank, WORDS, WORLD)
        nvshmem_device.put_then_flag(tl.load(gather_ptrs + rank) + dest * 4, (packed_ptr + row * WORDS).to(tl.int64),
                                     tl.full((), WORDS * 4, tl.int64),
                                     tl.load(flag_ptrs + rank) + (rank * max_rows + row) * 4, epoch, pes_ptr,
                                     WORLD, LIBRARY_PEERS)
    release_peers(row, epoch, flag_ptrs, max_rows, rank, WORLD, LIBRARY_PEERS)


def push_rows(packed, epochs, gather_ptrs, flag_ptrs, pes, *, max_rows: int, rank: int, world_size: int,
              library_peers: int) -> None:
    """packed: int32 [T, words]; epochs: int32 [>= T] (this call is epoch+1);
    gather_ptrs / flag_ptrs: int64 [W] peer addresses of the symmetric
    gather buffers [2, W, max_rows, words] and flags [2, W, max_rows]
    (entry ``rank`` is this rank's own); pes: int32 [W], the NVSHMEM PE of
    each rank; library_peers: bitmask of the ranks reached through NVSHMEM's
    device library (their address entries are not used)."""
    rows, words = packed.shape
    if rows == 0:
        return
    options = nvshmem_device.launch_options() if library_peers else {}
    push_rows_kernel[(rows,)](packed, epochs, gather_ptrs, flag_ptrs, pes, max_rows, rank,
                              WORDS=words, WORLD=world_size, LIBRARY_PEERS=library_peers, BLOCK=512, num_warps=4,
                              **options)

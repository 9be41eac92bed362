"""Push all-gather of round-1 rows: every rank stores its packed rows into
every peer's gather buffer (this epoch's parity, its own sender slot), then
releases the peer's flag for each row. Peers in LIBRARY_PEERS (no load/store
address) get the row by an NVSHMEM put and the flag by an NVSHMEM atomic
after a fence; the others through the peer address table. When every peer
has an address, the pack's finish pushes its rows itself (``push_row``) and
this kernel is not run; the select's saturated push uses the same two
helpers (``store_to_peers``, ``peer_flags`` and ``release_peers``)."""

import triton
import triton.language as tl

from . import nvshmem_device
from .keys import MAX_PEERS
from .launch import Launch
from .sync import after_prior_kernel, release_flags


@triton.jit
def call_epoch(epochs_ptr, row):
    """The epoch this call merges ``row`` at: one past its last finished
    one (``epochs_ptr``), the rule of ``nvshmem_topk/protocol.py``."""
    return tl.load(epochs_ptr + row) + 1


@triton.jit
def gather_slot(row, epoch, max_rows, sender, WORDS: tl.constexpr, WORLD: tl.constexpr):
    """Word offset of ``sender``'s round-1 ``row`` in a gather buffer
    [2, W, max_rows, WORDS] (this epoch's parity)."""
    return (((epoch & 1) * WORLD + sender) * max_rows + row) * WORDS


@triton.jit
def store_to_peers(src, peer_ptrs, dest, skip, WORDS: tl.constexpr, WORLD: tl.constexpr,
                   LIBRARY_PEERS: tl.constexpr, BLOCK: tl.constexpr):
    """WORDS int32 from ``src`` (read from L2: this kernel may have just
    written them) to word ``dest`` of every address peer's buffer
    (``peer_ptrs``), but rank ``skip`` (-1: none)."""
    for start in tl.range(0, WORDS, BLOCK):
        offs = start + tl.arange(0, BLOCK)
        words = tl.load(src + offs, mask=offs < WORDS, cache_modifier=".cg")
        for q in tl.static_range(WORLD):
            if (((LIBRARY_PEERS >> q) & 1) == 0) & (q != skip):
                peer = tl.load(peer_ptrs + q).to(tl.pointer_type(tl.int32))
                tl.store(peer + dest + offs, words, mask=offs < WORDS)



@triton.jit
def peer_flags(flag_ptrs, WORLD: tl.constexpr, LIBRARY_PEERS: tl.constexpr):
    """(addresses, mask): the flag buffers of the address peers. Loaded
    before a row is finished, so that its release does not wait for them."""
    q = tl.arange(0, MAX_PEERS)
    by_address = (q < WORLD) & (((LIBRARY_PEERS >> q) & 1) == 0)
    return tl.load(flag_ptrs + q, mask=by_address, other=0).to(tl.pointer_type(tl.int32)), by_address


@triton.jit
def release_peers(flags, flag, epoch):
    """Raise flag word ``flag`` to ``epoch`` on every address peer
    (``flags``: as ``peer_flags`` gives them)."""
    addresses, by_address = flags
    release_flags(addresses + flag, epoch, by_address)


@triton.jit
def push_row(row_ptr, row, epoch, gather_ptrs, flags, max_rows, rank, WORDS: tl.constexpr, WORLD: tl.constexpr,
             BLOCK: tl.constexpr):
    """This rank's round-1 ``row`` (``row_ptr``) into its sender slot of
    every peer's gather buffer, then its flag raised there (all peers
    reached by address; ``flags`` as ``peer_flags`` gives them)."""
    store_to_peers(row_ptr, gather_ptrs, gather_slot(row, epoch, max_rows, rank, WORDS, WORLD), -1, WORDS, WORLD, 0,
                   BLOCK)
    release_peers(flags, rank * max_rows + row, epoch)


@triton.jit
def push_list(row_ptr, offset, row, rank, epoch, recv_ptrs, flag_ptrs, flags, pes_ptr, max_rows,
              WORDS: tl.constexpr, WORLD: tl.constexpr, LIBRARY_PEERS: tl.constexpr, BLOCK: tl.constexpr):
    """A saturated rank's pushed list of ``row`` (``row_ptr``, word
    ``offset`` of its own receive buffer) into the same slot of every
    peer's, then its rescue flag of the row raised there (``flags``: the
    address peers', as ``peer_flags`` gives them)."""
    store_to_peers(row_ptr, recv_ptrs, offset, rank, WORDS, WORLD, LIBRARY_PEERS, BLOCK)
    flag = (WORLD + rank) * max_rows + row
    if LIBRARY_PEERS != 0:  # the same slot of the symmetric receive buffer on those PEs
        nvshmem_device.put_then_flag(row_ptr.to(tl.int64), row_ptr.to(tl.int64), tl.full((), WORDS * 4, tl.int64),
                                     tl.load(flag_ptrs + rank) + flag * 4, epoch, pes_ptr, WORLD, LIBRARY_PEERS)
    release_peers(flags, flag, epoch)


@triton.jit
def push_rows_kernel(packed_ptr, epochs_ptr, gather_ptrs, flag_ptrs, pes_ptr, max_rows, rank,
                     WORDS: tl.constexpr, WORLD: tl.constexpr, LIBRARY_PEERS: tl.constexpr, BLOCK: tl.constexpr,
                     PDL: tl.constexpr):
    after_prior_kernel(PDL)
    row = tl.program_id(0).to(tl.int64)
    epoch = call_epoch(epochs_ptr, row)
    flags = peer_flags(flag_ptrs, WORLD, LIBRARY_PEERS)
    dest = gather_slot(row, epoch, max_rows, rank, WORDS, WORLD)
    store_to_peers(packed_ptr + row * WORDS, gather_ptrs, dest, -1, WORDS, WORLD, LIBRARY_PEERS, BLOCK)
    if LIBRARY_PEERS != 0:  # compile-time: the address-only kernel links nothing
        nvshmem_device.put_then_flag(tl.load(gather_ptrs + rank) + dest * 4, (packed_ptr + row * WORDS).to(tl.int64),
                                     tl.full((), WORDS * 4, tl.int64),
                                     tl.load(flag_ptrs + rank) + (rank * max_rows + row) * 4, epoch, pes_ptr,
                                     WORLD, LIBRARY_PEERS)
    release_peers(flags, rank * max_rows + row, epoch)


def push_rows_launch(packed, epochs, gather_ptrs, flag_ptrs, pes, *, max_rows: int, rank: int, world_size: int,
                     library_peers: int, pdl: bool) -> Launch:
    """packed: int32 [T, words]; epochs: int32 [>= T] (this call is epoch+1);
    gather_ptrs / flag_ptrs: int64 [W] peer addresses of the symmetric
    gather buffers [2, W, max_rows, words] and flags [2, W, max_rows]
    (entry ``rank`` is this rank's own); pes: int32 [W], the NVSHMEM PE of
    each rank; library_peers: bitmask of the ranks reached through NVSHMEM's
    device library (their address entries are not used)."""
    rows, words = packed.shape
    return Launch(push_rows_kernel, (rows,), (packed, epochs, gather_ptrs, flag_ptrs, pes, max_rows, rank),
                  dict(WORDS=words, WORLD=world_size, LIBRARY_PEERS=library_peers, BLOCK=512,
                       PDL=pdl), 4)


def push_rows(packed, *args, **kw) -> None:
    if packed.shape[0]:
        push_rows_launch(packed, *args, **kw)()

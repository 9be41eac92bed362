"""Cross-rank synchronisation primitives, the only place they are written.

Release: every thread's payload stores, a CTA barrier, then one system-scope
release exchange of the flag (the release orders the barrier-ordered stores
of the whole block before the flag). Acquire: a system-scope acquire read of
the flag before any payload read. Waits are bounded by a spin count; the
caller turns a miss into a status record, never a hang. Flags are polled with
scalar atomics, which Triton lowers to one thread's atomic (predicated on
thread 0) with the result broadcast through shared memory: one thread polls,
not the whole block."""

import triton
import triton.language as tl


@triton.jit
def release_flag(flag_ptr, value):
    tl.debug_barrier()
    tl.atomic_xchg(flag_ptr, value, sem="release", scope="sys")


@triton.jit
def acquire_flag(flag_ptr):
    return tl.atomic_add(flag_ptr, 0, sem="acquire", scope="sys")


@triton.jit
def wait_flag_at_least(flag_ptr, epoch, max_spins):
    """Poll until flag >= epoch (a peer may already be one epoch ahead, so
    never ==). Returns True on success, False after ``max_spins`` polls."""
    value = acquire_flag(flag_ptr)
    spins = 0
    while (value < epoch) & (spins < max_spins):
        value = acquire_flag(flag_ptr)
        spins += 1
    return value >= epoch


@triton.jit
def record_timeout(status_ptr, row, rank, epoch):
    """(failed, row, rank, epoch) of the first wait that expired."""
    if tl.atomic_cas(status_ptr, 0, 1, sem="relaxed", scope="sys") == 0:
        tl.store(status_ptr + 1, row)
        tl.store(status_ptr + 2, rank)
        tl.store(status_ptr + 3, epoch)

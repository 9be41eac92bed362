"""Cross-rank synchronisation primitives, the only place they are written.

Release: every thread's payload stores, a CTA barrier, then a system-scope
release exchange of each flag (the release orders the barrier-ordered stores
of the whole block before the flag), each flag by its own thread, all at
once: a release waits until the block's stores are visible system-wide, and
one thread releasing W peers' flags in turn would wait W times. Acquire:
system-scope acquire reads of the flags before any payload read; the
reduction over what they saw crosses a CTA barrier before the payload is
read. Waits are bounded by a spin count; the caller turns a miss into a
status record, never a hang, and a wait stops early once that record
exists. Each flag is polled by the one thread that holds it (Triton masks a
tensor atomic's replicated lanes), all of a row's flags at once: one memory
round trip per poll, not one per peer.

Kernel order: on a GPU every kernel is launched as a programmatic dependent
of the one before it on the stream (PDL, the ``pdl`` argument of every
launcher: a workspace's setting, on by default on GPUs; the interpreter has
none), so that its launch overlaps that kernel's run. Its first step (``after_prior_kernel``) waits until the prior
kernel has finished and its writes are visible, and only then lets the next
kernel launch: a kernel released before its own wait would let the whole
chain launch at once, every CTA holding its registers while it waits. So
when a kernel starts, every kernel before its prior has finished: what they
wrote (the caller's logits, for the pack's filter) may be read before the
wait.
"""

import triton
import triton.language as tl
from triton.language.extra.cuda import gdc_launch_dependents, gdc_wait


@triton.jit
def after_prior_kernel(PDL: tl.constexpr):
    """Every kernel's first step: wait for the prior kernel, then let the
    next one launch (with PDL; without it the stream already orders them)."""
    if PDL:
        gdc_wait()
        gdc_launch_dependents()


@triton.jit
def release_flags(flag_ptrs, value, mask):
    """Raise the flags ``flag_ptrs`` (a 1-D tensor of pointers; ``mask``
    says which) to ``value``, after the block's stores."""
    tl.debug_barrier()
    tl.atomic_xchg(flag_ptrs, value, mask=mask, sem="release", scope="sys")


@triton.jit
def last_to_arrive(counter_ptr, arrivals):
    """Whether this program is the last of ``arrivals`` programs (each
    calling once, after its stores) to arrive at ``counter_ptr``: the one
    that then sees every other's stores, and that resets the counter for the
    next kernel. Nothing waits: the others carry on."""
    tl.debug_barrier()  # the block's stores are ordered before its arrival
    last = tl.atomic_add(counter_ptr, 1, sem="acq_rel", scope="gpu") == arrivals - 1
    if last:
        tl.store(counter_ptr, 0)
    return last


EXPIRED_CHECK_SPINS = tl.constexpr(32)


@triton.jit
def wait_flags_at_least(flag_ptrs, needed, epoch, max_spins, status_ptr):
    """Poll the flags ``flag_ptrs`` (a 1-D tensor of pointers; ``needed``
    says which count) until each is >= epoch (a peer may already be one epoch
    ahead, so never ==). Each flag is read by one thread's system-scope
    acquire, all of them at once; flags already seen are not read again.
    Returns which flags were seen, after at most ``max_spins`` rounds, or
    sooner once the status word says a wait has expired: the merge fails
    then anyway, and rows that wait one after another (the interpreter's
    programs, a second wave of CTAs, the rescue after the select) would
    otherwise add their bounds up. The status is read every
    EXPIRED_CHECK_SPINS rounds, never on the way through."""
    value = tl.atomic_add(flag_ptrs, 0, mask=needed, sem="acquire", scope="sys")
    seen = ~needed | (value >= epoch)
    spins = 0
    while (tl.min(seen.to(tl.int32), axis=0) == 0) & (spins < max_spins):
        value = tl.atomic_add(flag_ptrs, 0, mask=~seen, sem="acquire", scope="sys")
        seen = seen | (value >= epoch)
        spins += 1
        if spins % EXPIRED_CHECK_SPINS == 0:
            spins = tl.where(tl.load(status_ptr, volatile=True) != 0, max_spins, spins)
    return seen


@triton.jit
def record_timeout(status_ptr, row, rank, epoch):
    """(failed, row, rank, epoch) of the first wait that expired."""
    if tl.atomic_cas(status_ptr, 0, 1, sem="relaxed", scope="sys") == 0:
        tl.store(status_ptr + 1, row)
        tl.store(status_ptr + 2, rank)
        tl.store(status_ptr + 3, epoch)

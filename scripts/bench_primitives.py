"""The latency of Triton's block-wide steps in one program, the unit that
the latency-bound kernels (the estimate, the finish's select) are built
from: each kernel chains REPS of one step, each step's input depending on
the last one's result, in programs of W warps over ROOM int32 values; a
step costs (time at REPS - time at 0) / REPS. Timed as CUDA-graph replays
of 20 launches (nvshmem_topk.timing.median_us), 8 programs (one an SM).

    python scripts/bench_primitives.py

Steps: sum, max and cumsum of a 1-D tensor; tl.histogram of 16 to 256
bins; three sums in one tl.reduce of a tuple, and three counts as fields
of one int64 sum; tl.gather from 32 values; a dependent global load; a meet of the
programs (each adds itself to a counter, then polls it until all have:
the step between the passes of a row split over programs)."""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from nvshmem_topk.timing import graphed, median_us

REPS = 16
PROGRAMS = 8
MAX_SPINS = tl.constexpr(1 << 20)  # a meet's bound: far more polls than any meet of resident programs takes


@triton.jit
def _values(x_ptr, ROOM: tl.constexpr):
    """The program's ROOM values, and a zero to chain the steps through."""
    return tl.load(x_ptr + tl.program_id(0).to(tl.int64) * ROOM + tl.arange(0, ROOM)), tl.zeros((), tl.int32)


@triton.jit
def sum_kernel(out_ptr, x_ptr, REPS: tl.constexpr, ROOM: tl.constexpr):
    x, acc = _values(x_ptr, ROOM)
    for _ in tl.static_range(REPS):
        acc += tl.sum((x >= acc).to(tl.int32), axis=0)
    tl.store(out_ptr + tl.program_id(0), acc)


@triton.jit
def max_kernel(out_ptr, x_ptr, REPS: tl.constexpr, ROOM: tl.constexpr):
    x, acc = _values(x_ptr, ROOM)
    for _ in tl.static_range(REPS):
        acc += tl.max(x ^ acc, axis=0) & 1
    tl.store(out_ptr + tl.program_id(0), acc)


@triton.jit
def cumsum_kernel(out_ptr, x_ptr, REPS: tl.constexpr, ROOM: tl.constexpr):
    x, acc = _values(x_ptr, ROOM)
    for _ in tl.static_range(REPS):
        running = tl.cumsum((x >= acc).to(tl.int32), axis=0)
        acc += tl.sum(tl.where(tl.arange(0, ROOM) == ROOM - 1, running, 0), axis=0) & 1
    tl.store(out_ptr + tl.program_id(0), acc)


@triton.jit
def histogram_kernel(out_ptr, x_ptr, REPS: tl.constexpr, ROOM: tl.constexpr, BINS: tl.constexpr):
    x, acc = _values(x_ptr, ROOM)
    for _ in tl.static_range(REPS):
        hist = tl.histogram((x + acc) & (BINS - 1), BINS)
        acc += tl.sum(tl.where(tl.arange(0, BINS) == 3, hist, 0), axis=0) & 1
    tl.store(out_ptr + tl.program_id(0), acc)


@triton.jit
def _add3(a0, a1, a2, b0, b1, b2):
    return a0 + b0, a1 + b1, a2 + b2


@triton.jit
def tuple_sum_kernel(out_ptr, x_ptr, REPS: tl.constexpr, ROOM: tl.constexpr):
    x, acc = _values(x_ptr, ROOM)
    for _ in tl.static_range(REPS):
        a, b, c = tl.reduce(((x >= acc).to(tl.int32), (x >= acc + 1).to(tl.int32), (x >= acc + 2).to(tl.int32)),
                            0, _add3)
        acc += (a + b + c) & 1
    tl.store(out_ptr + tl.program_id(0), acc)


@triton.jit
def field_sum_kernel(out_ptr, x_ptr, REPS: tl.constexpr, ROOM: tl.constexpr):
    x, acc = _values(x_ptr, ROOM)
    for _ in tl.static_range(REPS):
        above = (x >= acc).to(tl.int32) + (x >= acc + 5).to(tl.int32) + (x >= acc + 9).to(tl.int32)
        fields = tl.sum(tl.full((), 1, tl.int64) << (above * 16).to(tl.int64), axis=0)
        acc += (fields >> 20).to(tl.int32) & 1
    tl.store(out_ptr + tl.program_id(0), acc)


@triton.jit
def gather_kernel(out_ptr, x_ptr, REPS: tl.constexpr, ROOM: tl.constexpr):
    x, _ = _values(x_ptr, ROOM)
    table = tl.load(x_ptr + tl.arange(0, 32)) & 31
    index = x & 31
    for _ in tl.static_range(REPS):
        index = tl.gather(table, index, 0) & 31
    tl.store(out_ptr + tl.program_id(0), tl.sum(index, axis=0))


@triton.jit
def load_kernel(out_ptr, x_ptr, REPS: tl.constexpr, ROOM: tl.constexpr):
    index = tl.arange(0, ROOM)
    for _ in tl.static_range(REPS):
        index = tl.load(x_ptr + (index & (ROOM * 64 - 1))) & (ROOM * 64 - 1)
    tl.store(out_ptr + tl.program_id(0), tl.sum(index, axis=0))


@triton.jit
def meet_kernel(out_ptr, x_ptr, REPS: tl.constexpr, ROOM: tl.constexpr):
    """REPS meets of the PROGRAMS programs at a counter (``out_ptr``'s last
    word, zero at launch and left zero): the programs wait for one another,
    one atomic round trip to arrive and at least one to see the last
    arrival. The grid is one program an SM: all are resident, so no wait
    outlasts the others' arrivals; each is bounded all the same, and a
    program writes how many of its waits expired (``main`` fails on any)."""
    counter = out_ptr + tl.num_programs(0)
    expired = tl.zeros((), dtype=tl.int32)
    for rep in tl.static_range(REPS):
        tl.debug_barrier()
        seen = tl.atomic_add(counter, 1, sem="acq_rel", scope="gpu") + 1
        spins = 0
        while (seen < (rep + 1) * tl.num_programs(0)) & (spins < MAX_SPINS):
            seen = tl.atomic_add(counter, 0, sem="acquire", scope="gpu")
            spins += 1
        expired += (seen < (rep + 1) * tl.num_programs(0)).to(tl.int32)
    tl.store(out_ptr + tl.program_id(0), expired)
    tl.debug_barrier()
    if tl.atomic_add(counter, 1, sem="acq_rel", scope="gpu") == (REPS + 1) * tl.num_programs(0) - 1:
        tl.store(counter, 0)  # the last to leave: every program has stopped polling


STEPS = {"sum": (sum_kernel, {}), "max": (max_kernel, {}), "cumsum": (cumsum_kernel, {}),
         **{f"histogram {bins}": (histogram_kernel, dict(BINS=bins)) for bins in (16, 32, 64, 256)},
         "3 sums, one tl.reduce": (tuple_sum_kernel, {}), "3 counts, one int64 sum": (field_sum_kernel, {}),
         "gather (32 values)": (gather_kernel, {}), "dependent load": (load_kernel, {}),
         f"meet of {PROGRAMS} programs": (meet_kernel, {})}


def main() -> None:
    dev = torch.device("cuda")
    x = torch.randint(0, 1 << 16, (PROGRAMS * 8192 * 64,), dtype=torch.int32, device=dev)
    out = torch.zeros(PROGRAMS + 1, dtype=torch.int32, device=dev)  # the meet's counter last
    print(f"# ns a step, one program of W warps over ROOM int32 ({PROGRAMS} programs, {REPS} chained steps)")
    print(f"{'step':26s}" + "".join(f"  W={w} ROOM={r:<5d}" for w in (4, 8) for r in (1024, 4096)))
    for name, (kernel, constexprs) in STEPS.items():
        costs = []
        for warps in (4, 8):
            for room in (1024, 4096):
                def run(reps):
                    return kernel[(PROGRAMS,)](out, x, REPS=reps, ROOM=room, num_warps=warps, **constexprs)
                times = [median_us(graphed(lambda: run(reps), 20).replay, dev, 50, calls=20) for reps in (0, REPS)]
                if kernel is meet_kernel and out[:PROGRAMS].any():
                    raise RuntimeError(f"a meet's wait expired ({out[:PROGRAMS].tolist()} a program)")
                costs.append((times[1] - times[0]) / REPS * 1000)
        print(f"{name:26s}" + "".join(f"  {c:15.0f}" for c in costs), flush=True)


if __name__ == "__main__":
    main()

"""The one timer of the CLI's bench and the benchmark scripts, and what
they time: the simulated merge, CUDA graphs of several calls, per-kernel
device times."""

from __future__ import annotations

import contextlib
import itertools
import statistics
import time

import torch

from .protocol import Outputs, backend, run_merge
from .api import init_dcp_topk_merge, simulate_dcp_topk_merge
from .groups.simulated import SimulatedGroup


class SimulatedMerge:
    """The whole merge of ``logits`` [W, T, S] over a simulated group of W
    ranks, on workspaces built once so that calls can be captured in a CUDA
    graph. Call it to merge; ``workspaces``, ``outputs`` and ``ids``
    (int32 [W, T, K], by descending key when ``sorted``) stay for checks and
    stage timings. ``destroy()`` frees the group."""

    def __init__(self, logits: torch.Tensor, row_ends: torch.Tensor, topk: int, impl: str,
                 interleave: int = 1, sorted: bool = False, score_dtype: torch.dtype | None = None) -> None:
        world_size, rows, width = logits.shape
        self.group = SimulatedGroup(world_size, logits.device)
        self.workspaces = [init_dcp_topk_merge(g, max_rows=rows, topk=topk, max_local_len=width, impl=impl,
                                               interleave=interleave, score_dtype=score_dtype)
                           for g in self.group.ranks]
        self.ids = torch.empty(world_size, rows, topk, dtype=torch.int32, device=logits.device)
        self.outputs = [Outputs(self.ids[r], None, sorted) for r in range(world_size)]
        self._inputs = (list(logits), list(row_ends))
        self._rows = rows

    def __call__(self, logits: torch.Tensor | None = None) -> None:
        """One merge, of the logits given at construction or of ``logits``
        (another [W, T, S] of the same shape: graphs of calls over distinct
        inputs)."""
        inputs = self._inputs if logits is None else (list(logits), self._inputs[1])
        run_merge(self.workspaces, *inputs, self.outputs, self._rows)

    def select_alone(self):
        """Rank 0's select stage alone (the select, then the saturated push's
        pipeline, whose kernels do nothing where this rank is not saturated),
        as a callable that re-runs it on one epoch (its ids land in
        ``ids[0]``). Two merges first: the select reads the gather buffer of
        the epoch after the last merge's, and buffers go by epoch parity, so
        after one merge it would read rows no merge wrote. Then every flag far
        ahead, so that no wait holds (the select never advances the epoch)."""
        self()
        self()
        for ws in self.workspaces:
            ws.flags.local.fill_(1 << 30)
        ws, out = self.workspaces[0], self.outputs[0]
        logits, row_ends = self._inputs[0][0], self._inputs[1][0]
        return lambda: backend(ws.impl).select(ws, logits, row_ends, self._rows, out)

    def destroy(self) -> None:
        self.group.destroy()


_SETTLING_GRAPHS = {}  # device index: the graphs that settled its context, kept while the process lives


def settle_graph_launches() -> None:
    """Capture ten CUDA graphs of 200 small kernels each on the current
    device, once a process, and keep them. On the H200 a process's first
    graphs replay slower than later ones: the pack's graph at [64, 131072]
    takes 23.3 µs a call until the process has captured a few graphs (the
    third or fourth such graph; these ten at once), then 21.4, the graphs
    captured before included, whatever their buffers
    (``scripts/bench_first_graphs.py``). A serving engine captures many
    graphs before it serves, so every timed graph is timed in that state."""
    device = torch.cuda.current_device()
    if device in _SETTLING_GRAPHS:
        return
    counter = torch.zeros(1, dtype=torch.int32, device=device)
    graphs = []
    for _ in range(10):
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            for _ in range(200):
                counter.add_(1)
        graph.replay()
        graphs.append(graph)
    torch.cuda.synchronize()
    _SETTLING_GRAPHS[device] = (counter, graphs)


def graphed(fn, calls: int = 1) -> torch.cuda.CUDAGraph:
    """``calls`` back-to-back calls of ``fn`` captured in one CUDA graph,
    after one eager call that compiles its kernels and allocates outside the
    capture (and ``settle_graph_launches``). Several calls per graph keep
    the GPU busy while the host launches the next replay, as a serving
    engine's decode-step graph does: timing one replay of a few-microsecond
    graph times the host's launch."""
    settle_graph_launches()
    fn()
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(calls):
            fn()
    return graph


GRAPH_CALLS = 10  # calls a timed graph holds: one call's graph would time the host's launch
_L2_FLUSH_BYTES = 256 << 20  # more than any GPU's L2


def median_us(fn, device: torch.device, reps: int, *, calls: int = 1, flush_l2: bool = False,
              before=None) -> float:
    """Median microseconds of one of the ``calls`` calls that ``fn`` makes,
    over ``reps`` timed runs after two warm-ups: CUDA events around each run
    on a GPU (``flush_l2``: a 256 MiB write before each, outside the timed
    span, so no run finds its inputs in L2), the host clock on a CPU.
    ``before`` runs once before the timed runs (a barrier of every rank)."""
    fn(), fn()
    if device.type == "cuda":
        torch.cuda.synchronize()
    if before is not None:
        before()
    if device.type != "cuda":
        samples = []
        for _ in range(reps):
            start = time.perf_counter()
            fn()
            samples.append((time.perf_counter() - start) * 1e6)
        return statistics.median(samples) / calls
    flush = torch.empty(_L2_FLUSH_BYTES, dtype=torch.int8, device=device) if flush_l2 else None
    events = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) for _ in range(reps)]
    for start, end in events:
        if flush is not None:
            flush.zero_()
        start.record()
        fn()
        end.record()
    torch.cuda.synchronize()
    return statistics.median(start.elapsed_time(end) * 1e3 for start, end in events) / calls


def graph_us(fn, reps: int, *, flush_l2: bool = True, before=None) -> float:
    """Median microseconds of one call of ``fn`` replayed from a CUDA graph
    of GRAPH_CALLS calls (``median_us``)."""
    return median_us(graphed(fn, GRAPH_CALLS).replay, torch.device("cuda"), reps, calls=GRAPH_CALLS,
                     flush_l2=flush_l2, before=before)


@contextlib.contextmanager
def without_pdl(workspaces=()):
    """A context in which the ``workspaces`` launch (and graphs capture)
    kernels without programmatic dependent launch (kernels/sync.py), so
    that each kernel's profiled time is its own: under PDL it also covers
    its prior's."""
    saved = [ws.pdl for ws in workspaces]
    for ws in workspaces:
        ws.pdl = False
    try:
        yield
    finally:
        for ws, pdl in zip(workspaces, saved):
            ws.pdl = pdl


def _kernel_events(fn, iters: int):
    """torch.profiler's device events of ``iters`` calls of ``fn`` (after
    one more), averaged by name."""
    from torch.profiler import ProfilerActivity, profile

    fn()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(iters):
            fn()
        torch.cuda.synchronize()
    return [e for e in prof.key_averages() if e.self_device_time_total > 0]


def kernel_times(fn, iters: int = 20) -> dict[str, float]:
    """Device microseconds per kernel name for one call of ``fn`` (torch.profiler)."""
    return {e.key: e.self_device_time_total / iters for e in _kernel_events(fn, iters)}


def kernel_launches(fn, iters: int = 4) -> float:
    """Kernels one call of ``fn`` launches on the GPU (torch.profiler)."""
    return sum(e.count for e in _kernel_events(fn, iters)
               if e.device_type.name == "CUDA" and not e.key.startswith(("Memcpy", "Memset"))) / iters


def graphed_over(fn, inputs: list) -> torch.cuda.CUDAGraph:
    """One graph of ``len(inputs)`` calls, ``fn(x)`` for each x of
    ``inputs`` in turn: calls over distinct inputs, so that no call reads
    what the one before it left in L2."""
    calls = itertools.cycle(inputs)
    return graphed(lambda: fn(next(calls)), len(inputs))


def merge_breakdown(copies: list[torch.Tensor], row_ends: torch.Tensor, topk: int, reps: int,
                    interleave: int = 1, stages: bool = True) -> dict:
    """The simulated merge of ``copies`` (each [W, T, S], one for each call
    of a graph; their row ends [W, T]) and its stages on rank 0, each timed alone
    (``median_us`` of graphs over the copies, L2 flushed): µs of one call of
    the merge (divide by W for a rank's), the merge with PDL off, the kernel
    launches of a merge per rank, and rank 0's pack (with its push), the
    push exchange alone (a kernel of its own: the merge's pack pushes its
    rows itself when every peer has an address), select (its saturated
    pushes included) and rescue (all but the merge's time left out unless
    ``stages``). ``exact``: the merge's ids of the last copy
    equal the reference's. The stages alone run on flags raised far ahead
    (``SimulatedMerge.select_alone``), so no wait holds them."""
    device = copies[0].device
    run = SimulatedMerge(copies[0], row_ends, topk, "triton", interleave=interleave)
    world, rows = copies[0].shape[:2]

    def timed(fn) -> float:
        return median_us(graphed_over(fn, copies).replay, device, reps, calls=len(copies), flush_l2=True)

    try:
        result = dict(merge_us=timed(run))
        run(copies[-1])
        expected = simulate_dcp_topk_merge(copies[-1], row_ends, topk=topk, impl="reference", interleave=interleave)
        result["exact"] = bool(torch.equal(run.ids, expected))
        if not stages:
            return result
        with without_pdl(run.workspaces):
            result["merge_no_pdl_us"] = timed(run)
        result["launches_per_rank"] = kernel_launches(run) / world
        run.select_alone()
        ws, out, impl = run.workspaces[0], run.outputs[0], backend("triton")
        ends = row_ends[0]
        result["pack_us"] = timed(lambda x: impl.pack_and_push(ws, x[0], ends, ws.staging.local[:rows]))
        result["exchange_us"] = timed(lambda x: impl.push_rows(ws, ws.staging.local[:rows]))
        result["select_us"] = timed(lambda x: impl.select(ws, x[0], ends, rows, out))
        result["rescue_us"] = timed(lambda x: impl.rescue(ws, x[0], ends, rows, out))
    finally:
        run.destroy()
    return result
